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
#include <memory>
#include <string>

namespace fastformer::metrics {

struct ModelLabels {
  std::string model, dtype, backend, device, version;
};

class Metrics {
 private:
  // Declared first: every family below registers in it during construction.
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Histogram>& request_duration_;
  prometheus::Family<prometheus::Counter>& dropped_;

 public:
  Metrics();

  // fastformer_model_info{model,dtype,backend,device,version} = 1, once the model loaded.
  void set_model_info(const ModelLabels& labels);

  // fastformer_requests_total{method,code} and fastformer_request_duration_seconds{method}.
  void record_request(const std::string& method, const std::string& code, double seconds);
  void set_device_memory(double used_bytes, double total_bytes);

  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

  prometheus::Histogram& queue_duration;          ///< per sequence, admission to batch
  prometheus::Histogram& batch_compute_duration;  ///< per batch
  prometheus::Histogram& batch_tokens;
  prometheus::Histogram& batch_sequences;
  prometheus::Counter& sequences_total;   ///< computed sequences
  prometheus::Counter& tokens_total;      ///< computed tokens
  prometheus::Counter& dropped_deadline;  ///< fastformer_sequences_dropped_total{reason="deadline"}
  prometheus::Counter& dropped_cancelled;  ///< ... {reason="cancelled"}
  prometheus::Counter& batch_failures;     ///< fastformer_batch_failures_total
  prometheus::Gauge& queue_tokens;
  prometheus::Gauge& queue_sequences;
  prometheus::Gauge& inflight_requests;
  prometheus::Gauge& open_streams;           ///< EncodeStream calls open
  prometheus::Histogram& tokenize_duration;  ///< per request with text, all its texts
  prometheus::Counter& texts_total;          ///< texts tokenized

 private:
  prometheus::Family<prometheus::Gauge>& model_info_;
  prometheus::Gauge& device_memory_used_;
  prometheus::Gauge& device_memory_total_;
};

// Why a queued sequence was dropped before compute: fastformer_sequences_dropped_total{reason}.
enum class DropReason { kDeadline, kCancelled };

// The callbacks that record the admission queue and the batches. Over plain types, so this
// module depends on nothing above it: the server wraps them in the batching layer's
// observers. Each may be called from any thread (prometheus-cpp metrics are thread-safe).
struct QueueRecorders {
  std::function<void(int64_t tokens, int64_t sequences)>
      depth;                                          ///< fastformer_queue_tokens, _sequences
  std::function<void(DropReason reason)> dropped;     ///< fastformer_sequences_dropped_total
  std::function<void(double queue_seconds)> batched;  ///< fastformer_queue_duration_seconds
};
struct BatchRecorders {
  // fastformer_batch_compute_duration_seconds, _batch_tokens, _batch_sequences,
  // fastformer_tokens_total and fastformer_sequences_total.
  std::function<void(int64_t tokens, int64_t sequences, double seconds)> computed;
  std::function<void()> failed;  ///< fastformer_batch_failures_total
};
// They record into `metrics`, which must outlive them.
QueueRecorders queue_recorders(Metrics& metrics);
BatchRecorders batch_recorders(Metrics& metrics);

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
