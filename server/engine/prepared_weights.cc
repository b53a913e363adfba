#include "server/engine/prepared_weights.h"

#include <cmath>
#include <map>

namespace fastformer::engine {
namespace {

std::vector<float> copy(const float* data, int64_t n) {
  return n > 0 && data ? std::vector<float>(data, data + n) : std::vector<float>();
}

PreparedLinear copy_linear(const Linear& l, bool with_bias = true) {
  PreparedLinear p;
  p.out = l.out;
  p.in = l.in;
  p.weight = copy(l.weight, l.out * l.in);
  if (with_bias) p.bias = copy(l.bias, l.out);
  return p;
}

PreparedLayer prepare_layer(const LayerWeights& w, const ModelConfig& c) {
  const int64_t D = c.hidden_size, H = c.num_attention_heads;
  const double inv_sqrt_d = 1.0 / std::sqrt(static_cast<double>(D / H));
  PreparedLayer p;

  // [Wq; Wk; Wqa Wq / sqrt(d); 0] and [bq; bk; (Wqa bq + bqa) / sqrt(d); 0], folded in double.
  PreparedLinear& qks = p.query_key_scores;
  qks.out = qks_width(c);
  qks.in = D;
  qks.weight.resize(static_cast<size_t>(qks.out * D));
  qks.bias.resize(static_cast<size_t>(qks.out));
  std::copy(w.query.weight, w.query.weight + D * D, qks.weight.begin());
  std::copy(w.key.weight, w.key.weight + D * D, qks.weight.begin() + D * D);
  std::copy(w.query.bias, w.query.bias + D, qks.bias.begin());
  std::copy(w.key.bias, w.key.bias + D, qks.bias.begin() + D);
  for (int64_t h = 0; h < H; ++h) {
    const float* wqa = w.query_att.weight + h * D;
    for (int64_t col = 0; col < D; ++col) {
      double acc = 0;
      for (int64_t j = 0; j < D; ++j) acc += double(wqa[j]) * w.query.weight[j * D + col];
      qks.weight[(2 * D + h) * D + col] = static_cast<float>(acc * inv_sqrt_d);
    }
    double b = w.query_att.bias[h];
    for (int64_t j = 0; j < D; ++j) b += double(wqa[j]) * w.query.bias[j];
    qks.bias[2 * D + h] = static_cast<float>(b * inv_sqrt_d);
  }

  p.key_att = copy_linear(w.key_att);
  for (float& x : p.key_att.weight) x = static_cast<float>(x * inv_sqrt_d);
  for (float& x : p.key_att.bias) x = static_cast<float>(x * inv_sqrt_d);

  p.transform = copy_linear(w.transform, /*with_bias=*/false);
  p.attention_output = copy_linear(w.attention_output);
  for (int64_t i = 0; i < D; ++i) {
    double b = w.attention_output.bias[i];
    for (int64_t j = 0; j < D; ++j)
      b += double(w.attention_output.weight[i * D + j]) * w.transform.bias[j];
    p.attention_output.bias[i] = static_cast<float>(b);
  }
  p.ln1_gamma = copy(w.attention_layernorm.gamma, D);
  p.ln1_beta = copy(w.attention_layernorm.beta, D);
  p.intermediate = copy_linear(w.intermediate);
  p.output = copy_linear(w.output);
  p.ln2_gamma = copy(w.output_layernorm.gamma, D);
  p.ln2_beta = copy(w.output_layernorm.beta, D);
  return p;
}

}  // namespace

PreparedWeights prepare_weights(const Model& model) {
  const ModelConfig& c = model.config();
  const ModelWeights& w = model.weights();
  PreparedWeights p;
  // Shared layers point at the same tensors: prepare each distinct layer once.
  std::map<const float*, std::shared_ptr<const PreparedLayer>> by_query_weight;
  for (const LayerWeights& layer : w.layers) {
    auto& prepared = by_query_weight[layer.query.weight];
    if (!prepared) {
      prepared = std::make_shared<const PreparedLayer>(prepare_layer(layer, c));
    }
    p.layers.push_back(prepared);
  }
  p.pooler_fc1 = copy_linear(w.pooler_fc1);
  p.pooler_fc2 = copy_linear(w.pooler_fc2);
  if (w.classifier.weight != nullptr) p.classifier = copy_linear(w.classifier);
  return p;
}

}  // namespace fastformer::engine
