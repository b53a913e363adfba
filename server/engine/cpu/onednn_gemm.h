// The CPU engine's GEMMs: oneDNN matmul primitives, created once per shape class (weight
// shape, leading dimensions, epilogue, dtype) and run with the row count given per call, so
// nothing is created on the hot path once the warm-up batch has passed through every layer.
//
// oneDNN picks its kernels by the CPU's instruction-set features (AVX2, AVX-512, AVX512_BF16,
// AMX), not by CPU model, so a CPU newer than the library still gets its fast kernels; the
// effective ISA is reported (cpu_gemm_info) and the speed checked at start-up
// (gemm_self_check).
//
// Both oneDNN 2.x (Debian 12) and 3.x (Ubuntu 24.04) build this file.
#pragma once

#include <compare>
#include <cstdint>
#include <memory>
#include <string>

#include "server/engine/ops.h"

namespace fastformer::engine {

// What oneDNN runs on this machine (honours ONEDNN_MAX_CPU_ISA).
struct CpuGemmInfo {
  std::string version;  ///< e.g. "2.6.3"
  std::string isa;      ///< the effective instruction set, e.g. "avx512_core_bf16"
  bool has_bf16 = false;  ///< AVX512_BF16 or AMX: bfloat16 matrix products in hardware
};
const CpuGemmInfo& cpu_gemm_info();

// A short single-threaded float32 GEMM timed against the floor expected for the ISA.
struct GemmSelfCheck {
  double gflops = 0;  ///< best of a few runs, one thread
  double floor_gflops = 0;
  std::string isa;
  std::string implementation;  ///< oneDNN's name for the kernel it chose
  bool below_floor() const { return gflops < floor_gflops; }
  // One line for the log: the figures, and when below the floor, the likely causes.
  std::string message() const;
};
GemmSelfCheck gemm_self_check();
// The single-threaded float32 GFLOP/s below which a CPU with `isa` is misbehaving (a
// fallback to generic kernels, a throttled or oversubscribed core): about a third of what
// such a core reaches.
double gemm_floor_gflops(const std::string& isa);

// C[m, n] (=|+=) A[m, k] W[n, k]^T (+ bias, activation), one primitive for every m.
class CpuMatmul {
 public:
  struct Shape {
    int64_t n = 0, k = 0;
    int64_t lda = 0, ldc = 0;  ///< leading dimensions of A and C, in elements
    Epilogue epilogue = Epilogue::kStore;
    Activation act = Activation::kGeluErf;  ///< for kBiasAct
    bool bf16 = false;  ///< W in bfloat16, A rounded to bfloat16; float32 accumulation and C
    auto operator<=>(const Shape&) const = default;
  };
  explicit CpuMatmul(const Shape& shape);  // throws EngineError if oneDNN has no kernel
  ~CpuMatmul();
  CpuMatmul(const CpuMatmul&) = delete;
  CpuMatmul& operator=(const CpuMatmul&) = delete;

  // Runs on the calling thread alone (the engine's pool splits the rows); safe to call from
  // several threads at once on disjoint rows. `w` is float32 or bfloat16 as the shape says.
  void run(int64_t m, const float* a, const void* w, const float* bias, float* c) const;

  const Shape& shape() const { return shape_; }
  std::string implementation() const;  ///< oneDNN's kernel name, e.g. "brg:avx512_core"

 private:
  struct Impl;
  Shape shape_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fastformer::engine
