// Every metric the server exports, registered at start-up so each exists before the
// first request (docs/metrics.md). Recorded where the thing happens: the rpc layer counts
// requests, the queue its depth and drops, the scheduler its batches (the last two through
// queue_recorders and batch_recorders below).
#pragma once

#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace fastformer::metrics {

// One model version's labels: `model` and `version` on every per-model series, the rest on
// fastformer_model_info.
struct ModelLabels {
  std::string model, version, dtype, backend, device, server_version;
};

// The series of one model version ({model, version}), registered when it loads and removed
// when the last copy of that version that records into them is freed (Metrics::add_model).
struct ModelSeries {
  std::string model, version;
  prometheus::Histogram* queue_duration = nullptr;          ///< per sequence, admission to batch
  prometheus::Histogram* batch_compute_duration = nullptr;  ///< per batch
  prometheus::Histogram* batch_tokens = nullptr;
  prometheus::Histogram* batch_sequences = nullptr;
  prometheus::Counter* sequences_total = nullptr;    ///< computed sequences
  prometheus::Counter* tokens_total = nullptr;       ///< computed tokens
  prometheus::Counter* dropped_deadline = nullptr;   ///< ..._dropped_total{reason="deadline"}
  prometheus::Counter* dropped_cancelled = nullptr;  ///< ... {reason="cancelled"}
  prometheus::Counter* batch_failures = nullptr;     ///< fastformer_batch_failures_total
  prometheus::Gauge* queue_tokens = nullptr;
  prometheus::Gauge* queue_sequences = nullptr;
  prometheus::Gauge* info = nullptr;  ///< fastformer_model_info, once loaded
  // Per priority class (kPriorityNames' order: interactive, bulk).
  prometheus::Histogram* class_queue_duration[2] = {};  ///< by the class admitted to
  prometheus::Gauge* class_queue_tokens[2] = {};
  prometheus::Gauge* class_queue_sequences[2] = {};
  prometheus::Counter* class_requests[2] = {};   ///< admitted
  prometheus::Counter* class_rejected[2] = {};   ///< refused: that class's queue (or budget) full
  prometheus::Counter* bulk_promoted = nullptr;  ///< bulk sequences batched as interactive
};

// The priority classes' label values, in batching::Priority's order (the batching layer's
// priority_name gives the same names; tests/unit/repository_test.cc checks it).
inline constexpr const char* kPriorityNames[] = {"interactive", "bulk"};

// A model version's state, as fastformer_model_state{model,version,state} shows it (1 for the
// current state, 0 for the others).
inline constexpr const char* kModelStates[] = {"LOADING", "READY", "UNLOADING", "UNAVAILABLE"};

class Metrics {
 private:
  // Declared first: every family below registers in it during construction.
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Histogram>& request_duration_;
  prometheus::Family<prometheus::Counter>& dropped_;
  prometheus::Family<prometheus::Histogram>& queue_duration_;
  prometheus::Family<prometheus::Histogram>& batch_compute_duration_;
  prometheus::Family<prometheus::Histogram>& batch_tokens_;
  prometheus::Family<prometheus::Histogram>& batch_sequences_;
  prometheus::Family<prometheus::Counter>& sequences_total_;
  prometheus::Family<prometheus::Counter>& tokens_total_;
  prometheus::Family<prometheus::Counter>& batch_failures_;
  prometheus::Family<prometheus::Gauge>& queue_tokens_;
  prometheus::Family<prometheus::Gauge>& queue_sequences_;
  prometheus::Family<prometheus::Histogram>& class_queue_duration_;
  prometheus::Family<prometheus::Gauge>& class_queue_tokens_;
  prometheus::Family<prometheus::Gauge>& class_queue_sequences_;
  prometheus::Family<prometheus::Counter>& class_requests_;
  prometheus::Family<prometheus::Counter>& class_rejected_;
  prometheus::Family<prometheus::Counter>& bulk_promoted_;
  prometheus::Family<prometheus::Counter>& job_lines_;  // fastformer_job_lines_total{outcome}
  prometheus::Family<prometheus::Gauge>& jobs_;         // fastformer_jobs{status}

 public:
  Metrics();

  // A model version's series (`labels.model`, `labels.version`): at zero, or the ones another
  // live copy of the same version records into. Removed from the registry when the last
  // holder lets go; fastformer_model_state stays.
  std::shared_ptr<ModelSeries> add_model(const ModelLabels& labels);
  // fastformer_model_info{model,version,dtype,backend,device,server_version} = 1 once loaded.
  void set_model_info(ModelSeries& series, const ModelLabels& labels);
  // fastformer_model_state: `state` (one of kModelStates) 1, the others 0.
  void set_model_state(const std::string& model, const std::string& version,
                       const std::string& state);
  // fastformer_model_load_failures_total{model} at 0 for a model the repository found, so that
  // increase() sees its first failure.
  void declare_model(const std::string& model);
  // fastformer_model_load_failures_total{model} and fastformer_model_load_duration_seconds.
  void record_model_load(const std::string& model, bool ok, double seconds);

  // fastformer_requests_total{method,code} and fastformer_request_duration_seconds{method}.
  void record_request(const std::string& method, const std::string& code, double seconds);
  void set_device_memory(double used_bytes, double total_bytes);

  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

  prometheus::Gauge& inflight_requests;
  prometheus::Gauge& open_streams;           ///< EncodeStream calls open
  prometheus::Histogram& tokenize_duration;  ///< per request with text, all its texts
  prometheus::Counter& texts_total;          ///< texts tokenized
  // Bulk jobs (issue 50, OpenAI's Batch API): a batch's lines answered, by outcome (completed:
  // status 200; failed: refused, cancelled or expired), and its lines queued now.
  prometheus::Counter& job_lines_completed;
  prometheus::Counter& job_lines_failed;
  prometheus::Gauge& job_lines_in_flight;
  prometheus::Gauge& job_queued_tokens;  ///< those lines' tokens (the feeder's token bound)
  // fastformer_jobs{status}: the batches in each status (OpenAI's names), as the store counts them.
  void set_jobs(const std::vector<std::pair<std::string, int64_t>>& by_status);

 private:
  prometheus::Family<prometheus::Gauge>& model_info_;
  prometheus::Family<prometheus::Gauge>& model_state_;
  prometheus::Family<prometheus::Counter>& model_load_failures_;
  prometheus::Family<prometheus::Histogram>& model_load_duration_;
  prometheus::Gauge& device_memory_used_;
  prometheus::Gauge& device_memory_total_;
  void remove_model(const ModelSeries& series);
  std::mutex series_mu_;
  std::map<std::pair<std::string, std::string>, std::weak_ptr<ModelSeries>> series_;
};

// Why a queued sequence was dropped before compute: fastformer_sequences_dropped_total{reason}.
enum class DropReason { kDeadline, kCancelled };

// The callbacks that record a model version's admission queue and batches. Over plain types,
// so this module depends on nothing above it: the repository wraps them in the batching
// layer's observers. Each may be called from any thread (prometheus-cpp metrics are
// thread-safe).
struct QueueRecorders {
  std::function<void(int64_t tokens, int64_t sequences)>
      depth;                                          ///< fastformer_queue_tokens, _sequences
  std::function<void(DropReason reason)> dropped;     ///< fastformer_sequences_dropped_total
  std::function<void(double queue_seconds)> batched;  ///< fastformer_queue_duration_seconds
  /// fastformer_priority_queue_tokens, _sequences{priority} (0 interactive, 1 bulk)
  std::function<void(int priority, int64_t tokens, int64_t sequences)> class_depth;
  /// fastformer_priority_queue_duration_seconds{priority}: the class admitted to
  std::function<void(int priority, double queue_seconds)> class_batched;
  std::function<void()> promoted;  ///< fastformer_bulk_promoted_total
};
struct BatchRecorders {
  // fastformer_batch_compute_duration_seconds, _batch_tokens, _batch_sequences,
  // fastformer_tokens_total and fastformer_sequences_total.
  std::function<void(int64_t tokens, int64_t sequences, double seconds)> computed;
  std::function<void()> failed;  ///< fastformer_batch_failures_total
};
// They record into `series`, which they keep alive.
QueueRecorders queue_recorders(std::shared_ptr<ModelSeries> series);
BatchRecorders batch_recorders(std::shared_ptr<ModelSeries> series);

// Serves `registry` (and the process metrics) on `listen` ("host:port") at /metrics.
class MetricsServer {
 public:
  MetricsServer(const std::string& listen, const std::shared_ptr<prometheus::Registry>& registry);
  int port() const;

 private:
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::shared_ptr<prometheus::Collectable> process_;
};

}  // namespace fastformer::metrics
