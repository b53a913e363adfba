// GEMMs through cuBLASLt. Row-major C[M, N] = A[M, K] W[N, K]^T is, in cuBLAS's
// column-major terms, C^T (N x M) = op(W^T) (N x K) * A^T (K x M): W is the "A" operand,
// transposed, and the activations are the "B" operand, so no copy transposes anything. The
// bias is a vector over C^T's rows (N), as CUBLASLT_EPILOGUE_BIAS broadcasts it.
//
// Plans: the first run of a shape (GemmShape plus the operands' alignments) creates its
// matmul descriptor, layouts and preference, and asks the heuristic once per power-of-two
// bucket of M up to max_rows: at the bucket's largest M, keeping the first candidate that
// cublasLtMatmulAlgoCheck also accepts at the bucket's smallest M (an algorithm is chosen
// for one problem; the check is how cuBLASLt says it also runs another). A run then sets
// the layouts' column count (M) and the bias pointer, host-side attribute writes, and
// launches the bucket's algorithm: no heuristic on the hot path. The alignments come from
// the real pointers and leading dimensions; a site's are the same every batch (workspace
// buffers sit at 256-byte offsets, views at fixed column offsets), so a site plans once.
// A shape the heuristic offers nothing for throws at its first run, the warm-up.
//
// Timing (GemmOptions::timed, opt-in gemm-timing): each bucket's candidates, the heuristic's
// (up to 8) and for bias+gelu_erf the CUTLASS kernels of the type, run at the bucket's
// largest M on scratch operands (one allocation per shape: M x lda and M x ldc elements, a
// constant non-zero fill, the real weights), a warm-up and kTimedRuns runs between two CUDA
// events each; the fastest is kept. The scratch is freed when the shape is planned; where it
// cannot be allocated the heuristic's first is kept and describe() says so. The cost (every
// shape's planning, in ms) is in describe() and planning_ms().
//
// bias+gelu_erf (GemmEpilogue::kBiasGeluErf, has_gelu_erf()): a CUTLASS sm_90a kernel with the
// bias and the erf GELU in its epilogue (gemm_cutlass.h), or, where timing finds it faster,
// cuBLASLt's store followed by the separate pass (kernels' launch_bias_activation). Untimed,
// the first CUTLASS kernel of the type serves every bucket.
//
// libcublasLt is opened with dlopen when the first CUDA engine is built, not linked: a
// process that merely links it cannot start the civetweb-based /metrics server (seen with
// CUDA 13's libcublasLt and Debian's civetweb 1.15), and a CUDA build must start and
// serve on the CPU where no CUDA libraries beyond the runtime are installed.
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/kernels.h"
#include "server/engine/cuda/gemm.h"
#include "server/engine/cuda/gemm_cutlass.h"
#include "server/engine/error.h"

namespace fastformer::engine::cuda::FF_KERNELS_ABI {
namespace {

void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw EngineError(std::string("cuBLASLt ") + what + " failed with status " +
                      std::to_string(int(status)));
  }
}

// The cuBLASLt entry points we use, resolved once from the shared library.
struct CublasLt {
#define FF_CUBLASLT_FUNCTION(name) decltype(&::name) name = nullptr;
  FF_CUBLASLT_FUNCTION(cublasLtCreate)
  FF_CUBLASLT_FUNCTION(cublasLtDestroy)
  FF_CUBLASLT_FUNCTION(cublasLtMatmulDescCreate)
  FF_CUBLASLT_FUNCTION(cublasLtMatmulDescDestroy)
  FF_CUBLASLT_FUNCTION(cublasLtMatmulDescSetAttribute)
  FF_CUBLASLT_FUNCTION(cublasLtMatrixLayoutCreate)
  FF_CUBLASLT_FUNCTION(cublasLtMatrixLayoutDestroy)
  FF_CUBLASLT_FUNCTION(cublasLtMatrixLayoutSetAttribute)
  FF_CUBLASLT_FUNCTION(cublasLtMatmulPreferenceCreate)
  FF_CUBLASLT_FUNCTION(cublasLtMatmulPreferenceDestroy)
  FF_CUBLASLT_FUNCTION(cublasLtMatmulPreferenceSetAttribute)
  FF_CUBLASLT_FUNCTION(cublasLtMatmulAlgoGetHeuristic)
  FF_CUBLASLT_FUNCTION(cublasLtMatmulAlgoCheck)
  FF_CUBLASLT_FUNCTION(cublasLtMatmul)
  FF_CUBLASLT_FUNCTION(cublasLtMatmulAlgoConfigGetAttribute)
#undef FF_CUBLASLT_FUNCTION
};

// Where libcublasLt is looked for: FASTFORMER_CUBLASLT_LIBRARY, a path, alone when set (so
// that a run says which library it used: tests/gpu/gpu-check.sh sets it where cuBLASLt is
// not on the loader's path, e.g. the nvidia-cublas wheel beside PyTorch); else the names the
// loader resolves (LD_LIBRARY_PATH, the ldconfig cache), of the header's major version.
std::vector<std::string> cublaslt_library_candidates() {
  const char* path = std::getenv("FASTFORMER_CUBLASLT_LIBRARY");
  if (path != nullptr && *path != '\0') return {path};
  return {"libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR), "libcublasLt.so"};
}

const CublasLt& cublaslt() {
  static CublasLt api;
  static std::once_flag once;
  static std::string error;
  std::call_once(once, [] {
    void* lib = nullptr;
    std::string errors;
    for (const std::string& name : cublaslt_library_candidates()) {
      if ((lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
      errors += (errors.empty() ? "" : "; ") + std::string(dlerror());
    }
    if (lib == nullptr) {
      error = "cannot load libcublasLt (" + errors + ")";
      return;
    }
    auto resolve = [&](auto& fn, const char* symbol) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, symbol));
      if (fn == nullptr && error.empty()) error = std::string("libcublasLt has no ") + symbol;
    };
#define FF_RESOLVE(name) resolve(api.name, #name);
    FF_RESOLVE(cublasLtCreate)
    FF_RESOLVE(cublasLtDestroy)
    FF_RESOLVE(cublasLtMatmulDescCreate)
    FF_RESOLVE(cublasLtMatmulDescDestroy)
    FF_RESOLVE(cublasLtMatmulDescSetAttribute)
    FF_RESOLVE(cublasLtMatrixLayoutCreate)
    FF_RESOLVE(cublasLtMatrixLayoutDestroy)
    FF_RESOLVE(cublasLtMatrixLayoutSetAttribute)
    FF_RESOLVE(cublasLtMatmulPreferenceCreate)
    FF_RESOLVE(cublasLtMatmulPreferenceDestroy)
    FF_RESOLVE(cublasLtMatmulPreferenceSetAttribute)
    FF_RESOLVE(cublasLtMatmulAlgoGetHeuristic)
    FF_RESOLVE(cublasLtMatmulAlgoCheck)
    FF_RESOLVE(cublasLtMatmul)
    FF_RESOLVE(cublasLtMatmulAlgoConfigGetAttribute)
#undef FF_RESOLVE
  });
  if (!error.empty()) throw EngineError(error);
  return api;
}

// Owners of cuBLASLt objects and device memory: whatever is created is destroyed, on every
// path (a constructor or a plan that throws half-way included).
template <class Opaque, auto CublasLt::*destroy>
struct Destroy {
  void operator()(Opaque* p) const { (cublaslt().*destroy)(p); }
};
using Handle =
    std::unique_ptr<cublasLtContext, Destroy<cublasLtContext, &CublasLt::cublasLtDestroy>>;
using MatmulDesc =
    std::unique_ptr<cublasLtMatmulDescOpaque_t,
                    Destroy<cublasLtMatmulDescOpaque_t, &CublasLt::cublasLtMatmulDescDestroy>>;
using Layout =
    std::unique_ptr<cublasLtMatrixLayoutOpaque_t,
                    Destroy<cublasLtMatrixLayoutOpaque_t, &CublasLt::cublasLtMatrixLayoutDestroy>>;
using Preference = std::unique_ptr<
    cublasLtMatmulPreferenceOpaque_t,
    Destroy<cublasLtMatmulPreferenceOpaque_t, &CublasLt::cublasLtMatmulPreferenceDestroy>>;
struct CudaFree {
  void operator()(void* p) const { cudaFree(p); }
};

template <class Value>
void set(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute, const Value& value,
         const char* what) {
  check(cublaslt().cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof value), what);
}
template <class Value>
void set(cublasLtMatmulPreference_t preference, cublasLtMatmulPreferenceAttributes_t attribute,
         const Value& value, const char* what) {
  check(
      cublaslt().cublasLtMatmulPreferenceSetAttribute(preference, attribute, &value, sizeof value),
      what);
}
void set_columns(cublasLtMatrixLayout_t layout, int64_t columns) {
  const uint64_t value = uint64_t(columns);
  check(cublaslt().cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_COLS, &value,
                                                    sizeof value),
        "layout columns");
}

Layout make_layout(cudaDataType_t type, int64_t rows, int64_t columns, int64_t ld) {
  cublasLtMatrixLayout_t layout = nullptr;
  check(cublaslt().cublasLtMatrixLayoutCreate(&layout, type, uint64_t(rows), uint64_t(columns), ld),
        "layout");
  return Layout(layout);
}

// The largest power of two (at most 256, cuBLASLt's default assumption) dividing the
// address and the leading dimension in bytes.
uint32_t alignment(const void* p, int64_t ld_bytes) {
  const uint64_t bits = uint64_t(reinterpret_cast<uintptr_t>(p)) | uint64_t(ld_bytes) | 256u;
  return uint32_t(bits & (~bits + 1));
}

cublasLtEpilogue_t lt_epilogue(GemmEpilogue epilogue) {
  switch (epilogue) {
    case GemmEpilogue::kStore:
    case GemmEpilogue::kAccumulate:
    case GemmEpilogue::kBiasGeluErf:  // cuBLASLt's part of it stores; the pass adds the rest
      return CUBLASLT_EPILOGUE_DEFAULT;
    case GemmEpilogue::kBias:
      return CUBLASLT_EPILOGUE_BIAS;
    case GemmEpilogue::kBiasRelu:
      return CUBLASLT_EPILOGUE_RELU_BIAS;
    case GemmEpilogue::kBiasGeluTanh:
      return CUBLASLT_EPILOGUE_GELU_BIAS;  // the tanh form
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

bool has_bias(GemmEpilogue epilogue) {
  return epilogue == GemmEpilogue::kBias || epilogue == GemmEpilogue::kBiasRelu ||
         epilogue == GemmEpilogue::kBiasGeluTanh;
}

// A plan's key: the shape and the alignments its algorithms were chosen for.
struct PlanKey {
  GemmShape shape;
  uint32_t align_w = 0, align_a = 0, align_c = 0, align_bias = 0;
  auto operator<=>(const PlanKey&) const = default;
};

// What runs one bucket of M: a cuBLASLt algorithm (then, for bias+gelu_erf, the pass), or a
// CUTLASS kernel.
struct Choice {
  cublasLtMatmulAlgo_t algo{};
  const CutlassGeluGemm* cutlass = nullptr;
  double ms = -1;  ///< measured at the bucket's largest M; < 0: not timed
};

struct Plan {
  MatmulDesc op;
  Layout w_layout, a_layout, c_layout;  // a's and c's column count is set to M per run
  std::vector<Choice> choices;          // [log2 of the bucket of M]
  std::string how;                      // how the largest bucket's was chosen (describe())
  double planning_ms = 0;
};

constexpr int kTimedRuns = 5;

// The algorithm's id in cuBLASLt's configuration (for describe()).
int algo_id(const cublasLtMatmulAlgo_t& algo) {
  int id = -1;
  size_t written = 0;
  cublaslt().cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id,
                                                  &written);
  return id;
}

struct EventPair {
  cudaEvent_t start = nullptr, stop = nullptr;
  EventPair() {
    if (cudaEventCreate(&start) != cudaSuccess || cudaEventCreate(&stop) != cudaSuccess) {
      cudaGetLastError();
      throw EngineError("cudaEventCreate failed while timing GEMMs");
    }
  }
  ~EventPair() {
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
  }
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;
};

}  // namespace

struct Gemm::Impl {
  Impl(const GemmOptions& o, cudaStream_t s)
      : options(o), stream(s), type(o.type), allow_tf32(o.allow_tf32) {}
  GemmOptions options;
  cudaStream_t stream;
  StorageType type;
  bool allow_tf32;
  int64_t max_rows = 0;
  int major = 0, minor = 0;                       // the current device's compute capability
  std::vector<const CutlassGeluGemm*> cutlass{};  // of this type, where has_gelu_erf()
  std::string no_gelu_erf;                        // why has_gelu_erf() is false
  Handle handle{};
  std::unique_ptr<void, CudaFree> workspace{};
  std::map<PlanKey, Plan> plans{};  // after `handle`: destroyed before it
  std::map<GemmShape, PlanKey> last_key{};
  double planning_ms = 0;

  cudaDataType_t data_type() const {
    return type == StorageType::kF32   ? CUDA_R_32F
           : type == StorageType::kF16 ? CUDA_R_16F
                                       : CUDA_R_16BF;
  }
  const char* dtype_name() const {
    return type == StorageType::kF32   ? "float32"
           : type == StorageType::kF16 ? "float16"
                                       : "bfloat16";
  }
  Plan make_plan(const PlanKey& key, const void* w, const void* bias) const;
  // Runs `choice` for M rows (cuBLASLt and, for bias+gelu_erf, the pass; or CUTLASS).
  void launch(const Plan& plan, const GemmShape& shape, const Choice& choice, int64_t M,
              const void* a, const void* w, const void* bias, void* c) const;
};

void Gemm::Impl::launch(const Plan& plan, const GemmShape& shape, const Choice& choice, int64_t M,
                        const void* a, const void* w, const void* bias, void* c) const {
  if (choice.cutlass != nullptr) {
    const std::string error =
        choice.cutlass->run(M, shape.N, shape.K, a, shape.lda, w, bias, c, shape.ldc,
                            workspace.get(), kGemmWorkspaceBytes, stream);
    if (!error.empty()) {
      throw EngineError(std::string(choice.cutlass->name) + " failed on " + shape.to_string() +
                        " at M " + std::to_string(M) + ": " + error);
    }
    return;
  }
  set_columns(plan.a_layout.get(), M);
  set_columns(plan.c_layout.get(), M);
  if (has_bias(shape.epilogue)) set(plan.op.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias, "bias");
  const float alpha = 1.0f, beta = shape.epilogue == GemmEpilogue::kAccumulate ? 1.0f : 0.0f;
  check(cublaslt().cublasLtMatmul(handle.get(), plan.op.get(), &alpha, w, plan.w_layout.get(), a,
                                  plan.a_layout.get(), &beta, c, plan.c_layout.get(), c,
                                  plan.c_layout.get(), &choice.algo, workspace.get(),
                                  kGemmWorkspaceBytes, stream),
        "matmul");
  if (shape.epilogue == GemmEpilogue::kBiasGeluErf) {
    const int32_t rows = int32_t(M), cols = int32_t(shape.N);
    namespace k = ::fastformer::kernels;
    if (type == StorageType::kBF16) {
      k::launch_bias_activation<ff_bfloat16>(static_cast<ff_bfloat16*>(c), shape.ldc,
                                             static_cast<const ff_bfloat16*>(bias), rows, cols,
                                             true, k::Act::kGeluErf, stream);
    } else {
      k::launch_bias_activation<ff_half>(static_cast<ff_half*>(c), shape.ldc,
                                         static_cast<const ff_half*>(bias), rows, cols, true,
                                         k::Act::kGeluErf, stream);
    }
  }
}

Plan Gemm::Impl::make_plan(const PlanKey& key, const void* w, const void* bias) const {
  const auto started = std::chrono::steady_clock::now();
  const CublasLt& lt = cublaslt();
  const GemmShape& shape = key.shape;
  const cudaDataType_t data = data_type();
  const cublasComputeType_t compute =
      type == StorageType::kF32 && allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  Plan plan;
  cublasLtMatmulDesc_t op = nullptr;
  check(lt.cublasLtMatmulDescCreate(&op, compute, CUDA_R_32F), "desc");
  plan.op.reset(op);
  set(op, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T, "transa");
  set(op, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N, "transb");
  set(op, CUBLASLT_MATMUL_DESC_EPILOGUE, lt_epilogue(shape.epilogue), "epilogue");
  if (has_bias(shape.epilogue)) {
    set(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, int32_t(data), "bias type");
    set(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias, "bias");  // the heuristic reads its alignment
  }
  plan.w_layout = make_layout(data, shape.K, shape.N, shape.K);
  plan.a_layout = make_layout(data, shape.K, max_rows, shape.lda);
  plan.c_layout = make_layout(data, shape.N, max_rows, shape.ldc);

  cublasLtMatmulPreference_t raw_preference = nullptr;
  check(lt.cublasLtMatmulPreferenceCreate(&raw_preference), "preference");
  const Preference preference(raw_preference);
  set(raw_preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, kGemmWorkspaceBytes, "workspace");
  set(raw_preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_w, "alignment of W");
  set(raw_preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_a, "alignment of A");
  set(raw_preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c, "alignment of C");
  set(raw_preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_c, "alignment of D");

  auto runs_at = [&](const cublasLtMatmulAlgo_t& algo, int64_t M) {
    set_columns(plan.a_layout.get(), M);
    set_columns(plan.c_layout.get(), M);
    cublasLtMatmulHeuristicResult_t result{};
    return lt.cublasLtMatmulAlgoCheck(handle.get(), op, plan.w_layout.get(), plan.a_layout.get(),
                                      plan.c_layout.get(), plan.c_layout.get(), &algo,
                                      &result) == CUBLAS_STATUS_SUCCESS &&
           result.workspaceSize <= kGemmWorkspaceBytes;
  };

  // Timing's scratch operands: A and C for max_rows rows at the shape's leading dimensions, and
  // a bias, filled with one non-zero bit pattern (a zero fill would time an idle datapath).
  std::unique_ptr<void, CudaFree> scratch;
  const int64_t element = type == StorageType::kF32 ? 4 : 2;
  const size_t a_bytes = size_t(max_rows * shape.lda * element),
               c_bytes = size_t(max_rows * shape.ldc * element),
               bias_bytes = size_t(shape.N * element);
  auto round_up = [](size_t n) { return (n + 255) / 256 * 256; };
  std::string untimed;  // why timing did not run
  if (options.timed) {
    void* p = nullptr;
    const size_t bytes = round_up(a_bytes) + round_up(c_bytes) + round_up(bias_bytes);
    if (cudaMalloc(&p, bytes) == cudaSuccess) {
      scratch.reset(p);
      if (cudaMemsetAsync(p, 0x3c, bytes, stream) != cudaSuccess) {
        cudaGetLastError();
        scratch.reset();
        untimed = "its scratch could not be filled";
      }
    } else {
      cudaGetLastError();
      untimed = "no device memory for its " + std::to_string(bytes >> 20) + " MiB of scratch";
    }
  } else {
    untimed = "timing not asked for (--cuda-opt-in gemm-timing)";
  }
  char* const scratch_a = static_cast<char*>(scratch.get());
  char* const scratch_c = scratch_a + round_up(a_bytes);
  char* const scratch_bias = scratch_c + round_up(c_bytes);
  std::unique_ptr<EventPair> events;
  if (scratch) events = std::make_unique<EventPair>();
  // Mean ms of kTimedRuns runs of `choice` at M rows, after one warm-up; < 0 when it failed.
  auto time_choice = [&](const Choice& choice, int64_t M) -> double {
    try {
      launch(plan, shape, choice, M, scratch_a, w, scratch_bias, scratch_c);
      ff_check(cudaEventRecord(events->start, stream), "cudaEventRecord");
      for (int i = 0; i < kTimedRuns; ++i)
        launch(plan, shape, choice, M, scratch_a, w, scratch_bias, scratch_c);
      ff_check(cudaEventRecord(events->stop, stream), "cudaEventRecord");
      ff_check(cudaEventSynchronize(events->stop), "cudaEventSynchronize");
      float ms = 0;
      ff_check(cudaEventElapsedTime(&ms, events->start, events->stop), "cudaEventElapsedTime");
      return double(ms) / kTimedRuns;
    } catch (const std::exception&) {
      cudaGetLastError();
      return -1;
    }
  };
  auto name = [&](const Choice& choice) {
    return choice.cutlass != nullptr
               ? std::string(choice.cutlass->name)
               : "cuBLASLt algo " + std::to_string(algo_id(choice.algo)) +
                     (shape.epilogue == GemmEpilogue::kBiasGeluErf ? " + bias_activation pass"
                                                                   : "");
  };

  constexpr int kCandidates = 8;
  for (int64_t bucket = 1;; bucket *= 2) {
    const int64_t largest = std::min(bucket, max_rows), smallest = bucket / 2 + 1;
    set_columns(plan.a_layout.get(), largest);
    set_columns(plan.c_layout.get(), largest);
    cublasLtMatmulHeuristicResult_t candidates[kCandidates] = {};
    int found = 0;
    const cublasStatus_t status = lt.cublasLtMatmulAlgoGetHeuristic(
        handle.get(), op, plan.w_layout.get(), plan.a_layout.get(), plan.c_layout.get(),
        plan.c_layout.get(), preference.get(), kCandidates, candidates, &found);
    std::vector<Choice> valid;  // the heuristic's order, then the CUTLASS kernels
    for (int i = 0; status == CUBLAS_STATUS_SUCCESS && i < found; ++i) {
      if (candidates[i].state == CUBLAS_STATUS_SUCCESS && runs_at(candidates[i].algo, smallest))
        valid.push_back(Choice{candidates[i].algo, nullptr, -1});
    }
    const size_t lt_valid = valid.size();
    if (shape.epilogue == GemmEpilogue::kBiasGeluErf) {
      for (const CutlassGeluGemm* kernel : cutlass) valid.push_back(Choice{{}, kernel, -1});
    }
    if (valid.empty()) {
      throw EngineError("cuBLASLt offers no algorithm for the " + std::string(dtype_name()) +
                        " GEMM " + shape.to_string() + " at M " + std::to_string(smallest) + ".." +
                        std::to_string(largest) + " (operand alignments W " +
                        std::to_string(key.align_w) + ", A " + std::to_string(key.align_a) +
                        ", C " + std::to_string(key.align_c) + " bytes; heuristic status " +
                        std::to_string(int(status)) + ", " + std::to_string(found) +
                        " candidates)");
    }
    // Untimed: the first CUTLASS kernel for bias+gelu_erf, the heuristic's first otherwise.
    Choice chosen = shape.epilogue == GemmEpilogue::kBiasGeluErf && valid.size() > lt_valid
                        ? valid[lt_valid]
                        : valid[0];
    std::string how = "untimed: " + untimed;
    if (scratch) {
      int timed = 0;
      for (Choice& candidate : valid) {
        candidate.ms = time_choice(candidate, largest);
        if (candidate.ms < 0) continue;
        ++timed;
        if (chosen.ms < 0 || candidate.ms < chosen.ms) chosen = candidate;
      }
      if (chosen.ms >= 0) {
        char line[160];
        std::snprintf(line, sizeof line, "timed %.4f ms at M %lld, fastest of %d (%s %.4f ms)",
                      chosen.ms, static_cast<long long>(largest), timed,
                      valid[0].cutlass ? "first" : "heuristic's first", valid[0].ms);
        how = line;
      } else {
        how = "untimed: every candidate failed to run on the scratch";
      }
    }
    plan.choices.push_back(chosen);
    if (largest >= max_rows) {
      plan.how = name(chosen) + " (" + how + ")";
      break;
    }
  }
  plan.planning_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
  if (scratch) ff_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  return plan;
}

Gemm::Gemm(const GemmOptions& options, ff_stream_t stream) : impl_(new Impl(options, stream)) {
  Impl& impl = *impl_;
  cublasLtHandle_t handle = nullptr;
  check(cublaslt().cublasLtCreate(&handle), "create");
  impl.handle.reset(handle);
  void* workspace = nullptr;
  if (cudaMalloc(&workspace, kGemmWorkspaceBytes) != cudaSuccess) {
    cudaGetLastError();
    throw EngineError("cudaMalloc of the cuBLASLt workspace failed");
  }
  impl.workspace.reset(workspace);
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&impl.major, cudaDevAttrComputeCapabilityMajor, device) !=
          cudaSuccess ||
      cudaDeviceGetAttribute(&impl.minor, cudaDevAttrComputeCapabilityMinor, device) !=
          cudaSuccess) {
    cudaGetLastError();
  }
  // The CUTLASS kernels are sm_90a code: they run on compute capability 9.0 only.
  if (!options.cutlass_gelu) {
    impl.no_gelu_erf = "not asked for (--cuda-opt-in cutlass-gelu)";
  } else if (options.type == StorageType::kF32) {
    impl.no_gelu_erf = "float32 keeps the separate pass";
  } else if (cutlass_gelu_gemms().empty()) {
    impl.no_gelu_erf =
        "this build has no CUTLASS kernels (configure with FASTFORMER_CUTLASS_DIR and "
        "CUDA architecture 90)";
  } else if (impl.major != 9 || impl.minor != 0) {
    impl.no_gelu_erf =
        "the CUTLASS kernels are sm_90a code and this device is compute capability " +
        std::to_string(impl.major) + "." + std::to_string(impl.minor);
  } else {
    for (const CutlassGeluGemm& kernel : cutlass_gelu_gemms())
      if (kernel.type == options.type) impl.cutlass.push_back(&kernel);
    if (impl.cutlass.empty()) impl.no_gelu_erf = "no CUTLASS kernel of this type";
  }
}

Gemm::~Gemm() = default;

bool Gemm::has_gelu_erf(std::string* why) const {
  if (!impl_->cutlass.empty()) return true;
  if (why != nullptr) *why = impl_->no_gelu_erf;
  return false;
}

std::string Gemm::describe(const GemmShape& shape) const {
  const auto key = impl_->last_key.find(shape);
  if (key == impl_->last_key.end()) return "";
  const Plan& plan = impl_->plans.at(key->second);
  char ms[48];
  std::snprintf(ms, sizeof ms, "; planned in %.1f ms", plan.planning_ms);
  return plan.how + ms;
}

double Gemm::planning_ms() const { return impl_->planning_ms; }

void Gemm::set_max_rows(int64_t max_rows) {
  impl_->max_rows = max_rows;
  impl_->plans.clear();  // planned for the old bound
  impl_->last_key.clear();
}

void Gemm::run(const GemmShape& shape, int64_t M, const void* a, const void* w, const void* bias,
               void* c) {
  Impl& impl = *impl_;
  if (M > impl.max_rows) {
    throw EngineError("GEMM of " + std::to_string(M) + " rows over the " +
                      std::to_string(impl.max_rows) + " it was planned for (" + shape.to_string() +
                      ")");
  }
  if (M == 0) return;
  if (shape.epilogue == GemmEpilogue::kBiasGeluErf && impl.cutlass.empty()) {
    throw EngineError("GEMM epilogue bias+gelu_erf asked of a Gemm without it (" +
                      shape.to_string() + "): " + impl.no_gelu_erf);
  }
  const int64_t element = impl.type == StorageType::kF32 ? 4 : 2;
  const PlanKey key{shape, alignment(w, shape.K * element), alignment(a, shape.lda * element),
                    alignment(c, shape.ldc * element),
                    has_bias(shape.epilogue) || shape.epilogue == GemmEpilogue::kBiasGeluErf
                        ? alignment(bias, 0)
                        : 0};
  auto it = impl.plans.find(key);
  if (it == impl.plans.end()) {
    it = impl.plans.emplace(key, impl.make_plan(key, w, bias)).first;
    impl.last_key[shape] = key;
    impl.planning_ms += it->second.planning_ms;
  }
  const Plan& plan = it->second;
  impl.launch(plan, shape, plan.choices[size_t(std::countr_zero(uint64_t(gemm_rows_bucket(M))))], M,
              a, w, bias, c);
}

}  // namespace fastformer::engine::cuda::FF_KERNELS_ABI
