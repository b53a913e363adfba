// Branch-free float exp and tanh that the compiler can vectorise (std::exp
// and std::tanh are scalar library calls, and the element-wise passes over
// [T, D] and [T, I] would otherwise cost as much as the GEMMs).
//
// Accuracy (float32): exp ~2 ulp on [-87, 88]; tanh absolute error below 3e-7 (2.75e-7 at
// worst over [-20, 20] in steps of 1e-5), far inside the 1e-4 parity tolerance against the
// float64 reference.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
// An AVX-512 clone (x86-64-v4), an AVX2+FMA one (x86-64-v3) and a baseline one; the loader
// picks by the CPU's features at start-up. (Not "arch=haswell": GCC picks such a clone by CPU
// model, so every AMD and every later Intel CPU ran the baseline SSE2 code.) (Not under the
// sanitizers: the picking function, an ifunc resolver, is instrumented too and runs during
// relocation, before the sanitizer's runtime is up; under TSan every binary crashed there.)
#define FASTFORMER_VECTOR_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define FASTFORMER_VECTOR_CLONES
#endif

namespace fastformer::engine::vmath {

// exp's range reduction and polynomial, for float and for the vector types of the row passes
// (vector_rows_common.h; one definition of the constants): ln 2 in two parts (x - n ln 2 stays
// exact), and e^r for |r| <= ln 2 / 2.
inline constexpr float kLn2High = 0.693359375f, kLn2Low = -2.12194440e-4f;
// (By reference, not returned: a vector return value changes the ABI between builds.)
template <class T>
[[gnu::always_inline]] inline void exp_polynomial(const T& r, T& p) {
  p = r * 1.9875691500e-4f + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
}

inline float exp(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  // n = round(x / ln 2) by truncation after adding +-0.5 (std::floor is a library call
  // on baseline x86-64 and would stop vectorisation).
  // NaN passes the clamp above but must not reach the float -> int conversion (undefined
  // behaviour): n is 0 for it, and the NaN carries on through r into the result.
  const float t = x == x ? x * 1.44269504088896341f : 0.0f;
  const auto ni = static_cast<int32_t>(t + std::copysign(0.5f, t));
  const float n = static_cast<float>(ni);
  const float r = (x - n * kLn2High) - n * kLn2Low;  // x - n ln2, in two parts
  const int32_t bits = (ni + 127) << 23;             // 2^n
  float p;
  exp_polynomial(r, p);
  return p * std::bit_cast<float>(bits);
}

// tanh as a rational function, x p(x^2) / q(x^2) (degrees 13 and 6; the coefficients are
// Eigen's fast float tanh), for float and the vector types: fewer operations than one through
// exp, and no range reduction. x must lie in [-kTanhClamp, kTanhClamp], where the function is
// within 3e-7 of tanh, and past which tanh rounds to +-1 in float to within that.
inline constexpr float kTanhClamp = 7.90531110763549805f;
template <class T>
[[gnu::always_inline]] inline void tanh_rational(const T& x, T& y) {
  const T x2 = x * x;
  T p = x2 * -2.76076847742355e-16f + 2.00018790482477e-13f;
  p = p * x2 + -8.60467152213735e-11f;
  p = p * x2 + 5.12229709037114e-08f;
  p = p * x2 + 1.48572235717979e-05f;
  p = p * x2 + 6.37261928875436e-04f;
  p = p * x2 + 4.89352455891786e-03f;
  T q = x2 * 1.19825839466702e-06f + 1.18534705686654e-04f;
  q = q * x2 + 2.26843463243900e-03f;
  q = q * x2 + 4.89352518554385e-03f;
  y = x * p / q;
}

inline float tanh(float x) {
  // (The comparisons, not std::clamp, so a NaN passes through.)
  x = x < -kTanhClamp ? -kTanhClamp : (x > kTanhClamp ? kTanhClamp : x);
  float y;
  tanh_rational(x, y);
  return y;
}

}  // namespace fastformer::engine::vmath
