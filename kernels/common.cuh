// Helpers shared by the kernels: 16-byte vector loads and stores, warp and block reductions in
// float, activations, and the block and grid sizes of their launches. Compiles under nvcc and
// against the host emulation (kernels/runtime.h).
//
// The row kernels (LayerNorms, bias + activation, mix, L2 normalise, pooler scores, dtype
// conversions) share one scheme. A row is cut into chunks: 16-byte vectors (kVecSize<T>
// elements: 4 floats, 8 halves or bfloat16s) where the width, the leading dimensions and the
// pointers allow (vector_path), else single elements (the scalar path). A short row (up to
// 8 chunks per lane) is one warp's, four rows to a 128-thread block, with warp-shuffle
// reductions and no barrier; a wider row takes a whole block (row_launch). Columns and
// chunks are 32-bit; a row's offset is one 64-bit multiply, never a division.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "kernels/runtime.h"

namespace fastformer::kernels {
inline namespace FF_KERNELS_ABI {

// Mirrors engine::Activation (server/engine/config.h), kept separate so kernels do not
// depend on the engine's headers.
enum class Act : int { kGeluErf = 0, kGeluTanh = 1, kRelu = 2, kSilu = 3 };

// Elements of T in one 16-byte vector.
template <class T>
inline constexpr int kVecSize = int(16 / sizeof(T));

// `#pragma unroll` for nvcc; the host compiler would warn about an unknown pragma.
#if defined(__CUDACC__)
#define FF_UNROLL _Pragma("unroll")
#else
#define FF_UNROLL
#endif

// Device helpers exist where kernels compile (nvcc or the emulation); host code that only
// launches kernels (the engine's .cc files in CUDA builds) sees the declarations above.
#if defined(__CUDACC__) || defined(FF_EMULATION)
template <Act A>
FF_DEVICE float activate(float x) {
  if constexpr (A == Act::kGeluErf) {
    return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
  } else if constexpr (A == Act::kGeluTanh) {
    return 0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));
  } else if constexpr (A == Act::kRelu) {
    return fmaxf(x, 0.0f);
  } else {
    return x / (1.0f + expf(-x));
  }
}

FF_DEVICE float activate(float x, Act act) {
  switch (act) {
    case Act::kGeluErf:
      return activate<Act::kGeluErf>(x);
    case Act::kGeluTanh:
      return activate<Act::kGeluTanh>(x);
    case Act::kRelu:
      return activate<Act::kRelu>(x);
    case Act::kSilu:
      return activate<Act::kSilu>(x);
  }
  return x;
}

// ---- 16-byte vectors: kVecSize<T> elements at `p` (16-byte aligned) as floats ---------------
#if defined(FF_EMULATION)
template <class T>
inline void load_vec(const T* p, float* v) {
  ::ff_emu::check_vector_alignment(p, 16, "load_vec");
  for (int i = 0; i < kVecSize<T>; ++i) v[i] = to_float(p[i]);
}
template <class T>
inline void store_vec(T* p, const float* v) {
  ::ff_emu::check_vector_alignment(p, 16, "store_vec");
  for (int i = 0; i < kVecSize<T>; ++i) p[i] = from_float<T>(v[i]);
}
#else
FF_DEVICE void load_vec(const float* p, float* v) {
  const float4 q = *reinterpret_cast<const float4*>(p);
  v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
}
FF_DEVICE void store_vec(float* p, const float* v) {
  *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
}
// Half and bfloat16: one 16-byte access, its bits viewed as four pairs (memcpy of registers
// compiles to nothing).
template <class T, class Pair, class Widen>
FF_DEVICE void load_pairs(const T* p, float* v, Widen widen) {
  const uint4 bits = *reinterpret_cast<const uint4*>(p);
  Pair pairs[4];
  memcpy(pairs, &bits, sizeof bits);
  FF_UNROLL for (int i = 0; i < 4; ++i) {
    const float2 f = widen(pairs[i]);
    v[2 * i] = f.x, v[2 * i + 1] = f.y;
  }
}
template <class T, class Pair, class Narrow>
FF_DEVICE void store_pairs(T* p, const float* v, Narrow narrow) {
  Pair pairs[4];
  FF_UNROLL for (int i = 0; i < 4; ++i) pairs[i] = narrow(v[2 * i], v[2 * i + 1]);
  uint4 bits;
  memcpy(&bits, pairs, sizeof bits);
  *reinterpret_cast<uint4*>(p) = bits;
}
FF_DEVICE void load_vec(const ff_half* p, float* v) {
  load_pairs<ff_half, __half2>(p, v, [](__half2 h) { return __half22float2(h); });
}
FF_DEVICE void store_vec(ff_half* p, const float* v) {
  store_pairs<ff_half, __half2>(p, v, [](float a, float b) { return __floats2half2_rn(a, b); });
}
FF_DEVICE void load_vec(const ff_bfloat16* p, float* v) {
  load_pairs<ff_bfloat16, __nv_bfloat162>(p, v,
                                          [](__nv_bfloat162 h) { return __bfloat1622float2(h); });
}
FF_DEVICE void store_vec(ff_bfloat16* p, const float* v) {
  store_pairs<ff_bfloat16, __nv_bfloat162>(
      p, v, [](float a, float b) { return __floats2bfloat162_rn(a, b); });
}
#endif

// G consecutive elements at `p` as floats: G / kVecSize<T> vector accesses when G is a
// multiple of the vector (e.g. 8 floats beside 8 halves), one element when G is 1.
template <int G, class T>
FF_DEVICE void load_chunk(const T* p, float* v) {
  static_assert(G == 1 || G % kVecSize<T> == 0);
  if constexpr (G == 1) {
    v[0] = to_float(*p);
  } else {
    FF_UNROLL for (int k = 0; k < G; k += kVecSize<T>) load_vec(p + k, v + k);
  }
}
template <int G, class T>
FF_DEVICE void store_chunk(T* p, const float* v) {
  static_assert(G == 1 || G % kVecSize<T> == 0);
  if constexpr (G == 1) {
    *p = from_float<T>(v[0]);
  } else {
    FF_UNROLL for (int k = 0; k < G; k += kVecSize<T>) store_vec(p + k, v + k);
  }
}

// ---- reductions ------------------------------------------------------------------------------
FF_DEVICE float warp_sum(float v) {
  FF_UNROLL for (int offset = 16; offset > 0; offset >>= 1) v +=
      __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum of `v` over the block; every thread gets the result. `scratch` holds 32 floats of
// shared memory; blockDim.x must be a multiple of 32. Ends with a barrier, so `scratch`
// may be reused right after.
FF_DEVICE float block_sum(float v, float* scratch) {
  const int lane_id = threadIdx.x % 32, warp_id = threadIdx.x / 32;
  const int warps = blockDim.x / 32;
  v = warp_sum(v);
  if (lane_id == 0) scratch[warp_id] = v;
  __syncthreads();
  float total = lane_id < warps ? scratch[lane_id] : 0.0f;
  total = warp_sum(total);
  __syncthreads();
  return total;
}

// Where this thread sits in row_launch's layout: its row, and its index among the
// `row_threads` threads of that row.
struct RowThread {
  int32_t row;
  int32_t index;
};
FF_DEVICE RowThread row_thread(int32_t row_threads) {
  if (row_threads == 32) {
    return RowThread{int32_t(blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32),
                     int32_t(threadIdx.x % 32)};
  }
  return RowThread{int32_t(blockIdx.x), int32_t(threadIdx.x)};
}

// Sum over the threads of one row of row_launch's layout: a warp (no barrier: rows of a block
// are independent) or the block (through `scratch`, 32 floats of shared memory).
FF_DEVICE float row_sum(float v, int32_t row_threads, float* scratch) {
  return row_threads == 32 ? warp_sum(v) : block_sum(v, scratch);
}
#endif

// ---- launch shapes (host) --------------------------------------------------------------------

inline bool is_aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Whether rows of `width` elements of T with these leading dimensions, at these pointers, can
// be moved in 16-byte vectors: the width and every leading dimension a multiple of the vector,
// every pointer (null ones aside) 16-byte aligned.
template <class T>
bool vector_path(int32_t width, std::initializer_list<int64_t> leading_dims,
                 std::initializer_list<const void*> pointers) {
  if (width % kVecSize<T> != 0) return false;
  for (const int64_t ld : leading_dims) {
    if (ld % kVecSize<T> != 0) return false;
  }
  for (const void* p : pointers) {
    if (!is_aligned16(p)) return false;
  }
  return true;
}

// One thread group per row of `chunks` chunks: a warp (4 rows to a 128-thread block) while
// each lane holds at most kMaxRowSlots chunks, else a block of up to 1024 threads. `slots`
// (1, 2, 4 or 8) is how many chunks each thread holds; a row wider than 1024 x 8 chunks does
// not fit (`fits` false) and only suits kernels that loop over the row.
inline constexpr int32_t kMaxRowSlots = 8;
struct RowLaunch {
  int32_t row_threads;
  int32_t slots;
  unsigned grid, block;
  bool fits;
};
inline RowLaunch row_launch(int32_t rows, int32_t chunks) {
  const int32_t per_lane = (chunks + 31) / 32;
  if (per_lane <= kMaxRowSlots) {
    const int32_t slots = per_lane <= 1 ? 1 : per_lane <= 2 ? 2 : per_lane <= 4 ? 4 : 8;
    return RowLaunch{32, slots, unsigned((int64_t(rows) + 3) / 4), 128, true};
  }
  const int32_t threads = (chunks + 32 * kMaxRowSlots - 1) / (32 * kMaxRowSlots) * 32;
  const int32_t row_threads = threads < 1024 ? threads : 1024;
  return RowLaunch{row_threads, kMaxRowSlots, unsigned(rows), unsigned(row_threads),
                   threads <= 1024};
}

// Calls launch.template operator()<N>() for N = slots (1, 2, 4 or 8): the register-staged row
// kernels are instantiated for these four.
template <class Launch>
void with_slots(int32_t slots, Launch&& launch) {
  switch (slots) {
    case 1:
      launch.template operator()<1>();
      return;
    case 2:
      launch.template operator()<2>();
      return;
    case 4:
      launch.template operator()<4>();
      return;
    default:
      launch.template operator()<8>();
      return;
  }
}

// Element-wise kernels over [rows, chunks]: a block of tile_x x tile_y threads (about 256)
// covers tile_y rows; a row's chunks are strided by tile_x, a multiple of 32 chosen so each
// thread takes about the same number of chunks.
struct TileLaunch {
  unsigned grid;
  unsigned tile_x, tile_y;
};
inline TileLaunch tile_launch(int32_t rows, int32_t chunks) {
  const int32_t per_thread = (chunks + 255) / 256;
  const int32_t per_row = (chunks + per_thread - 1) / (per_thread < 1 ? 1 : per_thread);
  const unsigned tile_x = unsigned((per_row + 31) / 32 * 32 < 32 ? 32 : (per_row + 31) / 32 * 32);
  const unsigned tile_y = 256 / tile_x < 1 ? 1 : 256 / tile_x;
  return TileLaunch{unsigned((int64_t(rows) + tile_y - 1) / tile_y), tile_x, tile_y};
}

// Threads for a kernel that gives one block to each row of D columns: a multiple of 32,
// at most 256, about one thread per 4 columns.
inline unsigned row_block_size(int32_t D) {
  const unsigned threads = unsigned((D / 4 + 31) / 32 * 32);
  return threads < 32 ? 32 : (threads > 256 ? 256 : threads);
}

// Blocks for an element-wise kernel over `count` elements with `threads` per block.
inline unsigned grid_size(int64_t count, unsigned threads) {
  const int64_t blocks = (count + threads - 1) / threads;
  return unsigned(blocks < 1 ? 1 : (blocks > 65535 * 32 ? 65535 * 32 : blocks));
}

}  // namespace FF_KERNELS_ABI
}  // namespace fastformer::kernels
