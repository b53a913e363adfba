// key_scores_kernel computes the key-side attention scores (docs/design.md, "The model
// contract", lines (5)-(6)):
//     r_t = (P_t Wka^T + bka) / sqrt(d),  P_t = K_t * pq
// as r_t = (K_t * pq) Wka'^T + bka' with Wka' = Wka / sqrt(d) prepared at load, so
// P = K * pq is never written to memory. One block per token: P_t is staged in shared
// memory, then each warp takes heads in turn and reduces its dot product with shuffles.
#include "kernels/instantiate.cuh"
#include "kernels/kernels.h"

namespace fastformer::kernels {
inline namespace FF_KERNELS_ABI {
namespace {

template <class T>
FF_GLOBAL void key_scores_kernel(BatchArgs batch, const T* k, int64_t ld_k, const T* pq, const T* wka, const T* bka,
                                 int32_t heads, int32_t D, float* r) {
  FF_DYNAMIC_SHARED(float, p);  // [D]: K_t * pq
  const int32_t t = blockIdx.x;
  const int32_t b = batch.token_seq[t];
  for (int32_t j = threadIdx.x; j < D; j += blockDim.x) {
    p[j] = to_float(k[int64_t(t) * ld_k + j]) * to_float(pq[int64_t(b) * D + j]);
  }
  __syncthreads();
  const int32_t lane_id = threadIdx.x % 32, warp_id = threadIdx.x / 32, warps = blockDim.x / 32;
  for (int32_t h = warp_id; h < heads; h += warps) {
    const T* w = wka + int64_t(h) * D;
    float dot = 0.0f;
    for (int32_t j = lane_id; j < D; j += 32) dot += p[j] * to_float(w[j]);
    dot = warp_sum(dot);
    if (lane_id == 0) r[int64_t(t) * heads + h] = dot + to_float(bka[h]);
  }
}

}  // namespace

template <class T>
void launch_key_scores(const BatchArgs& batch, const T* k, int64_t ld_k, const T* pq, const T* wka, const T* bka,
                       int32_t heads, int32_t D, float* r, ff_stream_t stream) {
  if (batch.num_tokens == 0) return;
  FF_LAUNCH(key_scores_kernel<T>, dim3(unsigned(batch.num_tokens)), dim3(128), size_t(D) * sizeof(float), stream,
            batch, k, ld_k, pq, wka, bka, heads, D, r);
}

#define FF_KEY_SCORES(T)                                                                                   \
  template void launch_key_scores<T>(const BatchArgs&, const T*, int64_t, const T*, const T*, const T*,     \
                                     int32_t, int32_t, float*, ff_stream_t);
FF_INSTANTIATE_FOR_DTYPES(FF_KEY_SCORES)

}  // inline namespace FF_KERNELS_ABI
}  // namespace fastformer::kernels
