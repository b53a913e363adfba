#include "server/serving/intake.h"

#include <spdlog/spdlog.h>

#include <cstdlib>

#include "server/request/encode_input.h"

namespace fastformer::serving {

using batching::Clock;

Status Intake::availability() const {
  if (draining_.load()) return {StatusCode::kUnavailable, "the server is shutting down"};
  if (!serving_.load(std::memory_order_acquire)) {
    return {StatusCode::kUnavailable, "the server is starting (warm-up); retry shortly"};
  }
  return Status();
}

void Intake::start_serving(repository::Repository& repository, std::string server_version) {
  repository_ = &repository;
  server_version_ = std::move(server_version);
  serving_.store(true, std::memory_order_release);
}

std::shared_ptr<const ServedModel> Intake::find(const std::string& name, const std::string& version,
                                                Status* status) const {
  if (*status = availability(); !status->ok()) return nullptr;
  return repository_->find(name, version, status);
}

void Intake::record(const char* method, const Status& status, Clock::time_point start) {
  metrics_.record_request(method, status_code_name(status.code()),
                          std::chrono::duration<double>(Clock::now() - start).count());
  if (!status.ok() && status.code() != StatusCode::kCancelled) {
    spdlog::warn("{} failed: {}: {}", method, status_code_name(status.code()), status.message());
  }
}

Status Intake::open_stream(const char* method) {
  // Counted before the check, so concurrent openers never exceed the limit together.
  if (open_streams_.fetch_add(1) >= max_concurrent_streams_ && max_concurrent_streams_ > 0) {
    open_streams_.fetch_sub(1);
    return {StatusCode::kResourceExhausted,
            "too many open streams: max_concurrent_streams " +
                std::to_string(max_concurrent_streams_) + " " + method +
                " and other streaming calls are open on this server; close one or retry later"};
  }
  metrics_.open_streams.Increment();
  return Status();
}

void Intake::record_inference(const batching::Job& request, bool ok, Clock::time_point start,
                              uint64_t output_ns) {
  if (!request.keep) return;
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

namespace {

// Why the queue did not take `job`: its class's limit on the model's queue or the server's
// budget (RESOURCE_EXHAUSTED), or the drain (UNAVAILABLE).
Status refusal(batching::Admission admission, const ServedModel& model, const batching::Job& job) {
  const bool bulk = job.priority == batching::Priority::kBulk;
  const std::string more = "queue full: " + std::to_string(job.tokens) + " more " +
                           (bulk ? "bulk " : "") + "tokens would exceed ";
  const char* limit = bulk ? "max_bulk_queue_tokens " : "max_queue_tokens ";
  switch (admission) {
    case batching::Admission::kQueueFull:
      return {StatusCode::kResourceExhausted,
              more + "model '" + model.name + "' " + limit +
                  std::to_string(model.queue->limits().class_limit(job.priority)) +
                  "; retry later"};
    case batching::Admission::kServerFull:
      return {StatusCode::kResourceExhausted,
              more + "the server's " + limit +
                  std::to_string(model.queue->budget_limit(job.priority)) +
                  " over every model; retry later"};
    case batching::Admission::kClosed:
    case batching::Admission::kAdmitted:
      break;
  }
  return {StatusCode::kUnavailable, "the server is shutting down"};
}

}  // namespace

const Admitted& Intake::admitted(const batching::Job& job) {
  // Every job this intake queues holds an Admitted; anything else is a programming error.
  const auto* held = dynamic_cast<const Admitted*>(job.keep.get());
  if (held == nullptr) {
    spdlog::critical("a job that the intake did not admit reached a protocol's answer");
    std::abort();
  }
  return *held;
}

Status Intake::admit(Clock::time_point deadline, const std::string& name,
                     const std::string& version, const Convert& convert,
                     const std::shared_ptr<batching::Job>& job) {
  // Counted in flight before the draining check: the drain (start_draining, then wait for
  // inflight() == 0) either sees this call or this call sees the drain; never neither.
  inflight_.fetch_add(1);
  metrics_.inflight_requests.Increment();
  Status status;
  std::shared_ptr<const ServedModel> model = find(name, version, &status);
  return admit_found(deadline, std::move(model), std::move(status), convert, job);
}

Status Intake::admit(Clock::time_point deadline, const std::shared_ptr<const ServedModel>& model,
                     const Convert& convert, const std::shared_ptr<batching::Job>& job) {
  inflight_.fetch_add(1);  // before the draining check, as above
  metrics_.inflight_requests.Increment();
  return admit_found(deadline, model, availability(), convert, job);
}

Status Intake::admit_found(Clock::time_point deadline, std::shared_ptr<const ServedModel> model,
                           Status status, const Convert& convert,
                           const std::shared_ptr<batching::Job>& request) {
  const Clock::time_point converting = Clock::now();
  auto prepared = std::make_shared<Admitted>();
  if (model && status.ok()) status = convert(*model, prepared.get());
  request->input_ns = ns_since(converting);
  if (prepared->texts > 0) {
    metrics_.tokenize_duration.Observe(double(prepared->tokenize_ns) * 1e-9);
    metrics_.texts_total.Increment(double(prepared->texts));
  }
  if (!status.ok()) {
    answered();
    return status;
  }
  if (prepared->options.dimensions > 0 || !prepared->passes.empty()) {
    // What acts on the results before any protocol formats them: a row run as macro-chunks
    // back to one result, then the output options.
    request->on_complete = [format = std::move(request->on_complete)](batching::Job& r) {
      if (r.outcome == batching::Outcome::kOk) request::merge_passes(admitted(r), &r);
      request::apply_dimensions(r.options, &r.results);
      format(r);
    };
  }
  request->sequences = prepared->sequences;
  request->options = prepared->options;
  request->arrival = Clock::now();
  request->priority = prepared->priority.value_or(model->settings.default_priority);
  request->promotable = prepared->promotable;
  // The call's deadline, else its class's default (0: none).
  const int64_t default_ms = model->settings.default_timeout_ms(request->priority);
  request->deadline = deadline == batching::Clock::time_point::max() && default_ms > 0
                          ? request->arrival + std::chrono::milliseconds(default_ms)
                          : deadline;
  // What the job views, and the version it is admitted to, live until it ends, even once
  // the version is swapped out.
  prepared->model = model;
  request->keep = std::move(prepared);
  const batching::Admission admission = model->queue->push(request);
  if (model->series) {
    prometheus::Counter* const* by_class = admission == batching::Admission::kAdmitted
                                               ? model->series->class_requests
                                               : model->series->class_rejected;
    if (admission != batching::Admission::kClosed) by_class[int(request->priority)]->Increment();
  }
  if (admission == batching::Admission::kAdmitted) return Status();
  status = refusal(admission, *model, *request);
  request->keep.reset();
  answered();
  return status;
}

}  // namespace fastformer::serving
