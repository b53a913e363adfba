// bias_activation_kernel computes the feed-forward's first half in place (DESIGN.md
// section 1, "X' = LN2( act(X1 Wi^T + bi) ...)"): c = act(c + b), or c = c + b for the
// Linears without an activation (Q|K|s, the pooler's att_fc1, the classifier).
// Element-wise over a [rows, cols] view with leading dimension ldc; a grid-stride loop.
#include "kernels/instantiate.cuh"
#include "kernels/kernels.h"

namespace fastformer::kernels {
inline namespace FF_KERNELS_ABI {
namespace {

template <class T>
FF_GLOBAL void bias_activation_kernel(T* c, int64_t ldc, const T* bias, int32_t rows, int32_t cols, bool apply_act,
                                      Act act) {
  const int64_t count = int64_t(rows) * cols;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, j = i % cols;
    T* p = c + r * ldc + j;
    const float v = to_float(*p) + to_float(bias[j]);
    *p = from_float<T>(apply_act ? activate(v, act) : v);
  }
}

}  // namespace

template <class T>
void launch_bias_activation(T* c, int64_t ldc, const T* bias, int32_t rows, int32_t cols, bool apply_act, Act act,
                            ff_stream_t stream) {
  if (rows == 0 || cols == 0) return;
  const unsigned threads = 256;
  FF_LAUNCH(bias_activation_kernel<T>, dim3(grid_size(int64_t(rows) * cols, threads)), dim3(threads), 0, stream, c,
            ldc, bias, rows, cols, apply_act, act);
}

#define FF_BIAS_ACTIVATION(T) \
  template void launch_bias_activation<T>(T*, int64_t, const T*, int32_t, int32_t, bool, Act, ff_stream_t);
FF_INSTANTIATE_FOR_DTYPES(FF_BIAS_ACTIVATION)

}  // inline namespace FF_KERNELS_ABI
}  // namespace fastformer::kernels
