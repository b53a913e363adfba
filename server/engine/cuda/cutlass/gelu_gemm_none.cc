// A build without CUTLASS's headers or without sm_90: no CUTLASS GEMM (gemm_cutlass.h).
#include "server/engine/cuda/gemm_cutlass.h"

namespace fastformer::engine::cuda::FF_KERNELS_ABI {

std::span<const CutlassGeluGemm> cutlass_gelu_gemms() { return {}; }

}  // namespace fastformer::engine::cuda::FF_KERNELS_ABI
