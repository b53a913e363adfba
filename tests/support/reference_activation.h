// The model's activations in double, from their definitions (the tests' independent
// expectation for the engine's fused GEMM epilogues).
#pragma once

#include <cmath>

#include "server/engine/config.h"

namespace fastformer::test {

inline double reference_activation(double x, engine::Activation act) {
  switch (act) {
    case engine::Activation::kGeluErf:
      return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
    case engine::Activation::kGeluTanh:
      return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
    case engine::Activation::kRelu:
      return x > 0 ? x : 0.0;
    case engine::Activation::kSilu:
      return x / (1.0 + std::exp(-x));
  }
  return 0;
}

}  // namespace fastformer::test
