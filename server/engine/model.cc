#include "server/engine/model.h"

#include <cstring>
#include <map>
#include <set>
#include <sstream>

#include "common/half.h"
#include "server/engine/error.h"

namespace fastformer::engine {
namespace {

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Collects every problem with the file's tensors before reporting, so one load attempt
// shows all missing, unexpected and mis-shaped tensors at once.
class TensorBinder {
 public:
  TensorBinder(const SafetensorsFile& file, std::string prefix,
               std::vector<std::unique_ptr<float[]>>* owned)
      : file_(file), prefix_(std::move(prefix)), owned_(owned) {}

  // Returns float32 data for `name` with `shape`, or null (recording why) when the tensor is
  // missing or mis-shaped. `optional` tensors may be absent.
  const float* bind(const std::string& name, const std::vector<int64_t>& shape,
                    bool optional = false, bool prefixed = true) {
    const std::string full = prefixed ? prefix_ + name : name;
    const TensorInfo* t = file_.find(full);
    if (t == nullptr) {
      if (!optional) missing_.push_back(full + " (expected shape " + shape_string(shape) + ")");
      return nullptr;
    }
    used_.insert(full);
    if (t->shape != shape) {
      misshaped_.push_back(full + ": expected shape " + shape_string(shape) + ", found " +
                           shape_string(t->shape));
      return nullptr;
    }
    dtypes_.insert(t->dtype);
    parameters_ += t->numel();
    return to_float(*t);
  }

  // Binds the tensor whatever its leading dimension (the classifier's num_labels, the word
  // embedding's vocab size); `rows` receives it.
  const float* bind_rows(const std::string& name, int64_t cols, int64_t* rows, bool prefixed) {
    const std::string full = prefixed ? prefix_ + name : name;
    const TensorInfo* t = file_.find(full);
    if (t == nullptr) return nullptr;
    if (t->shape.size() != 2 || t->shape[1] != cols || t->shape[0] <= 0) {
      used_.insert(full);
      misshaped_.push_back(full + ": expected shape [N, " + std::to_string(cols) + "], found " +
                           shape_string(t->shape));
      return nullptr;
    }
    *rows = t->shape[0];
    return bind(name, t->shape, false, prefixed);
  }

  void error(std::string message) { other_.push_back(std::move(message)); }

  // Throws ModelError listing every problem found.
  void finish() const {
    std::vector<std::string> unexpected;
    for (const auto& [name, info] : file_.tensors()) {
      if (!used_.count(name)) unexpected.push_back(name + " " + shape_string(info.shape));
    }
    if (missing_.empty() && misshaped_.empty() && unexpected.empty() && other_.empty()) return;
    std::ostringstream msg;
    msg << file_.path().string() << ": the weights do not match config.json";
    auto list = [&](const char* title, const std::vector<std::string>& items) {
      if (items.empty()) return;
      msg << "\n  " << title << " (" << items.size() << "):";
      for (const auto& item : items) msg << "\n    " << item;
    };
    list("missing tensors", missing_);
    list("mis-shaped tensors", misshaped_);
    list("unexpected tensors", unexpected);
    list("other problems", other_);
    throw ModelError(msg.str());
  }

  int64_t parameters() const { return parameters_; }
  std::string dtype() const {
    if (dtypes_.size() == 1) return dtype_name(*dtypes_.begin());
    return dtypes_.empty() ? "F32" : "mixed";
  }

 private:
  const float* to_float(const TensorInfo& t) {
    const int64_t n = t.numel();
    if (t.dtype == DType::kF32 && reinterpret_cast<uintptr_t>(t.data) % alignof(float) == 0) {
      return reinterpret_cast<const float*>(t.data);  // served in place from the mapping
    }
    auto out = std::make_unique<float[]>(static_cast<size_t>(n));
    const auto* src = reinterpret_cast<const unsigned char*>(t.data);
    if (t.dtype == DType::kF32) {
      std::memcpy(out.get(), src, static_cast<size_t>(n) * 4);
    } else {
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t bits = static_cast<uint16_t>(src[2 * i] | src[2 * i + 1] << 8);
        out[i] = t.dtype == DType::kF16 ? half_to_float(bits) : bfloat16_to_float(bits);
      }
    }
    file_.release(t);
    owned_->push_back(std::move(out));
    return owned_->back().get();
  }

  const SafetensorsFile& file_;
  std::string prefix_;
  std::vector<std::unique_ptr<float[]>>* owned_;
  std::set<std::string> used_;
  std::set<DType> dtypes_;
  std::vector<std::string> missing_, misshaped_, other_;
  int64_t parameters_ = 0;
};

Linear bind_linear(TensorBinder& b, const std::string& name, int64_t out, int64_t in) {
  Linear l;
  l.out = out;
  l.in = in;
  l.weight = b.bind(name + ".weight", {out, in});
  l.bias = b.bind(name + ".bias", {out});
  return l;
}

LayerNorm bind_layernorm(TensorBinder& b, const std::string& name, int64_t d) {
  return LayerNorm{b.bind(name + ".weight", {d}), b.bind(name + ".bias", {d})};
}

}  // namespace

// Says plainly what a model file is when it cannot be one (a directory, a dangling symbolic
// link), before a parser reports something confusing; a missing file is left to the parsers.
void check_model_file(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_symlink(fs::symlink_status(path, ec)) && !fs::exists(path, ec)) {
    throw ModelError(path.string() + ": cannot open: a symbolic link to " +
                     fs::read_symlink(path, ec).string() + ", which does not exist");
  }
  const fs::file_status status = fs::status(path, ec);
  if (fs::exists(status) && !fs::is_regular_file(status)) {
    throw ModelError(path.string() + ": cannot open: not a regular file (" +
                     (fs::is_directory(status) ? "a directory" : "a device, socket or pipe") + ")");
  }
}

std::shared_ptr<const Model> Model::load(const std::filesystem::path& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    throw ModelError(dir.string() + ": model directory does not exist or is not a directory");
  }
  std::shared_ptr<Model> model(new Model());
  check_model_file(dir / "config.json");
  check_model_file(dir / "model.safetensors");
  model->config_ = load_config(dir / "config.json");
  const ModelConfig& c = model->config_;
  model->file_ = std::make_unique<SafetensorsFile>(dir / "model.safetensors");
  const SafetensorsFile& file = *model->file_;

  // The reference Model nests the encoder under "fastformer_model."; a bare
  // FastformerEncoder state_dict has the same names without it.
  bool prefixed = false;
  for (const auto& [name, info] : file.tensors()) prefixed |= name.starts_with("fastformer_model.");
  const std::string prefix = prefixed ? "fastformer_model." : "";
  TensorBinder b(file, prefix, &model->owned_);
  const int64_t D = c.hidden_size, H = c.num_attention_heads, I = c.intermediate_size;
  ModelWeights& w = model->weights_;

  int64_t vocab_rows = 0;
  w.word_embedding = b.bind_rows("word_embedding.weight", D, &vocab_rows, /*prefixed=*/false);
  if (w.word_embedding != nullptr && vocab_rows != c.vocab_size) {
    b.error("word_embedding.weight has " + std::to_string(vocab_rows) +
            " rows but config.json vocab_size is " + std::to_string(c.vocab_size));
  }
  w.position_embeddings = b.bind("position_embeddings.weight", {c.max_position_embeddings, D});
  w.embedding_layernorm = bind_layernorm(b, "LayerNorm", D);

  const int64_t stored_layers = c.share_layer_parameters ? 1 : c.num_hidden_layers;
  for (int64_t i = 0; i < stored_layers; ++i) {
    const std::string p = "encoders." + std::to_string(i) + ".";
    LayerWeights l;
    l.query = bind_linear(b, p + "attention.self.query", D, D);
    l.query_att = bind_linear(b, p + "attention.self.query_att", H, D);
    l.key = bind_linear(b, p + "attention.self.key", D, D);
    l.key_att = bind_linear(b, p + "attention.self.key_att", H, D);
    l.transform = bind_linear(b, p + "attention.self.transform", D, D);
    l.attention_output = bind_linear(b, p + "attention.output.dense", D, D);
    l.attention_layernorm = bind_layernorm(b, p + "attention.output.LayerNorm", D);
    l.intermediate = bind_linear(b, p + "intermediate.dense", I, D);
    l.output = bind_linear(b, p + "output.dense", D, I);
    l.output_layernorm = bind_layernorm(b, p + "output.LayerNorm", D);
    w.layers.push_back(l);
  }
  while (static_cast<int64_t>(w.layers.size()) < c.num_hidden_layers)
    w.layers.push_back(w.layers[0]);

  w.pooler_fc1 = bind_linear(b, "poolers.0.att_fc1", D, D);
  w.pooler_fc2 = bind_linear(b, "poolers.0.att_fc2", 1, D);

  int64_t labels = 0;
  w.classifier.weight = b.bind_rows("dense_linear.weight", D, &labels, /*prefixed=*/false);
  if (w.classifier.weight != nullptr) {
    w.classifier.out = labels;
    w.classifier.in = D;
    w.classifier.bias = b.bind("dense_linear.bias", {labels}, false, /*prefixed=*/false);
  } else if (file.find("dense_linear.bias") != nullptr) {
    b.bind("dense_linear.bias", file.find("dense_linear.bias")->shape, false, false);
    b.error("dense_linear.bias is present without dense_linear.weight");
  }
  if (c.num_labels >= 0 && c.num_labels != labels) {
    b.error("config.json num_labels is " + std::to_string(c.num_labels) + " but dense_linear has " +
            std::to_string(labels) + " outputs");
  }
  b.finish();
  model->stored_dtype_ = b.dtype();
  model->parameter_count_ = b.parameters();
  return model;
}

}  // namespace fastformer::engine
