#include "server/cmd/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "server/cmd/listen_check.h"

#ifndef FASTFORMER_VERSION
#define FASTFORMER_VERSION "dev"
#endif

namespace fastformer {
namespace {

using Clock = std::chrono::steady_clock;

const std::string kService = "fastformer.v1.Encoder";
const std::string kInferenceService = "inference.GRPCInferenceService";

// One short sequence through the engine, so the first request does not pay for cold
// caches and lazy initialisation; health says SERVING only after it. Every output is asked
// for, so every op and GEMM shape runs (the CUDA engine plans its GEMMs on their first run,
// and a shape cuBLASLt cannot run fails here, not mid-serving).
void warm_up(engine::Engine& eng) {
  const engine::Model& model = eng.model();
  const auto& c = model.config();
  const int64_t n = std::min<int64_t>(16, c.max_position_embeddings);
  std::vector<int32_t> ids(size_t(n), (c.pad_token_id + 1) % int32_t(c.vocab_size));
  std::vector<float> embeddings(size_t(n * c.hidden_size), 0.5f);
  engine::RaggedBatch batch;
  if (model.has_word_embedding())
    batch.add({ids, {}}, c);
  else
    batch.add({{}, embeddings}, c);
  OutputOptions options;
  options.token_embeddings = options.logits = options.normalize = true;
  eng.encode(batch, {&options, 1});
}

// The metrics' recorders as the batching layer's observers (the metrics module does not
// know the batching types).
batching::QueueObserver queue_observer(metrics::Metrics& metrics) {
  metrics::QueueRecorders record = metrics::queue_recorders(metrics);
  batching::QueueObserver observer;
  observer.on_depth = std::move(record.depth);
  observer.on_dropped = [dropped = std::move(record.dropped)](const batching::QueueEntry&,
                                                              batching::Outcome reason) {
    // The queue reports only these two reasons.
    dropped(reason == batching::Outcome::kDeadlineExceeded ? metrics::DropReason::kDeadline
                                                           : metrics::DropReason::kCancelled);
  };
  observer.on_batched = [batched = std::move(record.batched)](const batching::QueueEntry&,
                                                              double seconds) { batched(seconds); };
  return observer;
}

batching::BatchObserver batch_observer(metrics::Metrics& metrics, rpc::Intake& intake,
                                       const std::optional<TestFaults>& test_faults) {
  metrics::BatchRecorders record = metrics::batch_recorders(metrics);
  batching::BatchObserver observer;
  observer.on_batch = [computed = std::move(record.computed), &intake](
                          int64_t tokens, int64_t sequences, double seconds) {
    computed(tokens, sequences, seconds);
    intake.record_execution();  // ModelStatistics.execution_count
  };
  observer.on_failure = [failed = std::move(record.failed)](const std::string& reason,
                                                            int64_t sequences) {
    failed();
    spdlog::warn("engine failed on a batch of {} sequences: {}", sequences, reason);
  };
  if (test_faults) observer.before_compute = test_fault_hook(*test_faults);
  return observer;
}

}  // namespace

Server::Server(ServerOptions options, std::optional<TestFaults> test_faults)
    : options_(std::move(options)),
      test_faults_(std::move(test_faults)),
      auth_metrics_(*metrics_.registry()),
      intake_(metrics_),
      service_(intake_),
      inference_service_(intake_),
      unimplemented_(intake_) {}

bool Server::start() {
  // Metrics and the port come first: health answers NOT_SERVING (and Encode UNAVAILABLE)
  // while the model loads and warms up.
  if (!open_metrics() || !secure() || !listen() || !listen_http() || !load_engine()) return false;
  start_serving();
  return true;
}

bool Server::open_metrics() {
  try {
    metrics_server_ =
        std::make_unique<metrics::MetricsServer>(options_.metrics_listen, metrics_.registry());
  } catch (const std::exception& e) {
    const std::string problem = listen_problem(options_.metrics_listen);
    spdlog::error("cannot serve metrics on {}: {}", options_.metrics_listen,
                  problem.empty() ? e.what() : problem);
    return false;
  }
  spdlog::info("metrics on {} (port {})", options_.metrics_listen, metrics_server_->port());
  return true;
}

bool Server::secure() {
  try {
    security_ = std::make_unique<rpc::ServerSecurity>(options_.security, auth_metrics_);
  } catch (const std::exception& e) {
    spdlog::error("start-up failed: {}", e.what());
    return false;
  }
  spdlog::info("gRPC security: {}", security_->describe());
  return true;
}

bool Server::listen() {
  intake_.set_max_concurrent_streams(options_.max_concurrent_streams);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options_.listen, security_->credentials(), &port);
  builder.SetMaxReceiveMessageSize(int(std::min<int64_t>(options_.max_message_bytes, INT32_MAX)));
  builder.SetMaxSendMessageSize(-1);
  // gRPC sets SO_REUSEPORT by default: a second server on a busy port would start and take
  // half of the connections. Refuse instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.RegisterService(&service_);
  builder.RegisterService(&inference_service_);
  builder.RegisterCallbackGenericService(&unimplemented_);
  grpc_server_ = builder.BuildAndStart();
  if (!grpc_server_ || port == 0) {
    const std::string problem = listen_problem(options_.listen);
    spdlog::error("cannot listen on {}: {}", options_.listen,
                  problem.empty() ? "gRPC could not bind it (see its message above)" : problem);
    return false;
  }
  health_ = grpc_server_->GetHealthCheckService();
  set_health(false);
  spdlog::info("listening on {} (port {}), health NOT_SERVING until the model is loaded and warm",
               options_.listen, port);
  return true;
}

bool Server::listen_http() {
  const ServerOptions& f = options_;
  if (f.http_listen.empty()) {
    spdlog::info("HTTP: off (--http-listen is empty)");
    return true;
  }
  http::ApiOptions api;
  api.served_model_names = f.served_model_names;
  api.labels = http::HttpApi::read_labels(f.model_dir);
  api.authenticator = security_->authenticator();
  http_api_ = std::make_unique<http::HttpApi>(intake_, std::move(api));
  http::HttpOptions o;
  o.listen = f.http_listen;
  o.threads = f.http_threads;
  o.max_body_bytes = f.http_max_body_bytes;
  o.max_connections = f.http_max_connections;
  o.idle_timeout = std::chrono::milliseconds(int64_t(f.http_idle_timeout_s * 1000));
  o.header_timeout = std::chrono::milliseconds(int64_t(f.http_header_timeout_s * 1000));
  o.tls = f.security;
  try {
    http_server_ = std::make_unique<http::HttpServer>(o, *http_api_);
  } catch (const std::exception& e) {
    const std::string problem = listen_problem(f.http_listen);
    fail_start(problem.empty()
                   ? e.what()
                   : "cannot listen on " + f.http_listen + " (--http-listen): " + problem);
    return false;
  }
  spdlog::info(
      "HTTP{} on {} (port {}): /v1/embeddings, TEI routes, KServe v2 REST; 503 until "
      "the model is loaded and warm",
      http_server_->tls() ? "S" : "", f.http_listen, http_server_->port());
  return true;
}

bool Server::load_engine() {
  const ServerOptions& f = options_;
  try {
    model_ = engine::Model::load(f.model_dir);
    tokenizer_ = text::load_tokenizer(f.model_dir, *model_);
    const auto& c = model_->config();
    max_request_tokens_ = f.max_request_tokens > 0
                              ? f.max_request_tokens
                              : std::max(f.max_batch_tokens, c.max_position_embeddings);
    spdlog::info(
        "model {} from {}: hidden {}, {} layers, {} heads, {} positions, {} parameters stored as "
        "{}{}",
        c.model_name, f.model_dir, c.hidden_size, c.num_hidden_layers, c.num_attention_heads,
        c.max_position_embeddings, model_->parameter_count(), model_->stored_dtype(),
        model_->num_labels()
            ? ", classifier head with " + std::to_string(model_->num_labels()) + " labels"
            : "");
    if (max_request_tokens_ > f.max_queue_tokens) {
      fail_start("--max-request-tokens " + std::to_string(max_request_tokens_) +
                 " exceeds --max-queue-tokens " + std::to_string(f.max_queue_tokens) +
                 ": such requests could never be admitted");
      return false;
    }
    engine::EngineOptions options;
    engine::parse_backend(f.backend, &options.backend);
    options.threads = f.threads;
    options.dtype = f.dtype;
    options.device = f.device;
    options.allow_tf32 = f.allow_tf32;
    // The buffers hold a full batch, or the longest sequence a request may bring, which
    // runs in a batch of its own.
    options.max_batch_tokens =
        std::max(f.max_batch_tokens, std::min(max_request_tokens_, c.max_position_embeddings));
    std::string why;
    engine_ = engine::create_engine(model_, options, &why);
    spdlog::info("backend {} on {} ({}); engine buffers for {} tokens", engine_->backend_name(),
                 engine_->device_name(), why, engine_->max_batch_tokens());
    warm_up(*engine_);
    // Which kernel runs each GEMM site (oneDNN's implementation on the CPU), now that the
    // warm-up batch has made them; and the packed weight copies, if any.
    for (const std::string& site : engine_->gemm_report()) spdlog::info("GEMM {}", site);
    if (const size_t packed = engine_->packed_weight_bytes(); packed > 0) {
      spdlog::info("packed GEMM weights: {:.1f} MiB beside the model's {:.1f} MiB",
                   double(packed) / (1 << 20), double(model_->weight_bytes()) / (1 << 20));
    }
    // A mis-detected CPU (a BLAS or oneDNN on generic kernels) shows here, not in production.
    if (const engine::SpeedCheck speed = engine_->speed_check(); speed.ran) {
      if (speed.warning)
        spdlog::warn("{}", speed.message);
      else
        spdlog::info("{}", speed.message);
    }
  } catch (const std::exception& e) {
    fail_start(e.what());
    return false;
  }
  return true;
}

void Server::start_serving() {
  const ServerOptions& f = options_;
  spdlog::info(
      "limits: max-batch-tokens {}, max-batch-sequences {}, max-queue-delay-us {}, "
      "max-queue-tokens {}, "
      "max-request-tokens {}, max-request-inputs {}, max-message-bytes {}, "
      "max-concurrent-streams {}, http-max-body-bytes {}, http-max-connections {}",
      f.max_batch_tokens, f.max_batch_sequences, f.max_queue_delay_us, f.max_queue_tokens,
      max_request_tokens_, f.max_request_inputs, f.max_message_bytes, f.max_concurrent_streams,
      f.http_max_body_bytes, f.http_max_connections);
  metrics_.set_model_info({model_->config().model_name, f.dtype, engine_->backend_name(),
                           engine_->device_name(), FASTFORMER_VERSION});
  // Device buffers are sized at start-up and never grow, so one reading stays true.
  const auto [device_used, device_total] = engine_->device_memory();
  metrics_.set_device_memory(double(device_used), double(device_total));

  batching::QueueLimits limits;
  limits.max_batch_tokens = f.max_batch_tokens;
  limits.max_batch_sequences = f.max_batch_sequences;
  limits.max_queue_tokens = f.max_queue_tokens;
  limits.max_queue_delay = std::chrono::microseconds(f.max_queue_delay_us);
  queue_ =
      std::make_unique<batching::BatchQueue>(limits, model_->config(), queue_observer(metrics_));
  scheduler_ = std::make_unique<batching::Scheduler>(
      *queue_, *engine_, batch_observer(metrics_, intake_, test_faults_));

  rpc::ServiceConfig config;
  config.limits.max_request_tokens = max_request_tokens_;
  config.limits.max_request_inputs = f.max_request_inputs;
  config.version = FASTFORMER_VERSION;
  config.max_batch_tokens = f.max_batch_tokens;
  config.max_batch_sequences = f.max_batch_sequences;
  config.max_queue_delay_us = f.max_queue_delay_us;
  config.dtype = f.dtype;
  config.tokenizer = tokenizer_;
  intake_.start_serving(config, *engine_, *queue_);
  set_health(true);
  spdlog::info(
      "SERVING fastformer.v1.Encoder and inference.GRPCInferenceService (model {}, version {}), "
      "version {}",
      model_->config().model_name, rpc::kModelVersion, FASTFORMER_VERSION);
}

int Server::serve(const std::function<int()>& next_signal) {
  int signal = next_signal();
  for (; signal == SIGHUP; signal = next_signal()) reload_tokens();
  return drain(strsignal(signal));
}

int Server::drain(const std::string& cause) {
  spdlog::info(
      "{} received: draining (new calls UNAVAILABLE), up to {} s; a second signal exits at once",
      cause, options_.shutdown_timeout_s);
  const auto give_up =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(options_.shutdown_timeout_s));
  set_health(false);
  intake_.start_draining();
  while (intake_.inflight() > 0 && Clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (const int64_t abandoned = intake_.inflight(); abandoned > 0) {
    spdlog::warn(
        "shutdown timeout after {} s: {} admitted requests not answered; exiting without them",
        options_.shutdown_timeout_s, abandoned);
    grpc_server_->Shutdown(std::chrono::system_clock::now());
    std::_Exit(1);
  }
  // Every admitted request is answered: HTTP writes what it was handed, then closes.
  if (http_server_) http_server_->stop(std::chrono::milliseconds(1000));
  queue_->close();
  grpc_server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  scheduler_->join();
  spdlog::info("drained; exiting");
  return 0;
}

void Server::set_health(bool serving) {
  health_->SetServingStatus("", serving);
  health_->SetServingStatus(kService, serving);
  health_->SetServingStatus(kInferenceService, serving);
}

void Server::fail_start(const std::string& what) {
  spdlog::error("start-up failed: {}", what);
  if (http_server_) http_server_->stop(std::chrono::milliseconds(0));
  grpc_server_->Shutdown(std::chrono::system_clock::now());
}

}  // namespace fastformer
