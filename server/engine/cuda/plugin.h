// The entry point of the CUDA engine plugin (plugin.cc) as create_engine() sees it.
#pragma once

#include <string>

#include "server/engine/cuda/cuda_ops.h"

namespace fastformer::engine::cuda {

inline constexpr int kPluginOk = 0;        ///< *ops holds the CUDA ops
inline constexpr int kPluginNoDevice = 1;  ///< no usable device; *why says why (fall back to CPU)
inline constexpr int kPluginError = 2;     ///< a device exists but the engine failed; *why says why

using MakeCudaOpsFn = int (*)(const Model* model, const CudaOpsOptions* options, Ops** ops,
                              CudaOpsChoice* chosen, std::string* why);
inline constexpr const char* kPluginLibrary = "libfastformer_cuda_engine.so";
// Versioned: bump the suffix whenever Ops, CudaOpsOptions or this signature change, so that a
// stale plugin found on the loader path is refused ("has no ...") instead of run with another
// layout. v2: the workspace plan (Ops::reserve/workspace/begin_batch). v3: dtype "auto", and
// the device and dtype it chose (CudaOpsChoice). v4: the opt-in kernels (CudaOpsOptions::opt_in,
// CudaOpsChoice::opt_in) and Ops::report().
inline constexpr const char* kPluginSymbol = "fastformer_make_cuda_ops_v4";

}  // namespace fastformer::engine::cuda
