// What fastformer-client and fastformer-loadgen share: the flags that say where the server is
// and how to reach it (target, deadline, TLS, token), and command-line parsing with the exit
// codes both programs use.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "fastformer/client.h"

namespace fastformer::cli {

constexpr int kExitFailure = 1;  ///< the server could not be reached or a call failed
constexpr int kExitUsage = 2;    ///< bad flags or unusable input

struct ConnectionFlags {
  std::string target = "127.0.0.1:50051";
  int64_t deadline_ms = 60000;  ///< per call; 0 = none
  bool tls = false;
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  std::string tls_server_name;
  std::string token;
  std::string token_file;
};

// Adds --target, --deadline-ms, --tls, --tls-ca, --tls-cert, --tls-key, --tls-server-name,
// --token and --token-file (with FASTFORMER_* environment variables) to `app`.
void add_connection_flags(CLI::App& app, ConnectionFlags& flags);

// ClientOptions from the flags (reads --token-file). On failure returns false and sets `error`.
bool make_client_options(const ConnectionFlags& flags, ClientOptions* out, std::string* error);

// A Client from the flags; null (the reason printed after `program`) when the flags cannot make
// one (an unreadable token or certificate file: a usage error).
std::unique_ptr<Client> make_client(const ConnectionFlags& flags, const std::string& program);

// Parses the command line. nullopt: go on; otherwise exit with the value returned (0 after
// --help, kExitUsage after a usage error, whose message has been printed).
std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv);

// "<program>: <message>" on stderr.
void print_error(const std::string& program, const std::string& message);

// "STATUS_NAME: message" of a failed call.
std::string describe(const grpc::Status& status);

}  // namespace fastformer::cli
