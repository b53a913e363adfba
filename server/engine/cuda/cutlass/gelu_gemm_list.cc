// The CUTLASS GEMMs this build has (gemm_cutlass.h): compiled when CMake finds CUTLASS's
// headers and builds for sm_90; gemm_cutlass_none.cc answers an empty list otherwise.
#include <cuda_runtime.h>

#include "server/engine/cuda/gemm_cutlass.h"

namespace fastformer::engine::cuda::cutlass_sm90 {
std::string gelu_gemm_bf16_128x256_cooperative(int64_t, int64_t, int64_t, const void*, int64_t,
                                               const void*, const void*, void*, int64_t, void*,
                                               size_t, cudaStream_t);
std::string gelu_gemm_bf16_128x128_pingpong(int64_t, int64_t, int64_t, const void*, int64_t,
                                            const void*, const void*, void*, int64_t, void*, size_t,
                                            cudaStream_t);
std::string gelu_gemm_f16_128x256_cooperative(int64_t, int64_t, int64_t, const void*, int64_t,
                                              const void*, const void*, void*, int64_t, void*,
                                              size_t, cudaStream_t);
std::string gelu_gemm_f16_128x128_pingpong(int64_t, int64_t, int64_t, const void*, int64_t,
                                           const void*, const void*, void*, int64_t, void*, size_t,
                                           cudaStream_t);
}  // namespace fastformer::engine::cuda::cutlass_sm90

namespace fastformer::engine::cuda::FF_KERNELS_ABI {

std::span<const CutlassGeluGemm> cutlass_gelu_gemms() {
  static const CutlassGeluGemm kGemms[] = {
      {"cutlass sm90a bf16 128x256x64 cooperative, cluster 1x2", StorageType::kBF16,
       cutlass_sm90::gelu_gemm_bf16_128x256_cooperative},
      {"cutlass sm90a bf16 128x128x64 ping-pong", StorageType::kBF16,
       cutlass_sm90::gelu_gemm_bf16_128x128_pingpong},
      {"cutlass sm90a f16 128x256x64 cooperative, cluster 1x2", StorageType::kF16,
       cutlass_sm90::gelu_gemm_f16_128x256_cooperative},
      {"cutlass sm90a f16 128x128x64 ping-pong", StorageType::kF16,
       cutlass_sm90::gelu_gemm_f16_128x128_pingpong},
  };
  return kGemms;
}

}  // namespace fastformer::engine::cuda::FF_KERNELS_ABI
