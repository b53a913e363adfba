#include "server/engine/cuda/emulated_engine.h"

#include "server/engine/cuda/cuda_ops.h"
#include "server/engine/error.h"
#include "server/engine/forward.h"

namespace fastformer::engine::cuda {

std::unique_ptr<Engine> create_emulated_cuda_engine(std::shared_ptr<const Model> model,
                                                    const EngineOptions& options) {
  CudaOpsOptions ops_options;
  ops_options.dtype = dtype_name(resolved_dtype(options.dtype));
  std::string device, why;
  auto ops = emulated::make_cuda_ops(*model, ops_options, &device, &why);
  if (!ops) throw EngineError("emulated CUDA engine: " + why);
  return std::make_unique<ForwardEngine>(std::move(model), std::move(ops), options.max_batch_tokens,
                                         "cuda", "cuda " + ops_options.dtype + " on " + device);
}

}  // namespace fastformer::engine::cuda
