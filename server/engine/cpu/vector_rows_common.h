// The shared layer of the CPU row passes (vector_rows.h), included only by their files
// (vector_rows_*.cc, one per kernel family): the vector types of the three builds, loads and
// stores of float32 and bfloat16 rows, and FF_BUILDS, which compiles a family's template once
// per build (AVX-512, AVX2 with FMA, baseline x86-64, each with an explicit target attribute)
// and defines the public function that switches on the Isa to run. Everything here is in an
// unnamed namespace and always inlined: each file gets its own copies, as when the families
// shared one file. The files are compiled with -ffp-contract=fast (server/engine/CMakeLists.txt).
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <utility>

#include "server/engine/cpu/vector_rows.h"

namespace fastformer::engine::rows {
namespace {

// The vector types of the three builds (GCC and Clang vector extensions): the key-score kernel
// is written over them; the other passes are plain loops the compiler vectorises for each
// build's target.
using v16f = float __attribute__((vector_size(64)));
using v8f = float __attribute__((vector_size(32)));
using v4f = float __attribute__((vector_size(16)));

#define FF_INLINE [[gnu::always_inline]] inline

FF_INLINE float ld(const float* p, int64_t j) { return p[j]; }
FF_INLINE float ld(const uint16_t* p, int64_t j) {
  return std::bit_cast<float>(uint32_t(p[j]) << 16);
}
FF_INLINE void st(float* p, int64_t j, float v) { p[j] = v; }
// common/half.h's float_to_bfloat16 (round to nearest even, NaN kept quiet), branch-free.
FF_INLINE void st(uint16_t* p, int64_t j, float v) {
  const uint32_t x = std::bit_cast<uint32_t>(v);
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  const uint32_t nan = (x >> 16) | 0x40u;
  p[j] = static_cast<uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

// The integer vectors of the same lane count: bfloat16 lanes are widened to float32 in
// registers (zero-extend to 32 bits, shift left by 16).
template <class V>
struct Lanes;
template <>
struct Lanes<v16f> {
  using u16 = uint16_t __attribute__((vector_size(32)));
  using u32 = uint32_t __attribute__((vector_size(64)));
  using i32 = int32_t __attribute__((vector_size(64)));
};
template <>
struct Lanes<v8f> {
  using u16 = uint16_t __attribute__((vector_size(16)));
  using u32 = uint32_t __attribute__((vector_size(32)));
  using i32 = int32_t __attribute__((vector_size(32)));
};
template <>
struct Lanes<v4f> {
  using u16 = uint16_t __attribute__((vector_size(8)));
  using u32 = uint32_t __attribute__((vector_size(16)));
  using i32 = int32_t __attribute__((vector_size(16)));
};

// (By reference, not returned: a vector return value changes the ABI between the builds.)
template <class V>
FF_INLINE void loadv(V& v, const float* p) {
  std::memcpy(&v, p, sizeof(V));
}
// Each bfloat16 lane paired with a zero below it: (0, h[i]) as 16-bit halves is h[i] << 16 as
// a little-endian 32-bit lane, the float32 it denotes (one interleave; a zero-extend and a
// shift come out as four instructions for 16 lanes in GCC).
template <class U16, size_t... I>
FF_INLINE void interleave_zero(const U16& half, void* out, std::index_sequence<I...>) {
  constexpr int L = sizeof(U16) / sizeof(uint16_t);
  const U16 zero = {};
  const auto wide = __builtin_shufflevector(zero, half, (I % 2 ? L + int(I / 2) : int(I / 2))...);
  std::memcpy(out, &wide, sizeof(wide));
}
template <class V>
FF_INLINE void loadv(V& v, const uint16_t* p) {
  typename Lanes<V>::u16 half;
  std::memcpy(&half, p, sizeof(half));
  interleave_zero(half, &v, std::make_index_sequence<2 * sizeof(V) / sizeof(float)>{});
}
template <class V>
FF_INLINE void storev(float* p, const V& v) {
  std::memcpy(p, &v, sizeof(V));
}

// The sum of a vector's lanes, by halves.
FF_INLINE float hsum(const v4f& v) { return (v[0] + v[2]) + (v[1] + v[3]); }
FF_INLINE float hsum(const v8f& v) {
  const v4f half =
      __builtin_shufflevector(v, v, 0, 1, 2, 3) + __builtin_shufflevector(v, v, 4, 5, 6, 7);
  return hsum(half);
}
FF_INLINE float hsum(const v16f& v) {
  const v8f half = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                   __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  return hsum(half);
}

// Stores a float vector as bfloat16, rounded to nearest even (NaN kept quiet), as st() does.
template <class V>
FF_INLINE void storev(uint16_t* p, const V& v) {
  using U = typename Lanes<V>::u32;
  U x;
  std::memcpy(&x, &v, sizeof(V));
  const U rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  const U nan = (x >> 16) | 0x40u;
  const U bits = (x & 0x7fffffffu) > 0x7f800000u ? nan : rounded;
  const typename Lanes<V>::u16 half = __builtin_convertvector(bits, typename Lanes<V>::u16);
  std::memcpy(p, &half, sizeof(half));
}

template <class V, class E>
FF_INLINE void scale_impl(const E* x, const float* scale, int64_t n, E* out) {
  constexpr int L = sizeof(V) / sizeof(float);
  const int64_t nv = n - n % L;
  for (int64_t j = 0; j < nv; j += L) {
    V a, b;
    loadv(a, x + j);
    loadv(b, scale + j);
    storev(out + j, a * b);
  }
  for (int64_t j = nv; j < n; ++j) st(out, j, ld(x, j) * scale[j]);
}

}  // namespace

// Three builds of each function: NAME_avx512, NAME_avx2 and NAME_baseline, each IMPL<vector>.
#if defined(__x86_64__)
// GCC vectorises AVX-512 loops 256 bits wide unless told (its tuning for the first AVX-512
// CPUs, which clocked down on 512-bit instructions): these passes want the full width.
#if defined(__clang__)
#define FF_TARGET_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,bmi,bmi2,f16c")))
#else
#define FF_TARGET_AVX512                                                  \
  __attribute__((                                                         \
      target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,bmi,bmi2,f16c," \
             "prefer-vector-width=512")))
#endif
#define FF_TARGET_AVX2 __attribute__((target("avx2,fma,bmi,bmi2,f16c")))
#else
#define FF_TARGET_AVX512
#define FF_TARGET_AVX2
#endif
#define FF_BUILDS(RET, NAME, PARAMS, IMPL, ARGS)                        \
  namespace {                                                           \
  FF_TARGET_AVX512 RET NAME##_avx512 PARAMS { return IMPL<v16f> ARGS; } \
  FF_TARGET_AVX2 RET NAME##_avx2 PARAMS { return IMPL<v8f> ARGS; }      \
  RET NAME##_baseline PARAMS { return IMPL<v4f> ARGS; }                 \
  }                                                                     \
  RET NAME(Isa isa, FF_UNPAREN PARAMS) {                                \
    switch (isa) {                                                      \
      case Isa::kAvx512:                                                \
        return NAME##_avx512 ARGS;                                      \
      case Isa::kAvx2:                                                  \
        return NAME##_avx2 ARGS;                                        \
      case Isa::kBaseline:                                              \
        break;                                                          \
    }                                                                   \
    return NAME##_baseline ARGS;                                        \
  }
#define FF_UNPAREN(...) __VA_ARGS__

}  // namespace fastformer::engine::rows
