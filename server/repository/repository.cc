#include "server/repository/repository.h"

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

namespace fastformer::repository {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

bool parse_control_mode(const std::string& name, ControlMode* out) {
  if (name == "none")
    *out = ControlMode::kNone;
  else if (name == "explicit")
    *out = ControlMode::kExplicit;
  else if (name == "poll")
    *out = ControlMode::kPoll;
  else
    return false;
  return true;
}

const char* state_name(State state) {
  switch (state) {
    case State::kReady:
      return "READY";
    case State::kLoading:
      return "LOADING";
    case State::kUnloading:
      return "UNLOADING";
    case State::kUnavailable:
      return "UNAVAILABLE";
    case State::kUnknown:
      break;
  }
  return "UNKNOWN";
}

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

namespace {

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
      s.dtype = v;
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
    } else {
      throw std::invalid_argument(f + ": parameters \"" + key +
                                  "\" is not a setting (dtype, backend, max_batch_tokens, "
                                  "max_queue_tokens, max_request_tokens, threads)");
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

namespace {

// Bytes this process may still allocate: MemAvailable, or less under a cgroup v2 limit.
int64_t available_memory() {
  int64_t available = INT64_MAX;
  std::ifstream meminfo("/proc/meminfo");
  for (std::string key; meminfo >> key;) {
    int64_t kb = 0;
    meminfo >> kb;
    if (key == "MemAvailable:") {
      available = kb * 1024;
      break;
    }
    meminfo.ignore(64, '\n');
  }
  std::ifstream max_file("/sys/fs/cgroup/memory.max"),
      current_file("/sys/fs/cgroup/memory.current");
  std::string max_text;
  int64_t current = 0;
  if (max_file >> max_text && max_text != "max" && current_file >> current) {
    int64_t limit = 0;
    if (std::from_chars(max_text.data(), max_text.data() + max_text.size(), limit).ec ==
        std::errc()) {
      available = std::min(available, limit - current);
    }
  }
  if (const char* test = std::getenv("FASTFORMER_TEST_AVAILABLE_MEMORY_BYTES")) {
    available = std::min<int64_t>(available, std::atoll(test));  // tests/repository only
  }
  return available;
}

// One short sequence through the engine, so the first request does not pay for cold caches
// and lazy initialisation. Every output is asked for, so every op and GEMM shape runs (the
// CUDA engine plans its GEMMs on their first run, and a shape cuBLASLt cannot run fails
// here, not mid-serving).
void warm_up(engine::Engine& eng) {
  const engine::Model& model = eng.model();
  const auto& c = model.config();
  const int64_t n = std::min<int64_t>(16, c.max_position_embeddings);
  std::vector<int32_t> ids(size_t(n), (c.pad_token_id + 1) % int32_t(c.vocab_size));
  std::vector<float> embeddings(size_t(n * c.hidden_size), 0.5f);
  engine::RaggedBatch batch;
  if (model.has_word_embedding())
    batch.add({ids, {}}, c);
  else
    batch.add({{}, embeddings}, c);
  OutputOptions options;
  options.token_embeddings = options.logits = options.normalize = true;
  eng.encode(batch, {&options, 1});
}

batching::QueueObserver queue_observer(const std::shared_ptr<metrics::ModelSeries>& series) {
  metrics::QueueRecorders record = metrics::queue_recorders(series);
  batching::QueueObserver observer;
  observer.on_depth = std::move(record.depth);
  observer.on_dropped = [dropped = std::move(record.dropped)](const batching::QueueEntry&,
                                                              batching::Outcome reason) {
    // The queue reports only these two reasons.
    dropped(reason == batching::Outcome::kDeadlineExceeded ? metrics::DropReason::kDeadline
                                                           : metrics::DropReason::kCancelled);
  };
  observer.on_batched = [batched = std::move(record.batched)](const batching::QueueEntry&,
                                                              double seconds) { batched(seconds); };
  return observer;
}

// Runs `done` once, after every version it was attached to has been freed.
struct DoneWhenAll {
  Repository::Done done;
  int remaining = 0;
};

}  // namespace

Repository::Repository(RepositoryOptions options, metrics::Metrics& metrics)
    : options_(std::move(options)),
      metrics_(metrics),
      pool_(std::make_unique<batching::ComputePool>()),
      budget_(std::make_shared<batching::QueueBudget>(options_.max_server_queue_tokens)) {
  root_ = options_.root;
  worker_ = std::thread([this] { run(); });
  if (options_.mode == ControlMode::kPoll && options_.poll_secs > 0) {
    poller_ = std::thread([this] {
      std::unique_lock lock(mu_);
      while (!stopping_) {
        poll_cv_.wait_for(lock, std::chrono::duration<double>(options_.poll_secs));
        if (stopping_ || closed_) continue;
        tasks_.push_back([this] { rescan_now(); });
        cv_.notify_all();
      }
    });
  }
}

Repository::~Repository() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  poll_cv_.notify_all();
  if (poller_.joinable()) poller_.join();
  if (worker_.joinable()) worker_.join();
  close();
}

void Repository::post(std::function<void()> task) {
  {
    std::lock_guard lock(mu_);
    tasks_.push_back(std::move(task));
  }
  cv_.notify_all();
}

void Repository::run() {
  std::unique_lock lock(mu_);
  for (;;) {
    if (!tasks_.empty()) {
      auto task = std::move(tasks_.front());
      tasks_.pop_front();
      lock.unlock();
      task();
      if (options_.on_change) options_.on_change();
      lock.lock();
      continue;
    }
    if (stopping_) return;
    const bool waiting = !retiring_.empty();
    lock.unlock();
    const bool more = waiting && reap();
    lock.lock();
    if (!tasks_.empty() || stopping_) continue;
    if (more)
      cv_.wait_for(lock, std::chrono::milliseconds(5));
    else
      cv_.wait(lock);
  }
}

bool Repository::reap() {
  std::vector<Retiring> freed;
  {
    std::lock_guard lock(mu_);
    for (auto it = retiring_.begin(); it != retiring_.end();) {
      // Only this list holds it, and nothing can take a new reference: it left the routing
      // table, and every request that held it has ended.
      if (it->served.use_count() == 1) {
        freed.push_back(std::move(*it));
        it = retiring_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (Retiring& r : freed) {
    const std::string name = r.served->name, version = r.served->version;
    bool unloaded = false;  // the version itself is gone, not a replaced copy of it
    const int64_t number = r.served->version_number;
    r.served.reset();  // closes its queue, joins its lane, frees its engine and weights
    {
      std::lock_guard lock(mu_);
      auto model = models_.find(name);
      if (model == models_.end()) {
        transition_locked(name, number, nullptr, State::kUnavailable, "gone from the repository");
        unloaded = true;
      } else {
        auto v = model->second.versions.find(number);
        if (v != model->second.versions.end() && v->second.state == State::kUnloading &&
            v->second.served == nullptr) {
          transition_locked(name, number, &v->second, State::kUnavailable, "unloaded");
          unloaded = true;
        }
      }
    }
    if (unloaded) {
      spdlog::info("model {} version {} unloaded: its last request ended, its memory is freed",
                   name, version);
    } else {
      spdlog::info("model {} version {}: the copy it replaced is freed (its last request ended)",
                   name, version);
    }
    for (Done& done : r.done)
      if (done) done(Status());
  }
  if (!freed.empty() && options_.on_change) options_.on_change();
  std::lock_guard lock(mu_);
  return !retiring_.empty();
}

void Repository::transition_locked(const std::string& name, int64_t version, VersionRecord* r,
                                   State state, std::string reason) {
  if (r != nullptr) {
    r->state = state;
    r->reason = std::move(reason);
  }
  metrics_.set_model_state(name, std::to_string(version), state_name(state));
  if (options_.on_transition) options_.on_transition(name, version, state);
}

void Repository::set_state(const std::string& name, int64_t version, State state,
                           std::string reason, std::shared_ptr<const ServedModel> served) {
  std::lock_guard lock(mu_);
  VersionRecord& r = models_[name].versions[version];
  r.served = std::move(served);
  transition_locked(name, version, &r, state, std::move(reason));
}

void Repository::retire_locked(const std::string& name, int64_t version, Done done) {
  VersionRecord& r = models_[name].versions[version];
  if (!r.served) {
    if (done) done(Status());
    return;
  }
  transition_locked(name, version, &r, State::kUnloading, "");
  Retiring retiring;
  retiring.served = std::move(r.served);
  r.served = nullptr;
  retiring.done.push_back(std::move(done));
  retiring_.push_back(std::move(retiring));
  spdlog::info("model {} version {} leaves the routing table; freed once its requests end", name,
               version);
}

std::shared_ptr<ServedModel> Repository::load_version(const std::string& name, int64_t version,
                                                      const std::string& dir,
                                                      const ModelSettings& settings) {
  const auto started = Clock::now();
  auto served = std::make_shared<ServedModel>();
  served->name = name;
  served->version = std::to_string(version);
  served->version_number = version;
  served->dir = dir;
  served->settings = settings;
  // Two copies must fit while the old one serves: check before reading the weights.
  std::error_code ec;
  const int64_t file_bytes = int64_t(fs::file_size(fs::path(dir) / "model.safetensors", ec));
  if (!ec) {
    // The weights as served, and as much again for packed GEMM copies and buffers.
    const int64_t need = 2 * file_bytes;
    const int64_t available = available_memory();
    if (need > available) {
      throw std::runtime_error("not enough memory to load it beside what serves: it needs about " +
                               std::to_string(need >> 20) + " MiB (twice model.safetensors), " +
                               std::to_string(std::max<int64_t>(0, available) >> 20) +
                               " MiB are available");
    }
  }
  served->model = engine::Model::load(dir);
  if (served->name.empty()) served->name = served->model->config().model_name;  // --model-dir
  const auto& c = served->model->config();
  served->config.tokenizer = text::load_tokenizer(dir, *served->model);
  served->config.labels = read_labels(dir);
  const int64_t max_request_tokens =
      settings.max_request_tokens > 0
          ? settings.max_request_tokens
          : std::max(settings.max_batch_tokens, c.max_position_embeddings);
  if (max_request_tokens > settings.max_queue_tokens) {
    throw std::invalid_argument(
        "max_request_tokens " + std::to_string(max_request_tokens) + " exceeds max_queue_tokens " +
        std::to_string(settings.max_queue_tokens) + ": such requests could never be admitted");
  }
  engine::EngineOptions options;
  if (!engine::parse_backend(settings.backend, &options.backend))
    throw std::invalid_argument("backend \"" + settings.backend + "\" is not cpu, cuda or auto");
  options.threads = settings.threads;
  options.dtype = settings.dtype;
  options.device = settings.device;
  options.allow_tf32 = settings.allow_tf32;
  // The buffers hold a full batch, or the longest sequence a request may bring, which runs in
  // a batch of its own.
  options.max_batch_tokens =
      std::max(settings.max_batch_tokens, std::min(max_request_tokens, c.max_position_embeddings));
  std::string why;
  served->engine = engine::create_engine(served->model, options, &why);
  const auto loaded = Clock::now();
  warm_up(*served->engine);
  const auto warm = Clock::now();

  served->config.limits.max_request_tokens = max_request_tokens;
  served->config.limits.max_request_inputs = settings.max_request_inputs;
  served->config.version = options_.server_version;
  served->config.max_batch_tokens = settings.max_batch_tokens;
  served->config.max_batch_sequences = settings.max_batch_sequences;
  served->config.max_queue_delay_us = settings.max_queue_delay_us;
  served->config.dtype = settings.dtype;

  metrics::ModelLabels labels{served->name,
                              served->version,
                              settings.dtype,
                              served->engine->backend_name(),
                              served->engine->device_name(),
                              options_.server_version};
  served->series = metrics_.add_model(labels);
  batching::QueueLimits limits;
  limits.max_batch_tokens = settings.max_batch_tokens;
  limits.max_batch_sequences = settings.max_batch_sequences;
  limits.max_queue_tokens = settings.max_queue_tokens;
  limits.max_queue_delay = std::chrono::microseconds(settings.max_queue_delay_us);
  served->queue =
      std::make_unique<batching::BatchQueue>(limits, c, queue_observer(served->series), budget_);
  metrics::BatchRecorders record = metrics::batch_recorders(served->series);
  batching::BatchObserver observer;
  InferenceStatistics* statistics = &served->statistics;
  observer.on_batch = [computed = std::move(record.computed), statistics](
                          int64_t tokens, int64_t sequences, double seconds) {
    computed(tokens, sequences, seconds);
    statistics->execution_count.fetch_add(1, std::memory_order_relaxed);
  };
  observer.on_failure = [failed = std::move(record.failed), hook = options_.on_batch_failure,
                         name = served->name](const std::string& reason, int64_t sequences) {
    failed();
    if (hook) hook(name, reason, sequences);
  };
  observer.before_compute = options_.before_compute;
  served->scheduler = std::make_unique<batching::Scheduler>(*pool_, *served->queue, *served->engine,
                                                            std::move(observer));
  metrics_.set_model_info(*served->series, labels);
  const auto [device_used, device_total] = served->engine->device_memory();
  if (device_total > 0) metrics_.set_device_memory(double(device_used), double(device_total));

  const double load_s = std::chrono::duration<double>(loaded - started).count();
  const double warm_s = std::chrono::duration<double>(warm - loaded).count();
  const double total_s = std::chrono::duration<double>(Clock::now() - started).count();
  metrics_.record_model_load(served->name, true, total_s);
  spdlog::info(
      "model {} version {} from {}: hidden {}, {} layers, {} heads, {} positions, {} parameters "
      "stored as {}{}; backend {} on {} ({}); buffers for {} tokens",
      served->name, served->version, dir, c.hidden_size, c.num_hidden_layers, c.num_attention_heads,
      c.max_position_embeddings, served->model->parameter_count(), served->model->stored_dtype(),
      served->model->num_labels()
          ? ", classifier head with " + std::to_string(served->model->num_labels()) + " labels"
          : "",
      served->engine->backend_name(), served->engine->device_name(), why,
      served->engine->max_batch_tokens());
  for (const std::string& site : served->engine->gemm_report()) spdlog::info("GEMM {}", site);
  if (const size_t packed = served->engine->packed_weight_bytes(); packed > 0) {
    spdlog::info("packed GEMM weights: {:.1f} MiB beside the model's {:.1f} MiB",
                 double(packed) / (1 << 20), double(served->model->weight_bytes()) / (1 << 20));
  }
  // A mis-detected CPU (a BLAS or oneDNN on generic kernels) shows here, not in production.
  if (const engine::SpeedCheck speed = served->engine->speed_check(); speed.ran) {
    if (speed.warning)
      spdlog::warn("{}", speed.message);
    else
      spdlog::info("{}", speed.message);
  }
  spdlog::info("model {} version {} READY in {:.3f} s (load {:.3f} s, warm-up {:.3f} s)",
               served->name, served->version, total_s, load_s, warm_s);
  return served;
}

std::vector<std::string> Repository::model_names() const {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root_, ec)) {
    const std::string name = e.path().filename().string();
    if (e.is_directory(ec) && !name.empty() && name[0] != '.') out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string Repository::fingerprint(const std::string& name) const {
  const fs::path dir = fs::path(root_) / name;
  std::string out = files_fingerprint(dir) + "|";
  for (const auto& [v, path] : version_dirs(dir))
    out += std::to_string(v) + "{" + files_fingerprint(path) + "}";
  return out;
}

std::string Repository::model_path(const std::string& name) const {
  if (!options_.model_dir.empty()) return options_.model_dir;
  std::lock_guard lock(mu_);
  auto m = models_.find(name);
  if (m != models_.end()) {
    for (auto it = m->second.versions.rbegin(); it != m->second.versions.rend(); ++it)
      if (it->second.served) return it->second.served->dir;
  }
  return (fs::path(root_) / name).string();
}

Status Repository::load_now(const std::string& name) {
  {
    std::lock_guard lock(mu_);
    if (closed_) return Status(StatusCode::kUnavailable, "the server is shutting down");
  }
  const fs::path dir = fs::path(root_) / name;
  std::error_code ec;
  if (name.empty() || name.find('/') != std::string::npos || name[0] == '.' ||
      !fs::is_directory(dir, ec)) {
    return Status(
        StatusCode::kNotFound,
        "model '" + name + "' is not in the repository (no directory " + dir.string() + ")");
  }
  metrics_.declare_model(name);
  const std::string print = fingerprint(name);
  ModelSettings settings;
  const auto present = version_dirs(dir);
  try {
    settings = read_settings(dir, name, options_.defaults);
  } catch (const std::exception& e) {
    const std::string why = e.what();
    for (const auto& [v, path] : present) {
      std::lock_guard lock(mu_);
      VersionRecord& r = models_[name].versions[v];
      if (r.state != State::kReady) transition_locked(name, v, &r, State::kUnavailable, why);
    }
    {
      std::lock_guard lock(mu_);
      models_[name].fingerprint = print;
    }
    metrics_.record_model_load(name, false, 0);
    spdlog::error("load of model {} failed: {}", name, why);
    return Status(StatusCode::kInvalidArgument, "failed to load model '" + name + "': " + why);
  }
  const std::set<int64_t> wanted = wanted_versions(settings.version_policy, present);
  if (wanted.empty()) {
    std::lock_guard lock(mu_);
    models_[name].fingerprint = print;
    const std::string why = present.empty()
                                ? "no version directory (a number, e.g. " + dir.string() + "/1)"
                                : "no version directory matches its version_policy";
    spdlog::error("load of model {} failed: {}", name, why);
    return Status(StatusCode::kInvalidArgument, "failed to load model '" + name + "': " + why);
  }
  // Load every wanted version that is not serving its current files; off the serving path.
  std::vector<std::pair<int64_t, std::shared_ptr<ServedModel>>> loaded;
  Status failure;
  for (const int64_t v : wanted) {
    const std::string& path = present.at(v);
    const std::string files = files_fingerprint(path);
    {
      std::lock_guard lock(mu_);
      const VersionRecord& r = models_[name].versions[v];
      if (r.state == State::kReady && r.served && r.fingerprint == files) continue;
    }
    // The version's previous state (READY, if it serves) is kept in the table while the new
    // copy loads beside it; only the index shows LOADING.
    {
      std::lock_guard lock(mu_);
      VersionRecord& r = models_[name].versions[v];
      if (!r.served) transition_locked(name, v, &r, State::kLoading, "");
    }
    spdlog::info("loading model {} version {} from {}", name, v, path);
    try {
      loaded.emplace_back(v, load_version(name, v, path, settings));
      loaded.back().second->fingerprint = files;
    } catch (const std::exception& e) {
      const std::string why = e.what();
      metrics_.record_model_load(name, false, 0);
      spdlog::error("load of model {} version {} failed: {}", name, v, why);
      {
        std::lock_guard lock(mu_);
        VersionRecord& r = models_[name].versions[v];
        // A version that serves stays READY (its old copy serves on); the reason says why the
        // new one is not there.
        transition_locked(name, v, &r, r.served ? r.state : State::kUnavailable,
                          "load failed: " + why);
      }
      failure = Status(StatusCode::kInternal, "failed to load model '" + name + "' version " +
                                                  std::to_string(v) + ": " + why);
      break;
    }
  }
  std::lock_guard lock(mu_);
  ModelRecord& model = models_[name];
  model.fingerprint = print;
  if (!failure.ok()) {
    // All or nothing: what was loaded for this attempt is dropped; what served, serves.
    for (auto& [v, served] : loaded) {
      VersionRecord& r = model.versions[v];
      if (!r.served)
        transition_locked(name, v, &r, State::kUnavailable, "not served: " + failure.message());
      Retiring retiring;
      retiring.served = std::move(served);
      retiring_.push_back(std::move(retiring));
    }
    cv_.notify_all();
    return failure;
  }
  // The swap: the new versions enter the routing table at once; the ones they replace (and
  // the versions the policy no longer serves) leave it, and are freed after their requests.
  for (auto& [v, served] : loaded) {
    VersionRecord& r = model.versions[v];
    if (r.served) {
      Retiring retiring;
      retiring.served = std::move(r.served);
      retiring_.push_back(std::move(retiring));
    }
    r.fingerprint = served->fingerprint;
    r.served = std::move(served);
    transition_locked(name, v, &r, State::kReady, "");
  }
  for (auto& [v, r] : model.versions) {
    if (!wanted.count(v) && r.served) {
      retire_locked(name, v, nullptr);
    } else if (!wanted.count(v) && r.state != State::kUnavailable && !r.served &&
               r.state != State::kUnloading) {
      transition_locked(name, v, &r, State::kUnavailable, "not in the version policy");
    }
  }
  expected_.insert(name);
  cv_.notify_all();
  return Status();
}

Status Repository::unload_now(const std::string& name, Done done) {
  std::unique_lock lock(mu_);
  // A model the server was started to serve stays expected: unloading it makes the server
  // unready until it is loaded again (it is what this instance is there to serve).
  if (!pinned_.count(name)) expected_.erase(name);
  auto m = models_.find(name);
  std::vector<int64_t> serving;
  if (m != models_.end()) {
    for (auto& [v, r] : m->second.versions)
      if (r.served) serving.push_back(v);
  }
  if (serving.empty()) {
    lock.unlock();
    done(Status());  // nothing loaded: unloaded already (as Triton answers)
    return Status();
  }
  auto all = std::make_shared<DoneWhenAll>();
  all->done = std::move(done);
  all->remaining = int(serving.size());
  for (const int64_t v : serving) {
    retire_locked(name, v, [all](const Status&) {
      if (--all->remaining == 0) all->done(Status());
    });
  }
  cv_.notify_all();
  return Status();
}

void Repository::rescan_now() {
  const std::vector<std::string> names = model_names();
  for (const std::string& name : names) {
    std::string known;
    {
      std::lock_guard lock(mu_);
      if (closed_) return;
      auto m = models_.find(name);
      if (m != models_.end()) known = m->second.fingerprint;
    }
    if (fingerprint(name) == known) continue;
    spdlog::info("repository poll: model {} is new or changed; loading", name);
    (void)load_now(name);  // a failure is logged and shown in the index
  }
  std::vector<std::string> gone;
  {
    std::lock_guard lock(mu_);
    for (const auto& [name, record] : models_)
      if (!std::binary_search(names.begin(), names.end(), name)) gone.push_back(name);
  }
  for (const std::string& name : gone) {
    spdlog::info("repository poll: model {} is gone from the repository; unloading", name);
    (void)unload_now(name, [](const Status&) {});
    std::lock_guard lock(mu_);
    auto m = models_.find(name);
    if (m != models_.end()) {
      bool any = false;
      for (const auto& [v, r] : m->second.versions) any |= r.served != nullptr;
      if (!any) models_.erase(m);  // drops out of the index once nothing of it serves
    }
  }
}

bool Repository::start(std::string* message) {
  if (!options_.model_dir.empty()) {
    try {
      std::shared_ptr<ServedModel> served =
          load_version("", 1, options_.model_dir, options_.defaults);
      served->fingerprint = files_fingerprint(options_.model_dir);
      const std::string name = served->name;
      metrics_.declare_model(name);
      set_state(name, 1, State::kReady, "", std::move(served));
      std::lock_guard lock(mu_);
      expected_.insert(name);
    } catch (const std::exception& e) {
      *message = e.what();
      return false;
    }
    return true;
  }
  std::error_code ec;
  if (!fs::is_directory(root_, ec)) {
    *message = "--model-repository " + root_ + " is not a directory";
    return false;
  }
  std::vector<std::string> names;
  if (options_.mode == ControlMode::kExplicit) {
    for (const std::string& n : options_.load_models) {
      if (n == "*") {
        names = model_names();
        break;
      }
      names.push_back(n);
    }
  } else {
    names = model_names();
  }
  if (names.empty() && options_.mode != ControlMode::kExplicit) {
    *message = "--model-repository " + root_ + " holds no model directory (<model>/<version>/)";
    return false;
  }
  for (const std::string& name : names) {
    if (Status e = load_now(name); !e.ok()) {
      *message = e.message();
      return false;
    }
  }
  if (options_.mode == ControlMode::kExplicit) {
    std::lock_guard lock(mu_);
    pinned_.insert(names.begin(), names.end());
  }
  if (!options_.default_model.empty()) {
    std::lock_guard lock(mu_);
    if (!models_.count(options_.default_model) && options_.mode != ControlMode::kExplicit) {
      *message = "--default-model " + options_.default_model + " is not in the repository";
      return false;
    }
  }
  return true;
}

void Repository::serve(std::shared_ptr<ServedModel> served) {
  const std::string name = served->name;
  const int64_t version = served->version_number;
  set_state(name, version, State::kReady, "", std::move(served));
  std::lock_guard lock(mu_);
  expected_.insert(name);
}

std::shared_ptr<const ServedModel> Repository::find(const std::string& name,
                                                    const std::string& version, Status* out) const {
  std::lock_guard lock(mu_);
  const std::string* wanted = &name;
  const bool alias =
      std::find(options_.aliases.begin(), options_.aliases.end(), name) != options_.aliases.end();
  if (name.empty() || alias) {
    if (!options_.default_model.empty()) {
      wanted = &options_.default_model;
    } else {
      // The only model with a READY version (or the only one known, to say why it is not).
      std::vector<const std::string*> ready;
      for (const auto& [n, record] : models_) {
        for (const auto& [v, r] : record.versions) {
          if (r.state == State::kReady) {
            ready.push_back(&n);
            break;
          }
        }
      }
      if (ready.size() == 1) {
        wanted = ready[0];
      } else if (ready.empty() && models_.size() == 1) {
        wanted = &models_.begin()->first;
      } else {
        *out = Status(StatusCode::kNotFound, "the request names no model and this server serves " +
                                                 std::to_string(ready.size()) +
                                                 " (no --default-model): name one (model_name)");
        return nullptr;
      }
    }
  }
  auto m = models_.find(*wanted);
  std::error_code ec;
  if (m == models_.end() && !root_.empty() && wanted->find('/') == std::string::npos &&
      !wanted->empty() && (*wanted)[0] != '.' && fs::is_directory(fs::path(root_) / *wanted, ec)) {
    *out = Status(StatusCode::kUnavailable,
                  "model '" + *wanted +
                      "' is in the repository but not loaded (RepositoryModelLoad, or POST "
                      "/v2/repository/models/" +
                      *wanted + "/load)");
    return nullptr;
  }
  if (m == models_.end()) {
    std::string names;
    for (const auto& [n, record] : models_) names += (names.empty() ? "'" : ", '") + n + "'";
    *out = Status(StatusCode::kNotFound, "model '" + *wanted +
                                             "' is not served here: it is not in the repository" +
                                             (names.empty() ? "" : " (which has " + names + ")"));
    return nullptr;
  }
  const auto& versions = m->second.versions;
  if (version.empty()) {
    for (auto it = versions.rbegin(); it != versions.rend(); ++it)
      if (it->second.state == State::kReady && it->second.served) return it->second.served;
    std::string states;
    for (const auto& [v, r] : versions) {
      states += (states.empty() ? "" : ", ") + std::string("version ") + std::to_string(v) + " " +
                state_name(r.state) + (r.reason.empty() ? "" : " (" + r.reason + ")");
    }
    *out = Status(StatusCode::kUnavailable, "model '" + *wanted + "' has no READY version" +
                                                (states.empty() ? "" : ": ") + states);
    return nullptr;
  }
  const std::optional<int64_t> v = version_number(version);
  auto it = v ? versions.find(*v) : versions.end();
  if (it == versions.end()) {
    *out =
        Status(StatusCode::kNotFound, "model '" + *wanted + "' has no version '" + version + "'");
    return nullptr;
  }
  if (it->second.state != State::kReady || !it->second.served) {
    *out = Status(StatusCode::kUnavailable,
                  "model '" + *wanted + "' version " + version + " is " +
                      state_name(it->second.state) +
                      (it->second.reason.empty() ? "" : ": " + it->second.reason));
    return nullptr;
  }
  return it->second.served;
}

std::vector<std::shared_ptr<const ServedModel>> Repository::serving() const {
  std::lock_guard lock(mu_);
  std::vector<std::shared_ptr<const ServedModel>> out;
  for (const auto& [name, m] : models_)
    for (const auto& [v, r] : m.versions)
      if (r.state == State::kReady && r.served) out.push_back(r.served);
  return out;
}

std::vector<std::string> Repository::served_names() const {
  std::vector<std::string> names;
  for (const auto& served : serving()) {
    if (std::find(names.begin(), names.end(), served->name) == names.end())
      names.push_back(served->name);
  }
  names.insert(names.end(), options_.aliases.begin(), options_.aliases.end());
  return names;
}

bool Repository::ready() const {
  std::lock_guard lock(mu_);
  if (closed_) return false;
  for (const std::string& name : expected_) {
    auto m = models_.find(name);
    if (m == models_.end()) return false;
    bool any = false;
    for (const auto& [v, r] : m->second.versions) any |= r.state == State::kReady;
    if (!any) return false;
  }
  return true;
}

std::vector<IndexEntry> Repository::index(bool ready_only) const {
  std::vector<IndexEntry> out;
  std::lock_guard lock(mu_);
  std::map<std::string, std::map<int64_t, std::string>> disk;
  if (!root_.empty()) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(root_, ec)) {
      const std::string n = e.path().filename().string();
      if (!e.is_directory(ec) || n.empty() || n[0] == '.') continue;
      disk[n] = version_dirs(e.path());
    }
  }
  for (const auto& [name, m] : models_) disk[name];
  for (const auto& [name, versions] : disk) {
    std::set<int64_t> all;
    for (const auto& [v, path] : versions) all.insert(v);
    auto m = models_.find(name);
    if (m != models_.end())
      for (const auto& [v, r] : m->second.versions) all.insert(v);
    for (const int64_t v : all) {
      IndexEntry e{name, std::to_string(v), State::kUnavailable, "not loaded"};
      if (m != models_.end()) {
        auto r = m->second.versions.find(v);
        if (r != m->second.versions.end()) {
          e.state = r->second.state;
          e.reason = r->second.reason;
        }
      }
      if (ready_only && e.state != State::kReady) continue;
      out.push_back(std::move(e));
    }
  }
  return out;
}

void Repository::load(const std::string& name, Done done) {
  post([this, name, done = std::move(done)] { done(load_now(name)); });
}

void Repository::unload(const std::string& name, Done done) {
  post([this, name, done = std::move(done)]() mutable {
    if (Status e = unload_now(name, done); !e.ok()) done(e);
  });
}

void Repository::rescan() {
  post([this] { rescan_now(); });
}

void Repository::close() {
  std::vector<std::shared_ptr<const ServedModel>> all;
  {
    std::lock_guard lock(mu_);
    closed_ = true;
    for (auto& [name, m] : models_) {
      for (auto& [v, r] : m.versions) {
        if (r.served) all.push_back(std::move(r.served));
        r.served = nullptr;
      }
    }
    for (Retiring& r : retiring_) all.push_back(std::move(r.served));
    retiring_.clear();
  }
  // Every request has been answered: wait (briefly) for the last references the transports
  // hold to go, then free each version here, on this thread.
  const auto give_up = Clock::now() + std::chrono::seconds(2);
  for (auto& served : all) {
    while (served.use_count() > 1 && Clock::now() < give_up)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    served.reset();
  }
}

}  // namespace fastformer::repository
