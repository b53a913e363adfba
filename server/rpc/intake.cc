#include "server/rpc/intake.h"

#include <spdlog/spdlog.h>

#include "common/status_names.h"

namespace fastformer::rpc {

using batching::Clock;

Clock::time_point steady_deadline(const grpc::CallbackServerContext* context) {
  const auto deadline = context->deadline();
  if (deadline >= std::chrono::system_clock::time_point::max() - std::chrono::hours(24 * 365)) {
    return Clock::time_point::max();
  }
  return Clock::now() + (deadline - std::chrono::system_clock::now());
}

grpc::Status Intake::availability() const {
  if (draining_.load()) return {grpc::StatusCode::UNAVAILABLE, "the server is shutting down"};
  if (!serving_.load(std::memory_order_acquire)) {
    return {grpc::StatusCode::UNAVAILABLE, "the server is starting (warm-up); retry shortly"};
  }
  return grpc::Status::OK;
}

void Intake::start_serving(ServiceConfig config, const engine::Engine& engine,
                           batching::BatchQueue& queue) {
  config_ = std::move(config);
  engine_ = &engine;
  queue_ = &queue;
  serving_.store(true, std::memory_order_release);
}

void Intake::record(const char* method, const grpc::Status& status, Clock::time_point start) {
  metrics_.record_request(method, status_code_name(status.error_code()),
                          std::chrono::duration<double>(Clock::now() - start).count());
  if (!status.ok() && status.error_code() != grpc::StatusCode::CANCELLED) {
    spdlog::warn("{} failed: {}: {}", method, status_code_name(status.error_code()),
                 status.error_message());
  }
}

grpc::Status Intake::open_stream(const char* method) {
  // Counted before the check, so concurrent openers never exceed the limit together.
  if (open_streams_.fetch_add(1) >= max_concurrent_streams_ && max_concurrent_streams_ > 0) {
    open_streams_.fetch_sub(1);
    return {grpc::StatusCode::RESOURCE_EXHAUSTED,
            "too many open streams: max_concurrent_streams " +
                std::to_string(max_concurrent_streams_) + " " + method +
                " and other streaming calls are open on this server; close one or retry later"};
  }
  metrics_.open_streams.Increment();
  return grpc::Status::OK;
}

void Intake::record_inference(const batching::Request& request, bool ok, Clock::time_point start,
                              uint64_t output_ns) {
  InferenceStatistics& s = statistics_;
  const uint64_t total = ns_since(start);
  if (!ok) {
    s.fail.add(total);
    return;
  }
  s.success.add(total);
  s.queue.add(uint64_t(std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                request.first_compute - request.arrival)
                                                .count())));
  s.compute_input.add(request.input_ns);
  s.compute_infer.add(uint64_t(request.compute_us) * 1000);
  s.compute_output.add(output_ns);
  s.inference_count.fetch_add(request.results.size(), std::memory_order_relaxed);
  s.last_inference_ms.store(uint64_t(std::chrono::duration_cast<std::chrono::milliseconds>(
                                         std::chrono::system_clock::now().time_since_epoch())
                                         .count()),
                            std::memory_order_relaxed);
}

grpc::Status Intake::admit(grpc::CallbackServerContext* context,
                           const std::function<grpc::Status()>& convert,
                           const std::shared_ptr<batching::Request>& request) {
  return admit(steady_deadline(context), convert, request);
}

grpc::Status Intake::admit(Clock::time_point deadline, const std::function<grpc::Status()>& convert,
                           const std::shared_ptr<batching::Request>& request) {
  // Counted in flight before the draining check: the drain (start_draining, then wait for
  // inflight() == 0) either sees this call or this call sees the drain; never neither.
  inflight_.fetch_add(1);
  metrics_.inflight_requests.Increment();
  grpc::Status status = availability();
  const Clock::time_point converting = Clock::now();
  if (status.ok()) status = convert();
  request->input_ns = ns_since(converting);
  if (request->texts > 0) {
    metrics_.tokenize_duration.Observe(double(request->tokenize_ns) * 1e-9);
    metrics_.texts_total.Increment(double(request->texts));
  }
  if (!status.ok()) {
    answered();
    return status;
  }
  request->arrival = Clock::now();
  request->deadline = deadline;
  switch (queue_->push(request)) {
    case batching::Admission::kAdmitted:
      return grpc::Status::OK;
    case batching::Admission::kQueueFull:
      status = {grpc::StatusCode::RESOURCE_EXHAUSTED,
                "queue full: " + std::to_string(request->tokens) +
                    " more tokens would exceed max_queue_tokens " +
                    std::to_string(queue_->limits().max_queue_tokens) + "; retry later"};
      break;
    case batching::Admission::kClosed:
      status = {grpc::StatusCode::UNAVAILABLE, "the server is shutting down"};
      break;
  }
  answered();
  return status;
}

}  // namespace fastformer::rpc
