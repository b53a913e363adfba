// One CUTLASS 3.x sm_90a GEMM with bias and exact-erf GELU in its epilogue, instantiated per
// storage type and tile configuration by the small .cu files beside this header (one
// instantiation a file, so a build compiles them in parallel: each takes about a minute).
//
// Row-major C[M, N] = A[M, K] W[N, K]^T: A is CUTLASS's row-major A, W its column-major B (both
// K-major), C and D row-major with the bias along N (LinCombPerColBiasEltAct), C not read
// (void source). The activation is cutlass::epilogue::thread::GELU, the erf form, applied to
// alpha * acc + bias in float. Strides are the real leading dimensions: TMA needs the
// addresses and the leading dimensions 16-byte aligned, which run() checks (the engine's
// activations and weights are; gemm_aligned in cuda_ops.cc).
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/epilogue/thread/activation.h"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/gemm/kernel/tile_scheduler.hpp"

namespace fastformer::engine::cuda::cutlass_sm90 {

template <class Element, class TileShape, class ClusterShape, class MainloopSchedule,
          class EpilogueSchedule>
struct GeluGemm {
  using LayoutA = cutlass::layout::RowMajor;
  using LayoutB = cutlass::layout::ColumnMajor;
  using LayoutD = cutlass::layout::RowMajor;
  static constexpr int kAlignment = 16 / int(sizeof(Element));  // elements in 16 bytes
  using Fusion = cutlass::epilogue::fusion::LinCombPerColBiasEltAct<cutlass::epilogue::thread::GELU,
                                                                    Element, float, Element, void>;
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD, kAlignment,
      Element, LayoutD, kAlignment, EpilogueSchedule, Fusion>::CollectiveOp;
  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, LayoutA, kAlignment, Element,
      LayoutB, kAlignment, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      MainloopSchedule>::CollectiveOp;
  using Kernel =
      cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, CollectiveMainloop,
                                           CollectiveEpilogue, cutlass::gemm::PersistentScheduler>;
  using Device = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static std::string run(int64_t M, int64_t N, int64_t K, const void* a, int64_t lda, const void* w,
                         const void* bias, void* c, int64_t ldc, void* workspace,
                         size_t workspace_bytes, cudaStream_t stream) {
    auto aligned = [](const void* p, int64_t ld) {
      return (reinterpret_cast<uintptr_t>(p) | uintptr_t(ld) * sizeof(Element)) % 16 == 0;
    };
    if (!aligned(a, lda) || !aligned(w, K) || !aligned(c, ldc) || !aligned(bias, 0))
      return "operands not 16-byte aligned";
    using StrideA = typename Kernel::StrideA;
    using StrideB = typename Kernel::StrideB;
    using StrideD = typename Kernel::StrideD;
    StrideA stride_a = cute::make_stride(int64_t(lda), cute::Int<1>{}, int64_t(0));
    StrideB stride_b = cute::make_stride(int64_t(K), cute::Int<1>{}, int64_t(0));
    StrideD stride_d = cute::make_stride(int64_t(ldc), cute::Int<1>{}, int64_t(0));
    typename Device::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {int(M), int(N), int(K), 1},
        {static_cast<const Element*>(a), stride_a, static_cast<const Element*>(w), stride_b},
        {{}, nullptr, stride_d, static_cast<Element*>(c), stride_d}};
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = 0.0f;
    args.epilogue.thread.bias_ptr = static_cast<const Element*>(bias);
    Device gemm;
    if (gemm.can_implement(args) != cutlass::Status::kSuccess) return "CUTLASS cannot implement it";
    if (Device::get_workspace_size(args) > workspace_bytes) return "workspace too small";
    const cutlass::Status status = gemm.run(args, workspace, stream);
    if (status != cutlass::Status::kSuccess)
      return std::string("CUTLASS status ") + cutlass::cutlassGetStatusString(status);
    return "";
  }
};

// One instantiation: NAME(...) runs GeluGemm<ELEMENT, tile, cluster, schedules>.
#define FF_CUTLASS_GELU_GEMM(NAME, ELEMENT, TM, TN, TK, CM, CN, MAINLOOP, EPILOGUE)                \
  std::string NAME(int64_t M, int64_t N, int64_t K, const void* a, int64_t lda, const void* w,     \
                   const void* bias, void* c, int64_t ldc, void* workspace,                        \
                   size_t workspace_bytes, cudaStream_t stream) {                                  \
    using namespace cute;                                                                          \
    return GeluGemm<ELEMENT, Shape<_##TM, _##TN, _##TK>, Shape<_##CM, _##CN, _1>,                  \
                    cutlass::gemm::MAINLOOP, cutlass::epilogue::EPILOGUE>::run(M, N, K, a, lda, w, \
                                                                               bias, c, ldc,       \
                                                                               workspace,          \
                                                                               workspace_bytes,    \
                                                                               stream);            \
  }

}  // namespace fastformer::engine::cuda::cutlass_sm90
