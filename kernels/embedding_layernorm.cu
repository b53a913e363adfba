// embedding_layernorm_kernel computes, per token t of the ragged batch (docs/design.md,
// "The model contract", line (0)):
//     X0_t = LN_emb( W_word[id_t] + W_pos[t] )   (input_embeddings row instead of W_word[id])
// One block per token row; the row sum is staged in shared memory (D floats) so the
// LayerNorm's two passes (mean, then variance) read it once from global memory.
#include "kernels/kernels.h"
#include "kernels/instantiate.cuh"

namespace fastformer::kernels {
inline namespace FF_KERNELS_ABI {
namespace {

template <class T>
FF_GLOBAL void embedding_layernorm_kernel(BatchArgs batch, const T* word_embedding, const T* position_embeddings,
                                          const T* gamma, const T* beta, float eps, int32_t D, T* x) {
  FF_DYNAMIC_SHARED(float, row);  // [D]
  FF_SHARED(float, scratch, 32);
  const int32_t t = blockIdx.x;
  const int32_t id = batch.token_ids[t];
  const int32_t pos = batch.position_ids[t];
  const T* pos_row = position_embeddings + int64_t(pos) * D;
  float sum = 0.0f;
  for (int32_t j = threadIdx.x; j < D; j += blockDim.x) {
    const float e = id >= 0 ? to_float(word_embedding[int64_t(id) * D + j])
                            : batch.input_embeddings[int64_t(batch.embedding_index[t]) * D + j];
    const float v = e + to_float(pos_row[j]);
    row[j] = v;
    sum += v;
  }
  const float mean = block_sum(sum, scratch) / float(D);
  float sq = 0.0f;
  for (int32_t j = threadIdx.x; j < D; j += blockDim.x) sq += (row[j] - mean) * (row[j] - mean);
  const float rstd = rsqrtf(block_sum(sq, scratch) / float(D) + eps);
  T* out = x + int64_t(t) * D;
  for (int32_t j = threadIdx.x; j < D; j += blockDim.x) {
    out[j] = from_float<T>((row[j] - mean) * rstd * to_float(gamma[j]) + to_float(beta[j]));
  }
}

}  // namespace

template <class T>
void launch_embedding_layernorm(const BatchArgs& batch, const T* word_embedding, const T* position_embeddings,
                                const T* gamma, const T* beta, float eps, int32_t D, T* x, ff_stream_t stream) {
  if (batch.num_tokens == 0) return;
  FF_LAUNCH(embedding_layernorm_kernel<T>, dim3(unsigned(batch.num_tokens)), dim3(row_block_size(D)),
            size_t(D) * sizeof(float), stream, batch, word_embedding, position_embeddings, gamma, beta, eps, D, x);
}

#define FF_EMBEDDING_LAYERNORM(T)                                                                           \
  template void launch_embedding_layernorm<T>(const BatchArgs&, const T*, const T*, const T*, const T*, float, \
                                              int32_t, T*, ff_stream_t);
FF_INSTANTIATE_FOR_DTYPES(FF_EMBEDDING_LAYERNORM)

}  // inline namespace FF_KERNELS_ABI
}  // namespace fastformer::kernels
