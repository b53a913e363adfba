// GEMMs through cuBLASLt. Row-major C[M, N] = A[M, K] W[N, K]^T is, in cuBLAS's
// column-major terms, C^T (N x M) = op(W^T) (N x K) * A^T (K x M): W is the "A" operand,
// transposed, and the activations are the "B" operand, so no copy transposes anything.
//
// libcublasLt is opened with dlopen when the first CUDA engine is built, not linked: a
// process that merely links it cannot start the civetweb-based /metrics server (seen with
// CUDA 13's libcublasLt and Debian's civetweb 1.15), and a CUDA build must start and
// serve on the CPU where no CUDA libraries beyond the runtime are installed.
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <mutex>
#include <string>
#include <type_traits>

#include "server/engine/cuda/gemm.h"
#include "server/engine/error.h"

namespace fastformer::engine::cuda::FF_KERNELS_ABI {
namespace {

void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw EngineError(std::string("cuBLASLt ") + what + " failed with status " + std::to_string(int(status)));
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
  FF_CUBLASLT_FUNCTION(cublasLtMatmulPreferenceCreate)
  FF_CUBLASLT_FUNCTION(cublasLtMatmulPreferenceDestroy)
  FF_CUBLASLT_FUNCTION(cublasLtMatmulPreferenceSetAttribute)
  FF_CUBLASLT_FUNCTION(cublasLtMatmulAlgoGetHeuristic)
  FF_CUBLASLT_FUNCTION(cublasLtMatmul)
#undef FF_CUBLASLT_FUNCTION
};

const CublasLt& cublaslt() {
  static CublasLt api;
  static std::once_flag once;
  static std::string error;
  std::call_once(once, [] {
    void* lib = nullptr;
    for (const char* name : {"libcublasLt.so.13", "libcublasLt.so"}) {
      if ((lib = dlopen(name, RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
    }
    if (lib == nullptr) {
      error = std::string("cannot load libcublasLt (") + dlerror() + ")";
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
    FF_RESOLVE(cublasLtMatmulPreferenceCreate)
    FF_RESOLVE(cublasLtMatmulPreferenceDestroy)
    FF_RESOLVE(cublasLtMatmulPreferenceSetAttribute)
    FF_RESOLVE(cublasLtMatmulAlgoGetHeuristic)
    FF_RESOLVE(cublasLtMatmul)
#undef FF_RESOLVE
  });
  if (!error.empty()) throw EngineError(error);
  return api;
}

}  // namespace

struct Gemm::Impl {
  StorageType type;
  bool allow_tf32;
  cudaStream_t stream;
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
};

Gemm::Gemm(StorageType type, bool allow_tf32, ff_stream_t stream) : impl_(new Impl{type, allow_tf32, stream}) {
  const CublasLt& lt = cublaslt();
  check(lt.cublasLtCreate(&impl_->handle), "create");
  if (cudaMalloc(&impl_->workspace, kGemmWorkspaceBytes) != cudaSuccess) {
    throw EngineError("cudaMalloc of the cuBLASLt workspace failed");
  }
}

Gemm::~Gemm() {
  const CublasLt& lt = cublaslt();
  cudaFree(impl_->workspace);
  lt.cublasLtDestroy(impl_->handle);
}

void Gemm::run(const void* a, int64_t lda, const void* w, int64_t M, int64_t N, int64_t K, void* c, int64_t ldc,
               bool accumulate) {
  if (M == 0) return;
  const CublasLt& lt = cublaslt();
  const cudaDataType_t data = impl_->type == StorageType::kF32   ? CUDA_R_32F
                              : impl_->type == StorageType::kF16 ? CUDA_R_16F
                                                                 : CUDA_R_16BF;
  const cublasComputeType_t compute = impl_->type == StorageType::kF32 && impl_->allow_tf32
                                          ? CUBLAS_COMPUTE_32F_FAST_TF32
                                          : CUBLAS_COMPUTE_32F;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t w_layout = nullptr, a_layout = nullptr, c_layout = nullptr;
  cublasLtMatmulPreference_t preference = nullptr;
  check(lt.cublasLtMatmulDescCreate(&op, compute, CUDA_R_32F), "desc");
  const cublasOperation_t transpose = CUBLAS_OP_T, keep = CUBLAS_OP_N;
  check(lt.cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof transpose), "transa");
  check(lt.cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &keep, sizeof keep), "transb");
  check(lt.cublasLtMatrixLayoutCreate(&w_layout, data, uint64_t(K), uint64_t(N), K), "layout W");
  check(lt.cublasLtMatrixLayoutCreate(&a_layout, data, uint64_t(K), uint64_t(M), lda), "layout A");
  check(lt.cublasLtMatrixLayoutCreate(&c_layout, data, uint64_t(N), uint64_t(M), ldc), "layout C");
  check(lt.cublasLtMatmulPreferenceCreate(&preference), "preference");
  const size_t workspace = kGemmWorkspaceBytes;
  check(lt.cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                             sizeof workspace),
        "workspace");
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  check(lt.cublasLtMatmulAlgoGetHeuristic(impl_->handle, op, w_layout, a_layout, c_layout, c_layout, preference, 1,
                                       &heuristic, &found),
        "heuristic");
  if (found == 0) throw EngineError("cuBLASLt found no algorithm for a GEMM");
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  check(lt.cublasLtMatmul(impl_->handle, op, &alpha, w, w_layout, a, a_layout, &beta, c, c_layout, c, c_layout,
                       &heuristic.algo, impl_->workspace, kGemmWorkspaceBytes, impl_->stream),
        "matmul");
  lt.cublasLtMatmulPreferenceDestroy(preference);
  lt.cublasLtMatrixLayoutDestroy(c_layout);
  lt.cublasLtMatrixLayoutDestroy(a_layout);
  lt.cublasLtMatrixLayoutDestroy(w_layout);
  lt.cublasLtMatmulDescDestroy(op);
}

}  // namespace fastformer::engine::cuda::FF_KERNELS_ABI
