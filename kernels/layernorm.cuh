// The LayerNorm of one row, shared by embedding_layernorm.cu and residual_layernorm.cu: the
// statistics in float over two passes (the mean, then the mean squared deviation), as the CPU
// engine's layernorm_row, then out = (x - mean) * rstd * gamma + beta. The caller's
// `load(c, v)` puts the G pre-norm values of chunk c (columns c*G ..) into v; the row's
// threads are row_launch's group (common.cuh).
//
// Each output element is written by the thread that read its inputs, after the row's
// statistics (a reduction every thread of the row takes part in), so `out` may be an input.
#pragma once

#include "kernels/common.cuh"

namespace fastformer::kernels {
inline namespace FF_KERNELS_ABI {

// Chunk count of the scalar path, which loops over the row instead of holding it.
inline constexpr int kLoopOverRow = 0;

#if defined(__CUDACC__) || defined(FF_EMULATION)
// N > 0: each thread keeps its N chunks (c = index + i * row_threads) in registers between the
// passes, so the row is read from memory once. N == kLoopOverRow (G == 1): any width; each
// pass reads the row again (from L1/L2).
template <int G, int N, class T, class Load>
FF_DEVICE void layernorm_row(RowThread thread, int32_t row_threads, int32_t D, Load load,
                             const T* gamma, const T* beta, float eps, T* out, float* scratch) {
  if constexpr (N == kLoopOverRow) {
    static_assert(G == 1);
    float sum = 0.0f;
    for (int32_t j = thread.index; j < D; j += row_threads) {
      float x;
      load(j, &x);
      sum += x;
    }
    const float mean = row_sum(sum, row_threads, scratch) / float(D);
    float sq = 0.0f;
    for (int32_t j = thread.index; j < D; j += row_threads) {
      float x;
      load(j, &x);
      sq += (x - mean) * (x - mean);
    }
    const float rstd = rsqrtf(row_sum(sq, row_threads, scratch) / float(D) + eps);
    for (int32_t j = thread.index; j < D; j += row_threads) {
      float x;
      load(j, &x);
      out[j] = from_float<T>((x - mean) * rstd * to_float(gamma[j]) + to_float(beta[j]));
    }
  } else {
    const int32_t chunks = D / G;
    float v[N][G] = {};
    float sum = 0.0f;
    FF_UNROLL for (int i = 0; i < N; ++i) {
      if (const int32_t c = thread.index + i * row_threads; c < chunks) {
        load(c, v[i]);
        FF_UNROLL for (int k = 0; k < G; ++k) sum += v[i][k];
      }
    }
    const float mean = row_sum(sum, row_threads, scratch) / float(D);
    float sq = 0.0f;
    FF_UNROLL for (int i = 0; i < N; ++i) {
      if (thread.index + i * row_threads < chunks) {
        FF_UNROLL for (int k = 0; k < G; ++k) sq += (v[i][k] - mean) * (v[i][k] - mean);
      }
    }
    const float rstd = rsqrtf(row_sum(sq, row_threads, scratch) / float(D) + eps);
    FF_UNROLL for (int i = 0; i < N; ++i) {
      if (const int32_t c = thread.index + i * row_threads; c < chunks) {
        float g[G], b[G];
        load_chunk<G>(gamma + c * G, g);
        load_chunk<G>(beta + c * G, b);
        FF_UNROLL for (int k = 0; k < G; ++k) v[i][k] = (v[i][k] - mean) * rstd * g[k] + b[k];
        store_chunk<G>(out + c * G, v[i]);
      }
    }
  }
}
#endif

}  // namespace FF_KERNELS_ABI
}  // namespace fastformer::kernels
