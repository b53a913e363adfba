#include "server/repository/settings.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>

namespace fastformer::repository {

int64_t ModelSettings::request_tokens(const engine::ModelConfig& model) const {
  return max_request_tokens > 0 ? max_request_tokens
                                : std::max(max_batch_tokens, model.max_position_embeddings);
}

engine::EngineOptions ModelSettings::engine_options(const engine::ModelConfig& model) const {
  engine::EngineOptions options;
  if (!engine::parse_backend(backend, &options.backend))
    throw std::invalid_argument("backend \"" + backend + "\" is not cpu, cuda or auto");
  options.threads = threads;
  options.dtype = dtype;
  options.device = device;
  options.allow_tf32 = allow_tf32;
  options.cuda_opt_in = cuda_opt_in;
  options.cpu_gemm = cpu_gemm;
  // The buffers hold a full batch, or the longest sequence a request may bring, which runs in
  // a batch of its own.
  options.max_batch_tokens =
      std::max(max_batch_tokens, std::min(request_tokens(model), model.max_position_embeddings));
  return options;
}

batching::QueueLimits ModelSettings::queue_limits() const {
  batching::QueueLimits limits;
  limits.max_batch_tokens = max_batch_tokens;
  limits.max_batch_sequences = max_batch_sequences;
  limits.max_queue_tokens = max_queue_tokens;
  limits.max_queue_delay = std::chrono::microseconds(max_queue_delay_us);
  limits.max_bulk_queue_tokens = max_bulk_queue_tokens;
  limits.bulk_promote_after = std::chrono::milliseconds(bulk_promote_after_ms);
  limits.mixed_batch_tokens = mixed_batch_tokens;
  return limits;
}

request::Limits ModelSettings::request_limits(const engine::ModelConfig& model) const {
  request::Limits limits;
  limits.max_request_tokens = request_tokens(model);
  limits.max_request_inputs = max_request_inputs;
  limits.max_request_spans = max_request_spans;
  return limits;
}

}  // namespace fastformer::repository
