// Branch-free float exp, tanh and erf-GELU that the compiler can vectorise (std::exp,
// std::tanh and std::erf are scalar library calls, and the element-wise passes over
// [T, D] and [T, I] would otherwise cost as much as the GEMMs).
//
// Accuracy (float32): exp ~2 ulp on [-87, 88]; tanh and GELU absolute error below 3e-7,
// far inside the 1e-4 parity tolerance against the float64 reference.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__) && \
    !defined(__SANITIZE_THREAD__)
// One AVX2+FMA clone and a baseline one; the loader picks at start-up. (Not under the
// sanitizers: the picking function, an ifunc resolver, is instrumented too and runs during
// relocation, before the sanitizer's runtime is up; under TSan every binary crashed there.)
#define FASTFORMER_VECTOR_CLONES __attribute__((target_clones("arch=haswell", "default")))
#else
#define FASTFORMER_VECTOR_CLONES
#endif

namespace fastformer::engine::vmath {

inline float exp(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  // n = round(x / ln 2) by truncation after adding +-0.5 (std::floor is a library call
  // on baseline x86-64 and would stop vectorisation).
  // NaN passes the clamp above but must not reach the float -> int conversion (undefined
  // behaviour): n is 0 for it, and the NaN carries on through r into the result.
  const float t = x == x ? x * 1.44269504088896341f : 0.0f;
  const auto ni = static_cast<int32_t>(t + std::copysign(0.5f, t));
  const float n = static_cast<float>(ni);
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;  // x - n ln2, in two parts
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (ni + 127) << 23;  // 2^n
  return p * std::bit_cast<float>(bits);
}

inline float tanh(float x) {
  const float t = exp(-2.0f * std::fabs(x));
  return std::copysign((1.0f - t) / (1.0f + t), x);
}

// erfc(|z|) by Abramowitz & Stegun 7.1.26 (absolute error below 1.5e-7).
inline float erfc_abs(float z) {
  const float a = std::fabs(z);
  const float t = 1.0f / (1.0f + 0.3275911f * a);
  float p = 1.061405429f;
  p = p * t - 1.453152027f;
  p = p * t + 1.421413741f;
  p = p * t - 0.284496736f;
  p = p * t + 0.254829592f;
  return p * t * exp(-a * a);
}

// gelu(x) = 0.5 x (1 + erf(x / sqrt 2)), computed from erfc so large negative x keeps
// its relative precision.
inline float gelu_erf(float x) {
  const float c = erfc_abs(x * 0.70710678118654752f);
  return 0.5f * x * (x >= 0.0f ? 2.0f - c : c);
}

// gelu_new / gelu_pytorch_tanh: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
inline float gelu_tanh(float x) {
  return 0.5f * x * (1.0f + tanh(0.79788456080286536f * (x + 0.044715f * x * x * x)));
}

inline float silu(float x) { return x / (1.0f + exp(-x)); }

}  // namespace fastformer::engine::vmath
