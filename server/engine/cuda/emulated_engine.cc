#include "server/engine/cuda/emulated_engine.h"

#include "server/engine/cuda/cuda_ops.h"
#include "server/engine/error.h"
#include "server/engine/forward.h"

namespace fastformer::engine::cuda {

std::unique_ptr<Engine> create_emulated_cuda_engine(std::shared_ptr<const Model> model,
                                                    const EngineOptions& options) {
  CudaOpsOptions ops_options;
  ops_options.dtype = dtype_name(options.dtype);
  CudaOpsChoice chosen;
  std::string why;
  auto ops = emulated::make_cuda_ops(*model, ops_options, &chosen, &why);
  if (!ops) throw EngineError("emulated CUDA engine: " + why);
  return std::make_unique<ForwardEngine>(
      std::move(model), std::move(ops), options.max_batch_tokens, "cuda",
      "cuda " + chosen.dtype + " on " + chosen.device_name,
      DtypeChoice{dtype_from_name(chosen.dtype), chosen.dtype_why});
}

}  // namespace fastformer::engine::cuda
