// The CUTLASS sm_90a GEMM with bias + exact-erf GELU, bf16, 128x128x64 ping-pong
// (gelu_gemm_sm90.cuh).
#include "server/engine/cuda/cutlass/gelu_gemm_sm90.cuh"

namespace fastformer::engine::cuda::cutlass_sm90 {
FF_CUTLASS_GELU_GEMM(gelu_gemm_bf16_128x128_pingpong, cutlass::bfloat16_t, 128, 128, 64, 1, 1,
                     KernelTmaWarpSpecializedPingpong, TmaWarpSpecialized)
}  // namespace fastformer::engine::cuda::cutlass_sm90
