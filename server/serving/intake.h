// What the services that queue requests share (fastformer.v1.Encoder, the Open Inference
// Protocol's inference.GRPCInferenceService and the HTTP routes): the model repository once
// serving, the starting / draining state, the count of admitted requests not yet answered
// (what the drain waits for), admission to a model version's batch queue, and the per-call
// metrics.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "common/status.h"
#include "server/batching/queue.h"
#include "server/engine/engine.h"
#include "server/metrics/metrics.h"
#include "server/repository/repository.h"
#include "server/request/prepared.h"

namespace fastformer::serving {

using repository::InferenceStatistics;
using repository::ServedModel;
using repository::ServiceConfig;

// What an admitted job holds (its batching::Job::keep): the request as prepared (what its
// sequences view) and the model version it was admitted to, which serves it even once swapped
// out. Built by the intake and the protocol's conversion; read-only once queued.
struct Admitted final : request::Prepared {
  std::shared_ptr<const ServedModel> model;
};

class Intake {
 public:
  explicit Intake(metrics::Metrics& metrics) : metrics_(metrics) {}

  // Attaches the repository (after the start-up models loaded and warmed up) and starts
  // admitting requests. Until then every call is answered UNAVAILABLE.
  void start_serving(repository::Repository& repository, std::string server_version);
  // Once draining, new calls and stream messages are answered UNAVAILABLE.
  void start_draining() { draining_.store(true); }
  // Admitted requests (unary calls and stream messages) not yet answered.
  int64_t inflight() const { return inflight_.load(); }

  Status availability() const;  // OK, or UNAVAILABLE while starting or draining
  // Serving, and every model the server was started to serve has a READY version (the
  // readiness probes: ServerReady, /v2/health/ready, /health).
  bool ready() const { return availability().ok() && repository_->ready(); }

  // The model version that serves `name` and `version` (empty: the default model, its newest
  // READY version), or null with `status` NOT_FOUND / UNAVAILABLE naming it (or availability()).
  std::shared_ptr<const ServedModel> find(const std::string& name, const std::string& version,
                                          Status* status) const;
  // What a job admitted here holds: its request and model version (until complete()).
  static const Admitted& admitted(const batching::Job& job);
  // The model version an admitted job was admitted to (until complete() releases it).
  static const ServedModel& served(const batching::Job& job) { return *admitted(job).model; }

  // Counts the request in flight, finds the model version for `model` and `version` (find),
  // runs `convert` (which fills a fresh Prepared from the call, for that version: build_request)
  // and queues `job` over it on the version's queue. OK: queued, and job->on_complete will run
  // once; it must call complete(), and may use admitted(*job) until then. Otherwise the status
  // to answer with; nothing was queued.
  using Convert = std::function<Status(const ServedModel& model, request::Prepared* out)>;
  // `deadline` is the call's, on the steady clock (max() for none).
  Status admit(batching::Clock::time_point deadline, const std::string& model,
               const std::string& version, const Convert& convert,
               const std::shared_ptr<batching::Job>& job);
  // The same on a version found before (find): it serves the request even if swapped out
  // meanwhile, as a request admitted before the swap would be.
  Status admit(batching::Clock::time_point deadline,
               const std::shared_ptr<const ServedModel>& model, const Convert& convert,
               const std::shared_ptr<batching::Job>& job);
  // An admitted request has been answered.
  void answered() {
    inflight_.fetch_sub(1);
    metrics_.inflight_requests.Decrement();
  }

  // At most `max` streams (of both APIs) open at once, server-wide (0 = no limit); one more
  // is answered RESOURCE_EXHAUSTED at once. Set before the server starts.
  void set_max_concurrent_streams(int64_t max) { max_concurrent_streams_ = max; }
  // OK and the stream counted open, or RESOURCE_EXHAUSTED naming the limit.
  Status open_stream(const char* method);
  void close_stream() {
    open_streams_.fetch_sub(1);
    metrics_.open_streams.Decrement();
  }

  // fastformer_requests_total and the duration histogram; a warning for failures.
  void record(const char* method, const Status& status, batching::Clock::time_point start);

  // Adds one finished inference request to its model version's statistics: `start` is when
  // its call arrived, `output_ns` the time spent converting its results into the response.
  static void record_inference(const batching::Job& request, bool ok,
                               batching::Clock::time_point start, uint64_t output_ns);
  // Closes an admitted call once its answer is ready: the statistics (record_inference), the
  // request metrics (record), the request's hold on its model version, and the drain count
  // (answered). Every API's completion calls it.
  void complete(const char* method, const batching::Job& request, const Status& status,
                batching::Clock::time_point start, uint64_t output_ns) {
    record_inference(request, status.ok(), start, output_ns);
    record(method, status, start);
    request.keep.reset();  // before answered(): the drain frees the versions at inflight 0
    answered();
  }

  // Valid once serving.
  repository::Repository& repository() const { return *repository_; }
  const std::string& server_version() const { return server_version_; }
  metrics::Metrics& metrics() { return metrics_; }

 private:
  // admit's common part: `model` found (or null, with `status` saying why).
  Status admit_found(batching::Clock::time_point deadline, std::shared_ptr<const ServedModel> model,
                     Status status, const Convert& convert,
                     const std::shared_ptr<batching::Job>& job);

  // Set once by start_serving, before serving_ turns true (release/acquire).
  repository::Repository* repository_ = nullptr;
  std::string server_version_;
  metrics::Metrics& metrics_;
  std::atomic<bool> serving_{false};
  std::atomic<bool> draining_{false};
  std::atomic<int64_t> inflight_{0};
  int64_t max_concurrent_streams_ = 0;
  std::atomic<int64_t> open_streams_{0};
};

using batching::ns_since;

}  // namespace fastformer::serving
