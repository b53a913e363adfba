#include "server/engine/engine.h"

#include <thread>

#include "server/engine/cpu/cpu_ops.h"
#include "server/engine/error.h"
#include "server/engine/forward.h"

namespace fastformer::engine {

bool parse_backend(const std::string& name, Backend* out) {
  if (name == "auto") *out = Backend::kAuto;
  else if (name == "cpu") *out = Backend::kCpu;
  else if (name == "cuda") *out = Backend::kCuda;
  else return false;
  return true;
}

std::unique_ptr<Engine> create_engine(std::shared_ptr<const Model> model, const EngineOptions& options,
                                      std::string* why) {
  if (options.max_batch_tokens <= 0) {
    throw EngineError("max_batch_tokens must be positive, got " + std::to_string(options.max_batch_tokens));
  }
  if (options.backend == Backend::kCuda) {
    throw EngineError(
        "backend cuda: this build has no CUDA engine (it arrives with the CUDA engine issue); "
        "use --backend cpu or auto");
  }
  if (options.dtype != "float32") {
    throw EngineError("dtype " + options.dtype + ": the CPU engine serves float32 only");
  }
  if (why != nullptr) {
    *why = options.backend == Backend::kAuto ? "auto: no CUDA engine in this build, using the CPU engine"
                                             : "cpu requested";
  }
  const int threads = options.threads > 0 ? options.threads
                                          : std::max(1, int(std::thread::hardware_concurrency()));
  auto ops = std::make_unique<CpuOps>(threads, options.max_batch_tokens, model->config(),
                                      model->num_labels());
  const std::string device = "cpu (" + std::to_string(threads) + " threads)";
  return std::make_unique<ForwardEngine>(std::move(model), std::move(ops), options.max_batch_tokens,
                                         "cpu", device);
}

}  // namespace fastformer::engine
