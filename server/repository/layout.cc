#include "server/repository/layout.h"

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>
#include <sys/stat.h>

#include <charconv>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

namespace fastformer::repository {
namespace fs = std::filesystem;

std::optional<int64_t> version_number(const std::string& name) {
  if (name.empty() || name[0] == '0' || name.size() > 18) return std::nullopt;
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), v);
  if (ec != std::errc() || end != name.data() + name.size()) return std::nullopt;
  return v;
}

std::map<int64_t, std::string> version_dirs(const std::filesystem::path& model_dir) {
  std::map<int64_t, std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(model_dir, ec)) {
    if (!e.is_directory(ec)) continue;
    if (const auto v = version_number(e.path().filename().string())) out[*v] = e.path().string();
  }
  return out;
}

// What changes when a directory's files do: their names, sizes and modification times.
std::string files_fingerprint(const fs::path& dir) {
  std::vector<std::string> parts;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    struct stat st {};
    if (::stat(e.path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    parts.push_back(e.path().filename().string() + ":" + std::to_string(st.st_size) + ":" +
                    std::to_string(st.st_mtim.tv_sec) + "." + std::to_string(st.st_mtim.tv_nsec));
  }
  std::sort(parts.begin(), parts.end());
  std::string out;
  for (const std::string& p : parts) out += p + ";";
  return out;
}

class CollectErrors : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    if (first.empty())
      first =
          "line " + std::to_string(line + 1) + ":" + std::to_string(column + 1) + ": " + message;
  }
  void AddWarning(int, google::protobuf::io::ColumnNumber, const std::string&) override {}
  std::string first;
};

namespace {

int64_t positive(const std::string& file, const std::string& key, const std::string& value) {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || end != value.data() + value.size() || v <= 0) {
    throw std::invalid_argument(file + ": parameters \"" + key +
                                "\" must be a positive integer, got \"" + value + "\"");
  }
  return v;
}

}  // namespace

std::vector<std::string> read_labels(const fs::path& version_dir) {
  auto read = [](const fs::path& path) -> nlohmann::json {
    std::error_code ec;
    if (!fs::is_regular_file(path, ec)) return nullptr;
    try {
      std::ifstream in(path);
      if (!in) return nullptr;
      return nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    } catch (const std::exception&) {
      return nullptr;
    }
  };
  std::vector<std::string> labels;
  const nlohmann::json config = read(version_dir / "config.json");
  if (config.is_object() && config.contains("id2label") && config["id2label"].is_object()) {
    for (const auto& [key, value] : config["id2label"].items()) {
      char* end = nullptr;
      const long id = std::strtol(key.c_str(), &end, 10);
      if (end == key.c_str() || *end != '\0' || id < 0 || id > 1 << 20 || !value.is_string())
        continue;
      if (size_t(id) >= labels.size()) labels.resize(size_t(id) + 1);
      labels[size_t(id)] = value.get<std::string>();
    }
    if (!labels.empty()) return labels;
  }
  const nlohmann::json file = read(version_dir / "labels.json");
  if (file.is_object() && file.contains("labels") && file["labels"].is_array()) {
    for (const auto& value : file["labels"]) {
      labels.push_back(value.is_string() ? value.get<std::string>() : value.dump());
    }
  }
  return labels;
}

std::shared_ptr<const request::Prompts> read_prompts(const fs::path& version_dir,
                                                     const std::string& from_settings) {
  if (!from_settings.empty()) {
    return std::make_shared<const request::Prompts>(
        request::Prompts::parse(from_settings, "config.pbtxt parameters \"prompts\""));
  }
  return request::Prompts::load(version_dir);
}

std::shared_ptr<const request::Quantization> read_quantization(const fs::path& version_dir,
                                                               int64_t hidden_size) {
  const fs::path path = version_dir / "quantization.json";
  std::error_code ec;
  if (!fs::exists(path, ec)) return nullptr;
  const std::string file = path.string();
  auto bad = [&](const std::string& what) {
    return std::invalid_argument(
        file + ": " + what +
        " (docs/api.md, \"Embedding types\"; tools/calibrate_quantization.py "
        "writes it)");
  };
  std::ifstream in(path);
  if (!in) throw bad("cannot be read");
  const nlohmann::json doc = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object()) throw bad("is not a JSON object");
  if (!doc.contains("ranges") || !doc["ranges"].is_array()) throw bad("\"ranges\" must be a list");
  auto q = std::make_shared<request::Quantization>();
  q->file = file;
  for (size_t i = 0; i < doc["ranges"].size(); ++i) {
    const nlohmann::json& r = doc["ranges"][i];
    const std::string where = "ranges[" + std::to_string(i) + "]";
    if (!r.is_object()) throw bad(where + " must be an object");
    request::QuantizationRange range;
    if (!r.contains("dimensions") || !r["dimensions"].is_number_integer() ||
        r["dimensions"].get<int64_t>() < 1 || r["dimensions"].get<int64_t>() > hidden_size) {
      throw bad(where + ".dimensions must be an integer in [1, hidden_size " +
                std::to_string(hidden_size) + "]");
    }
    range.dims = r["dimensions"].get<int64_t>();
    if (r.contains("normalized")) {
      if (!r["normalized"].is_boolean()) throw bad(where + ".normalized must be true or false");
      range.normalized = r["normalized"].get<bool>();
    }
    for (const char* key : {"min", "max"}) {
      if (!r.contains(key) || !r[key].is_array() || int64_t(r[key].size()) != range.dims) {
        throw bad(where + "." + key + " must be a list of " + std::to_string(range.dims) +
                  " numbers");
      }
      std::vector<float>& values = std::string(key) == "min" ? range.min : range.max;
      for (const nlohmann::json& v : r[key]) {
        if (!v.is_number() || !std::isfinite(v.get<double>()))
          throw bad(where + "." + key + " must hold finite numbers");
        values.push_back(v.get<float>());
      }
    }
    for (int64_t j = 0; j < range.dims; ++j) {
      if (range.min[size_t(j)] > range.max[size_t(j)]) {
        throw bad(where + ": dimension " + std::to_string(j) + " has min " +
                  std::to_string(range.min[size_t(j)]) + " above max " +
                  std::to_string(range.max[size_t(j)]));
      }
    }
    if (q->find(range.dims, range.normalized) != nullptr)
      throw bad(where + " repeats an earlier range's dimensions and normalisation");
    q->ranges.push_back(std::move(range));
  }
  return q;
}

ModelSettings read_settings(const std::filesystem::path& model_dir, const std::string& name,
                            const ModelSettings& defaults) {
  ModelSettings s = defaults;
  const fs::path file = model_dir / "config.pbtxt";
  std::error_code ec;
  if (!fs::exists(file, ec)) return s;
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  if (!in.good() && !in.eof()) throw std::invalid_argument(file.string() + ": cannot be read");
  inference::ModelConfig config;
  google::protobuf::TextFormat::Parser parser;
  CollectErrors errors;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text.str(), &config)) {
    throw std::invalid_argument(
        file.string() + ": " +
        (errors.first.empty() ? "not an inference.ModelConfig" : errors.first));
  }
  const std::string f = file.string();
  if (!config.name().empty() && config.name() != name) {
    throw std::invalid_argument(f + ": name \"" + config.name() +
                                "\" is not the model's directory name \"" + name + "\"");
  }
  if (config.max_batch_size() < 0)
    throw std::invalid_argument(f + ": max_batch_size must not be negative");
  if (config.max_batch_size() > 0) s.max_batch_sequences = config.max_batch_size();
  if (config.has_dynamic_batching() &&
      config.dynamic_batching().max_queue_delay_microseconds() > 0) {
    s.max_queue_delay_us = int64_t(config.dynamic_batching().max_queue_delay_microseconds());
  }
  if (config.has_dynamic_batching() && config.dynamic_batching().default_priority_level() > 0) {
    // Triton's levels: 1 interactive, 2 and more bulk (a "default_priority" parameter wins).
    const auto& batching = config.dynamic_batching();
    if (batching.priority_levels() > 0 &&
        batching.default_priority_level() > batching.priority_levels()) {
      throw std::invalid_argument(f + ": dynamic_batching default_priority_level " +
                                  std::to_string(batching.default_priority_level()) +
                                  " is above priority_levels " +
                                  std::to_string(batching.priority_levels()));
    }
    s.default_priority = batching.default_priority_level() == 1 ? batching::Priority::kInteractive
                                                                : batching::Priority::kBulk;
  }
  if (config.instance_group_size() > 1)
    throw std::invalid_argument(f + ": instance_group: one group at most (one engine per version)");
  if (config.instance_group_size() == 1) {
    const auto& group = config.instance_group(0);
    if (group.kind() == inference::ModelInstanceGroup::KIND_GPU) s.backend = "cuda";
    if (group.kind() == inference::ModelInstanceGroup::KIND_CPU) s.backend = "cpu";
    if (group.count() > 1)
      throw std::invalid_argument(f + ": instance_group count " + std::to_string(group.count()) +
                                  ": one instance per version (batches run one at a time)");
    if (group.gpus_size() > 0) s.device = group.gpus(0);
  }
  for (const auto& [key, value] : config.parameters()) {
    const std::string& v = value.string_value();
    if (key == "dtype") {
      if (!engine::parse_dtype(v, &s.dtype)) {
        throw std::invalid_argument(f + ": parameters \"dtype\": \"" + v +
                                    "\" is not auto, float32, float16 or bfloat16");
      }
    } else if (key == "cpu_gemm") {
      if (!engine::parse_cpu_gemm(v, &s.cpu_gemm)) {
        throw std::invalid_argument(f + ": parameters \"cpu_gemm\": \"" + v +
                                    "\" is not auto, onednn or amx");
      }
    } else if (key == "backend") {
      s.backend = v;
    } else if (key == "max_batch_tokens") {
      s.max_batch_tokens = positive(f, key, v);
    } else if (key == "max_queue_tokens") {
      s.max_queue_tokens = positive(f, key, v);
    } else if (key == "max_request_tokens") {
      s.max_request_tokens = positive(f, key, v);
    } else if (key == "threads") {
      s.threads = int(positive(f, key, v));
    } else if (key == "default_priority") {
      const auto p = batching::parse_priority(v);
      if (!p) {
        throw std::invalid_argument(f + ": parameters \"default_priority\": \"" + v +
                                    "\" is not interactive or bulk");
      }
      s.default_priority = *p;
    } else if (key == "max_bulk_queue_tokens") {
      s.max_bulk_queue_tokens = positive(f, key, v);
    } else if (key == "bulk_promote_after_ms") {
      s.bulk_promote_after_ms = positive(f, key, v);
    } else if (key == "mixed_batch_tokens") {
      s.mixed_batch_tokens = positive(f, key, v);
    } else if (key == "interactive_timeout_ms") {
      s.interactive_timeout_ms = positive(f, key, v);
    } else if (key == "bulk_timeout_ms") {
      s.bulk_timeout_ms = positive(f, key, v);
    } else if (key == "prompts") {
      request::Prompts::parse(v, f + ": parameters \"prompts\"");  // refused here, at load
      s.prompts = v;
    } else {
      throw std::invalid_argument(
          f + ": parameters \"" + key +
          "\" is not a setting (dtype, backend, max_batch_tokens, "
          "max_queue_tokens, max_request_tokens, threads, "
          "default_priority, max_bulk_queue_tokens, "
          "bulk_promote_after_ms, mixed_batch_tokens, interactive_timeout_ms, "
          "bulk_timeout_ms, prompts)");
    }
  }
  if (config.has_version_policy()) {
    s.version_policy = config.version_policy();
    if (s.version_policy.has_latest() && s.version_policy.latest().num_versions() == 0)
      throw std::invalid_argument(f + ": version_policy latest num_versions must be at least 1");
  }
  return s;
}

std::set<int64_t> wanted_versions(const inference::ModelVersionPolicy& policy,
                                  const std::map<int64_t, std::string>& present) {
  std::set<int64_t> out;
  if (policy.has_all()) {
    for (const auto& [v, dir] : present) out.insert(v);
  } else if (policy.has_specific()) {
    for (const int64_t v : policy.specific().versions())
      if (present.count(v)) out.insert(v);
  } else {
    const uint32_t n = policy.has_latest() ? policy.latest().num_versions() : 1;
    for (auto it = present.rbegin(); it != present.rend() && out.size() < n; ++it)
      out.insert(it->first);
  }
  return out;
}

}  // namespace fastformer::repository
