// The CUDA engine running on the host emulation of kernels/runtime.h: the same kernels,
// launch configurations, buffer offsets and orchestration as on a GPU, executed by the CPU.
// For tests (make test) and for debugging kernels on a machine without a GPU.
#pragma once

#include <memory>

#include "server/engine/engine.h"

namespace fastformer::engine::cuda {

std::unique_ptr<Engine> create_emulated_cuda_engine(std::shared_ptr<const Model> model,
                                                    const EngineOptions& options);

}  // namespace fastformer::engine::cuda
