// Small element-wise and per-row kernels (docs/design.md, "The model contract"):
//  - mix:            U_t = pk * Q_t   (pk of the token's sequence; query doubles as value)
//  - pooler_scores:  z_t = tanh(E_t) w2 + b2, E = X W1^T + b1 from the GEMM
//  - l2_normalize:   the optional L2-normalised pooled embedding
//  - to_float / from_float: dtype conversion for host transfers
// Each has a kernel that moves 16-byte vectors and a _scalar_kernel for widths, leading
// dimensions or pointers that do not allow them (common.cuh, "row kernels"). mix and
// to_float are tiled as tile_launch; pooler_scores and l2_normalize give each row a thread
// group as row_launch and loop over it; from_float is a flat grid-stride loop.
#include "kernels/instantiate.cuh"
#include "kernels/kernels.h"

namespace fastformer::kernels {
inline namespace FF_KERNELS_ABI {
namespace {

template <class T, int G>
FF_DEVICE void mix_rows(const BatchArgs& batch, const T* q, int64_t ld_q, const T* pk,
                        int32_t chunks, T* u, int64_t ld_u) {
  const int32_t t = int32_t(blockIdx.x * blockDim.y + threadIdx.y);
  if (t >= batch.num_tokens) return;
  const T* q_row = q + t * ld_q;
  const T* pk_row = pk + int64_t(batch.token_seq[t]) * (chunks * G);
  T* u_row = u + t * ld_u;
  for (int32_t j = int32_t(threadIdx.x); j < chunks; j += int32_t(blockDim.x)) {
    float x[G], w[G];
    load_chunk<G>(q_row + j * G, x);
    load_chunk<G>(pk_row + j * G, w);
    FF_UNROLL for (int k = 0; k < G; ++k) x[k] *= w[k];
    store_chunk<G>(u_row + j * G, x);
  }
}

template <class T>
FF_GLOBAL void mix_kernel(BatchArgs batch, const T* q, int64_t ld_q, const T* pk, int32_t chunks,
                          T* u, int64_t ld_u) {
  mix_rows<T, kVecSize<T>>(batch, q, ld_q, pk, chunks, u, ld_u);
}
template <class T>
FF_GLOBAL void mix_scalar_kernel(BatchArgs batch, const T* q, int64_t ld_q, const T* pk, int32_t D,
                                 T* u, int64_t ld_u) {
  mix_rows<T, 1>(batch, q, ld_q, pk, D, u, ld_u);
}

// One warp per row (row_launch with at most 8 chunks a lane; wider rows loop).
template <class T, int G>
FF_DEVICE void pooler_scores_rows(const T* e, int64_t ld_e, const T* w2, const T* b2, int32_t rows,
                                  int32_t chunks, float* z) {
  const RowThread thread = row_thread(32);
  if (thread.row >= rows) return;
  const T* e_row = e + thread.row * ld_e;
  float sum = 0.0f;
  for (int32_t j = thread.index; j < chunks; j += 32) {
    float x[G], w[G];
    load_chunk<G>(e_row + j * G, x);
    load_chunk<G>(w2 + j * G, w);
    FF_UNROLL for (int k = 0; k < G; ++k) sum += tanhf(x[k]) * w[k];
  }
  sum = warp_sum(sum);
  if (thread.index == 0) z[thread.row] = sum + to_float(*b2);
}

template <class T>
FF_GLOBAL void pooler_scores_kernel(const T* e, int64_t ld_e, const T* w2, const T* b2,
                                    int32_t rows, int32_t chunks, float* z) {
  pooler_scores_rows<T, kVecSize<T>>(e, ld_e, w2, b2, rows, chunks, z);
}
template <class T>
FF_GLOBAL void pooler_scores_scalar_kernel(const T* e, int64_t ld_e, const T* w2, const T* b2,
                                           int32_t rows, int32_t D, float* z) {
  pooler_scores_rows<T, 1>(e, ld_e, w2, b2, rows, D, z);
}

// A row group reads its row twice (the norm, then the scaling): B rows, so no registers kept.
template <class T, int G>
FF_DEVICE void l2_normalize_rows(T* rows, int32_t num_rows, int32_t chunks, int32_t row_threads) {
  FF_SHARED(float, scratch, 32);
  const RowThread thread = row_thread(row_threads);
  if (thread.row >= num_rows) return;
  T* row = rows + int64_t(thread.row) * (chunks * G);
  float sq = 0.0f;
  for (int32_t j = thread.index; j < chunks; j += row_threads) {
    float x[G];
    load_chunk<G>(row + j * G, x);
    FF_UNROLL for (int k = 0; k < G; ++k) sq += x[k] * x[k];
  }
  const float norm = fmaxf(sqrtf(row_sum(sq, row_threads, scratch)), 1e-12f);  // F.normalize's eps
  for (int32_t j = thread.index; j < chunks; j += row_threads) {
    float x[G];
    load_chunk<G>(row + j * G, x);
    FF_UNROLL for (int k = 0; k < G; ++k) x[k] /= norm;
    store_chunk<G>(row + j * G, x);
  }
}

template <class T>
FF_GLOBAL void l2_normalize_kernel(T* rows, int32_t num_rows, int32_t chunks, int32_t row_threads) {
  l2_normalize_rows<T, kVecSize<T>>(rows, num_rows, chunks, row_threads);
}
template <class T>
FF_GLOBAL void l2_normalize_scalar_kernel(T* rows, int32_t num_rows, int32_t D,
                                          int32_t row_threads) {
  l2_normalize_rows<T, 1>(rows, num_rows, D, row_threads);
}

template <class T, int G>
FF_DEVICE void to_float_rows(const T* src, int64_t ld_src, int32_t rows, int32_t chunks,
                             float* dst) {
  const int32_t r = int32_t(blockIdx.x * blockDim.y + threadIdx.y);
  if (r >= rows) return;
  const T* src_row = src + r * ld_src;
  float* dst_row = dst + int64_t(r) * (chunks * G);
  for (int32_t j = int32_t(threadIdx.x); j < chunks; j += int32_t(blockDim.x)) {
    float x[G];
    load_chunk<G>(src_row + j * G, x);
    store_chunk<G>(dst_row + j * G, x);
  }
}

template <class T>
FF_GLOBAL void to_float_kernel(const T* src, int64_t ld_src, int32_t rows, int32_t chunks,
                               float* dst) {
  to_float_rows<T, kVecSize<T>>(src, ld_src, rows, chunks, dst);
}
template <class T>
FF_GLOBAL void to_float_scalar_kernel(const T* src, int64_t ld_src, int32_t rows, int32_t cols,
                                      float* dst) {
  to_float_rows<T, 1>(src, ld_src, rows, cols, dst);
}

// `vectors` chunks of G, then (vector kernel only) the count % G elements left by thread 0..
template <class T, int G>
FF_DEVICE void from_float_flat(const float* src, int64_t vectors, int32_t tail, T* dst) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < vectors; i += stride) {
    float x[G];
    load_chunk<G>(src + i * G, x);
    store_chunk<G>(dst + i * G, x);
  }
  if (blockIdx.x == 0 && int32_t(threadIdx.x) < tail) {
    const int64_t i = vectors * G + threadIdx.x;
    dst[i] = from_float<T>(src[i]);
  }
}

template <class T>
FF_GLOBAL void from_float_kernel(const float* src, int64_t vectors, int32_t tail, T* dst) {
  from_float_flat<T, kVecSize<T>>(src, vectors, tail, dst);
}
template <class T>
FF_GLOBAL void from_float_scalar_kernel(const float* src, int64_t count, T* dst) {
  from_float_flat<T, 1>(src, count, 0, dst);
}

}  // namespace

template <class T>
void launch_mix(const BatchArgs& batch, const T* q, int64_t ld_q, const T* pk, int32_t D, T* u,
                int64_t ld_u, ff_stream_t stream) {
  if (batch.num_tokens == 0) return;
  if (vector_path<T>(D, {ld_q, ld_u}, {q, pk, u})) {
    const int32_t chunks = D / kVecSize<T>;
    const TileLaunch shape = tile_launch(batch.num_tokens, chunks);
    FF_LAUNCH(mix_kernel<T>, dim3(shape.grid), dim3(shape.tile_x, shape.tile_y), 0, stream, batch,
              q, ld_q, pk, chunks, u, ld_u);
    return;
  }
  const TileLaunch shape = tile_launch(batch.num_tokens, D);
  FF_LAUNCH(mix_scalar_kernel<T>, dim3(shape.grid), dim3(shape.tile_x, shape.tile_y), 0, stream,
            batch, q, ld_q, pk, D, u, ld_u);
}

template <class T>
void launch_pooler_scores(const BatchArgs& batch, const T* e, int64_t ld_e, const T* w2,
                          const T* b2, int32_t D, float* z, ff_stream_t stream) {
  const int32_t rows = batch.num_tokens;
  if (rows == 0) return;
  const unsigned grid = unsigned((int64_t(rows) + 3) / 4);  // a warp per row, as row_launch's
  if (vector_path<T>(D, {ld_e}, {e, w2})) {
    FF_LAUNCH(pooler_scores_kernel<T>, dim3(grid), dim3(128), 0, stream, e, ld_e, w2, b2, rows,
              D / kVecSize<T>, z);
    return;
  }
  FF_LAUNCH(pooler_scores_scalar_kernel<T>, dim3(grid), dim3(128), 0, stream, e, ld_e, w2, b2, rows,
            D, z);
}

template <class T>
void launch_l2_normalize(T* rows, int32_t num_rows, int32_t D, ff_stream_t stream) {
  if (num_rows == 0) return;
  if (vector_path<T>(D, {}, {rows})) {
    const RowLaunch shape = row_launch(num_rows, D / kVecSize<T>);
    FF_LAUNCH(l2_normalize_kernel<T>, dim3(shape.grid), dim3(shape.block), 0, stream, rows,
              num_rows, D / kVecSize<T>, shape.row_threads);
    return;
  }
  const RowLaunch shape = row_launch(num_rows, D);
  FF_LAUNCH(l2_normalize_scalar_kernel<T>, dim3(shape.grid), dim3(shape.block), 0, stream, rows,
            num_rows, D, shape.row_threads);
}

template <class T>
void launch_to_float(const T* src, int64_t ld_src, int32_t rows, int32_t cols, float* dst,
                     ff_stream_t stream) {
  if (rows == 0 || cols == 0) return;
  if (vector_path<T>(cols, {ld_src}, {src, dst})) {
    const int32_t chunks = cols / kVecSize<T>;
    const TileLaunch shape = tile_launch(rows, chunks);
    FF_LAUNCH(to_float_kernel<T>, dim3(shape.grid), dim3(shape.tile_x, shape.tile_y), 0, stream,
              src, ld_src, rows, chunks, dst);
    return;
  }
  const TileLaunch shape = tile_launch(rows, cols);
  FF_LAUNCH(to_float_scalar_kernel<T>, dim3(shape.grid), dim3(shape.tile_x, shape.tile_y), 0,
            stream, src, ld_src, rows, cols, dst);
}

template <class T>
void launch_from_float(const float* src, int64_t count, T* dst, ff_stream_t stream) {
  if (count == 0) return;
  if (is_aligned16(src) && is_aligned16(dst)) {
    const int64_t vectors = count / kVecSize<T>;
    FF_LAUNCH(from_float_kernel<T>, dim3(grid_size(vectors, 256)), dim3(256), 0, stream, src,
              vectors, int32_t(count - vectors * kVecSize<T>), dst);
    return;
  }
  FF_LAUNCH(from_float_scalar_kernel<T>, dim3(grid_size(count, 256)), dim3(256), 0, stream, src,
            count, dst);
}

#define FF_ELEMENTWISE(T)                                                                          \
  template void launch_mix<T>(const BatchArgs&, const T*, int64_t, const T*, int32_t, T*, int64_t, \
                              ff_stream_t);                                                        \
  template void launch_pooler_scores<T>(const BatchArgs&, const T*, int64_t, const T*, const T*,   \
                                        int32_t, float*, ff_stream_t);                             \
  template void launch_l2_normalize<T>(T*, int32_t, int32_t, ff_stream_t);                         \
  template void launch_to_float<T>(const T*, int64_t, int32_t, int32_t, float*, ff_stream_t);      \
  template void launch_from_float<T>(const float*, int64_t, T*, ff_stream_t);
FF_INSTANTIATE_FOR_DTYPES(FF_ELEMENTWISE)

}  // namespace FF_KERNELS_ABI
}  // namespace fastformer::kernels
