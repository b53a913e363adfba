#include "server/cmd/server_options.h"

#include <CLI/CLI.hpp>
#include <string_view>

#include "server/cmd/dtype_flag.h"

namespace fastformer {

namespace {

// A flag with its environment variable, showing its default in --help.
template <class T>
CLI::Option* opt(CLI::App& app, const char* name, T& value, const char* help, const char* env) {
  return app.add_option(name, value, help)->envname(env)->capture_default_str();
}

// Where the models come from and how they are loaded (docs/operations.md: the model repository).
void add_repository_flags(CLI::App& app, ServerOptions& f) {
  opt(app, "--model-dir", f.model_dir,
      "model directory (config.json + model.safetensors): a repository of "
      "this one model, version 1",
      "FASTFORMER_MODEL_DIR");
  opt(app, "--model-repository", f.model_repository,
      "model repository <dir>/<model>/<version>/ (Triton's layout; optional "
      "<dir>/<model>/config.pbtxt)",
      "FASTFORMER_MODEL_REPOSITORY");
  opt(app, "--model-control-mode", f.model_control_mode,
      "none: serve what the repository holds at start; explicit: --load-model at start, then "
      "the load/unload RPCs; poll: rescan every --repository-poll-secs and on SIGHUP",
      "FASTFORMER_MODEL_CONTROL_MODE")
      ->check(CLI::IsMember({"none", "explicit", "poll"}));
  app.add_option("--load-model", f.load_models,
                 "explicit mode: a model to load at start (repeatable; * = every model)")
      ->envname("FASTFORMER_LOAD_MODEL")
      ->delimiter(',');  // no default shown: an empty list is "none", as docs/operations.md says
  opt(app, "--repository-poll-secs", f.repository_poll_secs,
      "poll mode: seconds between repository scans (0: on SIGHUP only)",
      "FASTFORMER_REPOSITORY_POLL_SECS")
      ->check(CLI::NonNegativeNumber);
  opt(app, "--default-model", f.default_model,
      "the model a request that names none goes to (default: the only one)",
      "FASTFORMER_DEFAULT_MODEL");
}

// The gRPC, HTTP and metrics listeners, and the names the default model answers to.
void add_front_door_flags(CLI::App& app, ServerOptions& f) {
  opt(app, "--listen", f.listen, "gRPC address host:port (port 0 picks a free one)",
      "FASTFORMER_LISTEN");
  opt(app, "--metrics-listen", f.metrics_listen, "Prometheus /metrics address host:port",
      "FASTFORMER_METRICS_LISTEN");
  opt(app, "--http-listen", f.http_listen,
      "HTTP address host:port: OpenAI /v1/embeddings, TEI routes, KServe v2 REST (empty: off)",
      "FASTFORMER_HTTP_LISTEN");
  opt(app, "--http-threads", f.http_threads,
      "HTTP I/O threads (JSON parsing and printing run on them)", "FASTFORMER_HTTP_THREADS")
      ->check(CLI::PositiveNumber);
  opt(app, "--http-max-body-bytes", f.http_max_body_bytes,
      "largest HTTP request body accepted; beyond: 413", "FASTFORMER_HTTP_MAX_BODY_BYTES")
      ->check(CLI::PositiveNumber);
  opt(app, "--http-max-connections", f.http_max_connections,
      "HTTP connections open at once; one more is answered 503 and closed (0 = no limit)",
      "FASTFORMER_HTTP_MAX_CONNECTIONS")
      ->check(CLI::NonNegativeNumber);
  opt(app, "--http-idle-timeout-s", f.http_idle_timeout_s,
      "an idle kept-alive HTTP connection, or a body in flight, is closed after this long",
      "FASTFORMER_HTTP_IDLE_TIMEOUT_S")
      ->check(CLI::PositiveNumber);
  opt(app, "--http-header-timeout-s", f.http_header_timeout_s,
      "time a client has to send a request's headers, from its first byte",
      "FASTFORMER_HTTP_HEADER_TIMEOUT_S")
      ->check(CLI::PositiveNumber);
  opt(app, "--jobs-dir", f.jobs_dir,
      "data directory of OpenAI's Files and Batch APIs (SQLite in WAL mode: a local disk, one "
      "server a directory; empty: off)",
      "FASTFORMER_JOBS_DIR");
  opt(app, "--jobs-max-file-bytes", f.jobs_max_file_bytes,
      "largest file POST /v1/files takes; beyond: 413", "FASTFORMER_JOBS_MAX_FILE_BYTES")
      ->check(CLI::PositiveNumber);
  opt(app, "--jobs-max-stored-bytes", f.jobs_max_stored_bytes,
      "every stored file together (uploads and batch outputs); beyond, an upload is 413",
      "FASTFORMER_JOBS_MAX_STORED_BYTES")
      ->check(CLI::PositiveNumber);
  opt(app, "--jobs-file-ttl-s", f.jobs_file_ttl_s,
      "an upload's expiry when it names none (OpenAI's default for batch files: 30 days)",
      "FASTFORMER_JOBS_FILE_TTL_S")
      ->check(CLI::PositiveNumber);
  opt(app, "--jobs-completion-window-s", f.jobs_completion_window_s,
      "a batch's window (OpenAI's \"24h\"); one not finished by then ends expired. Shorter: "
      "tests",
      "FASTFORMER_JOBS_COMPLETION_WINDOW_S")
      ->check(CLI::PositiveNumber);
  opt(app, "--jobs-queued-tokens", f.jobs_queued_tokens,
      "tokens of batch jobs' lines admitted and not yet answered, all batches together (0: half "
      "of --max-bulk-queue-tokens, else of --max-queue-tokens), so live bulk requests still find "
      "room",
      "FASTFORMER_JOBS_QUEUED_TOKENS")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--served-model-name", f.served_model_names,
                 "names the default model also answers to, on every protocol (HTTP's model field, "
                 "/v1/models, gRPC's and KServe's model_name); repeat or comma-separate")
      ->envname("FASTFORMER_SERVED_MODEL_NAME")
      ->delimiter(',');
}

// Every model's settings (ServerOptions::model; a config.pbtxt overrides them per model).
void add_model_flags(CLI::App& app, ServerOptions& f) {
  opt(app, "--backend", f.model.backend, "auto, cpu or cuda", "FASTFORMER_BACKEND")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  opt(app, "--device", f.model.device, "CUDA device ordinal", "FASTFORMER_DEVICE")
      ->check(CLI::NonNegativeNumber);
  add_dtype_flag(app, &f.model.dtype,
                 "serving dtype: auto, float32, float16, bfloat16 (auto: bfloat16 on a CPU with "
                 "AVX512_BF16/AMX or a GPU of compute capability 8.0+, float32 elsewhere)")
      ->envname("FASTFORMER_DTYPE");
  add_cpu_gemm_flag(app, &f.model.cpu_gemm)->envname("FASTFORMER_CPU_GEMM");
  app.add_flag("--allow-tf32", f.model.allow_tf32,
               "TF32 tensor-core GEMMs for float32 on the CUDA engine")
      ->envname("FASTFORMER_ALLOW_TF32");
  app.add_option("--cuda-opt-in", f.model.cuda_opt_in,
                 "the CUDA engine's opt-in kernels, comma-separated: cutlass-gelu, fused-key-pool, "
                 "gemm-timing, cuda-graphs, "
                 "all or none (docs/kernels.md); default: FASTFORMER_CUDA_OPT_IN, else none");
  opt(app, "--threads", f.model.threads, "CPU engine threads, 0 = all cores", "FASTFORMER_THREADS")
      ->check(CLI::NonNegativeNumber);
  opt(app, "--max-batch-tokens", f.model.max_batch_tokens, "token budget of one batch",
      "FASTFORMER_MAX_BATCH_TOKENS")
      ->check(CLI::PositiveNumber);
  opt(app, "--max-batch-sequences", f.model.max_batch_sequences, "sequence budget of one batch",
      "FASTFORMER_MAX_BATCH_SEQUENCES")
      ->check(CLI::PositiveNumber);
  opt(app, "--max-queue-delay-us", f.model.max_queue_delay_us,
      "how long a non-full batch may wait for more work", "FASTFORMER_MAX_QUEUE_DELAY_US")
      ->check(CLI::NonNegativeNumber);
  opt(app, "--max-queue-tokens", f.model.max_queue_tokens,
      "admitted tokens waiting for a batch; beyond: RESOURCE_EXHAUSTED",
      "FASTFORMER_MAX_QUEUE_TOKENS")
      ->check(CLI::PositiveNumber);
  opt(app, "--max-bulk-queue-tokens", f.model.max_bulk_queue_tokens,
      "the bulk priority class's own limit of admitted tokens waiting for a batch (0 = "
      "--max-queue-tokens, which is the interactive class's); beyond: RESOURCE_EXHAUSTED for "
      "bulk work while interactive work is still admitted",
      "FASTFORMER_MAX_BULK_QUEUE_TOKENS")
      ->check(CLI::NonNegativeNumber);
  app.add_option_function<std::string>(
         "--default-priority",
         [&f](const std::string& v) { f.model.default_priority = *batching::parse_priority(v); },
         "the priority class of a request that names none: interactive (batched first) or bulk "
         "(fills the rest of each batch)")
      ->envname("FASTFORMER_DEFAULT_PRIORITY")
      ->check(CLI::IsMember({"interactive", "bulk"}))
      ->default_str("interactive");
  opt(app, "--bulk-promote-after-ms", f.model.bulk_promote_after_ms,
      "a bulk sequence queued this long is batched as an interactive one, so bulk work is never "
      "starved (0 = never)",
      "FASTFORMER_BULK_PROMOTE_AFTER_MS")
      ->check(CLI::NonNegativeNumber);
  opt(app, "--mixed-batch-tokens", f.model.mixed_batch_tokens,
      "in a batch that holds interactive work, bulk work fills it only up to this many tokens "
      "(0 = half of --max-batch-tokens), so a query's own batch is short; batches of one class "
      "fill --max-batch-tokens",
      "FASTFORMER_MIXED_BATCH_TOKENS")
      ->check(CLI::NonNegativeNumber);
  opt(app, "--interactive-timeout-ms", f.model.interactive_timeout_ms,
      "the deadline of an interactive request whose call sets none (0 = none); a request still "
      "queued then is answered DEADLINE_EXCEEDED / 504",
      "FASTFORMER_INTERACTIVE_TIMEOUT_MS")
      ->check(CLI::NonNegativeNumber);
  opt(app, "--bulk-timeout-ms", f.model.bulk_timeout_ms, "the same for a bulk request (0 = none)",
      "FASTFORMER_BULK_TIMEOUT_MS")
      ->check(CLI::NonNegativeNumber);
  opt(app, "--max-request-tokens", f.model.max_request_tokens,
      "tokens in one request; 0 = max(max-batch-tokens, max_position_embeddings)",
      "FASTFORMER_MAX_REQUEST_TOKENS")
      ->check(CLI::NonNegativeNumber);
  opt(app, "--max-request-inputs", f.model.max_request_inputs,
      "sequences (texts) in one request, every protocol; beyond: INVALID_ARGUMENT / 400 (0 = no "
      "limit)",
      "FASTFORMER_MAX_REQUEST_INPUTS")
      ->check(CLI::NonNegativeNumber);
  opt(app, "--max-request-spans", f.model.max_request_spans,
      "chunks (late chunking: spans and windows) over all sequences of one request, every "
      "protocol; beyond: INVALID_ARGUMENT / 400 (0 = no limit)",
      "FASTFORMER_MAX_REQUEST_SPANS")
      ->check(CLI::NonNegativeNumber);
}

// Server-wide limits and logging.
void add_server_flags(CLI::App& app, ServerOptions& f) {
  opt(app, "--max-message-bytes", f.max_message_bytes, "largest request message accepted",
      "FASTFORMER_MAX_MESSAGE_BYTES")
      ->check(CLI::PositiveNumber);
  opt(app, "--max-concurrent-streams", f.max_concurrent_streams,
      "streaming calls (EncodeStream, ModelStreamInfer) open at once, server-wide; beyond: "
      "RESOURCE_EXHAUSTED (0 = no limit)",
      "FASTFORMER_MAX_CONCURRENT_STREAMS")
      ->check(CLI::NonNegativeNumber);
  opt(app, "--shutdown-timeout-s", f.shutdown_timeout_s, "how long SIGTERM waits for admitted work",
      "FASTFORMER_SHUTDOWN_TIMEOUT_S")
      ->check(CLI::NonNegativeNumber);
  opt(app, "--log-level", f.log_level, "trace, debug, info, warn, error", "FASTFORMER_LOG_LEVEL")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
  opt(app, "--log-format", f.log_format, "text or json", "FASTFORMER_LOG_FORMAT")
      ->check(CLI::IsMember({"text", "json"}));
}

// Transport security and bearer tokens (docs/security.md).
void add_security_flags(CLI::App& app, ServerOptions& f) {
  auto* tls_cert =
      opt(app, "--tls-cert", f.security.tls_cert,
          "PEM certificate chain: serve gRPC over TLS (needs --tls-key)", "FASTFORMER_TLS_CERT");
  auto* tls_key = opt(app, "--tls-key", f.security.tls_key, "PEM private key of --tls-cert",
                      "FASTFORMER_TLS_KEY");
  tls_cert->needs(tls_key);
  tls_key->needs(tls_cert);
  opt(app, "--tls-client-ca", f.security.tls_client_ca,
      "PEM CA certificates: mutual TLS, clients must present a certificate they signed",
      "FASTFORMER_TLS_CLIENT_CA")
      ->needs(tls_cert);
  auto* token_file = opt(
      app, "--auth-token-file", f.security.auth_token_file,
      "bearer tokens, one per line: calls need `authorization: Bearer <token>`; re-read on SIGHUP",
      "FASTFORMER_AUTH_TOKEN_FILE");
  app.add_flag("--auth-health", f.security.auth_health,
               "health and reflection need the bearer token too")
      ->envname("FASTFORMER_AUTH_HEALTH")
      ->needs(token_file);
}

// The combinations CLI11 cannot check alone; throws CLI11's errors.
void check_combinations(int argc, char** argv, ServerOptions& f) {
  // The image sets FASTFORMER_MODEL_DIR=/models: a repository given on the command line or in
  // FASTFORMER_MODEL_REPOSITORY wins over that environment default (never over --model-dir).
  bool model_dir_flag = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    model_dir_flag |= arg == "--model-dir" || arg.starts_with("--model-dir=");
  }
  if (!model_dir_flag && !f.model_repository.empty()) f.model_dir.clear();
  if (!f.model_dir.empty() && !f.model_repository.empty())
    throw CLI::ExcludesError("--model-dir", "--model-repository");
  if (f.model_dir.empty() == f.model_repository.empty())
    throw CLI::RequiredError("--model-dir or --model-repository (exactly one)");
  if (!f.model_dir.empty() && f.model_control_mode != "none") {
    throw CLI::ValidationError("--model-control-mode",
                               "needs --model-repository (--model-dir serves one fixed model)");
  }
  if (!f.load_models.empty() && f.model_control_mode != "explicit")
    throw CLI::ValidationError("--load-model", "needs --model-control-mode explicit");
}

}  // namespace

std::optional<ServerOptions> parse_server_options(int argc, char** argv, int& exit_code) {
  ServerOptions f;
  CLI::App app{"fastformer-server: Fastformer encoders over gRPC, with dynamic ragged batching"};
  app.set_config();  // no config file: flags and FASTFORMER_* env vars only
  add_repository_flags(app, f);
  add_front_door_flags(app, f);
  add_model_flags(app, f);
  add_server_flags(app, f);
  add_security_flags(app, f);
  try {
    app.parse(argc, argv);
    check_combinations(argc, argv, f);
  } catch (const CLI::ParseError& e) {
    exit_code = app.exit(e);  // what CLI11_PARSE does: prints the help or the error
    return std::nullopt;
  }
  return f;
}

}  // namespace fastformer
