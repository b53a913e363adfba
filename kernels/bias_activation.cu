// bias_activation_kernel computes the feed-forward's first half in place (docs/design.md,
// "The model contract", line (12)): c = act(c + b), or c = c + b for the
// Linears without an activation (Q|K|s, the pooler's att_fc1, the classifier).
// Element-wise over a [rows, cols] view with leading dimension ldc; a grid-stride loop.
// When cols and ldc are multiples of 4 each thread moves 4 elements with one vector load
// and store (load_float4 / store_float4): the pass is memory-bound.
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

template <class T>
FF_GLOBAL void bias_activation_vec4_kernel(T* c, int64_t ldc, const T* bias, int32_t rows, int32_t cols,
                                           bool apply_act, Act act) {
  const int32_t quads = cols / 4;
  const int64_t count = int64_t(rows) * quads;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / quads, j = (i % quads) * 4;
    T* p = c + r * ldc + j;
    ff_float4 v = load_float4(p);
    const ff_float4 b = load_float4(bias + j);
    v.x += b.x;
    v.y += b.y;
    v.z += b.z;
    v.w += b.w;
    if (apply_act) {
      v.x = activate(v.x, act);
      v.y = activate(v.y, act);
      v.z = activate(v.z, act);
      v.w = activate(v.w, act);
    }
    store_float4(p, v);
  }
}

}  // namespace

template <class T>
void launch_bias_activation(T* c, int64_t ldc, const T* bias, int32_t rows, int32_t cols, bool apply_act, Act act,
                            ff_stream_t stream) {
  if (rows == 0 || cols == 0) return;
  const unsigned threads = 256;
  const bool aligned = reinterpret_cast<uintptr_t>(c) % (4 * sizeof(T)) == 0 &&
                       reinterpret_cast<uintptr_t>(bias) % (4 * sizeof(T)) == 0;
  if (cols % 4 == 0 && ldc % 4 == 0 && aligned) {
    FF_LAUNCH(bias_activation_vec4_kernel<T>, dim3(grid_size(int64_t(rows) * (cols / 4), threads)), dim3(threads), 0,
              stream, c, ldc, bias, rows, cols, apply_act, act);
    return;
  }
  FF_LAUNCH(bias_activation_kernel<T>, dim3(grid_size(int64_t(rows) * cols, threads)), dim3(threads), 0, stream, c,
            ldc, bias, rows, cols, apply_act, act);
}

#define FF_BIAS_ACTIVATION(T) \
  template void launch_bias_activation<T>(T*, int64_t, const T*, int32_t, int32_t, bool, Act, ff_stream_t);
FF_INSTANTIATE_FOR_DTYPES(FF_BIAS_ACTIVATION)

}  // inline namespace FF_KERNELS_ABI
}  // namespace fastformer::kernels
