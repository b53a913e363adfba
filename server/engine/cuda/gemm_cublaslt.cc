// GEMMs through cuBLASLt. Row-major C[M, N] = A[M, K] W[N, K]^T is, in cuBLAS's
// column-major terms, C^T (N x M) = op(W^T) (N x K) * A^T (K x M): W is the "A" operand,
// transposed, and the activations are the "B" operand, so no copy transposes anything.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <string>

#include "server/engine/cuda/gemm.h"
#include "server/engine/error.h"

namespace fastformer::engine::cuda::FF_OPS_NAMESPACE {
namespace {

void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw EngineError(std::string("cuBLASLt ") + what + " failed with status " + std::to_string(int(status)));
  }
}

constexpr size_t kWorkspaceBytes = 32u << 20;

}  // namespace

struct Gemm::Impl {
  StorageType type;
  bool allow_tf32;
  cudaStream_t stream;
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
};

Gemm::Gemm(StorageType type, bool allow_tf32, ff_stream_t stream) : impl_(new Impl{type, allow_tf32, stream}) {
  check(cublasLtCreate(&impl_->handle), "create");
  if (cudaMalloc(&impl_->workspace, kWorkspaceBytes) != cudaSuccess) {
    throw EngineError("cudaMalloc of the cuBLASLt workspace failed");
  }
}

Gemm::~Gemm() {
  cudaFree(impl_->workspace);
  cublasLtDestroy(impl_->handle);
}

void Gemm::run(const void* a, int64_t lda, const void* w, int64_t M, int64_t N, int64_t K, void* c, int64_t ldc,
               bool accumulate) {
  if (M == 0) return;
  const cudaDataType_t data = impl_->type == StorageType::kF32   ? CUDA_R_32F
                              : impl_->type == StorageType::kF16 ? CUDA_R_16F
                                                                 : CUDA_R_16BF;
  const cublasComputeType_t compute = impl_->type == StorageType::kF32 && impl_->allow_tf32
                                          ? CUBLAS_COMPUTE_32F_FAST_TF32
                                          : CUBLAS_COMPUTE_32F;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t w_layout = nullptr, a_layout = nullptr, c_layout = nullptr;
  cublasLtMatmulPreference_t preference = nullptr;
  check(cublasLtMatmulDescCreate(&op, compute, CUDA_R_32F), "desc");
  const cublasOperation_t transpose = CUBLAS_OP_T, keep = CUBLAS_OP_N;
  check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof transpose), "transa");
  check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &keep, sizeof keep), "transb");
  check(cublasLtMatrixLayoutCreate(&w_layout, data, uint64_t(K), uint64_t(N), K), "layout W");
  check(cublasLtMatrixLayoutCreate(&a_layout, data, uint64_t(K), uint64_t(M), lda), "layout A");
  check(cublasLtMatrixLayoutCreate(&c_layout, data, uint64_t(N), uint64_t(M), ldc), "layout C");
  check(cublasLtMatmulPreferenceCreate(&preference), "preference");
  const size_t workspace = kWorkspaceBytes;
  check(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                             sizeof workspace),
        "workspace");
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  check(cublasLtMatmulAlgoGetHeuristic(impl_->handle, op, w_layout, a_layout, c_layout, c_layout, preference, 1,
                                       &heuristic, &found),
        "heuristic");
  if (found == 0) throw EngineError("cuBLASLt found no algorithm for a GEMM");
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  check(cublasLtMatmul(impl_->handle, op, &alpha, w, w_layout, a, a_layout, &beta, c, c_layout, c, c_layout,
                       &heuristic.algo, impl_->workspace, kWorkspaceBytes, impl_->stream),
        "matmul");
  cublasLtMatmulPreferenceDestroy(preference);
  cublasLtMatrixLayoutDestroy(c_layout);
  cublasLtMatrixLayoutDestroy(a_layout);
  cublasLtMatrixLayoutDestroy(w_layout);
  cublasLtMatmulDescDestroy(op);
}

}  // namespace fastformer::engine::cuda::FF_OPS_NAMESPACE
