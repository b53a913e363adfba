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
      queue_duration(BuildHistogram()
                         .Name("fastformer_queue_duration_seconds")
                         .Help("Time a sequence waited from admission until its batch was formed.")
                         .Register(*registry_)
                         .Add({}, kSecondsBuckets)),
      batch_compute_duration(BuildHistogram()
                                 .Name("fastformer_batch_compute_duration_seconds")
                                 .Help("Engine time of one batch.")
                                 .Register(*registry_)
                                 .Add({}, kSecondsBuckets)),
      batch_tokens(BuildHistogram()
                       .Name("fastformer_batch_tokens")
                       .Help("Tokens per computed batch.")
                       .Register(*registry_)
                       .Add({}, kTokenBuckets)),
      batch_sequences(BuildHistogram()
                          .Name("fastformer_batch_sequences")
                          .Help("Sequences per computed batch.")
                          .Register(*registry_)
                          .Add({}, kSequenceBuckets)),
      sequences_total(BuildCounter()
                          .Name("fastformer_sequences_total")
                          .Help("Sequences computed.")
                          .Register(*registry_)
                          .Add({})),
      tokens_total(BuildCounter()
                       .Name("fastformer_tokens_total")
                       .Help("Tokens computed (padding tokens of the input included).")
                       .Register(*registry_)
                       .Add({})),
      dropped_deadline(dropped_.Add({{"reason", "deadline"}})),
      dropped_cancelled(dropped_.Add({{"reason", "cancelled"}})),
      batch_failures(BuildCounter()
                         .Name("fastformer_batch_failures_total")
                         .Help("Batches the engine failed on (their requests got INTERNAL).")
                         .Register(*registry_)
                         .Add({})),
      queue_tokens(BuildGauge()
                       .Name("fastformer_queue_tokens")
                       .Help("Tokens admitted and waiting for a batch.")
                       .Register(*registry_)
                       .Add({})),
      queue_sequences(BuildGauge()
                          .Name("fastformer_queue_sequences")
                          .Help("Sequences admitted and waiting for a batch.")
                          .Register(*registry_)
                          .Add({})),
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
      model_info_(BuildGauge()
                      .Name("fastformer_model_info")
                      .Help("The served model (set once it is loaded); always 1.")
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

void Metrics::set_model_info(const ModelLabels& labels) {
  model_info_
      .Add({{"model", labels.model},
            {"dtype", labels.dtype},
            {"backend", labels.backend},
            {"device", labels.device},
            {"version", labels.version}})
      .Set(1);
}

void Metrics::record_request(const std::string& method, const std::string& code, double seconds) {
  requests_.Add({{"method", method}, {"code", code}}).Increment();
  request_duration_.Add({{"method", method}}, kSecondsBuckets).Observe(seconds);
}

void Metrics::set_device_memory(double used_bytes, double total_bytes) {
  device_memory_used_.Set(used_bytes);
  device_memory_total_.Set(total_bytes);
}

QueueRecorders queue_recorders(Metrics& metrics) {
  QueueRecorders r;
  r.depth = [&metrics](int64_t tokens, int64_t sequences) {
    metrics.queue_tokens.Set(double(tokens));
    metrics.queue_sequences.Set(double(sequences));
  };
  r.dropped = [&metrics](DropReason reason) {
    (reason == DropReason::kDeadline ? metrics.dropped_deadline : metrics.dropped_cancelled)
        .Increment();
  };
  r.batched = [&metrics](double queue_seconds) { metrics.queue_duration.Observe(queue_seconds); };
  return r;
}

BatchRecorders batch_recorders(Metrics& metrics) {
  BatchRecorders r;
  r.computed = [&metrics](int64_t tokens, int64_t sequences, double seconds) {
    metrics.batch_compute_duration.Observe(seconds);
    metrics.batch_tokens.Observe(double(tokens));
    metrics.batch_sequences.Observe(double(sequences));
    metrics.tokens_total.Increment(double(tokens));
    metrics.sequences_total.Increment(double(sequences));
  };
  r.failed = [&metrics] { metrics.batch_failures.Increment(); };
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
