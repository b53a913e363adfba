// The weights rearranged for serving, once at load, on the host in float32.
//
// These fusions use the identities of docs/design.md, "Identities the kernels use"; they change
// rounding, not the math, and every engine (CPU and CUDA) serves the same prepared arrays:
//  - query_key_scores = [Wq; Wk; (Wqa Wq) / sqrt(d)]: one GEMM yields Q, K and the query
//    scores s (H extra output columns), bias [bq; bk; (Wqa bq + bqa) / sqrt(d)]; zero rows
//    pad it to qks_width().
//  - key_att is pre-scaled by 1 / sqrt(d), so r_t = (K_t * pq) Wka'^T + bka'.
//  - the transform bias rides on the attention output's bias: (A + bt) Wo^T + bo =
//    A Wo^T + (bo + Wo bt), so A = Q + U Wt^T needs no bias pass.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "server/engine/model.h"
#include "server/engine/workspace.h"  // padded_ld

namespace fastformer::engine {

struct PreparedLinear {
  std::vector<float> weight;  ///< [out, in]
  std::vector<float> bias;    ///< [out]; empty when the linear has no bias here
  int64_t out = 0;
  int64_t in = 0;
};

struct PreparedLayer {
  PreparedLinear query_key_scores;  ///< [qks_width, D]: Q, K, the query scores s, zero rows
  PreparedLinear key_att;           ///< [H, D], scaled by 1/sqrt(d)
  PreparedLinear transform;         ///< [D, D], no bias (folded into attention_output)
  PreparedLinear attention_output;  ///< [D, D], bias bo + Wo bt
  std::vector<float> ln1_gamma, ln1_beta;
  PreparedLinear intermediate;  ///< [I, D]
  PreparedLinear output;        ///< [D, I]
  std::vector<float> ln2_gamma, ln2_beta;
};

struct PreparedWeights {
  std::vector<std::shared_ptr<const PreparedLayer>> layers;  ///< shared layers share one
  PreparedLinear pooler_fc1;                                 ///< [D, D]
  PreparedLinear pooler_fc2;                                 ///< [1, D]
  PreparedLinear classifier;                                 ///< [L, D]; out == 0 if absent
};

PreparedWeights prepare_weights(const Model& model);

// The width of the Q|K|s GEMM's output (and weight rows): 2D + H padded_ld (a multiple of
// 8 elements), so its rows are a multiple of 16 bytes in every dtype, as cuBLASLt's fastest
// (Hopper) kernels need (base-long: 1,548 -> 1,552). The extra rows have zero weights and
// bias; nothing reads their columns (the forward reads Q, K and s as column views).
inline int64_t qks_width(const ModelConfig& c) {
  return padded_ld(2 * c.hidden_size + c.num_attention_heads);
}

}  // namespace fastformer::engine
