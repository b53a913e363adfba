// The CUDA implementation of Ops: weights and activations in the serving dtype (float32,
// float16 or bfloat16) in device memory sized once at start-up, GEMMs through cuBLASLt,
// every other step a kernel of kernels/.
//
// The same source builds twice: against the CUDA runtime (namespace cuda::device) and,
// with FF_EMULATION, against the host emulation of kernels/runtime.h
// (namespace cuda::emulated), which is how `make test` runs this engine on a CPU.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "server/engine/error.h"
#include "server/engine/model.h"
#include "server/engine/ops.h"

namespace fastformer::engine::cuda {

struct CudaOpsOptions {
  std::string dtype = "float32";  ///< float32, float16, bfloat16, or auto (choose_cuda_dtype)
  int device = 0;
  bool allow_tf32 = false;  ///< TF32 tensor-core GEMMs for float32
  std::string opt_in;       ///< the opt-in kernels (parse_cuda_opt_in)
};

// What make_cuda_ops built on, and in which dtype.
struct CudaOpsChoice {
  std::string device_name;  ///< e.g. "NVIDIA H200" or "host emulation"
  std::string dtype;        ///< float32, float16 or bfloat16: options.dtype, or auto's pick
  std::string dtype_why;    ///< auto only: why, e.g. "NVIDIA H200, compute capability 9.0: ..."
  /// The opt-in kernels that run (e.g. "cutlass-gelu"), and of those asked for, why any does
  /// not ("cutlass-gelu: this build has no CUTLASS kernels"); "" when none was asked for.
  std::string opt_in;
};

// The CUDA engine's opt-in kernels: new kernels that run only when asked for, until a GPU run
// has passed their parity and measured them faster (docs/kernels.md, "Opt-in kernels"); the
// GPU check runs the engine with and without them.
struct CudaOptIn {
  /// The feed-forward's bias and exact-erf GELU in the epilogue of a CUTLASS sm_90a GEMM
  /// (16-bit dtypes on compute capability 9.0; elsewhere the GEMM and a separate pass).
  bool cutlass_gelu = false;
  /// The key pool in one pass over K, its scores on tensor cores in 16-bit dtypes.
  bool fused_key_pool = false;
  /// Each GEMM shape's algorithm per bucket of M measured at its first run (the warm-up) among
  /// cuBLASLt's candidates and the CUTLASS kernels, instead of the heuristic's first.
  bool gemm_timing = false;
  /// The forward graph's kernels of a batch captured into a CUDA graph, per batch sizes, and
  /// replayed for the next batch of the same sizes (Ops::run_region).
  bool cuda_graphs = false;
};
inline constexpr const char* kCudaOptInNames =
    "cutlass-gelu, fused-key-pool, gemm-timing, cuda-graphs, all or none";

// Parses a comma-separated list of kCudaOptInNames ("" and "none": none). Throws EngineError
// naming the field, the unknown entry and the choices.
inline CudaOptIn parse_cuda_opt_in(std::string_view list) {
  CudaOptIn out;
  while (!list.empty()) {
    const size_t comma = list.find(',');
    std::string_view name = list.substr(0, comma);
    list = comma == std::string_view::npos ? std::string_view{} : list.substr(comma + 1);
    while (!name.empty() && name.front() == ' ') name.remove_prefix(1);
    while (!name.empty() && name.back() == ' ') name.remove_suffix(1);
    if (name == "cutlass-gelu") {
      out.cutlass_gelu = true;
    } else if (name == "fused-key-pool") {
      out.fused_key_pool = true;
    } else if (name == "gemm-timing") {
      out.gemm_timing = true;
    } else if (name == "cuda-graphs") {
      out.cuda_graphs = true;
    } else if (name == "all") {
      out.cutlass_gelu = out.fused_key_pool = out.gemm_timing = out.cuda_graphs = true;
    } else if (name != "none" && !name.empty()) {
      throw EngineError("cuda_opt_in (--cuda-opt-in, FASTFORMER_CUDA_OPT_IN): unknown kernel \"" +
                        std::string(name) + "\"; expected " + kCudaOptInNames);
    }
  }
  return out;
}

// The CUDA engine's --dtype auto on a device of compute capability major.minor: bfloat16 from
// 8.0 (Ampere and later multiply bfloat16 on tensor cores at float16's rate, with float32's
// range: no overflow to guard against), float32 before (no bfloat16 tensor cores, and float16
// can overflow: see the check after each batch). Header-only: the plugin links no engine.cc.
inline std::string choose_cuda_dtype(std::string_view device, int major, int minor,
                                     std::string* why) {
  const std::string capability = std::string(device) + ", compute capability " +
                                 std::to_string(major) + "." + std::to_string(minor);
  if (major >= 8) {
    *why = capability + ": bfloat16 tensor cores";
    return "bfloat16";
  }
  *why = capability + ": no bfloat16 tensor cores before 8.0";
  return "float32";
}

namespace device {
// Null (and `why` set) when no usable device exists; throws when one exists but
// the engine cannot be built on it (out of memory, ...).
std::unique_ptr<Ops> make_cuda_ops(const Model& model, const CudaOpsOptions& options,
                                   CudaOpsChoice* chosen, std::string* why);
}  // namespace device

namespace emulated {
// The host emulation is an sm_90 device (kernels/emulation/emulator.h): auto is bfloat16.
std::unique_ptr<Ops> make_cuda_ops(const Model& model, const CudaOpsOptions& options,
                                   CudaOpsChoice* chosen, std::string* why);
}  // namespace emulated

}  // namespace fastformer::engine::cuda
