// The masked softmax pooling at the heart of additive attention, split for long sequences
// (docs/design.md, "The model contract" and "Long sequences"):
//   a = softmax over t of s (masked), per head;   pooled_h = sum_t a_{t,h} V_{t,h-slice}
// used three times per model: the query pooling (s, V = Q -> pq), the key pooling
// (r, V = K -> pk after scaling by pq, since pk_h = pq_h * sum_t b_{t,h} K_{t,h-slice}), and
// the attention pooler (z, one "head" spanning all D columns, with the reference's + 1e-8
// in the denominator).
//
// pool_partials_kernel: one block per (chunk of at most kChunkTokens tokens, group of at most
// kPoolColumns columns), so 256 chunks of a batch become 768 blocks at D = 768. The block
// lists the chunk's real tokens (the mask becomes a list: no later loop tests it, and padding
// rows are never read), takes exp(s - m) once per (token, head) into shared memory, and then
// sums the weighted value rows with its tokens split across warps, each thread reading 16
// bytes of a row where the layout allows. It writes the chunk's online-softmax partials: per
// head the max m and the sum l of exp(s - m), per column the weighted sum v.
// pool_combine_kernel: one block per (sequence, group of columns), the sequence's chunks
// split across the block's threads too, rescales the partials to the sequence max M and
// divides. Masked tokens weigh nothing: the reference's -10000 underflows to exactly 0 after
// exp in float32, so leaving them out gives the same result.
#include <algorithm>

#include "kernels/instantiate.cuh"
#include "kernels/kernels.h"
#include "kernels/pooling.cuh"

namespace fastformer::kernels {
inline namespace FF_KERNELS_ABI {
namespace {

constexpr int32_t kPoolThreads = 256;
constexpr int32_t kPoolWarps = kPoolThreads / 32;
static_assert(kChunkTokens <= kPoolThreads,
              "one thread per token of a chunk while listing its real tokens");
// Columns of one partials block at most: 512 bytes of a bfloat16 row, so a warp reads a
// row's share in one 16-byte load per lane and D = 768 makes three blocks per chunk.
constexpr int32_t kPoolColumns = 256;

constexpr int32_t kCombineThreads = 256;
// Threads that split one column's chunks in the combine at most (a power of 2).
constexpr int32_t kCombineChunkLanes = 16;

template <class T, class S, int VEC>
FF_GLOBAL void pool_partials_kernel(BatchArgs batch, const S* scores, int64_t ld_scores,
                                    int32_t heads, const T* values, int64_t ld_values, int32_t D,
                                    int32_t block_columns, int32_t heads_max, Partials partials) {
  FF_SHARED(int32_t, real_tokens, kChunkTokens);  // the chunk's unmasked tokens, in order
  FF_SHARED(int32_t, warp_counts, kPoolWarps);
  FF_DYNAMIC_SHARED(float, shared);
  float* const weights = shared;                               // [heads_max][kChunkTokens]
  float* const head_max = weights + heads_max * kChunkTokens;  // [heads_max]
  float* const column_sums = head_max + heads_max;             // [token slots][block_columns]

  const int32_t c = blockIdx.x;
  const int32_t begin = batch.chunk_begin[c], n = batch.chunk_end[c] - begin;  // n >= 1
  const int32_t c0 = int32_t(blockIdx.y) * block_columns, c1 = min_int(D, c0 + block_columns);
  const int32_t d = D / heads;
  const int32_t h0 = c0 / d, nh = (c1 - 1) / d - h0 + 1;  // the heads this block's columns touch
  const int32_t tid = threadIdx.x, lane = tid % 32, warp = tid / 32;

  // 1. List the real tokens: a ballot per warp and a prefix over the warps. Each lists its
  //    scores for the block's heads.
  const int32_t t = begin + min_int(tid, n - 1);
  const bool real = tid < n && batch.mask[t] != 0;
  const unsigned ballot = __ballot_sync(0xffffffffu, real);
  if (lane == 0) warp_counts[warp] = __popc(ballot);
  __syncthreads();
  int32_t n_real = 0, slot = __popc(ballot & ((1u << lane) - 1u));
  for (int32_t w = 0; w < kPoolWarps; ++w) {
    slot += w < warp ? warp_counts[w] : 0;
    n_real += warp_counts[w];
  }
  if (real) {
    real_tokens[slot] = t;
    for (int32_t hh = 0; hh < nh; ++hh) {
      weights[hh * kChunkTokens + slot] = to_float(scores[int64_t(t) * ld_scores + h0 + hh]);
    }
  }
  __syncthreads();

  // 2. Per head the max (a warp per head), exp(s - m) once per (token, head), the sum.
  for (int32_t hh = warp; hh < nh; hh += kPoolWarps) {
    float m = -INFINITY;
    for (int32_t k = lane; k < n_real; k += 32) m = fmaxf(m, weights[hh * kChunkTokens + k]);
    m = warp_max(m);
    if (lane == 0) head_max[hh] = m;
  }
  __syncthreads();
  if (tid < n_real) {  // a chunk without real tokens keeps m = -inf, l = 0 and v = 0
    for (int32_t hh = 0; hh < nh; ++hh) {
      weights[hh * kChunkTokens + tid] = expf(weights[hh * kChunkTokens + tid] - head_max[hh]);
    }
  }
  __syncthreads();
  for (int32_t hh = warp; hh < nh; hh += kPoolWarps) {
    float l = 0.0f;
    for (int32_t k = lane; k < n_real; k += 32) l += weights[hh * kChunkTokens + k];
    l = warp_sum(l);
    const int32_t h = h0 + hh;
    if (lane == 0 && h * d >= c0) {  // the block holding the head's first column writes its stats
      partials.m[int64_t(c) * heads + h] = head_max[hh];
      partials.l[int64_t(c) * heads + h] = l;
    }
  }

  // 3. Weighted sums: a thread per VEC columns and a slot of the tokens, then the slots summed.
  const int32_t row_threads = (block_columns + VEC - 1) / VEC;
  const int32_t slots = kPoolThreads / row_threads;
  const int32_t vector = tid % row_threads, token_slot = tid / row_threads;
  const int32_t j = c0 + vector * VEC;
  if (token_slot < slots && j < c1) {
    const float* w = weights + (j / d - h0) * kChunkTokens;
    const T* v = values + j;
    float acc[VEC] = {};
    FF_POOL_UNROLL_BY(4)
    for (int32_t k = token_slot; k < n_real; k += slots) {
      float x[VEC];
      load_vector<VEC>(v + int64_t(real_tokens[k]) * ld_values, x);
      const float weight = w[k];
      FF_UNROLL
      for (int32_t e = 0; e < VEC; ++e) acc[e] += weight * x[e];
    }
    FF_UNROLL
    for (int32_t e = 0; e < VEC; ++e)
      column_sums[token_slot * block_columns + vector * VEC + e] = acc[e];
  }
  __syncthreads();
  for (int32_t i = tid; i < c1 - c0; i += kPoolThreads) {
    float sum = 0.0f;
    for (int32_t s = 0; s < slots; ++s) sum += column_sums[s * block_columns + i];
    partials.v[int64_t(c) * D + c0 + i] = sum;
  }
}

template <class T>
FF_GLOBAL void pool_combine_kernel(BatchArgs batch, Partials partials, int32_t heads, int32_t D,
                                   int32_t chunk_lanes, const T* scale, float denominator_extra,
                                   T* out) {
  FF_SHARED(float, maxima, kCombineThreads);
  FF_SHARED(float, sums, 2 * kCombineThreads);  // l, then v
  const int32_t columns = kCombineThreads / chunk_lanes;
  const int32_t b = blockIdx.x;
  const int32_t column = threadIdx.x % columns, chunk_lane = threadIdx.x / columns;
  const int32_t j = int32_t(blockIdx.y) * columns + column;
  const int32_t jc = min_int(j, D - 1);  // threads past D compute a real column and write nothing
  const int32_t h = jc / (D / heads);
  const int32_t c0 = batch.seq_first_chunk[b], c1 = batch.seq_first_chunk[b + 1];

  float m = -INFINITY;
  for (int32_t c = c0 + chunk_lane; c < c1; c += chunk_lanes)
    m = fmaxf(m, partials.m[int64_t(c) * heads + h]);
  maxima[threadIdx.x] = m;
  __syncthreads();
  float M = -INFINITY;
  for (int32_t i = 0; i < chunk_lanes; ++i) M = fmaxf(M, maxima[i * columns + column]);

  float L = 0.0f, acc = 0.0f;
  FF_POOL_UNROLL_BY(4)
  for (int32_t c = c0 + chunk_lane; c < c1; c += chunk_lanes) {
    const float mc = partials.m[int64_t(c) * heads + h];
    const float rescale = mc == -INFINITY ? 0.0f : expf(mc - M);  // a chunk of padding only adds 0
    L += partials.l[int64_t(c) * heads + h] * rescale;
    acc += partials.v[int64_t(c) * D + jc] * rescale;
  }
  sums[threadIdx.x] = L;
  sums[kCombineThreads + threadIdx.x] = acc;
  __syncthreads();
  if (chunk_lane == 0 && j < D) {
    L = 0.0f;
    acc = 0.0f;
    for (int32_t i = 0; i < chunk_lanes; ++i) {
      L += sums[i * columns + column];
      acc += sums[kCombineThreads + i * columns + column];
    }
    float value = acc / (L + denominator_extra * expf(-M));
    if (scale != nullptr) value *= to_float(scale[int64_t(b) * D + j]);
    out[int64_t(b) * D + j] = from_float<T>(value);
  }
}

}  // namespace

template <class T, class S>
void launch_pool_partials(const BatchArgs& batch, const S* scores, int64_t ld_scores, int32_t heads,
                          const T* values, int64_t ld_values, int32_t D, Partials partials,
                          ff_stream_t stream) {
  if (batch.num_chunks == 0) return;
  const int32_t d = D / heads;
  // At most 33 heads a block (their weights in shared memory); a multiple of any vector
  // width dividing d.
  const int32_t block_columns = std::min({D, kPoolColumns, 32 * d});
  const int32_t groups = (D + block_columns - 1) / block_columns;
  const int32_t heads_max = std::min(heads, (block_columns - 1) / d + 2);
  with_vector_width<T>(vector_width(values, ld_values, d), [&](auto width) {
    constexpr int VEC = decltype(width)::value;
    const int32_t slots = kPoolThreads / ((block_columns + VEC - 1) / VEC);
    const size_t shared =
        (size_t(heads_max) * (kChunkTokens + 1) + size_t(slots) * size_t(block_columns)) *
        sizeof(float);
    FF_LAUNCH((pool_partials_kernel<T, S, VEC>), dim3(unsigned(batch.num_chunks), unsigned(groups)),
              dim3(kPoolThreads), shared, stream, batch, scores, ld_scores, heads, values,
              ld_values, D, block_columns, heads_max, partials);
  });
}

template <class T>
void launch_pool_combine(const BatchArgs& batch, Partials partials, int32_t heads, int32_t D,
                         const T* scale, float denominator_extra, T* out, ff_stream_t stream) {
  if (batch.num_sequences == 0) return;
  // As many threads per column as the longest sequence has chunks (a power of 2, at most
  // kCombineChunkLanes); the rest of the block's threads take more columns.
  int32_t chunk_lanes = 1;
  const int32_t most =
      batch.max_sequence_chunks > 0 ? batch.max_sequence_chunks : kCombineChunkLanes;
  while (chunk_lanes < most && chunk_lanes < kCombineChunkLanes) chunk_lanes *= 2;
  const int32_t columns = kCombineThreads / chunk_lanes;
  FF_LAUNCH(pool_combine_kernel<T>,
            dim3(unsigned(batch.num_sequences), unsigned((D + columns - 1) / columns)),
            dim3(kCombineThreads), 0, stream, batch, partials, heads, D, chunk_lanes, scale,
            denominator_extra, out);
}

#define FF_POOLING(T)                                                                              \
  template void launch_pool_partials<T, T>(const BatchArgs&, const T*, int64_t, int32_t, const T*, \
                                           int64_t, int32_t, Partials, ff_stream_t);               \
  template void launch_pool_combine<T>(const BatchArgs&, Partials, int32_t, int32_t, const T*,     \
                                       float, T*, ff_stream_t);
FF_INSTANTIATE_FOR_DTYPES(FF_POOLING)

#define FF_POOLING_FLOAT_SCORES(T)                                                               \
  template void launch_pool_partials<T, float>(const BatchArgs&, const float*, int64_t, int32_t, \
                                               const T*, int64_t, int32_t, Partials, ff_stream_t);
FF_POOLING_FLOAT_SCORES(ff_half)
FF_POOLING_FLOAT_SCORES(ff_bfloat16)

}  // namespace FF_KERNELS_ABI
}  // namespace fastformer::kernels
