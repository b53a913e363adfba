// bias_activation computes the feed-forward's first half in place (docs/design.md, "The model
// contract", line (12)): c = act(c + b), or c = c + b for the Linears without an activation
// (Q|K|s, the pooler's att_fc1, the classifier), or c = act(c) when the GEMM added the bias
// (bias null). The activation is a template argument, so the element loop has no branch;
// exact-erf GELU stays here because cuBLASLt's GELU epilogue is the tanh form.
// Element-wise over a [rows, cols] view with leading dimension ldc, tiled as common.cuh's
// tile_launch (a block covers a few rows; a thread strides along one):
//  - bias_activation_kernel: 16-byte loads and stores (the columns past the last whole vector
//    one at a time);
//  - bias_activation_scalar_kernel: one element at a time, for ldc not a multiple of the
//    vector or a pointer that is not 16-byte aligned.
#include "kernels/instantiate.cuh"
#include "kernels/kernels.h"

namespace fastformer::kernels {
inline namespace FF_KERNELS_ABI {
namespace {

// G columns at p (bias: the bias of those columns, or null).
template <int G, bool kApply, Act A, class T>
FF_DEVICE void bias_activate(T* p, const T* bias) {
  float v[G];
  load_chunk<G>(p, v);
  if (bias != nullptr) {
    float b[G];
    load_chunk<G>(bias, b);
    FF_UNROLL for (int k = 0; k < G; ++k) v[k] += b[k];
  }
  if constexpr (kApply) {
    FF_UNROLL for (int k = 0; k < G; ++k) v[k] = activate<A>(v[k]);
  }
  store_chunk<G>(p, v);
}

// `chunks` chunks of G columns per row, then `tail` (< G) single columns.
template <class T, int G, bool kApply, Act A>
FF_DEVICE void bias_activation_rows(T* c, int64_t ldc, const T* bias, int32_t rows, int32_t chunks,
                                    int32_t tail) {
  const int32_t r = int32_t(blockIdx.x * blockDim.y + threadIdx.y);
  if (r >= rows) return;
  T* row = c + r * ldc;
  for (int32_t j = int32_t(threadIdx.x); j < chunks; j += int32_t(blockDim.x)) {
    bias_activate<G, kApply, A>(row + j * G, bias != nullptr ? bias + j * G : nullptr);
  }
  if (const int32_t j = chunks * G + int32_t(threadIdx.x); int32_t(threadIdx.x) < tail) {
    bias_activate<1, kApply, A>(row + j, bias != nullptr ? bias + j : nullptr);
  }
}

template <class T, bool kApply, Act A>
FF_GLOBAL void bias_activation_kernel(T* c, int64_t ldc, const T* bias, int32_t rows,
                                      int32_t chunks, int32_t tail) {
  bias_activation_rows<T, kVecSize<T>, kApply, A>(c, ldc, bias, rows, chunks, tail);
}

template <class T, bool kApply, Act A>
FF_GLOBAL void bias_activation_scalar_kernel(T* c, int64_t ldc, const T* bias, int32_t rows,
                                             int32_t cols) {
  bias_activation_rows<T, 1, kApply, A>(c, ldc, bias, rows, cols, 0);
}

template <class T, bool kApply, Act A>
void launch_tiles(T* c, int64_t ldc, const T* bias, int32_t rows, int32_t cols,
                  ff_stream_t stream) {
  // Vectors need aligned rows, not a whole number of them: a width such as Q|K|s's 1,548 in a
  // row padded to 1,552 ends with a few single columns.
  const int32_t chunks = cols / kVecSize<T>, tail = cols % kVecSize<T>;
  if (vector_path<T>(cols - tail, {ldc}, {c, bias})) {
    const TileLaunch shape = tile_launch(rows, chunks + (tail > 0));
    FF_LAUNCH((bias_activation_kernel<T, kApply, A>), dim3(shape.grid),
              dim3(shape.tile_x, shape.tile_y), 0, stream, c, ldc, bias, rows, chunks, tail);
    return;
  }
  const TileLaunch shape = tile_launch(rows, cols);
  FF_LAUNCH((bias_activation_scalar_kernel<T, kApply, A>), dim3(shape.grid),
            dim3(shape.tile_x, shape.tile_y), 0, stream, c, ldc, bias, rows, cols);
}

}  // namespace

template <class T>
void launch_bias_activation(T* c, int64_t ldc, const T* bias, int32_t rows, int32_t cols,
                            bool apply_act, Act act, ff_stream_t stream) {
  if (rows == 0 || cols == 0 || (bias == nullptr && !apply_act)) return;
  if (!apply_act) return launch_tiles<T, false, Act::kGeluErf>(c, ldc, bias, rows, cols, stream);
  switch (act) {
    case Act::kGeluErf:
      return launch_tiles<T, true, Act::kGeluErf>(c, ldc, bias, rows, cols, stream);
    case Act::kGeluTanh:
      return launch_tiles<T, true, Act::kGeluTanh>(c, ldc, bias, rows, cols, stream);
    case Act::kRelu:
      return launch_tiles<T, true, Act::kRelu>(c, ldc, bias, rows, cols, stream);
    case Act::kSilu:
      return launch_tiles<T, true, Act::kSilu>(c, ldc, bias, rows, cols, stream);
  }
}

#define FF_BIAS_ACTIVATION(T)                                                                 \
  template void launch_bias_activation<T>(T*, int64_t, const T*, int32_t, int32_t, bool, Act, \
                                          ff_stream_t);
FF_INSTANTIATE_FOR_DTYPES(FF_BIAS_ACTIVATION)

}  // namespace FF_KERNELS_ABI
}  // namespace fastformer::kernels
