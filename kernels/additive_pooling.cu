// The masked softmax pooling at the heart of additive attention, split for long sequences
// (docs/design.md, "The model contract" and "Long sequences"):
//   a = softmax over t of s (masked), per head;   pooled_h = sum_t a_{t,h} V_{t,h-slice}
// used three times per model: the query pooling (s, V = Q -> pq), the key pooling
// (r, V = K -> pk after scaling by pq, since pk_h = pq_h * sum_t b_{t,h} K_{t,h-slice}), and
// the attention pooler (z, one "head" spanning all D columns, with the reference's + 1e-8
// in the denominator).
//
// pool_partials_kernel: one block per chunk of at most kChunkTokens tokens of one sequence;
// it writes the chunk's per-head max m and sum l of exp(s - m), and the weighted value sums
// v. pool_combine_kernel: one block per sequence rescales its chunks' partials to the
// sequence max M and divides. So one 65,536-token sequence spreads over 256 blocks
// instead of one. Masked tokens are skipped: the reference's -10000 underflows to exactly
// 0 after exp in float32, so skipping them gives the same result.
#include "kernels/instantiate.cuh"
#include "kernels/kernels.h"

namespace fastformer::kernels {
inline namespace FF_KERNELS_ABI {
namespace {

template <class T, class S>
FF_GLOBAL void pool_partials_kernel(BatchArgs batch, const S* scores, int64_t ld_scores, int32_t heads,
                                    const T* values, int64_t ld_values, int32_t D, Partials partials) {
  FF_DYNAMIC_SHARED(float, head_stats);  // [2 * heads]: m, then l
  float* m = head_stats;
  float* l = head_stats + heads;
  const int32_t c = blockIdx.x;
  const int32_t begin = batch.chunk_begin[c], end = batch.chunk_end[c];
  const int32_t d = D / heads;
  for (int32_t h = threadIdx.x; h < heads; h += blockDim.x) {
    float max_score = -INFINITY;
    for (int32_t t = begin; t < end; ++t) {
      if (batch.mask[t]) max_score = fmaxf(max_score, to_float(scores[int64_t(t) * ld_scores + h]));
    }
    float sum = 0.0f;
    for (int32_t t = begin; t < end; ++t) {
      if (batch.mask[t]) sum += expf(to_float(scores[int64_t(t) * ld_scores + h]) - max_score);
    }
    m[h] = max_score;
    l[h] = sum;
    partials.m[int64_t(c) * heads + h] = max_score;
    partials.l[int64_t(c) * heads + h] = sum;
  }
  __syncthreads();
  for (int32_t j = threadIdx.x; j < D; j += blockDim.x) {
    const int32_t h = j / d;
    float acc = 0.0f;
    for (int32_t t = begin; t < end; ++t) {
      if (!batch.mask[t]) continue;
      const float weight = expf(to_float(scores[int64_t(t) * ld_scores + h]) - m[h]);
      acc += weight * to_float(values[int64_t(t) * ld_values + j]);
    }
    partials.v[int64_t(c) * D + j] = acc;
  }
}

template <class T>
FF_GLOBAL void pool_combine_kernel(BatchArgs batch, Partials partials, int32_t heads, int32_t D, const T* scale,
                                   float denominator_extra, T* out) {
  const int32_t b = blockIdx.x;
  const int32_t c0 = batch.seq_first_chunk[b], c1 = batch.seq_first_chunk[b + 1];
  const int32_t d = D / heads;
  for (int32_t j = threadIdx.x; j < D; j += blockDim.x) {
    const int32_t h = j / d;
    float M = -INFINITY;
    for (int32_t c = c0; c < c1; ++c) M = fmaxf(M, partials.m[int64_t(c) * heads + h]);
    float L = 0.0f, acc = 0.0f;
    for (int32_t c = c0; c < c1; ++c) {
      const float mc = partials.m[int64_t(c) * heads + h];
      if (mc == -INFINITY) continue;  // a chunk of padding only
      const float rescale = expf(mc - M);
      L += partials.l[int64_t(c) * heads + h] * rescale;
      acc += partials.v[int64_t(c) * D + j] * rescale;
    }
    float value = acc / (L + denominator_extra * expf(-M));
    if (scale != nullptr) value *= to_float(scale[int64_t(b) * D + j]);
    out[int64_t(b) * D + j] = from_float<T>(value);
  }
}

}  // namespace

template <class T, class S>
void launch_pool_partials(const BatchArgs& batch, const S* scores, int64_t ld_scores, int32_t heads, const T* values,
                          int64_t ld_values, int32_t D, Partials partials, ff_stream_t stream) {
  if (batch.num_chunks == 0) return;
  FF_LAUNCH((pool_partials_kernel<T, S>), dim3(unsigned(batch.num_chunks)), dim3(row_block_size(D)),
            size_t(2 * heads) * sizeof(float), stream, batch, scores, ld_scores, heads, values, ld_values, D,
            partials);
}

template <class T>
void launch_pool_combine(const BatchArgs& batch, Partials partials, int32_t heads, int32_t D, const T* scale,
                         float denominator_extra, T* out, ff_stream_t stream) {
  if (batch.num_sequences == 0) return;
  FF_LAUNCH(pool_combine_kernel<T>, dim3(unsigned(batch.num_sequences)), dim3(row_block_size(D)), 0, stream, batch,
            partials, heads, D, scale, denominator_extra, out);
}

#define FF_POOLING(T)                                                                                          \
  template void launch_pool_partials<T, T>(const BatchArgs&, const T*, int64_t, int32_t, const T*, int64_t,     \
                                           int32_t, Partials, ff_stream_t);                                    \
  template void launch_pool_combine<T>(const BatchArgs&, Partials, int32_t, int32_t, const T*, float, T*,       \
                                       ff_stream_t);
FF_INSTANTIATE_FOR_DTYPES(FF_POOLING)

#define FF_POOLING_FLOAT_SCORES(T)                                                                             \
  template void launch_pool_partials<T, float>(const BatchArgs&, const float*, int64_t, int32_t, const T*,      \
                                               int64_t, int32_t, Partials, ff_stream_t);
FF_POOLING_FLOAT_SCORES(ff_half)
FF_POOLING_FLOAT_SCORES(ff_bfloat16)

}  // inline namespace FF_KERNELS_ABI
}  // namespace fastformer::kernels
