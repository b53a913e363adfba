// key_pool_partials_kernel: the key pooling's chunk partials in one pass over K (docs/design.md,
// "The model contract", lines (5)-(8), split into chunks as in "Chunked pooling"):
//     r_{t,h} = K_t . G_b[h] + bka'[h],   G_b[h] = Wka'[h] * pq_b        (key_scores.cu)
//     m_c[h] = max_t r_{t,h},  l_c[h] = sum_t e^{r_{t,h} - m_c[h]},
//     v_c[j] = sum_t e^{r_{t,h(j)} - m_c[h(j)]} K_{t,j}                   (pool_partials<T, float>)
// over the real tokens t of each chunk c, the exact Partials pool_combine takes. The old path
// is two launches: key_scores reads K and writes r (float, [T, H]), pool_partials reads r and
// K again. This kernel reads each K row from memory once, into shared memory, and takes both
// from there; r never reaches memory.
//
// One block of 256 threads (8 warps) per chunk; the chunk's tokens go through shared memory in
// tiles of 16 rows (one mma row block), cp.async'd kStages - 1 tiles ahead (3 stages for 16-bit
// T: 2 tiles in flight, 48 KiB at D = 768; 2 for float). Per tile:
//   1. Scores. The warps split D in steps of 16 columns (warp w takes steps w, w + 8, ...; at
//      most kStepsPerWarp each: D <= 1024) and each warp scores the tile's 16 tokens against 16
//      heads (H <= 16, padded with zero rows of G) over its columns.
//      16-bit T: tensor cores, mma.m16n8k16 (ff_mma_m16n8k16, runtime.h), A = the K tile from
//      shared memory, B = G_b held in registers for the whole chunk (two n8 tiles of heads).
//      G_b is float (Wka' * pq) split into T hi + lo parts, two mmas each, so the scores keep
//      float precision of G (about 16 bits of mantissa in bfloat16, 22 in half) instead of
//      G rounded to T; the extra mmas are free here (the kernel waits on memory).
//      float T: the same output layout with CUDA-core FMAs (no TF32: float stays exact to the
//      old path within float rounding), G_b in shared memory in float.
//      The 8 warps' partial scores are summed in a fixed order through shared memory.
//   2. Online softmax: thread (h, i) of 16 x 16 takes the score of token i for head h, the
//      tile's max over real tokens (padding, mask 0, and rows past the chunk's end weigh
//      nothing and are never multiplied, as in pool_partials), rescales the running m and l
//      (e^{m_old - m_new}) and writes e^{r - m} for the weighted sum.
//   3. Weighted sum of the same tile from shared memory: a thread per VEC columns (one 16-byte
//      load where the head size allows) and a slot of the tile's real tokens; the tile's sum
//      is added to the float accumulators rescaled with the head's running max.
// At the end the slots are summed and m, l, v written. Registers and shared memory (sm_90,
// nvcc 13): 16-bit 116-124 registers, no spills, 84 KiB of shared memory at D = 768 (108 KiB at
// 1024): two blocks an SM; float 96-103 registers, 156 KiB at D = 768: one block.
//
// Why G_b per block, not a pre-kernel into scratch: a block serves a whole chunk (up to 256
// tokens, 384 KiB of K at D = 768 in bfloat16), and its lanes need G_b in the mma's B fragment
// layout anyway: each lane reads its fragments' pairs of Wka' and pq (4-byte loads where
// aligned; 18 KiB of Wka' per block from L2, 5 MB over 256 chunks against 96 MiB of K) once,
// while the first tiles' copies are in flight. No scratch memory, no extra launch.
//
// Bytes (base-long, D = 768, H = 12, bfloat16, 65,536 tokens in 256 chunks): K once (96 MiB),
// the mask and chunk bounds (64 KiB), Wka' and pq per block from L2, partials written
// (256 x (768 + 2 x 12) x 4 = 0.8 MB); the old path read K twice and wrote and read r
// (2 x 3 MiB).
//
// Shapes the kernel does not take (more than 16 heads, D over 1024, D not a multiple of the
// heads, K rows not 4-byte aligned) run the old key_scores + pool_partials<T, float> in
// launch_key_pool_partials, so callers never care. cp.async and mma.m16n8k16 need sm_80 or
// later (the builds target 80, 90, 100); on an older GPU the 16-bit kernel traps.
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "kernels/instantiate.cuh"
#include "kernels/kernels.h"
#include "kernels/pooling.cuh"

namespace fastformer::kernels {
inline namespace FF_KERNELS_ABI {
namespace {

constexpr int32_t kKeyPoolThreads = 256;
constexpr int32_t kKeyPoolWarps = kKeyPoolThreads / 32;
constexpr int32_t kTileTokens = 16;  // one mma row block
constexpr int32_t kHeadsMax = 16;    // two mma n8 tiles
constexpr int32_t kMaxColumns = 1024;
constexpr int32_t kStepsPerWarpMax = kMaxColumns / 16 / kKeyPoolWarps;  // 8
// Partial scores of the warps, [warp][head][token]; the row of 20 floats keeps both the
// fragment writes and the per-head reads free of bank conflicts.
constexpr int32_t kScoreRow = 20;
constexpr size_t kMaxSharedBytes = 227 * 1024;  // sm_90's opt-in limit per block
static_assert(kTileTokens * kHeadsMax == kKeyPoolThreads, "one thread per (head, token) of a tile");
static_assert(kChunkTokens % kTileTokens == 0);

template <class T>
constexpr int32_t kStages = sizeof(T) == 2 ? 3 : 2;
// Two blocks per SM for 16-bit T (registers capped at 128 a thread, about 86 KiB of shared
// memory each at D = 768); float's K tiles and G take most of an SM's shared memory.
template <class T>
constexpr int32_t kMinBlocks = sizeof(T) == 2 ? 2 : 1;

// The dynamic shared memory: the K tiles (rows of D rounded up to 16 columns, plus 16 bytes so
// that the 8 rows an mma fragment load touches fall in different banks), G_b in float for
// float T, the warps' partial scores, the tile's weights and rescale factors. The slots' sums
// at the end reuse the tiles.
struct KeyPoolLayout {
  int32_t columns;     // D rounded up to 16
  int32_t tile_row;    // elements between rows of a tile
  int32_t g_row;       // floats between rows of G (float T)
  size_t tiles_bytes;  // every stage
  size_t g_offset, scores_offset, weights_offset, scales_offset, bytes;

  FF_HOST_DEVICE KeyPoolLayout(int32_t D, int32_t element_bytes, int32_t stages) {
    columns = (D + 15) / 16 * 16;
    tile_row = columns + 16 / element_bytes;
    g_row = columns + 4;
    tiles_bytes = size_t(stages) * kTileTokens * size_t(tile_row) * size_t(element_bytes);
    g_offset = tiles_bytes;
    const size_t g_bytes = element_bytes == 4 ? size_t(kHeadsMax) * size_t(g_row) * 4 : 0;
    scores_offset = g_offset + g_bytes;
    weights_offset = scores_offset + size_t(kKeyPoolWarps) * kHeadsMax * kScoreRow * 4;
    scales_offset = weights_offset + size_t(kHeadsMax) * kTileTokens * 4;
    bytes = scales_offset + size_t(kHeadsMax) * 4;
  }
};

// ---- cp.async: a 4-, 8- or 16-byte copy from global to shared memory that does not wait -----
// (the emulation copies at once: it cannot show a read before the wait, see the README)
FF_DEVICE void copy_async(void* shared_dst, const void* global_src, int32_t bytes) {
#if defined(FF_EMULATION)
  ::ff_emu::check_vector_alignment(global_src, size_t(bytes), "cp.async (global)");
  ::ff_emu::check_vector_alignment(shared_dst, size_t(bytes), "cp.async (shared)");
  std::memcpy(shared_dst, global_src, size_t(bytes));
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(shared_dst));
  if (bytes == 16) {  // .cg: K is streamed once, through L2 only
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(global_src)
                 : "memory");
  } else if (bytes == 8) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(dst), "l"(global_src)
                 : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(global_src)
                 : "memory");
  }
#else
  memcpy(shared_dst, global_src, size_t(bytes));
#endif
}
FF_DEVICE void copy_async_commit() {
#if !defined(FF_EMULATION) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
// Waits until at most `Pending` of this thread's committed groups are still in flight.
template <int Pending>
FF_DEVICE void copy_async_wait() {
#if !defined(FF_EMULATION) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending) : "memory");
#endif
}

// Two consecutive 16-bit elements of shared memory as one mma register (4-byte aligned).
template <class T>
FF_DEVICE uint32_t load_pair_bits(const T* p) {
#if defined(FF_EMULATION)
  ::ff_emu::check_vector_alignment(p, 4, "load_pair_bits");
  uint32_t bits;
  std::memcpy(&bits, p, 4);
  return bits;
#else
  return *reinterpret_cast<const uint32_t*>(p);
#endif
}

// The register of two 16-bit values, `low` in the low half (the lower-indexed element).
template <class T>
FF_DEVICE uint32_t pack_pair(T low, T high) {
  uint16_t lo, hi;
  memcpy(&lo, &low, 2);
  memcpy(&hi, &high, 2);
  return uint32_t(lo) | (uint32_t(hi) << 16);
}

// G_b[h][j], G_b[h][j + 1] (0 past D): Wka'[h] * pq_b in float.
template <class T>
FF_DEVICE void g_pair(const T* wka, const T* pq_b, int32_t D, int32_t h, int32_t j, bool pair_loads,
                      float (&out)[2]) {
  if (pair_loads && j + 1 < D) {  // D even, Wka' and pq 4-byte aligned
    float w[2], p[2];
    load_vector<2>(wka + int64_t(h) * D + j, w);
    load_vector<2>(pq_b + j, p);
    out[0] = w[0] * p[0];
    out[1] = w[1] * p[1];
    return;
  }
  for (int32_t e = 0; e < 2; ++e) {
    out[e] = j + e < D ? to_float(wka[int64_t(h) * D + j + e]) * to_float(pq_b[j + e]) : 0.0f;
  }
}

// One tile's rows of K (rows_in_tile of them, from token t0) into shared memory, in copies of
// copy_bytes; the columns past D keep their zeros.
template <class T>
FF_DEVICE void copy_tile(const T* k, int64_t ld_k, int32_t t0, int32_t rows_in_tile, int32_t D,
                         int32_t copy_bytes, int32_t tile_row, T* tile) {
  const int32_t per_copy = copy_bytes / int32_t(sizeof(T));
  const int32_t row_copies = D / per_copy;
  for (int32_t i = threadIdx.x; i < rows_in_tile * row_copies; i += kKeyPoolThreads) {
    const int32_t r = i / row_copies, j = (i - r * row_copies) * per_copy;
    copy_async(tile + r * tile_row + j, k + int64_t(t0 + r) * ld_k + j, copy_bytes);
  }
}

// VEC columns per weighted-sum vector (d % VEC == 0); STEPS: D's 16-column steps per warp at
// most (16-bit T; G's fragments held in registers).
template <class T, int VEC, int STEPS>
FF_GLOBAL void FF_POOL_LAUNCH_BOUNDS(kKeyPoolThreads, kMinBlocks<T>)
    key_pool_partials_kernel(BatchArgs batch, const T* k, int64_t ld_k, const T* pq, const T* wka,
                             const T* bka, int32_t heads, int32_t D, int32_t copy_bytes,
                             bool pair_loads, Partials partials) {
  constexpr bool kTensorCores = sizeof(T) == 2;
  constexpr int32_t kStagesT = kStages<T>;
  // Vectors a thread accumulates (more than one where D / VEC exceeds the block).
  constexpr int32_t kVectors = std::max(1, kMaxColumns / (VEC * kKeyPoolThreads));
  FF_DYNAMIC_SHARED(unsigned char, shared);
  const KeyPoolLayout layout(D, int32_t(sizeof(T)), kStagesT);
  T* const tiles = reinterpret_cast<T*>(shared);
  float* const g_shared = reinterpret_cast<float*>(shared + layout.g_offset);  // float T
  float* const partial_scores = reinterpret_cast<float*>(shared + layout.scores_offset);
  float* const weights = reinterpret_cast<float*>(shared + layout.weights_offset);  // [h][i]
  float* const scales = reinterpret_cast<float*>(shared + layout.scales_offset);

  const int32_t c = blockIdx.x;
  const int32_t begin = batch.chunk_begin[c], n = batch.chunk_end[c] - begin;  // n >= 1
  const int32_t num_tiles = (n + kTileTokens - 1) / kTileTokens;
  const T* const pq_b = pq + int64_t(batch.token_seq[begin]) * D;
  const int32_t tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int32_t group = lane / 4, quad = lane % 4;  // the mma fragments' groupID, threadID_in_group
  const int32_t steps = layout.columns / 16, tile_row = layout.tile_row;
  const int32_t tile_elements = kTileTokens * tile_row;

  // The columns past D of every stage are zeros (G is 0 there too, but 0 x NaN is not 0).
  const int32_t pad = layout.columns - D;
  for (int32_t i = tid; i < kStagesT * kTileTokens * pad; i += kKeyPoolThreads) {
    tiles[(i / pad) * tile_row + D + i % pad] = from_float<T>(0.0f);
  }
  auto tile_rows = [&](int32_t tile) { return min_int(kTileTokens, n - tile * kTileTokens); };
  for (int32_t s = 0; s < kStagesT - 1; ++s) {
    if (s < num_tiles) {
      copy_tile(k, ld_k, begin + s * kTileTokens, tile_rows(s), D, copy_bytes, tile_row,
                tiles + s * tile_elements);
    }
    copy_async_commit();  // one group per tile, empty past the end, so the waits count tiles
  }

  // G_b while the first tiles are in flight. 16-bit T: this lane's B fragments of its steps,
  // hi and lo parts (b[step][n8 tile][register]); float T: G_b in shared memory.
  uint32_t g_hi[kTensorCores ? STEPS : 1][2][2], g_lo[kTensorCores ? STEPS : 1][2][2];
  if constexpr (kTensorCores) {
    FF_UNROLL
    for (int32_t s = 0; s < STEPS; ++s) {
      const int32_t step = warp + kKeyPoolWarps * s;
      FF_UNROLL
      for (int32_t nt = 0; nt < 2; ++nt) {
        const int32_t h = 8 * nt + group;  // B's column: the head
        FF_UNROLL
        for (int32_t r = 0; r < 2; ++r) {  // B's rows 2 quad (+ 8): columns of D
          float gv[2] = {0.0f, 0.0f};
          if (step < steps && h < heads)
            g_pair(wka, pq_b, D, h, 16 * step + 2 * quad + 8 * r, pair_loads, gv);
          T hi[2], lo[2];
          FF_UNROLL
          for (int32_t e = 0; e < 2; ++e) {
            hi[e] = from_float<T>(gv[e]);
            lo[e] = from_float<T>(gv[e] - to_float(hi[e]));
          }
          g_hi[s][nt][r] = pack_pair(hi[0], hi[1]);
          g_lo[s][nt][r] = pack_pair(lo[0], lo[1]);
        }
      }
    }
  } else {
    for (int32_t i = tid; i < kHeadsMax * layout.columns; i += kKeyPoolThreads) {
      const int32_t h = i / layout.columns, j = i - h * layout.columns;
      g_shared[h * layout.g_row + j] =
          h < heads && j < D ? to_float(wka[int64_t(h) * D + j]) * to_float(pq_b[j]) : 0.0f;
    }
  }

  // Thread (h, i) of the softmax step: head h = tid / 16 keeps the running m and l (its 16
  // threads hold the same values), token i = tid % 16 of each tile.
  const int32_t softmax_head = tid / kTileTokens, softmax_token = tid % kTileTokens;
  const float bias = softmax_head < heads ? to_float(bka[softmax_head]) : 0.0f;
  float m_run = -INFINITY, l_run = 0.0f;

  // Weighted sums: thread = (vector v, slot); a slot takes every slots-th token of a tile.
  const int32_t d = D / heads, vectors = D / VEC;
  const int32_t vector_threads = min_int(vectors, kKeyPoolThreads);
  const int32_t slots = kKeyPoolThreads / vector_threads;
  const int32_t slot = tid / vector_threads, first_vector = tid % vector_threads;
  float acc[kVectors][VEC] = {};

  for (int32_t tile = 0; tile < num_tiles; ++tile) {
    copy_async_wait<kStagesT - 2>();  // this thread's copies of `tile` have landed
    __syncthreads();  // everyone's have; everyone is done with tile - 1 (its stage is free)
    if (tile + kStagesT - 1 < num_tiles) {
      const int32_t ahead = tile + kStagesT - 1;
      copy_tile(k, ld_k, begin + ahead * kTileTokens, tile_rows(ahead), D, copy_bytes, tile_row,
                tiles + (ahead % kStagesT) * tile_elements);
    }
    copy_async_commit();
    const T* const x = tiles + (tile % kStagesT) * tile_elements;

    // 1. The warp's partial scores: score[nt][i] is token group + 8 (i / 2), head 8 nt + 2 quad
    //    + i % 2 (the mma's accumulator layout, kept by the float path too).
    float score[2][4] = {};
    if constexpr (kTensorCores) {
      FF_UNROLL
      for (int32_t s = 0; s < STEPS; ++s) {
        const int32_t step = warp + kKeyPoolWarps * s;
        if (step < steps) {  // the same for the whole warp
          const T* a_base = x + group * tile_row + 16 * step + 2 * quad;
          const uint32_t a[4] = {load_pair_bits(a_base), load_pair_bits(a_base + 8 * tile_row),
                                 load_pair_bits(a_base + 8),
                                 load_pair_bits(a_base + 8 * tile_row + 8)};
          FF_UNROLL
          for (int32_t nt = 0; nt < 2; ++nt) {
            ff_mma_m16n8k16<T>(score[nt], a, g_hi[s][nt], score[nt]);
            ff_mma_m16n8k16<T>(score[nt], a, g_lo[s][nt], score[nt]);
          }
        }
      }
    } else {
      for (int32_t step = warp; step < steps; step += kKeyPoolWarps) {
        FF_UNROLL
        for (int32_t j = 16 * step; j < 16 * step + 16; j += 4) {
          const ff_float4 x0 = load_float4(x + group * tile_row + j);
          const ff_float4 x1 = load_float4(x + (group + 8) * tile_row + j);
          FF_UNROLL
          for (int32_t nt = 0; nt < 2; ++nt) {
            FF_UNROLL
            for (int32_t e = 0; e < 2; ++e) {
              const ff_float4 g =
                  load_float4(g_shared + (8 * nt + 2 * quad + e) * layout.g_row + j);
              score[nt][e] += x0.x * g.x + x0.y * g.y + x0.z * g.z + x0.w * g.w;
              score[nt][2 + e] += x1.x * g.x + x1.y * g.y + x1.z * g.z + x1.w * g.w;
            }
          }
        }
      }
    }
    FF_UNROLL
    for (int32_t nt = 0; nt < 2; ++nt) {
      FF_UNROLL
      for (int32_t i = 0; i < 4; ++i) {
        const int32_t h = 8 * nt + 2 * quad + i % 2, token = group + 8 * (i / 2);
        partial_scores[(warp * kHeadsMax + h) * kScoreRow + token] = score[nt][i];
      }
    }
    __syncthreads();

    // 2. Online softmax of the tile, per head over its real tokens.
    const int32_t t0 = begin + tile * kTileTokens, rows = tile_rows(tile);
    const bool real = softmax_token < rows && batch.mask[t0 + softmax_token] != 0;
    float r = bias;
    for (int32_t w = 0; w < kKeyPoolWarps; ++w)
      r += partial_scores[(w * kHeadsMax + softmax_head) * kScoreRow + softmax_token];
    r = real ? r : -INFINITY;
    float tile_max = r;
    for (int32_t offset = kTileTokens / 2; offset > 0; offset >>= 1)
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, offset));
    const float m_new = fmaxf(m_run, tile_max);
    const float scale = m_new == -INFINITY ? 1.0f : expf(m_run - m_new);  // e^-inf = 0: first
    const float weight = real ? expf(r - m_new) : 0.0f;
    float tile_sum = weight;
    for (int32_t offset = kTileTokens / 2; offset > 0; offset >>= 1)
      tile_sum += __shfl_xor_sync(0xffffffffu, tile_sum, offset);
    l_run = l_run * scale + tile_sum;
    m_run = m_new;
    weights[softmax_head * kTileTokens + softmax_token] = weight;
    if (softmax_token == 0) scales[softmax_head] = scale;
    // Tokens 0..15 in the low bits, the same in every warp (its two heads see the same tokens).
    const unsigned real_tokens = __ballot_sync(0xffffffffu, real) & 0xffffu;
    __syncthreads();

    // 3. The weighted sum of the tile's real rows (padding rows are never read: NaN x 0 is NaN).
    if (slot < slots) {
      FF_UNROLL
      for (int32_t iv = 0; iv < kVectors; ++iv) {
        const int32_t v = first_vector + iv * vector_threads;
        if (v < vectors) {
          const int32_t h = v * VEC / d;
          // The tile's sum apart, then into the rescaled total: two short float sums, not one
          // of up to 256 terms (the old path's 4 slots of 64 tokens are as accurate).
          float tile_sum[VEC] = {};
          for (int32_t i = slot; i < kTileTokens; i += slots) {
            if ((real_tokens >> i) & 1u) {
              float values[VEC];
              load_vector<VEC>(x + i * tile_row + v * VEC, values);
              const float w = weights[h * kTileTokens + i];
              FF_UNROLL
              for (int32_t e = 0; e < VEC; ++e) tile_sum[e] += w * values[e];
            }
          }
          const float rescale = scales[h];
          FF_UNROLL
          for (int32_t e = 0; e < VEC; ++e) acc[iv][e] = acc[iv][e] * rescale + tile_sum[e];
        }
      }
    }
  }

  // The chunk's partials. A chunk without real tokens keeps m = -inf, l = 0 and v = 0.
  if (softmax_token == 0 && softmax_head < heads) {
    partials.m[int64_t(c) * heads + softmax_head] = m_run;
    partials.l[int64_t(c) * heads + softmax_head] = l_run;
  }
  float* const v_out = partials.v + int64_t(c) * D;
  if (slots == 1) {
    if (slot >= slots) return;  // threads past the vectors hold nothing
    FF_UNROLL
    for (int32_t iv = 0; iv < kVectors; ++iv) {
      const int32_t v = first_vector + iv * vector_threads;
      if (v < vectors) {
        FF_UNROLL
        for (int32_t e = 0; e < VEC; ++e) v_out[v * VEC + e] = acc[iv][e];
      }
    }
    return;
  }
  // Several slots (vectors < threads, so one vector a thread): summed in slot order.
  float* const slot_sums = reinterpret_cast<float*>(shared);  // [slots][D], over the tiles
  __syncthreads();                                            // every thread is done with the tiles
  if (slot < slots) {
    FF_UNROLL
    for (int32_t e = 0; e < VEC; ++e) slot_sums[slot * D + first_vector * VEC + e] = acc[0][e];
  }
  __syncthreads();
  for (int32_t j = tid; j < D; j += kKeyPoolThreads) {
    float sum = 0.0f;
    for (int32_t s = 0; s < slots; ++s) sum += slot_sums[s * D + j];
    v_out[j] = sum;
  }
}

// Bytes of K a cp.async can move: the widest of 16, 8, 4 that the rows allow, else 0.
template <class T>
int32_t copy_width(const T* k, int64_t ld_k, int32_t D) {
  const int32_t vec = vector_width(k, ld_k, D);
  const int32_t bytes = vec * int32_t(sizeof(T));
  return bytes >= 4 ? bytes : 0;
}

}  // namespace

template <class T>
void launch_key_pool_partials(const BatchArgs& batch, const T* k, int64_t ld_k, const T* pq,
                              const T* wka, const T* bka, int32_t heads, int32_t D, float* scores,
                              Partials partials, ff_stream_t stream) {
  if (batch.num_chunks == 0) return;
  const int32_t copy_bytes = copy_width(k, ld_k, D);
  const KeyPoolLayout layout(D, int32_t(sizeof(T)), kStages<T>);
  constexpr int32_t kVec = 16 / int32_t(sizeof(T));
  const size_t slot_bytes = size_t(kKeyPoolThreads) * kVec * sizeof(float);  // at most
  const size_t shared = std::max(layout.bytes, slot_bytes);
  const bool fused = heads >= 1 && heads <= kHeadsMax && D % heads == 0 && D <= kMaxColumns &&
                     copy_bytes >= 4 && shared <= kMaxSharedBytes;
  if (!fused) {
    launch_key_scores<T>(batch, k, ld_k, pq, wka, bka, heads, D, scores, stream);
    launch_pool_partials<T, float>(batch, scores, heads, heads, k, ld_k, D, partials, stream);
    return;
  }
  const bool pair_loads = D % 2 == 0 && reinterpret_cast<uintptr_t>(wka) % 4 == 0 &&
                          reinterpret_cast<uintptr_t>(pq) % 4 == 0;
  const int32_t steps_per_warp = (layout.columns / 16 + kKeyPoolWarps - 1) / kKeyPoolWarps;
  const int32_t d = D / heads;
  auto launch = [&](auto vec, auto steps) {
    constexpr int VEC = decltype(vec)::value, STEPS = decltype(steps)::value;
    auto kernel = key_pool_partials_kernel<T, VEC, STEPS>;
    if (shared > 48 * 1024) ff_set_max_dynamic_shared_memory(kernel, shared);
    FF_LAUNCH((key_pool_partials_kernel<T, VEC, STEPS>), dim3(unsigned(batch.num_chunks)),
              dim3(kKeyPoolThreads), shared, stream, batch, k, ld_k, pq, wka, bka, heads, D,
              copy_bytes, pair_loads, partials);
  };
  // G's fragments in registers: 6 steps a warp up to D = 768 (base), 8 up to 1024. Float keeps
  // G in shared memory and loops over any number of steps.
  auto with_steps = [&](auto vec) {
    if constexpr (sizeof(T) == 4) {
      launch(vec, std::integral_constant<int, 1>{});
    } else if (steps_per_warp <= 6) {
      launch(vec, std::integral_constant<int, 6>{});
    } else {
      launch(vec, std::integral_constant<int, kStepsPerWarpMax>{});
    }
  };
  if (d % kVec == 0) {
    with_steps(std::integral_constant<int, kVec>{});
  } else {
    with_steps(std::integral_constant<int, 1>{});
  }
}

#define FF_KEY_POOL(T)                                                                     \
  template void launch_key_pool_partials<T>(const BatchArgs&, const T*, int64_t, const T*, \
                                            const T*, const T*, int32_t, int32_t, float*,  \
                                            Partials, ff_stream_t);
FF_INSTANTIATE_FOR_DTYPES(FF_KEY_POOL)

}  // namespace FF_KERNELS_ABI
}  // namespace fastformer::kernels
