// bias_activation computes the feed-forward's first half in place (docs/design.md, "The model
// contract", line (12)): c = act(c + b), or c = c + b for the Linears without an activation
// (Q|K|s, the pooler's att_fc1, the classifier), or c = act(c) when the GEMM added the bias
// (bias null). The activation is a template argument, so the element loop has no branch;
// exact-erf GELU stays here because cuBLASLt's GELU epilogue is the tanh form.
// Element-wise over a [rows, cols] view with leading dimension ldc, tiled as common.cuh's
// tile_launch (a block covers a few rows; a thread strides along one, kUnroll chunks at a time):
//  - bias_activation_kernel: 16-byte loads and stores (the columns past the last whole vector
//    one at a time);
//  - bias_activation_scalar_kernel: one element at a time, for ldc not a multiple of the
//    vector or a pointer that is not 16-byte aligned.
#include "kernels/instantiate.cuh"
#include "kernels/kernels.h"

namespace fastformer::kernels {
inline namespace FF_KERNELS_ABI {
namespace {

// `chunks` chunks of G columns per row, then `tail` (< G) single columns. A thread takes its
// chunks kUnroll at a time: every load of the group is issued before the first store, so
// kUnroll 16-byte loads are in flight per thread, not one (a store to c could alias the next
// load as far as the compiler knows, which serialised them).
constexpr int32_t kUnroll = 4;
template <class T, int G, bool kApply, Act A>
FF_DEVICE void bias_activation_rows(T* c, int64_t ldc, const T* bias, int32_t rows, int32_t chunks,
                                    int32_t tail) {
  const int32_t r = int32_t(blockIdx.x * blockDim.y + threadIdx.y);
  if (r >= rows) return;
  T* row = c + r * ldc;
  const int32_t step = int32_t(blockDim.x);
  for (int32_t base = int32_t(threadIdx.x); base < chunks; base += kUnroll * step) {
    float v[kUnroll][G] = {};  // (zeroed: GCC cannot see that the stores read only the loaded ones)
    FF_UNROLL for (int32_t u = 0; u < kUnroll; ++u) {
      const int32_t j = base + u * step;
      if (j >= chunks) break;
      load_chunk<G>(row + j * G, v[u]);
      if (bias != nullptr) {
        float b[G];
        load_chunk<G>(bias + j * G, b);
        FF_UNROLL for (int k = 0; k < G; ++k) v[u][k] += b[k];
      }
    }
    FF_UNROLL for (int32_t u = 0; u < kUnroll; ++u) {
      const int32_t j = base + u * step;
      if (j >= chunks) break;
      if constexpr (kApply) {
        FF_UNROLL for (int k = 0; k < G; ++k) v[u][k] = activate<A>(v[u][k]);
      }
      store_chunk<G>(row + j * G, v[u]);
    }
  }
  if (const int32_t j = chunks * G + int32_t(threadIdx.x); int32_t(threadIdx.x) < tail) {
    float v[1];
    load_chunk<1>(row + j, v);
    if (bias != nullptr) {
      float b[1];
      load_chunk<1>(bias + j, b);
      v[0] += b[0];
    }
    if constexpr (kApply) v[0] = activate<A>(v[0]);
    store_chunk<1>(row + j, v);
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
