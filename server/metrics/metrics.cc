#include "server/metrics/metrics.h"

#include <dirent.h>
#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <vector>

namespace fastformer::metrics {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;
using prometheus::Histogram;

// Exponential buckets: start, start*factor, ... (count of them).
Histogram::BucketBoundaries exponential(double start, double factor, int count) {
  Histogram::BucketBoundaries b;
  for (double v = start; int(b.size()) < count; v *= factor) b.push_back(v);
  return b;
}

const Histogram::BucketBoundaries kSecondsBuckets = exponential(0.0001, 2, 18);  // 0.1 ms .. 13 s
const Histogram::BucketBoundaries kTokenBuckets = exponential(16, 2, 14);        // 16 .. 131072
const Histogram::BucketBoundaries kShortSecondsBuckets =
    exponential(0.00001, 2, 20);                                             // 10 us .. 5 s
const Histogram::BucketBoundaries kSequenceBuckets = exponential(1, 2, 12);  // 1 .. 2048

// process_resident_memory_bytes, process_cpu_seconds_total, process_open_fds from /proc,
// read at scrape time (prometheus-cpp has no process collector).
class ProcessCollector : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override {
    std::vector<prometheus::MetricFamily> out;
    auto gauge = [&](const char* name, const char* help, prometheus::MetricType type,
                     double value) {
      prometheus::MetricFamily f;
      f.name = name;
      f.help = help;
      f.type = type;
      prometheus::ClientMetric m;
      if (type == prometheus::MetricType::Counter)
        m.counter.value = value;
      else
        m.gauge.value = value;
      f.metric.push_back(m);
      out.push_back(std::move(f));
    };
    std::ifstream stat("/proc/self/stat");
    std::string content((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    // Fields after the command name (which may hold spaces) start after the last ')'.
    std::istringstream fields(content.substr(content.rfind(')') + 2));
    std::vector<std::string> f;
    for (std::string s; fields >> s;) f.push_back(s);
    const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
    const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
    if (f.size() > 21) {
      // utime and stime are fields 14 and 15 of stat(5): indices 11, 12 here; rss is 24 -> 21.
      gauge("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.",
            prometheus::MetricType::Counter, (std::stod(f[11]) + std::stod(f[12])) / ticks);
      gauge("process_resident_memory_bytes", "Resident memory size in bytes.",
            prometheus::MetricType::Gauge, std::stod(f[21]) * page);
    }
    int fds = 0;
    if (DIR* dir = opendir("/proc/self/fd")) {
      while (dirent* e = readdir(dir)) fds += e->d_name[0] != '.';
      closedir(dir);
      fds -= 1;  // the descriptor opendir itself holds
    }
    gauge("process_open_fds", "Number of open file descriptors.", prometheus::MetricType::Gauge,
          fds);
    return out;
  }
};

}  // namespace

Metrics::Metrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      requests_(BuildCounter()
                    .Name("fastformer_requests_total")
                    .Help("RPCs (and stream messages) answered, by method and status code.")
                    .Register(*registry_)),
      request_duration_(BuildHistogram()
                            .Name("fastformer_request_duration_seconds")
                            .Help("Time from receiving a request to sending its answer.")
                            .Register(*registry_)),
      dropped_(
          BuildCounter()
              .Name("fastformer_sequences_dropped_total")
              .Help("Queued sequences dropped before compute, by reason (deadline, cancelled).")
              .Register(*registry_)),
      queue_duration_(BuildHistogram()
                          .Name("fastformer_queue_duration_seconds")
                          .Help("Time a sequence waited from admission until its batch was formed.")
                          .Register(*registry_)),
      batch_compute_duration_(BuildHistogram()
                                  .Name("fastformer_batch_compute_duration_seconds")
                                  .Help("Engine time of one batch.")
                                  .Register(*registry_)),
      batch_tokens_(BuildHistogram()
                        .Name("fastformer_batch_tokens")
                        .Help("Tokens per computed batch.")
                        .Register(*registry_)),
      batch_sequences_(BuildHistogram()
                           .Name("fastformer_batch_sequences")
                           .Help("Sequences per computed batch.")
                           .Register(*registry_)),
      sequences_total_(BuildCounter()
                           .Name("fastformer_sequences_total")
                           .Help("Sequences computed.")
                           .Register(*registry_)),
      tokens_total_(BuildCounter()
                        .Name("fastformer_tokens_total")
                        .Help("Tokens computed (padding tokens of the input included).")
                        .Register(*registry_)),
      batch_failures_(BuildCounter()
                          .Name("fastformer_batch_failures_total")
                          .Help("Batches the engine failed on (their requests got INTERNAL).")
                          .Register(*registry_)),
      queue_tokens_(BuildGauge()
                        .Name("fastformer_queue_tokens")
                        .Help("Tokens admitted and waiting for a batch.")
                        .Register(*registry_)),
      queue_sequences_(BuildGauge()
                           .Name("fastformer_queue_sequences")
                           .Help("Sequences admitted and waiting for a batch.")
                           .Register(*registry_)),
      class_queue_duration_(
          BuildHistogram()
              .Name("fastformer_priority_queue_duration_seconds")
              .Help("Time a sequence waited from admission until its batch was formed, by the "
                    "priority class it was admitted to (interactive, bulk).")
              .Register(*registry_)),
      class_queue_tokens_(BuildGauge()
                              .Name("fastformer_priority_queue_tokens")
                              .Help("Tokens admitted and waiting for a batch, by priority class.")
                              .Register(*registry_)),
      class_queue_sequences_(
          BuildGauge()
              .Name("fastformer_priority_queue_sequences")
              .Help("Sequences waiting for a batch, by priority class (interactive holds promoted "
                    "bulk sequences).")
              .Register(*registry_)),
      class_requests_(BuildCounter()
                          .Name("fastformer_priority_requests_total")
                          .Help("Requests admitted to the queue, by priority class.")
                          .Register(*registry_)),
      class_rejected_(BuildCounter()
                          .Name("fastformer_priority_rejected_total")
                          .Help("Requests refused because their priority class's queue (or its "
                                "share of the server's) was full.")
                          .Register(*registry_)),
      bulk_promoted_(BuildCounter()
                         .Name("fastformer_bulk_promoted_total")
                         .Help("Bulk sequences batched as interactive, so that they start "
                               "computing by the promotion bound.")
                         .Register(*registry_)),
      job_lines_(BuildCounter()
                     .Name("fastformer_job_lines_total")
                     .Help("Lines of batch jobs answered, by outcome: completed (status 200) or "
                           "failed (refused by the route, cancelled, expired).")
                     .Register(*registry_)),
      jobs_(BuildGauge()
                .Name("fastformer_jobs")
                .Help("Batch jobs in each status (validating, in_progress, finalizing, "
                      "completed, failed, expired, cancelling, cancelled).")
                .Register(*registry_)),
      inflight_requests(BuildGauge()
                            .Name("fastformer_inflight_requests")
                            .Help("Encode calls and stream messages admitted and not yet answered.")
                            .Register(*registry_)
                            .Add({})),
      open_streams(BuildGauge()
                       .Name("fastformer_open_streams")
                       .Help("Streaming calls open, EncodeStream and ModelStreamInfer (bounded by "
                             "--max-concurrent-streams).")
                       .Register(*registry_)
                       .Add({})),
      tokenize_duration(BuildHistogram()
                            .Name("fastformer_tokenize_duration_seconds")
                            .Help("Time a request's texts took to tokenize (on the request "
                                  "thread), per request with text.")
                            .Register(*registry_)
                            .Add({}, kShortSecondsBuckets)),
      texts_total(BuildCounter()
                      .Name("fastformer_texts_total")
                      .Help("Text sequences tokenized (accepted or not).")
                      .Register(*registry_)
                      .Add({})),
      job_lines_completed(job_lines_.Add({{"outcome", "completed"}})),
      job_lines_failed(job_lines_.Add({{"outcome", "failed"}})),
      job_lines_in_flight(BuildGauge()
                              .Name("fastformer_job_lines_in_flight")
                              .Help("Lines of batch jobs queued as bulk requests and not yet "
                                    "answered.")
                              .Register(*registry_)
                              .Add({})),
      job_queued_tokens(BuildGauge()
                            .Name("fastformer_job_queued_tokens")
                            .Help("Tokens of the batch jobs' lines admitted as bulk requests and "
                                  "not yet answered.")
                            .Register(*registry_)
                            .Add({})),
      model_info_(BuildGauge()
                      .Name("fastformer_model_info")
                      .Help("Each loaded model version (set once it is loaded); always 1.")
                      .Register(*registry_)),
      model_state_(BuildGauge()
                       .Name("fastformer_model_state")
                       .Help("Each model version's state: 1 for the current one (LOADING, READY, "
                             "UNLOADING, UNAVAILABLE), 0 for the others.")
                       .Register(*registry_)),
      model_load_failures_(BuildCounter()
                               .Name("fastformer_model_load_failures_total")
                               .Help("Model version loads that failed (the serving version, if "
                                     "any, kept serving).")
                               .Register(*registry_)),
      model_load_duration_(BuildHistogram()
                               .Name("fastformer_model_load_duration_seconds")
                               .Help("Time from the start of a version's load to READY (weights, "
                                     "tokenizer, engine, warm-up).")
                               .Register(*registry_)),
      device_memory_used_(BuildGauge()
                              .Name("fastformer_device_memory_used_bytes")
                              .Help("Device memory the engine holds (CUDA backend; 0 on CPU).")
                              .Register(*registry_)
                              .Add({})),
      device_memory_total_(BuildGauge()
                               .Name("fastformer_device_memory_total_bytes")
                               .Help("Device memory of the GPU (CUDA backend; 0 on CPU).")
                               .Register(*registry_)
                               .Add({})) {
  // Every inference method and common code exists from start-up, at zero (the protocol's
  // metadata RPCs appear when first called).
  for (const char* method :
       {"Encode", "EncodeStream", "GetModelInfo", "ModelInfer", "ModelStreamInfer",
        // The HTTP routes that infer (server/http/api.cc names them so).
        "POST /v1/embeddings", "POST /embed", "POST /embed_all", "POST /predict", "POST /",
        "POST /v2/models/{model}/infer"}) {
    request_duration_.Add({{"method", method}}, kSecondsBuckets);
    for (const char* code : {"OK", "INVALID_ARGUMENT", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED",
                             "CANCELLED", "UNAVAILABLE", "INTERNAL"}) {
      requests_.Add({{"method", method}, {"code", code}});
    }
  }
}

std::shared_ptr<ModelSeries> Metrics::add_model(const ModelLabels& labels) {
  std::lock_guard lock(series_mu_);
  std::weak_ptr<ModelSeries>& slot = series_[{labels.model, labels.version}];
  if (auto live = slot.lock()) return live;
  std::shared_ptr<ModelSeries> s(new ModelSeries, [this](ModelSeries* gone) {
    {
      // Under the lock add_model takes: a copy of the version made meanwhile took over the
      // same children (prometheus-cpp hands out one child per label set) and keeps them.
      std::lock_guard lock(series_mu_);
      auto it = series_.find({gone->model, gone->version});
      if (it == series_.end() || it->second.expired()) {
        if (it != series_.end()) series_.erase(it);
        remove_model(*gone);
      }
    }
    delete gone;
  });
  slot = s;
  s->model = labels.model;
  s->version = labels.version;
  const prometheus::Labels l{{"model", labels.model}, {"version", labels.version}};
  auto with = [&](const char* key, const char* value) {
    prometheus::Labels more = l;
    more.emplace(key, value);
    return more;
  };
  s->queue_duration = &queue_duration_.Add(l, kSecondsBuckets);
  s->batch_compute_duration = &batch_compute_duration_.Add(l, kSecondsBuckets);
  s->batch_tokens = &batch_tokens_.Add(l, kTokenBuckets);
  s->batch_sequences = &batch_sequences_.Add(l, kSequenceBuckets);
  s->sequences_total = &sequences_total_.Add(l);
  s->tokens_total = &tokens_total_.Add(l);
  s->dropped_deadline = &dropped_.Add(with("reason", "deadline"));
  s->dropped_cancelled = &dropped_.Add(with("reason", "cancelled"));
  s->batch_failures = &batch_failures_.Add(l);
  s->queue_tokens = &queue_tokens_.Add(l);
  s->queue_sequences = &queue_sequences_.Add(l);
  for (int c = 0; c < 2; ++c) {
    const prometheus::Labels p = with("priority", kPriorityNames[c]);
    s->class_queue_duration[c] = &class_queue_duration_.Add(p, kSecondsBuckets);
    s->class_queue_tokens[c] = &class_queue_tokens_.Add(p);
    s->class_queue_sequences[c] = &class_queue_sequences_.Add(p);
    s->class_requests[c] = &class_requests_.Add(p);
    s->class_rejected[c] = &class_rejected_.Add(p);
  }
  s->bulk_promoted = &bulk_promoted_.Add(l);
  return s;
}

void Metrics::set_model_info(ModelSeries& series, const ModelLabels& labels) {
  series.info = &model_info_.Add({{"model", labels.model},
                                  {"version", labels.version},
                                  {"dtype", labels.dtype},
                                  {"backend", labels.backend},
                                  {"device", labels.device},
                                  {"server_version", labels.server_version}});
  series.info->Set(1);
}

void Metrics::remove_model(const ModelSeries& s) {
  queue_duration_.Remove(s.queue_duration);
  batch_compute_duration_.Remove(s.batch_compute_duration);
  batch_tokens_.Remove(s.batch_tokens);
  batch_sequences_.Remove(s.batch_sequences);
  sequences_total_.Remove(s.sequences_total);
  tokens_total_.Remove(s.tokens_total);
  dropped_.Remove(s.dropped_deadline);
  dropped_.Remove(s.dropped_cancelled);
  batch_failures_.Remove(s.batch_failures);
  queue_tokens_.Remove(s.queue_tokens);
  queue_sequences_.Remove(s.queue_sequences);
  for (int c = 0; c < 2; ++c) {
    class_queue_duration_.Remove(s.class_queue_duration[c]);
    class_queue_tokens_.Remove(s.class_queue_tokens[c]);
    class_queue_sequences_.Remove(s.class_queue_sequences[c]);
    class_requests_.Remove(s.class_requests[c]);
    class_rejected_.Remove(s.class_rejected[c]);
  }
  bulk_promoted_.Remove(s.bulk_promoted);
  if (s.info != nullptr) model_info_.Remove(s.info);
}

void Metrics::set_model_state(const std::string& model, const std::string& version,
                              const std::string& state) {
  for (const char* each : kModelStates) {
    model_state_.Add({{"model", model}, {"version", version}, {"state", each}})
        .Set(state == each ? 1 : 0);
  }
}

void Metrics::declare_model(const std::string& model) {
  model_load_failures_.Add({{"model", model}});
}

void Metrics::record_model_load(const std::string& model, bool ok, double seconds) {
  if (ok) {
    model_load_duration_.Add({{"model", model}}, kSecondsBuckets).Observe(seconds);
  } else {
    model_load_failures_.Add({{"model", model}}).Increment();
  }
}

void Metrics::set_jobs(const std::vector<std::pair<std::string, int64_t>>& by_status) {
  for (const auto& [status, count] : by_status) jobs_.Add({{"status", status}}).Set(double(count));
}

void Metrics::record_request(const std::string& method, const std::string& code, double seconds) {
  requests_.Add({{"method", method}, {"code", code}}).Increment();
  request_duration_.Add({{"method", method}}, kSecondsBuckets).Observe(seconds);
}

void Metrics::set_device_memory(double used_bytes, double total_bytes) {
  device_memory_used_.Set(used_bytes);
  device_memory_total_.Set(total_bytes);
}

QueueRecorders queue_recorders(std::shared_ptr<ModelSeries> series) {
  QueueRecorders r;
  r.depth = [series](int64_t tokens, int64_t sequences) {
    series->queue_tokens->Set(double(tokens));
    series->queue_sequences->Set(double(sequences));
  };
  r.dropped = [series](DropReason reason) {
    (reason == DropReason::kDeadline ? series->dropped_deadline : series->dropped_cancelled)
        ->Increment();
  };
  r.batched = [series](double queue_seconds) { series->queue_duration->Observe(queue_seconds); };
  r.class_depth = [series](int priority, int64_t tokens, int64_t sequences) {
    series->class_queue_tokens[priority]->Set(double(tokens));
    series->class_queue_sequences[priority]->Set(double(sequences));
  };
  r.class_batched = [series](int priority, double queue_seconds) {
    series->class_queue_duration[priority]->Observe(queue_seconds);
  };
  r.promoted = [series] { series->bulk_promoted->Increment(); };
  return r;
}

BatchRecorders batch_recorders(std::shared_ptr<ModelSeries> series) {
  BatchRecorders r;
  r.computed = [series](int64_t tokens, int64_t sequences, double seconds) {
    series->batch_compute_duration->Observe(seconds);
    series->batch_tokens->Observe(double(tokens));
    series->batch_sequences->Observe(double(sequences));
    series->tokens_total->Increment(double(tokens));
    series->sequences_total->Increment(double(sequences));
  };
  r.failed = [series] { series->batch_failures->Increment(); };
  return r;
}

MetricsServer::MetricsServer(const std::string& listen,
                             const std::shared_ptr<prometheus::Registry>& registry)
    : exposer_(std::make_unique<prometheus::Exposer>(listen)),
      process_(std::make_shared<ProcessCollector>()) {
  exposer_->RegisterCollectable(registry);
  exposer_->RegisterCollectable(process_);
}

int MetricsServer::port() const {
  const auto ports = exposer_->GetListeningPorts();
  return ports.empty() ? 0 : ports.front();
}

}  // namespace fastformer::metrics
