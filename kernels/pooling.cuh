// Device helpers of the pooling kernels (additive_pooling.cu, key_scores.cu): vector loads of
// VEC consecutive elements as floats, the warp maximum, and the host's choice of the vector
// width. Kept beside the pooling kernels rather than in common.cuh.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/common.cuh"
#include "kernels/runtime.h"

// `#pragma unroll n` and `__launch_bounds__` for nvcc (FF_UNROLL, common.cuh, is the plain
// unroll); the host compiler of the emulation knows neither.
#define FF_POOL_PRAGMA(x) _Pragma(#x)
#if defined(__CUDACC__)
#define FF_POOL_UNROLL_BY(n) FF_POOL_PRAGMA(unroll n)
#define FF_POOL_LAUNCH_BOUNDS(threads, blocks) __launch_bounds__(threads, blocks)
#else
#define FF_POOL_UNROLL_BY(n)
#define FF_POOL_LAUNCH_BOUNDS(threads, blocks)
#endif

namespace fastformer::kernels {
inline namespace FF_KERNELS_ABI {

#if defined(__CUDACC__) || defined(FF_EMULATION)
FF_DEVICE int32_t min_int(int32_t a, int32_t b) { return a < b ? a : b; }

FF_DEVICE float warp_max(float v) {
  for (int offset = 16; offset > 0; offset >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

#if !defined(FF_EMULATION)
template <int Bytes>
struct RawVector;
template <>
struct RawVector<16> {
  using type = uint4;
};
template <>
struct RawVector<8> {
  using type = uint2;
};
template <>
struct RawVector<4> {
  using type = unsigned;
};
template <>
struct RawVector<2> {
  using type = unsigned short;
};
#endif

// out[i] = p[i] for i < VEC, in one load of VEC * sizeof(T) bytes: `p` must be aligned to it
// (the emulation checks that).
template <int VEC, class T>
FF_DEVICE void load_vector(const T* p, float (&out)[VEC]) {
#if defined(FF_EMULATION)
  ::ff_emu::check_vector_alignment(p, VEC * sizeof(T), "load_vector");
  for (int i = 0; i < VEC; ++i) out[i] = to_float(p[i]);
#else
  using Raw = typename RawVector<int(VEC * sizeof(T))>::type;
  const Raw raw = *reinterpret_cast<const Raw*>(p);
  T elements[VEC];
  memcpy(elements, &raw, sizeof(raw));
  FF_UNROLL
  for (int i = 0; i < VEC; ++i) out[i] = to_float(elements[i]);
#endif
}
#endif

// The widest vector, in elements of T (16, 8, 4 bytes, else 1 element), in which rows of `ld`
// elements starting at `p` can be read from every column that is a multiple of `columns`.
template <class T>
inline int32_t vector_width(const T* p, int64_t ld, int32_t columns) {
  for (int32_t bytes : {16, 8, 4}) {
    const int32_t vec = bytes / int32_t(sizeof(T));
    if (vec > 1 && reinterpret_cast<uintptr_t>(p) % uintptr_t(bytes) == 0 && ld % vec == 0 &&
        columns % vec == 0)
      return vec;
  }
  return 1;
}

// Calls f(std::integral_constant<int, VEC>{}) for the vector width `vec` vector_width<T>
// returned, so a launch function instantiates its kernel for each width once.
template <class T, class F>
void with_vector_width(int32_t vec, F&& f) {
  constexpr int kWidest = 16 / int(sizeof(T));
  if (vec == kWidest) {
    f(std::integral_constant<int, kWidest>{});
  } else if (vec == kWidest / 2) {
    f(std::integral_constant<int, kWidest / 2>{});
  } else if (vec == kWidest / 4) {
    f(std::integral_constant<int, kWidest / 4>{});
  } else {
    f(std::integral_constant<int, 1>{});
  }
}

}  // namespace FF_KERNELS_ABI
}  // namespace fastformer::kernels
