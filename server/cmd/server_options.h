// fastformer-server's command line: every flag, each with its FASTFORMER_* environment
// variable (docs/operations.md lists them). No config file.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "server/rpc/server_credentials.h"

namespace fastformer {

struct ServerOptions {
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
  int64_t max_request_tokens = 0;  ///< 0: max(max_batch_tokens, max_position_embeddings)
  int64_t max_message_bytes = 64 << 20;
  int64_t max_concurrent_streams = 1024;
  double shutdown_timeout_s = 30;
  std::string log_level = "info";
  std::string log_format = "text";
  rpc::SecurityOptions security;
};

// The options on the command line, each falling back to its environment variable. When they
// make no server (invalid, or --help) prints what CLI11 prints, stores the exit code it
// chose in `exit_code` (0 for --help, CLI11's 10x codes for invalid flags) and returns nullopt.
std::optional<ServerOptions> parse_server_options(int argc, char** argv, int& exit_code);

}  // namespace fastformer
