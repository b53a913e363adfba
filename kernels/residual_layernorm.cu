// bias_residual_layernorm_kernel computes the two post-norms of a layer (docs/design.md,
// "The model contract", lines (11) and (13)): X1 = LN1( A Wo^T + bo + X ) and
// X' = LN2( F Wf^T + bf + X1 ), given the GEMM output c = A Wo^T (or F Wf^T). One block per row; the row is staged in shared memory
// before any output is written, so `out` may alias `residual` (the hidden state is
// updated in place).
#include "kernels/instantiate.cuh"
#include "kernels/kernels.h"

namespace fastformer::kernels {
inline namespace FF_KERNELS_ABI {
namespace {

template <class T>
FF_GLOBAL void bias_residual_layernorm_kernel(const T* c, int64_t ldc, const T* bias, const T* residual,
                                              int64_t ld_residual, const T* gamma, const T* beta, float eps,
                                              int32_t D, T* out, int64_t ld_out) {
  FF_DYNAMIC_SHARED(float, row);  // [D]
  FF_SHARED(float, scratch, 32);
  const int64_t r = blockIdx.x;
  float sum = 0.0f;
  for (int32_t j = threadIdx.x; j < D; j += blockDim.x) {
    const float v = to_float(c[r * ldc + j]) + to_float(bias[j]) + to_float(residual[r * ld_residual + j]);
    row[j] = v;
    sum += v;
  }
  const float mean = block_sum(sum, scratch) / float(D);  // its barrier also orders reads before writes
  float sq = 0.0f;
  for (int32_t j = threadIdx.x; j < D; j += blockDim.x) sq += (row[j] - mean) * (row[j] - mean);
  const float rstd = rsqrtf(block_sum(sq, scratch) / float(D) + eps);
  for (int32_t j = threadIdx.x; j < D; j += blockDim.x) {
    out[r * ld_out + j] = from_float<T>((row[j] - mean) * rstd * to_float(gamma[j]) + to_float(beta[j]));
  }
}

}  // namespace

template <class T>
void launch_bias_residual_layernorm(const T* c, int64_t ldc, const T* bias, const T* residual, int64_t ld_residual,
                                    const T* gamma, const T* beta, float eps, int32_t rows, int32_t D, T* out,
                                    int64_t ld_out, ff_stream_t stream) {
  if (rows == 0) return;
  FF_LAUNCH(bias_residual_layernorm_kernel<T>, dim3(unsigned(rows)), dim3(row_block_size(D)),
            size_t(D) * sizeof(float), stream, c, ldc, bias, residual, ld_residual, gamma, beta, eps, D, out, ld_out);
}

#define FF_RESIDUAL_LAYERNORM(T)                                                                              \
  template void launch_bias_residual_layernorm<T>(const T*, int64_t, const T*, const T*, int64_t, const T*,     \
                                                  const T*, float, int32_t, int32_t, T*, int64_t, ff_stream_t);
FF_INSTANTIATE_FOR_DTYPES(FF_RESIDUAL_LAYERNORM)

}  // inline namespace FF_KERNELS_ABI
}  // namespace fastformer::kernels
