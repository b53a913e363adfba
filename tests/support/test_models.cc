#include "tests/support/test_models.h"

#include <stdlib.h>

#include <bit>
#include <cmath>
#include <fstream>
#include <random>
#include <stdexcept>

#include "common/half.h"

namespace fastformer::test {

using engine::DType;
using nlohmann::json;

TempDir::TempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "fastformer_unit_XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + tmpl);
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

void write_file(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw std::runtime_error("cannot write " + path.string());
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("short write to " + path.string());
}

void write_safetensors_raw(const std::filesystem::path& path, uint64_t header_size,
                           const std::string& header, const std::string& data) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[size_t(i)] = static_cast<char>((header_size >> (8 * i)) & 0xff);
  write_file(path, bytes + header + data);
}

void write_safetensors_raw(const std::filesystem::path& path, const std::string& header,
                           const std::string& data) {
  write_safetensors_raw(path, header.size(), header, data);
}

float round_to_dtype(float value, DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return value;
    case DType::kF16:
      return half_to_float(float_to_half(value));
    case DType::kBF16:
      return bfloat16_to_float(float_to_bfloat16(value));
  }
  return value;
}

std::string encode_values(const std::vector<float>& values, DType dtype) {
  std::string out;
  out.reserve(values.size() * engine::dtype_size(dtype));
  for (float v : values) {
    if (dtype == DType::kF32) {
      const uint32_t bits = std::bit_cast<uint32_t>(v);
      for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
    } else {
      const uint16_t bits = dtype == DType::kF16 ? float_to_half(v) : float_to_bfloat16(v);
      out.push_back(static_cast<char>(bits & 0xff));
      out.push_back(static_cast<char>(bits >> 8));
    }
  }
  return out;
}

void write_safetensors(const std::filesystem::path& path,
                       const std::map<std::string, TensorSpec>& tensors, bool align) {
  json header = json::object();
  header["__metadata__"] = {{"format", "pt"}};
  std::string data;
  for (const auto& [name, t] : tensors) {
    const std::string bytes = encode_values(t.values, t.dtype);
    header[name] = {{"dtype", engine::dtype_name(t.dtype)},
                    {"shape", t.shape},
                    {"data_offsets", {data.size(), data.size() + bytes.size()}}};
    data += bytes;
  }
  std::string text = header.dump();
  if (align) {
    while ((8 + text.size()) % 8 != 0) text.push_back(' ');
  } else if ((8 + text.size()) % 4 == 0) {
    text.push_back(' ');  // misalign the data on purpose
  }
  write_safetensors_raw(path, text, data);
}

namespace {

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

class Filler {
 public:
  Filler(const TinyModelSpec& spec, TinyModel* model)
      : spec_(spec), model_(model), rng_(spec.seed) {}

  // Uniform values in [center - scale, center + scale], rounded to the storage dtype.
  void add(const std::string& name, std::vector<int64_t> shape, float scale, float center = 0.0f) {
    std::uniform_real_distribution<float> dist(-scale, scale);
    TensorSpec t;
    t.shape = std::move(shape);
    t.dtype = spec_.dtype;
    t.values.resize(size_t(numel(t.shape)));
    for (float& v : t.values) v = round_to_dtype(center + dist(rng_), spec_.dtype);
    model_->tensors[name] = std::move(t);
  }

  void linear(const std::string& name, int64_t out, int64_t in, float gain = 1.0f) {
    const float scale = gain / std::sqrt(static_cast<float>(in));
    add(name + ".weight", {out, in}, scale);
    add(name + ".bias", {out}, 0.1f);
  }

  void layernorm(const std::string& name, int64_t d) {
    add(name + ".weight", {d}, 0.2f, 1.0f);
    add(name + ".bias", {d}, 0.1f);
  }

 private:
  const TinyModelSpec& spec_;
  TinyModel* model_;
  std::mt19937_64 rng_;
};

}  // namespace

TinyModel make_tiny_model(const TinyModelSpec& s) {
  TinyModel m;
  m.config = {
      {"hidden_size", s.hidden},
      {"hidden_dropout_prob", 0.2},
      {"num_hidden_layers", s.layers},
      {"hidden_act", s.activation},
      {"num_attention_heads", s.heads},
      {"intermediate_size", s.intermediate},
      {"max_position_embeddings", s.max_positions},
      {"type_vocab_size", 2},
      {"vocab_size", s.vocab},
      {"layer_norm_eps", s.layer_norm_eps},
      {"initializer_range", 0.02},
      {"pooler_type", "weightpooler"},
      {"enable_fp16", "False"},
      {"pad_token_id", s.pad_token_id},
      {"share_layer_parameters", s.shared_layers},
      {"model_name", "tiny"},
  };
  if (s.num_labels > 0) m.config["num_labels"] = s.num_labels;

  const int64_t D = s.hidden, H = s.heads, I = s.intermediate;
  const std::string p = s.bare ? "" : "fastformer_model.";
  Filler f(s, &m);
  if (s.word_embedding) f.add("word_embedding.weight", {s.vocab, D}, 1.0f);
  f.add(p + "position_embeddings.weight", {s.max_positions, D}, 0.5f);
  f.layernorm(p + "LayerNorm", D);
  const int64_t stored = s.shared_layers ? 1 : s.layers;
  for (int64_t i = 0; i < stored; ++i) {
    const std::string l = p + "encoders." + std::to_string(i) + ".";
    f.linear(l + "attention.self.query", D, D);
    f.linear(l + "attention.self.query_att", H, D, 3.0f);  // sharp enough to matter
    f.linear(l + "attention.self.key", D, D);
    f.linear(l + "attention.self.key_att", H, D, 3.0f);
    f.linear(l + "attention.self.transform", D, D);
    f.linear(l + "attention.output.dense", D, D);
    f.layernorm(l + "attention.output.LayerNorm", D);
    f.linear(l + "intermediate.dense", I, D, 2.0f);
    f.linear(l + "output.dense", D, I);
    f.layernorm(l + "output.LayerNorm", D);
  }
  f.linear(p + "poolers.0.att_fc1", D, D);
  f.linear(p + "poolers.0.att_fc2", 1, D, 2.0f);
  if (s.num_labels > 0) f.linear("dense_linear", s.num_labels, D);
  return m;
}

void write_model(const std::filesystem::path& dir, const TinyModel& model) {
  std::filesystem::create_directories(dir);
  write_file(dir / "config.json", model.config.dump(2));
  write_safetensors(dir / "model.safetensors", model.tensors);
}

TinyModelSpec base_long_two_layers() {
  TinyModelSpec spec;
  spec.hidden = 768;
  spec.heads = 12;
  spec.layers = 2;
  spec.intermediate = 3072;
  spec.max_positions = 1024;
  spec.vocab = 512;
  spec.num_labels = 4;
  return spec;
}

std::filesystem::path write_tiny_model(const std::filesystem::path& root, const std::string& name,
                                       const TinyModelSpec& spec) {
  const std::filesystem::path dir = root / name;
  write_model(dir, make_tiny_model(spec));
  return dir;
}

}  // namespace fastformer::test
