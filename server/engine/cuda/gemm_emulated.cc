// The host emulation's GEMM: the operands (device memory is host memory here) are widened
// to float, multiplied by oneDNN in float32 (the CPU engine's matmul), and the result
// rounded back to the storage type.
#include <cstring>
#include <vector>

#include "server/engine/cpu/onednn_gemm.h"
#include "server/engine/cuda/gemm.h"
#include "common/half.h"

namespace fastformer::engine::cuda::FF_KERNELS_ABI {

struct Gemm::Impl {
  StorageType type;
};

Gemm::Gemm(StorageType type, bool, ff_stream_t) : impl_(new Impl{type}) {}
Gemm::~Gemm() = default;

namespace {

float load(const void* base, int64_t i, StorageType type) {
  if (type == StorageType::kF32) return static_cast<const float*>(base)[i];
  uint16_t bits;
  std::memcpy(&bits, static_cast<const char*>(base) + 2 * i, 2);
  return type == StorageType::kF16 ? half_to_float(bits) : bfloat16_to_float(bits);
}

void store(void* base, int64_t i, float v, StorageType type) {
  if (type == StorageType::kF32) {
    static_cast<float*>(base)[i] = v;
    return;
  }
  const uint16_t bits = type == StorageType::kF16 ? float_to_half(v) : float_to_bfloat16(v);
  std::memcpy(static_cast<char*>(base) + 2 * i, &bits, 2);
}

}  // namespace

void Gemm::run(const void* a, int64_t lda, const void* w, int64_t M, int64_t N, int64_t K, void* c, int64_t ldc,
               bool accumulate) {
  const StorageType type = impl_->type;
  std::vector<float> af(size_t(M * K)), wf(size_t(N * K)), cf(size_t(M * N), 0.0f);
  for (int64_t r = 0; r < M; ++r)
    for (int64_t k = 0; k < K; ++k) af[size_t(r * K + k)] = load(a, r * lda + k, type);
  for (int64_t i = 0; i < N * K; ++i) wf[size_t(i)] = load(w, i, type);
  if (accumulate) {
    for (int64_t r = 0; r < M; ++r)
      for (int64_t n = 0; n < N; ++n) cf[size_t(r * N + n)] = load(c, r * ldc + n, type);
  }
  const CpuMatmul matmul({N, K, K, N, accumulate ? Epilogue::kAccumulate : Epilogue::kStore, Activation::kGeluErf,
                          false});
  matmul.run(M, af.data(), wf.data(), nullptr, cf.data());
  for (int64_t r = 0; r < M; ++r)
    for (int64_t n = 0; n < N; ++n) store(c, r * ldc + n, cf[size_t(r * N + n)], type);
}

}  // namespace fastformer::engine::cuda::FF_KERNELS_ABI
