// key_scores_kernel computes the key-side attention scores (docs/design.md, "The model
// contract", lines (5)-(6)):
//     r_t = (P_t Wka^T + bka) / sqrt(d),  P_t = K_t * pq
// as r_t = K_t . G_b[h] + bka'[h] with G_b[h] = Wka'[h] * pq_b and Wka' = Wka / sqrt(d)
// prepared at load, so P = K * pq is never written to memory.
//
// One block per kKeyScoreTokens tokens of one pooling chunk (so of one sequence b): it builds
// G_b for up to kHeadTile heads once in shared memory (float), and serves all its tokens from
// it, instead of reading the heads x D weights again for every token. A warp takes
// kTokenStep tokens at once: each lane reads its columns of the K rows in 16-byte vectors
// where the layout allows, each G value it reads from shared memory serves all kTokenStep
// rows (shared-memory bandwidth would bound a token at a time), the kHeadTile dot products
// per token accumulate in registers, and the warp reduces them together, halving the values
// each lane keeps at every shuffle step (16 shuffles for 16 heads, not 16 x 5).
#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/instantiate.cuh"
#include "kernels/kernels.h"
#include "kernels/pooling.cuh"

namespace fastformer::kernels {
inline namespace FF_KERNELS_ABI {
namespace {

constexpr int32_t kKeyScoreThreads = 256;
constexpr int32_t kKeyScoreWarps = kKeyScoreThreads / 32;
// Tokens per block: G_b, staged once, serves 64 tokens; 4 blocks per full chunk.
constexpr int32_t kKeyScoreTokens = 64;
constexpr int32_t kHeadTile =
    16;  // heads per pass, in registers (one per pair of lanes at the end)
constexpr int32_t kTokenStep = 4;               // tokens a warp scores at once
constexpr size_t kMaxSharedBytes = 227 * 1024;  // sm_90's opt-in limit per block

// a[0..2N) summed pairwise with lane ^ 2N into a[0..N): the lane with that bit set keeps the
// upper half, its partner the lower one, and each sends the half it gives up.
template <int N>
FF_DEVICE void fold_across_lanes(float* a, int32_t lane) {
  const bool upper = (lane & (2 * N)) != 0;
  FF_UNROLL
  for (int32_t i = 0; i < N; ++i) {
    const float keep = upper ? a[i + N] : a[i];
    const float give = upper ? a[i] : a[i + N];
    a[i] = keep + __shfl_xor_sync(0xffffffffu, give, 2 * N);
  }
}

// The warp's sums of a[0..16): lanes 2i and 2i + 1 get the sum of a[i].
FF_DEVICE float warp_sum_16(float (&a)[kHeadTile], int32_t lane) {
  static_assert(kHeadTile == 16);
  fold_across_lanes<8>(a, lane);
  fold_across_lanes<4>(a, lane);
  fold_across_lanes<2>(a, lane);
  fold_across_lanes<1>(a, lane);
  return a[0] + __shfl_xor_sync(0xffffffffu, a[0], 1);
}

// Where G's column v * VEC + e sits in a head's row of G: with VEC = 8 (32 bytes of floats
// a lane) in quads of 4 floats, lane after lane, so each 16-byte shared load of a warp reads
// 512 contiguous bytes (the plain layout has 2 lanes share banks in every quarter-warp).
template <int VEC>
FF_DEVICE int32_t g_index(int32_t v, int32_t e) {
  if constexpr (VEC <= 4) {
    return v * VEC + e;
  } else {
    return (v / 32) * (32 * VEC) + (e / 4) * 128 + (v % 32) * 4 + e % 4;
  }
}

// G's row per head: D rounded up to whole warps of vectors (the layout above).
FF_HOST_DEVICE int32_t g_row(int32_t D, int32_t vec) {
  return (D + 32 * vec - 1) / (32 * vec) * (32 * vec);
}

// Two blocks per SM at least: registers capped at 128 a thread (kTokenStep x kHeadTile
// accumulators need most of them).
template <class T, int VEC>
FF_GLOBAL void FF_POOL_LAUNCH_BOUNDS(kKeyScoreThreads, 2)
    key_scores_kernel(BatchArgs batch, const T* k, int64_t ld_k, const T* pq, const T* wka,
                      const T* bka, int32_t heads, int32_t D, float* r) {
  FF_DYNAMIC_SHARED(float, g);  // [min(heads, kHeadTile)][g_row]: Wka'[h] * pq_b
  const int32_t c = blockIdx.x;
  const int32_t t0 = batch.chunk_begin[c] + int32_t(blockIdx.y) * kKeyScoreTokens;
  const int32_t t1 = min_int(batch.chunk_end[c], t0 + kKeyScoreTokens);
  if (t0 >= t1) return;  // the chunk is shorter than this block's share (the whole block)
  const T* pq_b = pq + int64_t(batch.token_seq[t0]) * D;
  const int32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int32_t vectors = D / VEC, row = g_row(D, VEC);

  for (int32_t h0 = 0; h0 < heads; h0 += kHeadTile) {
    const int32_t nh = min_int(heads - h0, kHeadTile);
    if (h0 > 0) __syncthreads();  // every warp is done with the previous heads' G
    for (int32_t hh = 0; hh < nh; ++hh) {
      for (int32_t j = threadIdx.x; j < D; j += kKeyScoreThreads) {
        g[hh * row + g_index<VEC>(j / VEC, j % VEC)] =
            to_float(wka[int64_t(h0 + hh) * D + j]) * to_float(pq_b[j]);
      }
    }
    __syncthreads();
    // A warp takes kTokenStep tokens at once, so each G value read from shared memory
    // serves kTokenStep rows (shared-memory bandwidth, not HBM, bounds a token at a time).
    for (int32_t t = t0 + warp; t < t1; t += kTokenStep * kKeyScoreWarps) {
      const T* rows[kTokenStep];
      FF_UNROLL
      for (int32_t i = 0; i < kTokenStep; ++i) {
        const int32_t u = t + i * kKeyScoreWarps;
        rows[i] =
            k + int64_t(u < t1 ? u : t) * ld_k;  // past the block's tokens: t again, not written
      }
      float acc[kTokenStep][kHeadTile] = {};
      for (int32_t v = lane; v < vectors; v += 32) {
        float x[kTokenStep][VEC];
        FF_UNROLL
        for (int32_t i = 0; i < kTokenStep; ++i) load_vector<VEC>(rows[i] + v * VEC, x[i]);
        FF_UNROLL
        for (int32_t hh = 0; hh < kHeadTile; ++hh) {
          if (hh < nh) {
            const float* gh = g + hh * row;
            FF_UNROLL
            for (int32_t e = 0; e < VEC; ++e) {
              const float ge = gh[g_index<VEC>(v, e)];
              FF_UNROLL
              for (int32_t i = 0; i < kTokenStep; ++i) acc[i][hh] += x[i][e] * ge;
            }
          }
        }
      }
      const int32_t hh = lane / 2;
      FF_UNROLL
      for (int32_t i = 0; i < kTokenStep; ++i) {
        const int32_t u = t + i * kKeyScoreWarps;
        const float sum = warp_sum_16(acc[i], lane);
        if (u < t1 && lane % 2 == 0 && hh < nh)
          r[int64_t(u) * heads + h0 + hh] = sum + to_float(bka[h0 + hh]);
      }
    }
  }
}

}  // namespace

template <class T>
void launch_key_scores(const BatchArgs& batch, const T* k, int64_t ld_k, const T* pq, const T* wka,
                       const T* bka, int32_t heads, int32_t D, float* r, ff_stream_t stream) {
  if (batch.num_chunks == 0) return;
  const dim3 grid(unsigned(batch.num_chunks), unsigned(kChunkTokens / kKeyScoreTokens));
  with_vector_width<T>(vector_width(k, ld_k, D), [&](auto width) {
    constexpr int VEC = decltype(width)::value;
    const size_t shared =
        size_t(std::min(heads, kHeadTile)) * size_t(g_row(D, VEC)) * sizeof(float);
    if (shared > kMaxSharedBytes) {
      throw std::runtime_error("key_scores: hidden size " + std::to_string(D) + " needs " +
                               std::to_string(shared) +
                               " bytes of shared memory, more than a block has");
    }
    if (shared > 48 * 1024) ff_set_max_dynamic_shared_memory(key_scores_kernel<T, VEC>, shared);
    FF_LAUNCH((key_scores_kernel<T, VEC>), grid, dim3(kKeyScoreThreads), shared, stream, batch, k,
              ld_k, pq, wka, bka, heads, D, r);
  });
}
static_assert(kChunkTokens % kKeyScoreTokens == 0);

#define FF_KEY_SCORES(T)                                                                      \
  template void launch_key_scores<T>(const BatchArgs&, const T*, int64_t, const T*, const T*, \
                                     const T*, int32_t, int32_t, float*, ff_stream_t);
FF_INSTANTIATE_FOR_DTYPES(FF_KEY_SCORES)

}  // namespace FF_KERNELS_ABI
}  // namespace fastformer::kernels
