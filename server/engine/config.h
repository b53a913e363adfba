// The model's config.json: the BertConfig-style keys of the official fastformer.json plus
// our optional keys (pad_token_id, share_layer_parameters, model_name, num_labels).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

namespace fastformer::engine {

enum class Activation { kGeluErf, kGeluTanh, kRelu, kSilu };

// Parses an activation name as the reference model spells it ("gelu", "gelu_new", ...).
// Returns false for an unknown name.
bool parse_activation(const std::string& name, Activation* out);
const char* activation_name(Activation act);

struct ModelConfig {
  int64_t hidden_size = 0;              ///< D
  int64_t num_hidden_layers = 0;        ///< number of Fastformer layers
  int64_t num_attention_heads = 0;      ///< H; head size d = D / H
  int64_t intermediate_size = 0;        ///< I, the feed-forward width
  int64_t max_position_embeddings = 0;  ///< longest sequence the model accepts
  int64_t vocab_size = 0;               ///< rows of word_embedding (when present)
  Activation hidden_act = Activation::kGeluErf;
  std::string hidden_act_name = "gelu";  ///< as written in config.json
  double layer_norm_eps = 1e-12;
  int32_t pad_token_id = 0;             ///< token id masked out as padding
  bool share_layer_parameters = false;  ///< every layer uses layer 0's tensors
  std::string model_name;               ///< defaults to the model directory's name
  int64_t num_labels = -1;              ///< -1: not given; else must match dense_linear

  int64_t head_size() const { return hidden_size / num_attention_heads; }
};

// Reads and validates `path` (a config.json). Throws ModelError naming the file and key.
ModelConfig load_config(const std::filesystem::path& path);

// Parses config.json text; `origin` names the file in error messages.
ModelConfig parse_config(const std::string& text, const std::string& origin);

}  // namespace fastformer::engine
