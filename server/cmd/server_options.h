// fastformer-server's command line: every flag, each with its FASTFORMER_* environment
// variable (docs/operations.md lists them). No config file.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/defaults.h"
#include "server/repository/served_model.h"
#include "server/serving/security_options.h"

namespace fastformer {

struct ServerOptions {
  std::string model_dir;         ///< --model-dir: a repository of one model
  std::string model_repository;  ///< --model-repository
  std::string model_control_mode = "none";
  std::vector<std::string> load_models;
  double repository_poll_secs = 15;
  std::string default_model;
  std::string listen = defaults::kListen;
  std::string metrics_listen = defaults::kMetricsListen;
  std::string http_listen = defaults::kHttpListen;  ///< empty: no HTTP listener
  int http_threads = defaults::kHttpThreads;
  int64_t http_max_body_bytes = defaults::kMaxMessageBytes;
  int64_t http_max_connections = defaults::kHttpMaxConnections;
  double http_idle_timeout_s = defaults::kHttpIdleTimeoutS;
  double http_header_timeout_s = defaults::kHttpHeaderTimeoutS;
  std::vector<std::string> served_model_names;  ///< names the model answers to besides its own
  /// --jobs-dir: the Files and Batch APIs' data directory (server/jobs); empty: both off.
  std::string jobs_dir;
  int64_t jobs_max_file_bytes = int64_t(512) << 20;
  int64_t jobs_max_stored_bytes = int64_t(100) << 30;
  int64_t jobs_file_ttl_s = 30 * 24 * 3600;
  int64_t jobs_completion_window_s = 24 * 3600;
  int64_t jobs_queued_tokens = 0;  ///< 0: half the bulk class's queue limit
  /// Every model's settings as the flags give them (--backend, --dtype, --max-batch-tokens,
  /// ...); each model's config.pbtxt overrides them. --max-queue-tokens is also the limit
  /// over every model's queue.
  repository::ModelSettings model;
  int64_t max_message_bytes = defaults::kMaxMessageBytes;
  int64_t max_concurrent_streams = defaults::kMaxConcurrentStreams;
  double shutdown_timeout_s = defaults::kShutdownTimeoutS;
  std::string log_level = "info";
  std::string log_format = "text";
  serving::SecurityOptions security;
};

// The options on the command line, each falling back to its environment variable. When they
// make no server (invalid, or --help) prints what CLI11 prints, stores the exit code it
// chose in `exit_code` (0 for --help, CLI11's 10x codes for invalid flags) and returns nullopt.
std::optional<ServerOptions> parse_server_options(int argc, char** argv, int& exit_code);

}  // namespace fastformer
