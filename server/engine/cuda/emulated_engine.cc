#include "server/engine/cuda/emulated_engine.h"

#include "server/engine/cuda/cuda_ops.h"
#include "server/engine/error.h"
#include "server/engine/forward.h"

namespace fastformer::engine::cuda {

std::unique_ptr<Engine> create_emulated_cuda_engine(std::shared_ptr<const Model> model,
                                                    const EngineOptions& options) {
  CudaOpsOptions ops_options;
  ops_options.dtype = dtype_name(options.dtype);
  ops_options.opt_in = options.cuda_opt_in;  // the environment's FASTFORMER_CUDA_OPT_IN is not read
  CudaOpsChoice chosen;
  std::string why;
  auto ops = emulated::make_cuda_ops(*model, ops_options, &chosen, &why);
  if (!ops) throw EngineError("emulated CUDA engine: " + why);
  OpsReport* report = ops->report();
  return std::make_unique<ForwardEngine>(
      std::move(model), std::move(ops), options.max_batch_tokens, "cuda",
      "cuda " + chosen.dtype + " on " + chosen.device_name +
          (chosen.opt_in.empty() ? "" : ", opt-in " + chosen.opt_in),
      DtypeChoice{dtype_from_name(chosen.dtype), chosen.dtype_why}, report);
}

}  // namespace fastformer::engine::cuda
