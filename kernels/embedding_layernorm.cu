// embedding_layernorm computes, per token t of the ragged batch (docs/design.md, "The model
// contract", line (0)):
//     X0_t = LN_emb( W_word[id_t] + W_pos[t] )   (input_embeddings row instead of W_word[id])
// One warp per token row for hidden sizes up to 32 x 8 vectors, else a block (common.cuh,
// "row kernels"); the LayerNorm is layernorm.cuh's.
//  - embedding_layernorm_kernel: 16-byte loads and stores, the row held in registers;
//  - embedding_layernorm_scalar_kernel: one element at a time, for a width that is not a
//    multiple of the vector or a table that is not 16-byte aligned.
#include "kernels/instantiate.cuh"
#include "kernels/kernels.h"
#include "kernels/layernorm.cuh"

namespace fastformer::kernels {
inline namespace FF_KERNELS_ABI {
namespace {

template <class T, int G, int N>
FF_DEVICE void embedding_layernorm_row(const BatchArgs& batch, const T* word_embedding,
                                       const T* position_embeddings, const T* gamma, const T* beta,
                                       float eps, int32_t D, int32_t row_threads, T* x) {
  FF_SHARED(float, scratch, 32);
  const RowThread thread = row_thread(row_threads);
  const int32_t t = thread.row;
  if (t >= batch.num_tokens) return;  // a whole warp: the last block's spare rows
  const int32_t id = batch.token_ids[t];
  const T* word_row = id >= 0 ? word_embedding + int64_t(id) * D : nullptr;
  const float* input_row =
      id >= 0 ? nullptr : batch.input_embeddings + int64_t(batch.embedding_index[t]) * D;
  const T* pos_row = position_embeddings + int64_t(batch.position_ids[t]) * D;
  auto load = [&](int32_t c, float* v) {
    float p[G];
    if (word_row != nullptr) {
      load_chunk<G>(word_row + c * G, v);
    } else {
      load_chunk<G>(input_row + c * G, v);
    }
    load_chunk<G>(pos_row + c * G, p);
    FF_UNROLL for (int k = 0; k < G; ++k) v[k] += p[k];
  };
  layernorm_row<G, N>(thread, row_threads, D, load, gamma, beta, eps, x + int64_t(t) * D, scratch);
}

template <class T, int N>
FF_GLOBAL void embedding_layernorm_kernel(BatchArgs batch, const T* word_embedding,
                                          const T* position_embeddings, const T* gamma,
                                          const T* beta, float eps, int32_t D, int32_t row_threads,
                                          T* x) {
  embedding_layernorm_row<T, kVecSize<T>, N>(batch, word_embedding, position_embeddings, gamma,
                                             beta, eps, D, row_threads, x);
}

template <class T>
FF_GLOBAL void embedding_layernorm_scalar_kernel(BatchArgs batch, const T* word_embedding,
                                                 const T* position_embeddings, const T* gamma,
                                                 const T* beta, float eps, int32_t D,
                                                 int32_t row_threads, T* x) {
  embedding_layernorm_row<T, 1, kLoopOverRow>(batch, word_embedding, position_embeddings, gamma,
                                              beta, eps, D, row_threads, x);
}

}  // namespace

template <class T>
void launch_embedding_layernorm(const BatchArgs& batch, const T* word_embedding,
                                const T* position_embeddings, const T* gamma, const T* beta,
                                float eps, int32_t D, T* x, ff_stream_t stream) {
  if (batch.num_tokens == 0) return;
  // The float input embeddings have the row width of T's vector or more: aligned with it.
  if (vector_path<T>(
          D, {}, {word_embedding, position_embeddings, gamma, beta, x, batch.input_embeddings})) {
    const RowLaunch shape = row_launch(batch.num_tokens, D / kVecSize<T>);
    if (shape.fits) {
      with_slots(shape.slots, [&]<int N>() {
        FF_LAUNCH((embedding_layernorm_kernel<T, N>), dim3(shape.grid), dim3(shape.block), 0,
                  stream, batch, word_embedding, position_embeddings, gamma, beta, eps, D,
                  shape.row_threads, x);
      });
      return;
    }
  }
  const RowLaunch shape = row_launch(batch.num_tokens, D);
  FF_LAUNCH(embedding_layernorm_scalar_kernel<T>, dim3(shape.grid), dim3(shape.block), 0, stream,
            batch, word_embedding, position_embeddings, gamma, beta, eps, D, shape.row_threads, x);
}

#define FF_EMBEDDING_LAYERNORM(T)                                                             \
  template void launch_embedding_layernorm<T>(const BatchArgs&, const T*, const T*, const T*, \
                                              const T*, float, int32_t, T*, ff_stream_t);
FF_INSTANTIATE_FOR_DTYPES(FF_EMBEDDING_LAYERNORM)

}  // namespace FF_KERNELS_ABI
}  // namespace fastformer::kernels
