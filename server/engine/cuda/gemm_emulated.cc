// The host emulation's GEMM: the operands (device memory is host memory here) are widened
// to float, multiplied by oneDNN in float32 (the CPU engine's matmul) with the epilogue
// fused as cuBLASLt fuses it (bias and activation on the float32 accumulator), and the
// result rounded once to the storage type. One oneDNN primitive per shape, as cuBLASLt
// keeps one plan per shape.
#include <cstring>
#include <map>
#include <vector>

#include "common/half.h"
#include "server/engine/cpu/onednn_gemm.h"
#include "server/engine/cuda/gemm.h"
#include "server/engine/error.h"

namespace fastformer::engine::cuda::FF_KERNELS_ABI {

struct Gemm::Impl {
  GemmOptions options;
  int64_t max_rows = 0;
  std::map<GemmShape, std::unique_ptr<CpuMatmul>> plans{};
};

Gemm::Gemm(const GemmOptions& options, ff_stream_t) : impl_(new Impl{options}) {}
Gemm::~Gemm() = default;

// The emulation models what the device offers: the fused exact-erf GELU where it was asked for
// in a 16-bit type (the CUTLASS kernels themselves run only on a GPU: ctest -L gpu).
bool Gemm::has_gelu_erf(std::string* why) const {
  if (impl_->options.cutlass_gelu && impl_->options.type != StorageType::kF32) return true;
  if (why != nullptr) {
    *why = impl_->options.cutlass_gelu ? "float32 keeps the separate pass"
                                       : "not asked for (--cuda-opt-in cutlass-gelu)";
  }
  return false;
}

double Gemm::planning_ms() const { return 0; }

std::string Gemm::describe(const GemmShape& shape) const {
  return impl_->plans.count(shape) != 0 ? std::string("oneDNN float32 matmul (host emulation), ") +
                                              gemm_epilogue_name(shape.epilogue)
                                        : std::string();
}

void Gemm::set_max_rows(int64_t max_rows) { impl_->max_rows = max_rows; }

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

// The CPU matmul computing `shape` on dense float operands.
CpuMatmul::Shape cpu_shape(const GemmShape& shape) {
  CpuMatmul::Shape s{shape.N, shape.K, shape.K, shape.N, Epilogue::kStore, Activation::kGeluErf,
                     false};
  switch (shape.epilogue) {
    case GemmEpilogue::kStore:
      break;
    case GemmEpilogue::kAccumulate:
      s.epilogue = Epilogue::kAccumulate;
      break;
    case GemmEpilogue::kBias:
      s.epilogue = Epilogue::kBias;
      break;
    case GemmEpilogue::kBiasRelu:
      s.epilogue = Epilogue::kBiasAct, s.act = Activation::kRelu;
      break;
    case GemmEpilogue::kBiasGeluTanh:
      s.epilogue = Epilogue::kBiasAct, s.act = Activation::kGeluTanh;
      break;
    case GemmEpilogue::kBiasGeluErf:
      s.epilogue = Epilogue::kBiasAct, s.act = Activation::kGeluErf;
      break;
  }
  return s;
}

}  // namespace

void Gemm::run(const GemmShape& shape, int64_t M, const void* a, const void* w, const void* bias,
               void* c) {
  if (M > impl_->max_rows) {
    throw EngineError("GEMM of " + std::to_string(M) + " rows over the " +
                      std::to_string(impl_->max_rows) + " it was planned for (" +
                      shape.to_string() + ")");
  }
  if (M == 0) return;
  if (shape.epilogue == GemmEpilogue::kBiasGeluErf && !has_gelu_erf()) {
    throw EngineError("GEMM epilogue bias+gelu_erf asked of a Gemm without it (" +
                      shape.to_string() + ")");
  }
  std::unique_ptr<CpuMatmul>& matmul = impl_->plans[shape];
  if (!matmul) matmul = std::make_unique<CpuMatmul>(cpu_shape(shape));
  const StorageType type = impl_->options.type;
  const int64_t N = shape.N, K = shape.K;
  std::vector<float> af(size_t(M * K)), wf(size_t(N * K)), cf(size_t(M * N), 0.0f), bf;
  for (int64_t r = 0; r < M; ++r)
    for (int64_t k = 0; k < K; ++k) af[size_t(r * K + k)] = load(a, r * shape.lda + k, type);
  for (int64_t i = 0; i < N * K; ++i) wf[size_t(i)] = load(w, i, type);
  if (shape.epilogue == GemmEpilogue::kAccumulate) {
    for (int64_t r = 0; r < M; ++r)
      for (int64_t n = 0; n < N; ++n) cf[size_t(r * N + n)] = load(c, r * shape.ldc + n, type);
  }
  if (matmul->shape().epilogue == Epilogue::kBias ||
      matmul->shape().epilogue == Epilogue::kBiasAct) {
    bf.resize(size_t(N));
    for (int64_t n = 0; n < N; ++n) bf[size_t(n)] = load(bias, n, type);
  }
  matmul->run(M, af.data(), wf.data(), bf.empty() ? nullptr : bf.data(), cf.data());
  for (int64_t r = 0; r < M; ++r)
    for (int64_t n = 0; n < N; ++n) store(c, r * shape.ldc + n, cf[size_t(r * N + n)], type);
}

}  // namespace fastformer::engine::cuda::FF_KERNELS_ABI
