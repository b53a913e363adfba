// What the services that queue requests share (fastformer.v1.Encoder and the Open Inference
// Protocol's inference.GRPCInferenceService): the engine and queue once serving, the
// starting / draining state, the count of admitted requests not yet answered (what the drain
// waits for), admission to the one batch queue, and the per-call metrics.
#pragma once

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "server/batching/queue.h"
#include "server/engine/engine.h"
#include "server/metrics/metrics.h"
#include "server/rpc/request_conversion.h"

namespace fastformer::rpc {

struct ServiceConfig {
  request::Limits limits;
  std::string version;              ///< server_version in ModelInfo, version in ServerMetadata
  int64_t max_batch_tokens = 0;     ///< reported in ModelInfo
  int64_t max_batch_sequences = 0;  ///< max_batch_size in the v2 ModelConfig
  int64_t max_queue_delay_us = 0;   ///< reported in the v2 ModelConfig
  std::string dtype = "float32";
  /// The model directory's tokenizer.json (text::load_tokenizer); null: the model takes no text.
  std::shared_ptr<const text::Tokenizer> tokenizer;
};

// Cumulative statistics of the served model, for the protocol's ModelStatistics: every
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

class Intake {
 public:
  explicit Intake(metrics::Metrics& metrics) : metrics_(metrics) {}

  // Attaches the engine and queue (after the model loaded and warmed up) and starts
  // admitting requests. Until then every call is answered UNAVAILABLE.
  void start_serving(ServiceConfig config, const engine::Engine& engine,
                     batching::BatchQueue& queue);
  // Once draining, new calls and stream messages are answered UNAVAILABLE.
  void start_draining() { draining_.store(true); }
  // Admitted requests (unary calls and stream messages) not yet answered.
  int64_t inflight() const { return inflight_.load(); }

  grpc::Status availability() const;  // OK, or UNAVAILABLE while starting or draining

  // Counts the request in flight, runs `convert` (which fills `request` from the call) and
  // queues it. OK: queued, and request->on_complete will run once; it must call
  // answered(). Otherwise the status to answer with; nothing was queued.
  grpc::Status admit(grpc::CallbackServerContext* context,
                     const std::function<grpc::Status()>& convert,
                     const std::shared_ptr<batching::Request>& request);
  // The same for a call whose deadline is given on the steady clock (HTTP: max() for none).
  grpc::Status admit(batching::Clock::time_point deadline,
                     const std::function<grpc::Status()>& convert,
                     const std::shared_ptr<batching::Request>& request);
  // An admitted request has been answered.
  void answered() {
    inflight_.fetch_sub(1);
    metrics_.inflight_requests.Decrement();
  }

  // At most `max` streams (of both APIs) open at once, server-wide (0 = no limit); one more
  // is answered RESOURCE_EXHAUSTED at once. Set before the server starts.
  void set_max_concurrent_streams(int64_t max) { max_concurrent_streams_ = max; }
  // OK and the stream counted open, or RESOURCE_EXHAUSTED naming the limit.
  grpc::Status open_stream(const char* method);
  void close_stream() {
    open_streams_.fetch_sub(1);
    metrics_.open_streams.Decrement();
  }

  // fastformer_requests_total and the duration histogram; a warning for failures.
  void record(const char* method, const grpc::Status& status, batching::Clock::time_point start);

  // Adds one finished inference request to the statistics: `start` is when its call arrived,
  // `output_ns` the time spent converting its results into the response.
  void record_inference(const batching::Request& request, bool ok,
                        batching::Clock::time_point start, uint64_t output_ns);
  // Closes an admitted call once its answer is ready: the statistics (record_inference), the
  // request metrics (record) and the drain count (answered). Every API's completion calls it.
  void complete(const char* method, const batching::Request& request, const grpc::Status& status,
                batching::Clock::time_point start, uint64_t output_ns) {
    record_inference(request, status.ok(), start, output_ns);
    record(method, status, start);
    answered();
  }

  // One engine batch ran (the scheduler's observer calls this).
  void record_execution() { statistics_.execution_count.fetch_add(1, std::memory_order_relaxed); }
  const InferenceStatistics& statistics() const { return statistics_; }

  // Valid once serving.
  const ServiceConfig& config() const { return config_; }
  const engine::Engine& engine() const { return *engine_; }
  const text::Tokenizer* tokenizer() const { return config_.tokenizer.get(); }
  const batching::BatchQueue& queue() const { return *queue_; }
  metrics::Metrics& metrics() { return metrics_; }

 private:
  // Set once by start_serving, before serving_ turns true (release/acquire).
  ServiceConfig config_;
  const engine::Engine* engine_ = nullptr;
  batching::BatchQueue* queue_ = nullptr;
  metrics::Metrics& metrics_;
  std::atomic<bool> serving_{false};
  std::atomic<bool> draining_{false};
  std::atomic<int64_t> inflight_{0};
  InferenceStatistics statistics_;
  int64_t max_concurrent_streams_ = 0;
  std::atomic<int64_t> open_streams_{0};
};

using batching::ns_since;

// The call's deadline on the steady clock (max() when the client set none).
batching::Clock::time_point steady_deadline(const grpc::CallbackServerContext* context);

}  // namespace fastformer::rpc
