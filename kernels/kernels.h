// Host-side launch functions of every Fastformer kernel. Each launches one kernel on
// `stream`; T is the storage dtype (float, ff_half, ff_bfloat16); statistics, softmax and
// accumulation are float in every dtype. Matrices are row-major with a leading dimension
// (`ld`, in elements) so Q, K and the query scores can share one GEMM output.
//
// Which line of the model contract (docs/design.md, "The model contract") each computes is
// said in its file.
#pragma once

#include <cstdint>

#include "kernels/common.cuh"
#include "kernels/pooling_chunks.h"
#include "kernels/runtime.h"

namespace fastformer::kernels {
inline namespace FF_KERNELS_ABI {

// The ragged batch's metadata in device memory.
struct BatchArgs {
  int32_t num_tokens = 0;
  int32_t num_sequences = 0;
  const int32_t* cu_seqlens = nullptr;       ///< [B+1]
  const int32_t* token_seq = nullptr;        ///< [T] sequence of each token
  const int32_t* token_ids = nullptr;        ///< [T], < 0 where input embeddings are used
  const int32_t* embedding_index = nullptr;  ///< [T] row of input_embeddings, or -1
  const int32_t* position_ids = nullptr;     ///< [T]
  const uint8_t* mask = nullptr;             ///< [T] 1 real, 0 padding
  const float* input_embeddings = nullptr;   ///< [E, D]
  int32_t num_chunks = 0;                    ///< pooling chunks over all sequences
  const int32_t* chunk_begin = nullptr;      ///< [chunks] first token
  const int32_t* chunk_end = nullptr;        ///< [chunks] one past the last token
  const int32_t* seq_first_chunk = nullptr;  ///< [B+1] chunk offsets per sequence
  int32_t max_sequence_chunks = 0;           ///< the most chunks one sequence has (0: unknown)
};

// Online-softmax partials of every chunk: per head the max m and sum l, and per column
// the weighted value sum v (float).
struct Partials {
  float* m = nullptr;  ///< [chunks, heads]
  float* l = nullptr;  ///< [chunks, heads]
  float* v = nullptr;  ///< [chunks, D]
};

template <class T>
void launch_embedding_layernorm(const BatchArgs& batch, const T* word_embedding,
                                const T* position_embeddings, const T* gamma, const T* beta,
                                float eps, int32_t D, T* x, ff_stream_t stream);

// c[r, j] = act(c[r, j] + bias[j]) in place (act only when `activate`; bias null: none).
template <class T>
void launch_bias_activation(T* c, int64_t ldc, const T* bias, int32_t rows, int32_t cols,
                            bool activate, Act act, ff_stream_t stream);

// out[r] = LN(c[r] + bias + residual[r]) * gamma + beta (bias null: none); out may be residual.
template <class T>
void launch_bias_residual_layernorm(const T* c, int64_t ldc, const T* bias, const T* residual,
                                    int64_t ld_residual, const T* gamma, const T* beta, float eps,
                                    int32_t rows, int32_t D, T* out, int64_t ld_out,
                                    ff_stream_t stream);

// Partials of softmax-weighted sums over each chunk: weights softmax_t(scores[t, h]) over
// real tokens, values[t, h*d .. h*d+d-1]. S is the score type (T for the query scores
// riding on the QKS GEMM, float for computed scores).
template <class T, class S>
void launch_pool_partials(const BatchArgs& batch, const S* scores, int64_t ld_scores, int32_t heads,
                          const T* values, int64_t ld_values, int32_t D, Partials partials,
                          ff_stream_t stream);

// out[b, j] = (sum_c v_c[j] e^{m_c - M}) / (L + extra e^{-M}) * (scale ? scale[b, j] : 1).
template <class T>
void launch_pool_combine(const BatchArgs& batch, Partials partials, int32_t heads, int32_t D,
                         const T* scale, float denominator_extra, T* out, ff_stream_t stream);

// r[t, h] = (K_t * pq_b) . Wka'[h] + bka'[h]  (float, [T, H]).
template <class T>
void launch_key_scores(const BatchArgs& batch, const T* k, int64_t ld_k, const T* pq, const T* wka,
                       const T* bka, int32_t heads, int32_t D, float* r, ff_stream_t stream);

// key_scores + pool_partials<T, float> in one pass over K (key_pool.cu): each chunk's partials
// of the key pool, from K, pq, Wka' and bka' (the same Partials pool_combine takes). `scores`
// ([T, H] floats) is scratch for the shapes the one-pass kernel does not take (over 16 heads,
// D over 1024, K rows not 4-byte aligned): those run key_scores into it, then pool_partials.
template <class T>
void launch_key_pool_partials(const BatchArgs& batch, const T* k, int64_t ld_k, const T* pq,
                              const T* wka, const T* bka, int32_t heads, int32_t D, float* scores,
                              Partials partials, ff_stream_t stream);

// u[t, j] = pk[b(t), j] * q[t, j].
template <class T>
void launch_mix(const BatchArgs& batch, const T* q, int64_t ld_q, const T* pk, int32_t D, T* u,
                int64_t ld_u, ff_stream_t stream);

// z[t] = tanh(E_t) . w2 + b2  (float, [T]).
template <class T>
void launch_pooler_scores(const BatchArgs& batch, const T* e, int64_t ld_e, const T* w2,
                          const T* b2, int32_t D, float* z, ff_stream_t stream);

template <class T>
void launch_l2_normalize(T* rows, int32_t num_rows, int32_t D, ff_stream_t stream);

// dst (float, dense [rows, cols]) = src (T, leading dimension ld_src).
template <class T>
void launch_to_float(const T* src, int64_t ld_src, int32_t rows, int32_t cols, float* dst,
                     ff_stream_t stream);

// dst (T, dense) = src (float, dense), count elements.
template <class T>
void launch_from_float(const float* src, int64_t count, T* dst, ff_stream_t stream);

}  // namespace FF_KERNELS_ABI
}  // namespace fastformer::kernels
