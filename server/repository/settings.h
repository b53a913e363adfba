// The settings of one model (ModelSettings): what the server's flags and the model's
// config.pbtxt say, and the options each part of the server takes from them.
#pragma once

#include <cstdint>
#include <string>

#include "common/defaults.h"
#include "inference/model_config.pb.h"
#include "server/batching/queue.h"
#include "server/engine/engine.h"
#include "server/request/encode_input.h"

namespace fastformer::repository {

// One model's settings, the one struct a setting lives in: the server's flags fill it (the
// CLI writes straight into ServerOptions::model), its config.pbtxt overrides it
// (read_settings), and each part of the server takes its own options from it; nothing copies
// the fields by hand. A new setting is a field here, its flag (server_options.cc), its
// config.pbtxt key (read_settings) and the line of the accessor that hands it out.
struct ModelSettings {
  std::string backend = defaults::kBackend;                         ///< auto, cpu or cuda
  engine::Dtype dtype = engine::dtype_from_name(defaults::kDtype);  ///< auto: the engine picks
  int device = defaults::kDevice;
  int threads = defaults::kThreads;
  bool allow_tf32 = false;
  std::string cuda_opt_in;  ///< the CUDA engine's opt-in kernels (EngineOptions::cuda_opt_in)
  engine::CpuGemm cpu_gemm = engine::CpuGemm::kAuto;  ///< the CPU engine's bfloat16 GEMMs
  int64_t max_batch_tokens = defaults::kMaxBatchTokens;
  int64_t max_batch_sequences = defaults::kMaxBatchSequences;
  int64_t max_queue_delay_us = defaults::kMaxQueueDelayUs;
  /// This model's queue; the server-wide limit (--max-queue-tokens too) is separate.
  int64_t max_queue_tokens = defaults::kMaxQueueTokens;
  /// 0: max(max_batch_tokens, max_position_embeddings)
  int64_t max_request_tokens = defaults::kMaxRequestTokens;
  int64_t max_request_inputs = defaults::kMaxRequestInputs;
  int64_t max_request_spans = defaults::kMaxRequestSpans;
  /// Priority classes (docs/operations.md): the class of a request that names none; the bulk
  /// class's own queue limit (0: max_queue_tokens); how long a bulk sequence waits before it is
  /// batched as an interactive one (0: never).
  batching::Priority default_priority = batching::Priority::kInteractive;
  int64_t max_bulk_queue_tokens = 0;
  int64_t bulk_promote_after_ms = defaults::kBulkPromoteAfterMs;
  /// In a batch with interactive sequences, bulk ones fill it only up to this many tokens
  /// (0: half of max_batch_tokens).
  int64_t mixed_batch_tokens = 0;
  /// Each class's deadline for a call that sets none (0: none): a request still queued then is
  /// answered DEADLINE_EXCEEDED (504).
  int64_t interactive_timeout_ms = 0;
  int64_t bulk_timeout_ms = 0;
  int64_t default_timeout_ms(batching::Priority p) const {
    return p == batching::Priority::kBulk ? bulk_timeout_ms : interactive_timeout_ms;
  }
  inference::ModelVersionPolicy version_policy;  ///< default: latest 1
  /// config.pbtxt's parameters["prompts"]: the prompts object as JSON (request::Prompts::parse),
  /// which replaces the version's config_sentence_transformers.json; empty: that file's.
  std::string prompts;

  // max_request_tokens, resolved against the model when 0.
  int64_t request_tokens(const engine::ModelConfig& model) const;
  // The engine's: backend, dtype, device, threads, TF32, CPU GEMMs, and buffers for a full batch or
  // the longest request (which runs in a batch of its own). Throws std::invalid_argument for a
  // backend that is not auto, cpu or cuda.
  engine::EngineOptions engine_options(const engine::ModelConfig& model) const;
  // The batch queue's: the batch budgets, the queue delay, this model's queue limits (per
  // class) and the bulk promotion bound.
  batching::QueueLimits queue_limits() const;
  // What every protocol checks a request against (the request layer's).
  request::Limits request_limits(const engine::ModelConfig& model) const;
};

}  // namespace fastformer::repository
