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
  if (!open_metrics() || !secure() || !listen() || !listen_http() || !load_models()) return false;
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
  api.authenticator = security_->authenticator();
  if (!f.jobs_dir.empty()) {
    std::string why;
    jobs_store_ = jobs::Store::open(f.jobs_dir, &why);
    if (!jobs_store_) {
      fail_start(why);
      return false;
    }
    spdlog::info("jobs: {} (OpenAI's Files and Batch APIs under /v1/files and /v1/batches)",
                 f.jobs_dir);
    api.jobs = jobs_store_.get();
    api.files.max_file_bytes = f.jobs_max_file_bytes;
    api.files.max_stored_bytes = f.jobs_max_stored_bytes;
    api.files.ttl_seconds = f.jobs_file_ttl_s;
    api.files.completion_window_s = f.jobs_completion_window_s;
    const int64_t bulk_limit = f.model.max_bulk_queue_tokens > 0 ? f.model.max_bulk_queue_tokens
                                                                 : f.model.max_queue_tokens;
    api.files.batch_queued_tokens =
        f.jobs_queued_tokens > 0 ? f.jobs_queued_tokens : std::max<int64_t>(1, bulk_limit / 2);
  }
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

bool Server::load_models() {
  const ServerOptions& f = options_;
  repository::RepositoryOptions o;
  o.root = f.model_repository;
  o.model_dir = f.model_dir;
  repository::parse_control_mode(f.model_control_mode, &o.mode);
  o.load_models = f.load_models;
  o.poll_secs = f.repository_poll_secs;
  o.default_model = f.default_model;
  o.aliases = f.served_model_names;
  o.defaults = f.model;
  o.max_server_queue_tokens = f.model.max_queue_tokens;
  o.max_server_bulk_queue_tokens = f.model.max_bulk_queue_tokens;
  o.server_version = FASTFORMER_VERSION;
  if (test_faults_) o.before_compute = test_fault_hook(*test_faults_);
  o.on_batch_failure = [](const std::string& model, const std::string& reason, int64_t sequences) {
    spdlog::warn("engine failed on a batch of {} sequences of model {}: {}", sequences, model,
                 reason);
  };
  o.on_change = [this] { update_health(); };
  spdlog::info(
      "limits: max-batch-tokens {}, max-batch-sequences {}, max-queue-delay-us {}, "
      "max-queue-tokens {} (per model and over all), max-request-tokens {}, "
      "max-request-inputs {}, max-request-spans {}, max-message-bytes {}, "
      "max-concurrent-streams {}, "
      "http-max-body-bytes {}, http-max-connections {} (a model's config.pbtxt may set its own)",
      f.model.max_batch_tokens, f.model.max_batch_sequences, f.model.max_queue_delay_us,
      f.model.max_queue_tokens, f.model.max_request_tokens, f.model.max_request_inputs,
      f.model.max_request_spans, f.max_message_bytes, f.max_concurrent_streams,
      f.http_max_body_bytes, f.http_max_connections);
  repository_ = std::make_unique<repository::Repository>(std::move(o), metrics_);
  std::string why;
  if (!repository_->start(&why)) {
    fail_start(why);
    return false;
  }
  return true;
}

void Server::start_serving() {
  intake_.start_serving(*repository_, FASTFORMER_VERSION);
  update_health();
  if (http_api_) http_api_->start_jobs();  // resumes unfinished batches (--jobs-dir)
  std::string models;
  for (const auto& served : repository_->serving())
    models += (models.empty() ? "" : ", ") + served->name + " version " + served->version;
  spdlog::info(
      "SERVING fastformer.v1.Encoder and inference.GRPCInferenceService ({}{}), version {}",
      models.empty() ? "no model loaded yet" : models,
      repository_->root().empty() ? "" : " from " + repository_->root(), FASTFORMER_VERSION);
}

void Server::reload() {
  security_->reload_tokens();
  if (repository_ && repository_->mode() == repository::ControlMode::kPoll) {
    spdlog::info("SIGHUP: rescanning the model repository {}", repository_->root());
    repository_->rescan();
  }
}

int Server::serve(const std::function<int()>& next_signal) {
  int signal = next_signal();
  for (; signal == SIGHUP; signal = next_signal()) reload();
  return drain(strsignal(signal));
}

int Server::drain(const std::string& cause) {
  spdlog::info(
      "{} received: draining (new calls UNAVAILABLE), up to {} s; a second signal exits at once",
      cause, options_.shutdown_timeout_s);
  const auto give_up =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(options_.shutdown_timeout_s));
  {
    std::lock_guard lock(health_mu_);
    draining_ = true;
  }
  set_health(false);
  // Batches first: their lines in flight are answered and committed while the queues still
  // take work; the rest resumes at the next start.
  if (http_api_) http_api_->stop_jobs();
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
  grpc_server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  repository_->close();  // each model's queue closes and its lane joins
  spdlog::info("drained; exiting");
  return 0;
}

void Server::set_health(bool serving) {
  health_->SetServingStatus("", serving);
  health_->SetServingStatus(kService, serving);
  health_->SetServingStatus(kInferenceService, serving);
}

void Server::update_health() {
  // SERVING once every model this server was started to serve has a READY version, and not
  // while draining: what the readiness probes ask.
  std::lock_guard lock(health_mu_);
  if (draining_ || health_ == nullptr || !intake_.availability().ok()) return;
  set_health(repository_->ready());
}

void Server::fail_start(const std::string& what) {
  spdlog::error("start-up failed: {}", what);
  if (http_server_) http_server_->stop(std::chrono::milliseconds(0));
  grpc_server_->Shutdown(std::chrono::system_clock::now());
}

}  // namespace fastformer
