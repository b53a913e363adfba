// Seeded random test inputs, the same values for a seed on every machine (std::mt19937's sequence
// is fixed by the standard; the distributions are libstdc++'s).
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace fastformer::test {

// n values of a normal distribution with mean 0 and standard deviation `scale`.
inline std::vector<float> random_values(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = normal(rng);
  return v;
}

// n values uniform in [lo, hi).
inline std::vector<float> random_floats(size_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

}  // namespace fastformer::test
