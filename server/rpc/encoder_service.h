// The fastformer.v1.Encoder service on gRPC's callback API: one handler per RPC. Requests
// are validated and converted here, then admitted to the batch queue; the engine thread
// answers them through each request's completion.
#pragma once

#include <atomic>
#include <string>

#include "fastformer/v1/encoder.grpc.pb.h"
#include "server/batching/queue.h"
#include "server/engine/engine.h"
#include "server/metrics/metrics.h"
#include "server/rpc/request_conversion.h"

namespace fastformer::rpc {

struct ServiceConfig {
  RequestLimits limits;
  std::string version;            ///< server_version in ModelInfo
  int64_t max_batch_tokens = 0;   ///< reported in ModelInfo
  std::string dtype = "float32";
};

class EncoderService final : public v1::Encoder::CallbackService {
 public:
  // The service answers UNAVAILABLE from the moment the port opens until start_serving.
  explicit EncoderService(metrics::Metrics& metrics);

  // Attaches the engine and queue (after the model loaded and warmed up) and starts
  // admitting requests.
  void start_serving(ServiceConfig config, const engine::Engine& engine, batching::BatchQueue& queue);

  grpc::ServerUnaryReactor* Encode(grpc::CallbackServerContext* context,
                                   const v1::EncodeRequest* request,
                                   v1::EncodeResponse* response) override;
  grpc::ServerBidiReactor<v1::EncodeRequest, v1::EncodeResponse>* EncodeStream(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const v1::GetModelInfoRequest* request,
                                         v1::ModelInfo* response) override;

  // Once draining, new calls and stream messages are answered UNAVAILABLE.
  void start_draining() { draining_.store(true); }
  // Admitted requests (unary calls and stream messages) not yet answered.
  int64_t inflight() const { return inflight_.load(); }

  // At most `max` EncodeStream calls open at once, server-wide (0 = no limit); one more is
  // answered RESOURCE_EXHAUSTED at once. Set before the server starts.
  void set_max_concurrent_streams(int64_t max) { max_concurrent_streams_ = max; }

 private:
  class StreamReactor;
  class RejectedStreamReactor;

  // Validates and admits one request. On success returns OK and the request is queued;
  // else the status to answer with (nothing queued).
  grpc::Status admit(const v1::EncodeRequest& proto, grpc::CallbackServerContext* context,
                     std::shared_ptr<batching::Request> request);
  void record(const char* method, const grpc::Status& status, batching::Clock::time_point start);
  // One request more / less in flight: inflight_ (what the drain waits for) and its gauge.
  void count_inflight() {
    inflight_.fetch_add(1);
    metrics_.inflight_requests.Increment();
  }
  void uncount_inflight() {
    inflight_.fetch_sub(1);
    metrics_.inflight_requests.Decrement();
  }
  grpc::Status availability() const;  // OK, or UNAVAILABLE while starting or draining

  // Set once by start_serving, before serving_ turns true (release/acquire).
  ServiceConfig config_;
  const engine::Engine* engine_ = nullptr;
  batching::BatchQueue* queue_ = nullptr;
  metrics::Metrics& metrics_;
  std::atomic<bool> serving_{false};
  std::atomic<bool> draining_{false};
  std::atomic<int64_t> inflight_{0};
  int64_t max_concurrent_streams_ = 0;
  std::atomic<int64_t> open_streams_{0};
};

}  // namespace fastformer::rpc
