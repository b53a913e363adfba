// The CUDA engine is a plugin (libfastformer_cuda_engine.so) that create_engine() opens with
// dlopen only when a CUDA backend is asked for. Linking the CUDA runtime into the server
// would put its thread-local storage into every thread's stack, and civetweb (the /metrics
// server) runs its workers on 100 KiB stacks, from which every linked library's static TLS
// is taken (cudart's overflowed them); the plugin also lets a CUDA build start on machines
// with no CUDA libraries at all.
#include "server/engine/cuda/plugin.h"

#include <exception>
#include <string>

#include "server/engine/cuda/cuda_ops.h"

extern "C" __attribute__((visibility("default"))) int fastformer_make_cuda_ops_v4(
    const fastformer::engine::Model* model, const fastformer::engine::cuda::CudaOpsOptions* options,
    fastformer::engine::Ops** ops, fastformer::engine::cuda::CudaOpsChoice* chosen,
    std::string* why) {
  try {
    auto made = fastformer::engine::cuda::device::make_cuda_ops(*model, *options, chosen, why);
    if (!made) return fastformer::engine::cuda::kPluginNoDevice;
    *ops = made.release();
    return fastformer::engine::cuda::kPluginOk;
  } catch (const std::exception& e) {
    *why = e.what();
    return fastformer::engine::cuda::kPluginError;
  }
}
