// The CUTLASS sm_90a GEMM with bias + exact-erf GELU, f16, 128x256x64 cooperative, cluster 1x2
// (gelu_gemm_sm90.cuh).
#include "server/engine/cuda/cutlass/gelu_gemm_sm90.cuh"

namespace fastformer::engine::cuda::cutlass_sm90 {
FF_CUTLASS_GELU_GEMM(gelu_gemm_f16_128x256_cooperative, cutlass::half_t, 128, 256, 64, 1, 2,
                     KernelTmaWarpSpecializedCooperative, TmaWarpSpecializedCooperative)
}  // namespace fastformer::engine::cuda::cutlass_sm90
