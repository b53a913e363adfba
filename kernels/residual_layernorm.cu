// bias_residual_layernorm computes the two post-norms of a layer (docs/design.md, "The model
// contract", lines (11) and (13)): X1 = LN1( A Wo^T + bo + X ) and X' = LN2( F Wf^T + bf + X1 ),
// given the GEMM output c = A Wo^T (or F Wf^T; a null bias when the GEMM added it already).
// One warp per row for hidden sizes up to 32 x 8 vectors, else a block (common.cuh, "row
// kernels"); the LayerNorm is layernorm.cuh's, so `out` may alias `residual` (the hidden state
// is updated in place).
//  - bias_residual_layernorm_kernel: 16-byte loads and stores, the row held in registers;
//  - bias_residual_layernorm_scalar_kernel: one element at a time, for a width or a leading
//    dimension that is not a multiple of the vector, or a pointer that is not 16-byte aligned.
#include "kernels/instantiate.cuh"
#include "kernels/kernels.h"
#include "kernels/layernorm.cuh"

namespace fastformer::kernels {
inline namespace FF_KERNELS_ABI {
namespace {

template <class T, int G, int N>
FF_DEVICE void bias_residual_layernorm_row(const T* c, int64_t ldc, const T* bias,
                                           const T* residual, int64_t ld_residual, const T* gamma,
                                           const T* beta, float eps, int32_t rows, int32_t D,
                                           int32_t row_threads, T* out, int64_t ld_out) {
  FF_SHARED(float, scratch, 32);
  const RowThread thread = row_thread(row_threads);
  if (thread.row >= rows) return;  // a whole warp: the last block's spare rows
  const T* c_row = c + thread.row * ldc;
  const T* residual_row = residual + thread.row * ld_residual;
  auto load = [&](int32_t j, float* v) {
    float r[G];
    load_chunk<G>(c_row + j * G, v);
    load_chunk<G>(residual_row + j * G, r);
    if (bias != nullptr) {
      float b[G];
      load_chunk<G>(bias + j * G, b);
      FF_UNROLL for (int k = 0; k < G; ++k) v[k] += b[k];
    }
    FF_UNROLL for (int k = 0; k < G; ++k) v[k] += r[k];
  };
  layernorm_row<G, N>(thread, row_threads, D, load, gamma, beta, eps, out + thread.row * ld_out,
                      scratch);
}

template <class T, int N>
FF_GLOBAL void bias_residual_layernorm_kernel(const T* c, int64_t ldc, const T* bias,
                                              const T* residual, int64_t ld_residual,
                                              const T* gamma, const T* beta, float eps,
                                              int32_t rows, int32_t D, int32_t row_threads, T* out,
                                              int64_t ld_out) {
  bias_residual_layernorm_row<T, kVecSize<T>, N>(c, ldc, bias, residual, ld_residual, gamma, beta,
                                                 eps, rows, D, row_threads, out, ld_out);
}

template <class T>
FF_GLOBAL void bias_residual_layernorm_scalar_kernel(const T* c, int64_t ldc, const T* bias,
                                                     const T* residual, int64_t ld_residual,
                                                     const T* gamma, const T* beta, float eps,
                                                     int32_t rows, int32_t D, int32_t row_threads,
                                                     T* out, int64_t ld_out) {
  bias_residual_layernorm_row<T, 1, kLoopOverRow>(c, ldc, bias, residual, ld_residual, gamma, beta,
                                                  eps, rows, D, row_threads, out, ld_out);
}

}  // namespace

template <class T>
void launch_bias_residual_layernorm(const T* c, int64_t ldc, const T* bias, const T* residual,
                                    int64_t ld_residual, const T* gamma, const T* beta, float eps,
                                    int32_t rows, int32_t D, T* out, int64_t ld_out,
                                    ff_stream_t stream) {
  if (rows == 0) return;
  if (vector_path<T>(D, {ldc, ld_residual, ld_out}, {c, bias, residual, gamma, beta, out})) {
    const RowLaunch shape = row_launch(rows, D / kVecSize<T>);
    if (shape.fits) {
      with_slots(shape.slots, [&]<int N>() {
        FF_LAUNCH((bias_residual_layernorm_kernel<T, N>), dim3(shape.grid), dim3(shape.block), 0,
                  stream, c, ldc, bias, residual, ld_residual, gamma, beta, eps, rows, D,
                  shape.row_threads, out, ld_out);
      });
      return;
    }
  }
  const RowLaunch shape = row_launch(rows, D);
  FF_LAUNCH(bias_residual_layernorm_scalar_kernel<T>, dim3(shape.grid), dim3(shape.block), 0,
            stream, c, ldc, bias, residual, ld_residual, gamma, beta, eps, rows, D,
            shape.row_threads, out, ld_out);
}

#define FF_RESIDUAL_LAYERNORM(T)                                                                   \
  template void launch_bias_residual_layernorm<T>(const T*, int64_t, const T*, const T*, int64_t,  \
                                                  const T*, const T*, float, int32_t, int32_t, T*, \
                                                  int64_t, ff_stream_t);
FF_INSTANTIATE_FOR_DTYPES(FF_RESIDUAL_LAYERNORM)

}  // namespace FF_KERNELS_ABI
}  // namespace fastformer::kernels
