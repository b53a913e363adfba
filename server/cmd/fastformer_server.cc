// fastformer-server: loads a model, serves fastformer.v1.Encoder over gRPC with dynamic
// ragged batching, health and reflection, and exports Prometheus metrics.
//
// Start-up: load the model, build the engine, open /metrics, listen (health NOT_SERVING),
// run one warm-up batch, then SERVING. SIGTERM/SIGINT: NOT_SERVING, new calls UNAVAILABLE,
// everything admitted is answered, exit 0 within --shutdown-timeout-s; a second signal
// exits at once. SIGHUP re-reads --auth-token-file.
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <csignal>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include <CLI/CLI.hpp>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include "server/batching/queue.h"
#include "server/batching/scheduler.h"
#include "server/cmd/listen_check.h"
#include "server/cmd/test_faults.h"
#include "server/engine/engine.h"
#include "server/engine/model.h"
#include "server/metrics/metrics.h"
#include "server/rpc/encoder_service.h"
#include "server/rpc/server_credentials.h"

#ifndef FASTFORMER_VERSION
#define FASTFORMER_VERSION "dev"
#endif

namespace {

using namespace fastformer;
using Clock = std::chrono::steady_clock;

struct Flags {
  std::string model_dir;
  std::string listen = "0.0.0.0:50051";
  std::string metrics_listen = "0.0.0.0:8002";
  std::string backend = "auto";
  int device = 0;
  std::string dtype = "float32";
  int threads = 0;
  bool allow_tf32 = false;
  int64_t max_batch_tokens = 16384;
  int64_t max_batch_sequences = 256;
  int64_t max_queue_delay_us = 0;
  int64_t max_queue_tokens = 262144;
  int64_t max_request_tokens = 0;
  int64_t max_message_bytes = 64 << 20;
  int64_t max_concurrent_streams = 1024;
  double shutdown_timeout_s = 30;
  std::string log_level = "info";
  std::string log_format = "text";
  rpc::SecurityOptions security;
};

// %j: the log message escaped as a JSON string body, for --log-format json.
class JsonEscapedMessage final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&, spdlog::memory_buf_t& dest) override {
    for (char c : msg.payload) {
      switch (c) {
        case '"': dest.append(std::string_view("\\\"")); break;
        case '\\': dest.append(std::string_view("\\\\")); break;
        case '\n': dest.append(std::string_view("\\n")); break;
        case '\t': dest.append(std::string_view("\\t")); break;
        default:
          if (static_cast<unsigned char>(c) < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\u%04x", c);
            dest.append(std::string_view(buf));
          } else {
            dest.push_back(c);
          }
      }
    }
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<JsonEscapedMessage>();
  }
};

void setup_logging(const Flags& flags) {
  auto logger = spdlog::stderr_logger_mt("fastformer");
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::from_str(flags.log_level));
  if (flags.log_format == "json") {
    auto formatter = std::make_unique<spdlog::pattern_formatter>(spdlog::pattern_time_type::utc);
    formatter->add_flag<JsonEscapedMessage>('j').set_pattern(
        R"({"time":"%Y-%m-%dT%H:%M:%S.%fZ","level":"%l","msg":"%j"})");
    spdlog::set_formatter(std::move(formatter));
  } else {
    spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%eZ %^%l%$ %v", spdlog::pattern_time_type::utc);
  }
}

// One short sequence through the engine, so the first request does not pay for cold
// caches and lazy initialisation; health says SERVING only after it.
void warm_up(engine::Engine& eng) {
  const engine::Model& model = eng.model();
  const auto& c = model.config();
  const int64_t n = std::min<int64_t>(16, c.max_position_embeddings);
  std::vector<int32_t> ids(size_t(n), (c.pad_token_id + 1) % int32_t(c.vocab_size));
  std::vector<float> embeddings(size_t(n * c.hidden_size), 0.5f);
  engine::RaggedBatch batch;
  if (model.has_word_embedding()) batch.add({ids, {}}, c);
  else batch.add({{}, embeddings}, c);
  const engine::OutputOptions options;
  eng.encode(batch, {&options, 1});
}

// SIGTERM/SIGINT: the first is written to a pipe that main waits on (a handler, not
// sigwait, because OpenBLAS starts threads before main could block the signals in them);
// a second one exits at once. SIGHUP (re-read the token file) goes down the same pipe, any
// number of times.
int signal_pipe[2] = {-1, -1};
std::atomic<int> signals_received{0};

void on_signal(int signal) {
  if (signal != SIGHUP && signals_received.fetch_add(1) > 0) {
    static const char kMsg[] = "second signal: exiting at once\n";
    (void)!write(STDERR_FILENO, kMsg, sizeof kMsg - 1);
    std::_Exit(130);
  }
  const char byte = static_cast<char>(signal);
  (void)!write(signal_pipe[1], &byte, 1);
}

int wait_for_signal() {
  char byte = 0;
  while (read(signal_pipe[0], &byte, 1) != 1) {
  }
  return byte;
}

void install_signal_handlers() {
  if (pipe2(signal_pipe, O_CLOEXEC) != 0) {
    spdlog::error("cannot create the signal pipe");
    std::exit(1);
  }
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGHUP, &action, nullptr);
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  CLI::App app{"fastformer-server: Fastformer encoders over gRPC, with dynamic ragged batching"};
  app.set_config();  // no config file: flags and FASTFORMER_* env vars only
  auto opt = [&](const char* name, auto& value, const char* help, const char* env) {
    return app.add_option(name, value, help)->envname(env)->capture_default_str();
  };
  opt("--model-dir", f.model_dir, "model directory (config.json + model.safetensors)", "FASTFORMER_MODEL_DIR")
      ->required();
  opt("--listen", f.listen, "gRPC address host:port (port 0 picks a free one)", "FASTFORMER_LISTEN");
  opt("--metrics-listen", f.metrics_listen, "Prometheus /metrics address host:port", "FASTFORMER_METRICS_LISTEN");
  opt("--backend", f.backend, "auto, cpu or cuda", "FASTFORMER_BACKEND")->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  opt("--device", f.device, "CUDA device ordinal", "FASTFORMER_DEVICE")->check(CLI::NonNegativeNumber);
  opt("--dtype", f.dtype, "serving dtype: float32, float16, bfloat16 (CPU: float32)", "FASTFORMER_DTYPE")
      ->check(CLI::IsMember({"float32", "float16", "bfloat16"}));
  app.add_flag("--allow-tf32", f.allow_tf32, "TF32 tensor-core GEMMs for float32 on the CUDA engine")
      ->envname("FASTFORMER_ALLOW_TF32");
  opt("--threads", f.threads, "CPU engine threads, 0 = all cores", "FASTFORMER_THREADS")->check(CLI::NonNegativeNumber);
  opt("--max-batch-tokens", f.max_batch_tokens, "token budget of one batch", "FASTFORMER_MAX_BATCH_TOKENS")
      ->check(CLI::PositiveNumber);
  opt("--max-batch-sequences", f.max_batch_sequences, "sequence budget of one batch", "FASTFORMER_MAX_BATCH_SEQUENCES")
      ->check(CLI::PositiveNumber);
  opt("--max-queue-delay-us", f.max_queue_delay_us, "how long a non-full batch may wait for more work",
      "FASTFORMER_MAX_QUEUE_DELAY_US")
      ->check(CLI::NonNegativeNumber);
  opt("--max-queue-tokens", f.max_queue_tokens, "admitted tokens waiting for a batch; beyond: RESOURCE_EXHAUSTED",
      "FASTFORMER_MAX_QUEUE_TOKENS")
      ->check(CLI::PositiveNumber);
  opt("--max-request-tokens", f.max_request_tokens,
      "tokens in one request; 0 = max(max-batch-tokens, max_position_embeddings)", "FASTFORMER_MAX_REQUEST_TOKENS")
      ->check(CLI::NonNegativeNumber);
  opt("--max-message-bytes", f.max_message_bytes, "largest request message accepted", "FASTFORMER_MAX_MESSAGE_BYTES")
      ->check(CLI::PositiveNumber);
  opt("--max-concurrent-streams", f.max_concurrent_streams,
      "EncodeStream calls open at once, server-wide; beyond: RESOURCE_EXHAUSTED (0 = no limit)",
      "FASTFORMER_MAX_CONCURRENT_STREAMS")
      ->check(CLI::NonNegativeNumber);
  opt("--shutdown-timeout-s", f.shutdown_timeout_s, "how long SIGTERM waits for admitted work",
      "FASTFORMER_SHUTDOWN_TIMEOUT_S")
      ->check(CLI::NonNegativeNumber);
  opt("--log-level", f.log_level, "trace, debug, info, warn, error", "FASTFORMER_LOG_LEVEL")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
  opt("--log-format", f.log_format, "text or json", "FASTFORMER_LOG_FORMAT")->check(CLI::IsMember({"text", "json"}));
  // Transport security and bearer tokens (docs/security.md).
  auto* tls_cert = opt("--tls-cert", f.security.tls_cert, "PEM certificate chain: serve gRPC over TLS (needs --tls-key)",
                       "FASTFORMER_TLS_CERT");
  auto* tls_key = opt("--tls-key", f.security.tls_key, "PEM private key of --tls-cert", "FASTFORMER_TLS_KEY");
  tls_cert->needs(tls_key);
  tls_key->needs(tls_cert);
  opt("--tls-client-ca", f.security.tls_client_ca,
      "PEM CA certificates: mutual TLS, clients must present a certificate they signed", "FASTFORMER_TLS_CLIENT_CA")
      ->needs(tls_cert);
  auto* token_file = opt("--auth-token-file", f.security.auth_token_file,
                         "bearer tokens, one per line: calls need `authorization: Bearer <token>`; re-read on SIGHUP",
                         "FASTFORMER_AUTH_TOKEN_FILE");
  app.add_flag("--auth-health", f.security.auth_health, "health and reflection need the bearer token too")
      ->envname("FASTFORMER_AUTH_HEALTH")
      ->needs(token_file);
  CLI11_PARSE(app, argc, argv);
  setup_logging(f);

  std::optional<TestFaults> test_faults;
  try {
    test_faults = test_faults_from_env();
  } catch (const std::exception& e) {
    spdlog::error("{}: {}", kTestFaultsEnv, e.what());
    return 1;
  }
  if (test_faults) {
    spdlog::warn("TEST FAULT INJECTION ON ({} is set): {}. This is for tests only: unset it in production.",
                 kTestFaultsEnv, test_faults->describe());
  }

  install_signal_handlers();

  // Metrics and the port come first: health answers NOT_SERVING (and Encode UNAVAILABLE)
  // while the model loads and warms up.
  metrics::Metrics metrics;
  std::unique_ptr<metrics::MetricsServer> metrics_server;
  try {
    metrics_server = std::make_unique<metrics::MetricsServer>(f.metrics_listen, metrics.registry());
  } catch (const std::exception& e) {
    const std::string problem = listen_problem(f.metrics_listen);
    spdlog::error("cannot serve metrics on {}: {}", f.metrics_listen, problem.empty() ? e.what() : problem);
    return 1;
  }
  spdlog::info("metrics on {} (port {})", f.metrics_listen, metrics_server->port());
  rpc::AuthMetrics auth_metrics(*metrics.registry());
  std::unique_ptr<rpc::ServerSecurity> security;
  try {
    security = std::make_unique<rpc::ServerSecurity>(f.security, auth_metrics);
  } catch (const std::exception& e) {
    spdlog::error("start-up failed: {}", e.what());
    return 1;
  }
  spdlog::info("gRPC security: {}", security->describe());

  rpc::EncoderService service(metrics);
  service.set_max_concurrent_streams(f.max_concurrent_streams);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(f.listen, security->credentials(), &port);
  builder.SetMaxReceiveMessageSize(int(std::min<int64_t>(f.max_message_bytes, INT32_MAX)));
  builder.SetMaxSendMessageSize(-1);
  // gRPC sets SO_REUSEPORT by default: a second server on a busy port would start and take
  // half of the connections. Refuse instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    const std::string problem = listen_problem(f.listen);
    spdlog::error("cannot listen on {}: {}", f.listen,
                  problem.empty() ? "gRPC could not bind it (see its message above)" : problem);
    return 1;
  }
  auto* health = server->GetHealthCheckService();
  const std::string kService = "fastformer.v1.Encoder";
  health->SetServingStatus("", false);
  health->SetServingStatus(kService, false);
  spdlog::info("listening on {} (port {}), health NOT_SERVING until the model is loaded and warm", f.listen, port);
  auto fail_start = [&](const std::string& what) {
    spdlog::error("start-up failed: {}", what);
    server->Shutdown(std::chrono::system_clock::now());
    return 1;
  };

  std::shared_ptr<const engine::Model> model;
  std::unique_ptr<engine::Engine> eng;
  int64_t max_request_tokens = 0;
  try {
    model = engine::Model::load(f.model_dir);
    const auto& c = model->config();
    max_request_tokens = f.max_request_tokens > 0 ? f.max_request_tokens
                                                  : std::max(f.max_batch_tokens, c.max_position_embeddings);
    spdlog::info("model {} from {}: hidden {}, {} layers, {} heads, {} positions, {} parameters stored as {}{}",
                 c.model_name, f.model_dir, c.hidden_size, c.num_hidden_layers, c.num_attention_heads,
                 c.max_position_embeddings, model->parameter_count(), model->stored_dtype(),
                 model->num_labels() ? ", classifier head with " + std::to_string(model->num_labels()) + " labels" : "");
    if (max_request_tokens > f.max_queue_tokens) {
      return fail_start("--max-request-tokens " + std::to_string(max_request_tokens) + " exceeds --max-queue-tokens " +
                        std::to_string(f.max_queue_tokens) + ": such requests could never be admitted");
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
        std::max(f.max_batch_tokens, std::min(max_request_tokens, c.max_position_embeddings));
    std::string why;
    eng = engine::create_engine(model, options, &why);
    spdlog::info("backend {} on {} ({}); engine buffers for {} tokens", eng->backend_name(), eng->device_name(),
                 why, eng->max_batch_tokens());
    warm_up(*eng);
  } catch (const std::exception& e) {
    return fail_start(e.what());
  }
  spdlog::info("limits: max-batch-tokens {}, max-batch-sequences {}, max-queue-delay-us {}, max-queue-tokens {}, "
               "max-request-tokens {}, max-message-bytes {}, max-concurrent-streams {}",
               f.max_batch_tokens, f.max_batch_sequences, f.max_queue_delay_us, f.max_queue_tokens,
               max_request_tokens, f.max_message_bytes, f.max_concurrent_streams);
  metrics.set_model_info({model->config().model_name, f.dtype, eng->backend_name(), eng->device_name(),
                          FASTFORMER_VERSION});
  // Device buffers are sized at start-up and never grow, so one reading stays true.
  const auto [device_used, device_total] = eng->device_memory();
  metrics.set_device_memory(double(device_used), double(device_total));

  batching::QueueLimits limits;
  limits.max_batch_tokens = f.max_batch_tokens;
  limits.max_batch_sequences = f.max_batch_sequences;
  limits.max_queue_tokens = f.max_queue_tokens;
  limits.max_queue_delay = std::chrono::microseconds(f.max_queue_delay_us);
  batching::QueueObserver queue_observer;
  queue_observer.on_depth = [&](int64_t tokens, int64_t sequences) {
    metrics.queue_tokens.Set(double(tokens));
    metrics.queue_sequences.Set(double(sequences));
  };
  queue_observer.on_dropped = [&](const batching::QueueEntry&, batching::Outcome reason) {
    (reason == batching::Outcome::kDeadlineExceeded ? metrics.dropped_deadline : metrics.dropped_cancelled).Increment();
  };
  queue_observer.on_batched = [&](const batching::QueueEntry&, double seconds) {
    metrics.queue_duration.Observe(seconds);
  };
  batching::BatchQueue queue(limits, model->config(), queue_observer);

  batching::BatchObserver batch_observer;
  batch_observer.on_batch = [&](int64_t tokens, int64_t sequences, double seconds) {
    metrics.batch_compute_duration.Observe(seconds);
    metrics.batch_tokens.Observe(double(tokens));
    metrics.batch_sequences.Observe(double(sequences));
    metrics.tokens_total.Increment(double(tokens));
    metrics.sequences_total.Increment(double(sequences));
  };
  batch_observer.on_failure = [&](const std::string& reason, int64_t sequences) {
    metrics.batch_failures.Increment();
    spdlog::warn("engine failed on a batch of {} sequences: {}", sequences, reason);
  };
  if (test_faults) batch_observer.before_compute = test_fault_hook(*test_faults);
  batching::Scheduler scheduler(queue, *eng, batch_observer);
  rpc::ServiceConfig service_config;
  service_config.limits.max_request_tokens = max_request_tokens;
  service_config.version = FASTFORMER_VERSION;
  service_config.max_batch_tokens = f.max_batch_tokens;
  service_config.dtype = f.dtype;
  service.start_serving(service_config, *eng, queue);
  health->SetServingStatus("", true);
  health->SetServingStatus(kService, true);
  spdlog::info("SERVING fastformer.v1.Encoder, version {}", FASTFORMER_VERSION);

  int signal = wait_for_signal();
  for (; signal == SIGHUP; signal = wait_for_signal()) security->reload_tokens();
  spdlog::info("{} received: draining (new calls UNAVAILABLE), up to {} s; a second signal exits at once",
               strsignal(signal), f.shutdown_timeout_s);
  const auto give_up = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double>(f.shutdown_timeout_s));
  health->SetServingStatus("", false);
  health->SetServingStatus(kService, false);
  service.start_draining();
  while (service.inflight() > 0 && Clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (const int64_t abandoned = service.inflight(); abandoned > 0) {
    spdlog::warn("shutdown timeout after {} s: {} admitted requests not answered; exiting without them",
                 f.shutdown_timeout_s, abandoned);
    server->Shutdown(std::chrono::system_clock::now());
    std::_Exit(1);
  }
  queue.close();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  scheduler.join();
  spdlog::info("drained; exiting");
  return 0;
}
