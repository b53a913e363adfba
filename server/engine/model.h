// A loaded Fastformer: its config and its weights as float32 host arrays.
//
// Weight names follow the official state_dict (docs/model-format.md, "Tensor names"). F32 tensors
// whose bytes are aligned are used in place from the memory-mapped file; F16/BF16 (and unaligned
// F32) tensors are converted once into owned arrays and their file pages are released, so peak
// memory stays near one copy of the weights.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "server/engine/config.h"
#include "server/engine/safetensors.h"

namespace fastformer::engine {

struct Linear {
  const float* weight = nullptr;  ///< [out, in], row-major (PyTorch's nn.Linear layout)
  const float* bias = nullptr;    ///< [out]
  int64_t out = 0;
  int64_t in = 0;
};

struct LayerNorm {
  const float* gamma = nullptr;  ///< [D]
  const float* beta = nullptr;   ///< [D]
};

struct LayerWeights {
  Linear query, query_att, key, key_att, transform;  ///< attention.self.*
  Linear attention_output;                           ///< attention.output.dense
  LayerNorm attention_layernorm;                     ///< attention.output.LayerNorm
  Linear intermediate;                               ///< intermediate.dense
  Linear output;                                     ///< output.dense
  LayerNorm output_layernorm;                        ///< output.LayerNorm
};

struct ModelWeights {
  const float* word_embedding = nullptr;       ///< [vocab, D]; null when the model has none
  const float* position_embeddings = nullptr;  ///< [max_position_embeddings, D]
  LayerNorm embedding_layernorm;
  std::vector<LayerWeights> layers;  ///< one per layer (shared: all alike)
  Linear pooler_fc1;                 ///< poolers.0.att_fc1 [D, D]
  Linear pooler_fc2;                 ///< poolers.0.att_fc2 [1, D]
  Linear classifier;                 ///< dense_linear [num_labels, D]; weight null if absent
};

class Model {
 public:
  // Loads `dir`/config.json and `dir`/model.safetensors. Throws ModelError. The weights only:
  // a tokenizer.json beside them is the text layer's (server/text/text.h, load_tokenizer).
  static std::shared_ptr<const Model> load(const std::filesystem::path& dir);

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  bool has_word_embedding() const { return weights_.word_embedding != nullptr; }
  int64_t num_labels() const { return weights_.classifier.weight ? weights_.classifier.out : 0; }
  const std::string& stored_dtype() const {
    return stored_dtype_;
  }  ///< "F32", "F16", "BF16" or "mixed"
  int64_t parameter_count() const { return parameter_count_; }
  // Bytes of the weights as this Model holds them: float32 host arrays whatever the file
  // stores (F16/BF16 tensors are widened at load). An engine serving float16 or bfloat16
  // holds half as many in device memory (Engine::device_memory()).
  int64_t weight_bytes() const { return parameter_count_ * int64_t(sizeof(float)); }

 private:
  Model() = default;
  ModelConfig config_;
  ModelWeights weights_;
  std::string stored_dtype_;
  int64_t parameter_count_ = 0;
  std::unique_ptr<SafetensorsFile> file_;
  std::vector<std::unique_ptr<float[]>> owned_;  // converted tensors
};

// A file of a model directory, before it is opened: ModelError naming the path when it is a
// dangling symbolic link, a directory or a device. A missing file is left to the opener.
void check_model_file(const std::filesystem::path& path);

}  // namespace fastformer::engine
