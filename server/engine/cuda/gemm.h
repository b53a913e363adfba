// C = A W^T (+ C) for every Linear of the model, row-major, in the serving dtype with float
// accumulation: cuBLASLt in CUDA builds (TF32 only when allowed), the CPU engine's oneDNN
// float32 matmul under the host emulation ("GEMMs served by the CPU path").
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "kernels/runtime.h"

namespace fastformer::engine::cuda::FF_KERNELS_ABI {

enum class StorageType { kF32, kF16, kBF16 };

// The device workspace cuBLASLt may use per GEMM (counted in device_memory() in every build).
inline constexpr size_t kGemmWorkspaceBytes = 32u << 20;

class Gemm {
 public:
  Gemm(StorageType type, bool allow_tf32, ff_stream_t stream);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // c[M, N] (ldc) = a[M, K] (lda) w[N, K]^T, plus c when `accumulate`.
  void run(const void* a, int64_t lda, const void* w, int64_t M, int64_t N, int64_t K, void* c, int64_t ldc,
           bool accumulate);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fastformer::engine::cuda::FF_KERNELS_ABI
