// bias_activation computes the feed-forward's first half in place (docs/design.md, "The model
// contract", line (12)): c = act(c + b), or c = c + b for the Linears without an activation
// (Q|K|s, the pooler's att_fc1, the classifier), or c = act(c) when the GEMM added the bias
// (bias null). The activation is a template argument, so the element loop has no branch;
// exact-erf GELU stays here because cuBLASLt's GELU epilogue is the tanh form.
// Element-wise over a [rows, cols] view with leading dimension ldc, tiled as common.cuh's
// tile_launch (a block covers a few rows; a thread strides along one):
//  - bias_activation_kernel: 16-byte loads and stores;
//  - bias_activation_scalar_kernel: one element at a time, for cols or ldc not a multiple of
//    the vector or a pointer that is not 16-byte aligned.
#include "kernels/instantiate.cuh"
#include "kernels/kernels.h"

namespace fastformer::kernels {
inline namespace FF_KERNELS_ABI {
namespace {

template <class T, int G, bool kApply, Act A>
FF_DEVICE void bias_activation_rows(T* c, int64_t ldc, const T* bias, int32_t rows, int32_t chunks) {
  const int32_t r = int32_t(blockIdx.x * blockDim.y + threadIdx.y);
  if (r >= rows) return;
  T* row = c + r * ldc;
  for (int32_t j = int32_t(threadIdx.x); j < chunks; j += int32_t(blockDim.x)) {
    float v[G];
    load_chunk<G>(row + j * G, v);
    if (bias != nullptr) {
      float b[G];
      load_chunk<G>(bias + j * G, b);
      FF_UNROLL for (int k = 0; k < G; ++k) v[k] += b[k];
    }
    if constexpr (kApply) {
      FF_UNROLL for (int k = 0; k < G; ++k) v[k] = activate<A>(v[k]);
    }
    store_chunk<G>(row + j * G, v);
  }
}

template <class T, bool kApply, Act A>
FF_GLOBAL void bias_activation_kernel(T* c, int64_t ldc, const T* bias, int32_t rows, int32_t chunks) {
  bias_activation_rows<T, kVecSize<T>, kApply, A>(c, ldc, bias, rows, chunks);
}

template <class T, bool kApply, Act A>
FF_GLOBAL void bias_activation_scalar_kernel(T* c, int64_t ldc, const T* bias, int32_t rows, int32_t cols) {
  bias_activation_rows<T, 1, kApply, A>(c, ldc, bias, rows, cols);
}

template <class T, bool kApply, Act A>
void launch_tiles(T* c, int64_t ldc, const T* bias, int32_t rows, int32_t cols, ff_stream_t stream) {
  if (vector_path<T>(cols, {ldc}, {c, bias})) {
    const int32_t chunks = cols / kVecSize<T>;
    const TileLaunch shape = tile_launch(rows, chunks);
    FF_LAUNCH((bias_activation_kernel<T, kApply, A>), dim3(shape.grid), dim3(shape.tile_x, shape.tile_y), 0, stream,
              c, ldc, bias, rows, chunks);
    return;
  }
  const TileLaunch shape = tile_launch(rows, cols);
  FF_LAUNCH((bias_activation_scalar_kernel<T, kApply, A>), dim3(shape.grid), dim3(shape.tile_x, shape.tile_y), 0,
            stream, c, ldc, bias, rows, cols);
}

}  // namespace

template <class T>
void launch_bias_activation(T* c, int64_t ldc, const T* bias, int32_t rows, int32_t cols, bool apply_act, Act act,
                            ff_stream_t stream) {
  if (rows == 0 || cols == 0 || (bias == nullptr && !apply_act)) return;
  if (!apply_act) return launch_tiles<T, false, Act::kGeluErf>(c, ldc, bias, rows, cols, stream);
  switch (act) {
    case Act::kGeluErf: return launch_tiles<T, true, Act::kGeluErf>(c, ldc, bias, rows, cols, stream);
    case Act::kGeluTanh: return launch_tiles<T, true, Act::kGeluTanh>(c, ldc, bias, rows, cols, stream);
    case Act::kRelu: return launch_tiles<T, true, Act::kRelu>(c, ldc, bias, rows, cols, stream);
    case Act::kSilu: return launch_tiles<T, true, Act::kSilu>(c, ldc, bias, rows, cols, stream);
  }
}

#define FF_BIAS_ACTIVATION(T) \
  template void launch_bias_activation<T>(T*, int64_t, const T*, int32_t, int32_t, bool, Act, ff_stream_t);
FF_INSTANTIATE_FOR_DTYPES(FF_BIAS_ACTIVATION)

}  // inline namespace FF_KERNELS_ABI
}  // namespace fastformer::kernels
