// Small element-wise and per-row kernels (docs/design.md, "The model contract"):
//  - mix_kernel:            U_t = pk * Q_t   (pk of the token's sequence; query doubles as value)
//  - pooler_scores_kernel:  z_t = tanh(E_t) w2 + b2, E = X W1^T + b1 from the GEMM
//  - l2_normalize_kernel:   the optional L2-normalised pooled embedding
//  - to_float / from_float: dtype conversion for host transfers
#include "kernels/instantiate.cuh"
#include "kernels/kernels.h"

namespace fastformer::kernels {
inline namespace FF_KERNELS_ABI {
namespace {

template <class T>
FF_GLOBAL void mix_kernel(BatchArgs batch, const T* q, int64_t ld_q, const T* pk, int32_t D, T* u, int64_t ld_u) {
  const int64_t count = int64_t(batch.num_tokens) * D;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / D, j = i % D;
    const int32_t b = batch.token_seq[t];
    u[t * ld_u + j] = from_float<T>(to_float(pk[int64_t(b) * D + j]) * to_float(q[t * ld_q + j]));
  }
}

// The same with 4 elements per thread (D, ld_q and ld_u multiples of 4).
template <class T>
FF_GLOBAL void mix_vec4_kernel(BatchArgs batch, const T* q, int64_t ld_q, const T* pk, int32_t D, T* u, int64_t ld_u) {
  const int32_t quads = D / 4;
  const int64_t count = int64_t(batch.num_tokens) * quads;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / quads, j = (i % quads) * 4;
    const int32_t b = batch.token_seq[t];
    const ff_float4 x = load_float4(q + t * ld_q + j);
    const ff_float4 w = load_float4(pk + int64_t(b) * D + j);
    store_float4(u + t * ld_u + j, ff_float4{x.x * w.x, x.y * w.y, x.z * w.z, x.w * w.w});
  }
}

template <class T>
FF_GLOBAL void pooler_scores_kernel(const T* e, int64_t ld_e, const T* w2, const T* b2, int32_t D, float* z) {
  FF_SHARED(float, scratch, 32);
  const int64_t t = blockIdx.x;
  float sum = 0.0f;
  for (int32_t j = threadIdx.x; j < D; j += blockDim.x) sum += tanhf(to_float(e[t * ld_e + j])) * to_float(w2[j]);
  sum = block_sum(sum, scratch);
  if (threadIdx.x == 0) z[t] = sum + to_float(b2[0]);
}

template <class T>
FF_GLOBAL void l2_normalize_kernel(T* rows, int32_t D) {
  FF_SHARED(float, scratch, 32);
  T* row = rows + int64_t(blockIdx.x) * D;
  float sq = 0.0f;
  for (int32_t j = threadIdx.x; j < D; j += blockDim.x) sq += to_float(row[j]) * to_float(row[j]);
  const float norm = fmaxf(sqrtf(block_sum(sq, scratch)), 1e-12f);  // F.normalize's eps
  for (int32_t j = threadIdx.x; j < D; j += blockDim.x) row[j] = from_float<T>(to_float(row[j]) / norm);
}

template <class T>
FF_GLOBAL void to_float_kernel(const T* src, int64_t ld_src, int32_t rows, int32_t cols, float* dst) {
  const int64_t count = int64_t(rows) * cols;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    dst[i] = to_float(src[(i / cols) * ld_src + i % cols]);
  }
}

template <class T>
FF_GLOBAL void from_float_kernel(const float* src, int64_t count, T* dst) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    dst[i] = from_float<T>(src[i]);
  }
}

}  // namespace

template <class T>
void launch_mix(const BatchArgs& batch, const T* q, int64_t ld_q, const T* pk, int32_t D, T* u, int64_t ld_u,
                ff_stream_t stream) {
  if (batch.num_tokens == 0) return;
  const bool aligned = reinterpret_cast<uintptr_t>(q) % (4 * sizeof(T)) == 0 &&
                       reinterpret_cast<uintptr_t>(u) % (4 * sizeof(T)) == 0 &&
                       reinterpret_cast<uintptr_t>(pk) % (4 * sizeof(T)) == 0;
  if (D % 4 == 0 && ld_q % 4 == 0 && ld_u % 4 == 0 && aligned) {
    FF_LAUNCH(mix_vec4_kernel<T>, dim3(grid_size(int64_t(batch.num_tokens) * (D / 4), 256)), dim3(256), 0, stream,
              batch, q, ld_q, pk, D, u, ld_u);
    return;
  }
  FF_LAUNCH(mix_kernel<T>, dim3(grid_size(int64_t(batch.num_tokens) * D, 256)), dim3(256), 0, stream, batch, q,
            ld_q, pk, D, u, ld_u);
}

template <class T>
void launch_pooler_scores(const BatchArgs& batch, const T* e, int64_t ld_e, const T* w2, const T* b2, int32_t D,
                          float* z, ff_stream_t stream) {
  if (batch.num_tokens == 0) return;
  FF_LAUNCH(pooler_scores_kernel<T>, dim3(unsigned(batch.num_tokens)), dim3(row_block_size(D)), 0, stream, e, ld_e,
            w2, b2, D, z);
}

template <class T>
void launch_l2_normalize(T* rows, int32_t num_rows, int32_t D, ff_stream_t stream) {
  if (num_rows == 0) return;
  FF_LAUNCH(l2_normalize_kernel<T>, dim3(unsigned(num_rows)), dim3(row_block_size(D)), 0, stream, rows, D);
}

template <class T>
void launch_to_float(const T* src, int64_t ld_src, int32_t rows, int32_t cols, float* dst, ff_stream_t stream) {
  if (rows == 0 || cols == 0) return;
  FF_LAUNCH(to_float_kernel<T>, dim3(grid_size(int64_t(rows) * cols, 256)), dim3(256), 0, stream, src, ld_src, rows,
            cols, dst);
}

template <class T>
void launch_from_float(const float* src, int64_t count, T* dst, ff_stream_t stream) {
  if (count == 0) return;
  FF_LAUNCH(from_float_kernel<T>, dim3(grid_size(count, 256)), dim3(256), 0, stream, src, count, dst);
}

#define FF_ELEMENTWISE(T)                                                                                         \
  template void launch_mix<T>(const BatchArgs&, const T*, int64_t, const T*, int32_t, T*, int64_t, ff_stream_t);   \
  template void launch_pooler_scores<T>(const BatchArgs&, const T*, int64_t, const T*, const T*, int32_t, float*,  \
                                        ff_stream_t);                                                              \
  template void launch_l2_normalize<T>(T*, int32_t, int32_t, ff_stream_t);                                         \
  template void launch_to_float<T>(const T*, int64_t, int32_t, int32_t, float*, ff_stream_t);                      \
  template void launch_from_float<T>(const float*, int64_t, T*, ff_stream_t);
FF_INSTANTIATE_FOR_DTYPES(FF_ELEMENTWISE)

}  // inline namespace FF_KERNELS_ABI
}  // namespace fastformer::kernels
