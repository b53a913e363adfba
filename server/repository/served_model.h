// One model version as it serves: its weights, tokenizer and engine (loaded and warmed up off
// the serving path), its own batch queue and its lane on the shared compute pool, the limits
// its requests are checked against, and its protocol statistics. Immutable once READY, except
// the statistics; requests hold it (batching::Job::owner) until they end, so a version
// swapped out or unloaded finishes what it admitted before it is freed.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "inference/model_config.pb.h"
#include "server/batching/queue.h"
#include "server/batching/scheduler.h"
#include "server/engine/engine.h"
#include "server/engine/model.h"
#include "server/metrics/metrics.h"
#include "server/repository/settings.h"
#include "server/request/encode_input.h"
#include "server/request/quantize.h"
#include "server/text/text.h"

namespace fastformer::repository {

// What the protocol layers answer a model's requests and metadata with, besides its settings.
struct ServiceConfig {
  request::Limits limits;  ///< settings.request_limits(the model)
  std::string version;     ///< server_version in ModelInfo, version in ServerMetadata
  /// The model directory's tokenizer.json (text::load_tokenizer); null: the model takes no text.
  std::shared_ptr<const text::Tokenizer> tokenizer;
  /// The classifier head's class names, read once at load (read_labels): config.json's
  /// id2label, else labels.json's "labels"; empty when neither names them.
  std::vector<std::string> labels;
  /// The version's quantization.json (read_quantization), read once at load; null: none, so
  /// the int8 and uint8 embedding types are refused naming quantization_file.
  std::shared_ptr<const request::Quantization> quantization;
  std::string quantization_file;  ///< where it is (or would be)
  /// The version's prompts (read_prompts), read once at load; null: none.
  std::shared_ptr<const request::Prompts> prompts;
  // The files above as the request rules take them (valid while this config lives).
  request::VersionFiles files() const {
    return {prompts.get(), quantization.get(), quantization_file};
  }
};

// Cumulative statistics of one model version, for the protocol's ModelStatistics: every
// inference request of every API counts. Nanoseconds, as the protocol has them.
struct InferenceStatistics {
  struct Duration {
    std::atomic<uint64_t> count{0}, ns{0};
    void add(uint64_t n) {
      count.fetch_add(1, std::memory_order_relaxed);
      ns.fetch_add(n, std::memory_order_relaxed);
    }
  };
  Duration success, fail, queue, compute_input, compute_infer, compute_output;
  std::atomic<uint64_t> inference_count{0};    ///< sequences (batch rows) of successful requests
  std::atomic<uint64_t> execution_count{0};    ///< engine batches run
  std::atomic<uint64_t> last_inference_ms{0};  ///< milliseconds since the epoch
};

struct ServedModel {
  std::string name;     ///< the repository's directory name (or config.json's, for --model-dir)
  std::string version;  ///< the version directory's name, "1" for --model-dir
  int64_t version_number = 1;
  std::string dir;  ///< the version directory
  ModelSettings settings;
  ServiceConfig config;
  std::shared_ptr<const engine::Model> model;
  std::shared_ptr<engine::Engine> engine;
  std::unique_ptr<batching::BatchQueue> queue;
  std::unique_ptr<batching::Scheduler> scheduler;  // a lane of the server's compute pool (null:
                                                   // the owner forms and runs its batches)
  mutable InferenceStatistics statistics;
  std::string fingerprint;  ///< the version directory's files when it loaded
  /// Its metric series (shared with another copy of the same version while one replaces it).
  std::shared_ptr<metrics::ModelSeries> series;

  // What loading a version needs from the repository that loads it.
  struct LoadContext {
    metrics::Metrics& metrics;
    batching::ComputePool& pool;                    ///< the version's lane runs on it
    std::shared_ptr<batching::QueueBudget> budget;  ///< --max-queue-tokens over every model
    std::string server_version;
    std::function<void(const batching::Batch&)> before_compute;  ///< test faults
    std::function<void(const std::string& model, const std::string& reason, int64_t sequences)>
        on_batch_failure;
  };
  // Assembles version `version` of model `name` (empty: config.json's model_name) from `dir`
  // with `settings`: the memory check (two copies must fit while the old one serves), the
  // weights, tokenizer and labels, the engine and its warm-up, the queue, the lane and the
  // metric series; READY to serve when it returns. Throws (std::runtime_error,
  // std::invalid_argument, engine errors) with the reason when it cannot.
  static std::shared_ptr<ServedModel> load(const std::string& name, int64_t version,
                                           const std::string& dir, const ModelSettings& settings,
                                           const LoadContext& context);

  const text::Tokenizer* tokenizer() const { return config.tokenizer.get(); }
  // Why `type` cannot be answered for this version's embeddings of `dims` dimensions
  // (request::check_embedding_type with its quantization.json); nothing when it can.
  std::optional<std::string> check_embedding_type(request::EmbeddingType type, int64_t dims,
                                                  bool normalized) const {
    return request::check_embedding_type(type, dims, normalized, config.quantization.get(),
                                         config.quantization_file);
  }
  // The calibrated range for int8 / uint8 (null otherwise, or where check_embedding_type refuses).
  const request::QuantizationRange* quantization_range(int64_t dims, bool normalized) const {
    return config.quantization ? config.quantization->find(dims, normalized) : nullptr;
  }
  // Class `index`'s name: config.labels', else LABEL_<index> (as Hugging Face names the labels
  // it was not told). What every protocol shows.
  std::string label(size_t index) const {
    if (index < config.labels.size() && !config.labels[index].empty()) return config.labels[index];
    return "LABEL_" + std::to_string(index);
  }

  // Closes the queue, runs what it holds and leaves the pool: the scheduler before the queue
  // and the engine it runs on.
  ~ServedModel() {
    if (queue) queue->close();
    scheduler.reset();
    queue.reset();
  }
};

}  // namespace fastformer::repository
