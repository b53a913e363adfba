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

grpc::Status to_status(const repository::Error& error) {
  using Code = repository::Error::Code;
  switch (error.code) {
    case Code::kNotFound:
      return {grpc::StatusCode::NOT_FOUND, error.message};
    case Code::kUnavailable:
      return {grpc::StatusCode::UNAVAILABLE, error.message};
    case Code::kInvalidArgument:
      return {grpc::StatusCode::INVALID_ARGUMENT, error.message};
    case Code::kFailedPrecondition:
      return {grpc::StatusCode::FAILED_PRECONDITION, error.message};
    case Code::kInternal:
      break;
  }
  return {grpc::StatusCode::INTERNAL, error.message};
}

void Intake::start_serving(repository::Repository& repository, std::string server_version) {
  repository_ = &repository;
  server_version_ = std::move(server_version);
  serving_.store(true, std::memory_order_release);
}

std::shared_ptr<const ServedModel> Intake::find(const std::string& name, const std::string& version,
                                                grpc::Status* status) const {
  if (*status = availability(); !status->ok()) return nullptr;
  repository::Error error;
  std::shared_ptr<const ServedModel> model = repository_->find(name, version, &error);
  if (!model) *status = to_status(error);
  return model;
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
  if (!request.owner) return;
  InferenceStatistics& s = served(request).statistics;
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

grpc::Status Intake::admit(grpc::CallbackServerContext* context, const std::string& name,
                           const std::string& version, const Convert& convert,
                           const std::shared_ptr<batching::Request>& request) {
  return admit(steady_deadline(context), name, version, convert, request);
}

grpc::Status Intake::admit(Clock::time_point deadline, const std::string& name,
                           const std::string& version, const Convert& convert,
                           const std::shared_ptr<batching::Request>& request) {
  // Counted in flight before the draining check: the drain (start_draining, then wait for
  // inflight() == 0) either sees this call or this call sees the drain; never neither.
  inflight_.fetch_add(1);
  metrics_.inflight_requests.Increment();
  grpc::Status status;
  std::shared_ptr<const ServedModel> model = find(name, version, &status);
  return admit_found(deadline, std::move(model), std::move(status), convert, request);
}

grpc::Status Intake::admit(Clock::time_point deadline,
                           const std::shared_ptr<const ServedModel>& model, const Convert& convert,
                           const std::shared_ptr<batching::Request>& request) {
  inflight_.fetch_add(1);  // before the draining check, as above
  metrics_.inflight_requests.Increment();
  return admit_found(deadline, model, availability(), convert, request);
}

grpc::Status Intake::admit_found(Clock::time_point deadline,
                                 std::shared_ptr<const ServedModel> model, grpc::Status status,
                                 const Convert& convert,
                                 const std::shared_ptr<batching::Request>& request) {
  const Clock::time_point converting = Clock::now();
  if (model && status.ok()) status = convert(*model);
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
  // The version it is admitted to lives until the request ends, even once swapped out.
  request->owner = model;
  switch (model->queue->push(request)) {
    case batching::Admission::kAdmitted:
      return grpc::Status::OK;
    case batching::Admission::kQueueFull:
      status = {grpc::StatusCode::RESOURCE_EXHAUSTED,
                "queue full: " + std::to_string(request->tokens) +
                    " more tokens would exceed model '" + model->name + "' max_queue_tokens " +
                    std::to_string(model->queue->limits().max_queue_tokens) + "; retry later"};
      break;
    case batching::Admission::kServerFull:
      status = {grpc::StatusCode::RESOURCE_EXHAUSTED,
                "queue full: " + std::to_string(request->tokens) +
                    " more tokens would exceed the server's max_queue_tokens " +
                    std::to_string(model->queue->budget_limit()) +
                    " over every model; retry later"};
      break;
    case batching::Admission::kClosed:
      status = {grpc::StatusCode::UNAVAILABLE, "the server is shutting down"};
      break;
  }
  request->owner.reset();
  answered();
  return status;
}

}  // namespace fastformer::rpc
