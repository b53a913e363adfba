// C = epilogue(A W^T) for every Linear of the model, row-major, in the serving dtype with
// float accumulation: cuBLASLt in CUDA builds (TF32 only when allowed), with CUTLASS sm_90a
// kernels for bias + exact-erf GELU where asked for (gemm_cutlass.h); the CPU engine's oneDNN
// float32 matmul under the host emulation ("GEMMs served by the CPU path"), with the same
// epilogues, so the emulated engine runs the path the GPU runs.
//
// Each GEMM site is a GemmShape (everything but the row count M). The first run of a shape
// plans it for every M up to max_rows (cuBLASLt: descriptors, layouts and one algorithm per
// power-of-two bucket of M, gemm_cublaslt.cc; with timing asked for, the fastest of the
// candidates measured at the bucket's largest M); later runs only look the plan up. The
// server's warm-up batch passes through every site, so planning, and a shape cuBLASLt has
// no algorithm for, happen at start-up, never mid-serving.
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "kernels/runtime.h"

namespace fastformer::engine::cuda::FF_KERNELS_ABI {

enum class StorageType { kF32, kF16, kBF16 };

// What is added and applied to A W^T, in float32, before the one rounding to the storage
// type. ReLU and the tanh GELU are cuBLASLt epilogues; the exact-erf GELU is not (cuBLASLt's
// GELU is the tanh form): it is a CUTLASS epilogue where Gemm::has_gelu_erf() (16-bit types
// on sm_90, opted in), else the GEMM stores and a pass of its own adds the bias and applies it,
// as for SiLU.
enum class GemmEpilogue {
  kStore,         ///< C = A W^T
  kAccumulate,    ///< C = C + A W^T
  kBias,          ///< C = A W^T + b
  kBiasRelu,      ///< C = relu(A W^T + b)
  kBiasGeluTanh,  ///< C = gelu_tanh(A W^T + b)
  kBiasGeluErf,   ///< C = gelu_erf(A W^T + b): only where Gemm::has_gelu_erf()
};
inline const char* gemm_epilogue_name(GemmEpilogue epilogue) {
  switch (epilogue) {
    case GemmEpilogue::kStore:
      return "store";
    case GemmEpilogue::kAccumulate:
      return "accumulate";
    case GemmEpilogue::kBias:
      return "bias";
    case GemmEpilogue::kBiasRelu:
      return "bias+relu";
    case GemmEpilogue::kBiasGeluTanh:
      return "bias+gelu_tanh";
    case GemmEpilogue::kBiasGeluErf:
      return "bias+gelu_erf";
  }
  return "?";
}

// One GEMM site: c[M, N] (ldc) = epilogue(a[M, K] (lda) w[N, K]^T), w dense.
struct GemmShape {
  int64_t N = 0, K = 0;
  int64_t lda = 0, ldc = 0;  ///< in elements
  GemmEpilogue epilogue = GemmEpilogue::kStore;
  auto operator<=>(const GemmShape&) const = default;
  std::string to_string() const {  ///< for errors: "N 1552, K 768, lda 768, ldc 1552, bias"
    return "N " + std::to_string(N) + ", K " + std::to_string(K) + ", lda " + std::to_string(lda) +
           ", ldc " + std::to_string(ldc) + ", " + gemm_epilogue_name(epilogue);
  }
};

// The bucket of M a plan's algorithm serves: the smallest power of two >= M. cuBLASLt's
// heuristic depends on M; an algorithm is chosen at the bucket's largest M and checked
// valid at its smallest.
inline int64_t gemm_rows_bucket(int64_t M) {
  int64_t bucket = 1;
  while (bucket < M) bucket *= 2;
  return bucket;
}

// The device workspace cuBLASLt may use per GEMM (counted in device_memory() in every build).
inline constexpr size_t kGemmWorkspaceBytes = 32u << 20;

struct GemmOptions {
  StorageType type = StorageType::kF32;
  bool allow_tf32 = false;    ///< TF32 tensor-core GEMMs for float32
  bool cutlass_gelu = false;  ///< kBiasGeluErf by CUTLASS (opt-in cutlass-gelu)
  /// Each shape's algorithm per bucket of M measured among the candidates at its first run
  /// (opt-in gemm-timing), instead of cuBLASLt's heuristic's first.
  bool timed = false;
};

class Gemm {
 public:
  Gemm(const GemmOptions& options, ff_stream_t stream);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // The most rows any later run has (the engine's max_batch_tokens): plans cover M up to
  // it. Call before the first run; a run with more rows is an EngineError.
  void set_max_rows(int64_t max_rows);

  // Whether run() takes GemmEpilogue::kBiasGeluErf: CUTLASS was asked for (cutlass_gelu), this
  // build has its kernels, the device is compute capability 9.0 and the type 16-bit (the host
  // emulation: asked for and 16-bit). Else false, and `why` (when given) says why not.
  bool has_gelu_erf(std::string* why = nullptr) const;

  // For the start-up log: the kernel `shape`'s plan runs at its largest bucket of M and how it
  // was chosen (timed among how many candidates, in how many ms); "" before its first run.
  std::string describe(const GemmShape& shape) const;
  // The ms every shape's planning took so far (the load time timing costs).
  double planning_ms() const;

  // c = epilogue(a w^T) for `M` rows; `bias` ([N], storage type) for the kBias* epilogues.
  // Throws EngineError naming the shape when cuBLASLt has no algorithm for it (on the
  // shape's first run).
  void run(const GemmShape& shape, int64_t M, const void* a, const void* w, const void* bias,
           void* c);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fastformer::engine::cuda::FF_KERNELS_ABI
