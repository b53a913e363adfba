// The CUTLASS GEMMs of the CUDA engine (issue 48): C[M, N] (ldc) = gelu_erf(A[M, K] (lda)
// W[N, K]^T + bias[N]) in bfloat16 or float16 with float accumulation, bias and exact-erf GELU
// applied to the float accumulator in the epilogue, one rounding to the storage type, no pass
// of its own (cuBLASLt's GELU epilogue is the tanh form). sm_90a kernels (TMA, warp-specialised,
// wgmma) built from CUTLASS's headers (deploy/cutlass-headers.sh) when CMake is given
// FASTFORMER_CUTLASS_DIR and the architectures include 90; the list is empty otherwise, and
// Gemm (gemm_cublaslt.cc) keeps cuBLASLt plus the separate pass. Which kernel runs a shape is
// measured at its first run (Gemm's plan). Plain C++: no CUTLASS type crosses this header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "kernels/runtime.h"
#include "server/engine/cuda/gemm.h"

namespace fastformer::engine::cuda::FF_KERNELS_ABI {

struct CutlassGeluGemm {
  const char* name;  ///< e.g. "cutlass sm90a bf16 128x256x64 cooperative"
  StorageType type;  ///< kBF16 or kF16
  /// Launches on `stream`; "" when launched, else why this kernel cannot take the problem
  /// (alignment, workspace, a CUTLASS status), nothing launched.
  std::string (*run)(int64_t M, int64_t N, int64_t K, const void* a, int64_t lda, const void* w,
                     const void* bias, void* c, int64_t ldc, void* workspace,
                     size_t workspace_bytes, ff_stream_t stream);
};

// Every such kernel this build has (empty without CUTLASS).
std::span<const CutlassGeluGemm> cutlass_gelu_gemms();

}  // namespace fastformer::engine::cuda::FF_KERNELS_ABI
