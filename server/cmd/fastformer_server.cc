// fastformer-server: loads a model, serves fastformer.v1.Encoder over gRPC with dynamic
// ragged batching, health and reflection, and exports Prometheus metrics.
//
// Start-up (server.h): open /metrics, listen (health NOT_SERVING), load the model, build the
// engine, run one warm-up batch, then SERVING. SIGTERM/SIGINT: NOT_SERVING, new calls UNAVAILABLE,
// everything admitted is answered, exit 0 within --shutdown-timeout-s; a second signal
// exits at once. SIGHUP re-reads --auth-token-file.
#include <fcntl.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>

#include "server/cmd/server.h"
#include "server/cmd/server_options.h"
#include "server/cmd/test_faults.h"

namespace {

using namespace fastformer;

// %j: the log message escaped as a JSON string body, for --log-format json.
class JsonEscapedMessage final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    for (char c : msg.payload) {
      switch (c) {
        case '"':
          dest.append(std::string_view("\\\""));
          break;
        case '\\':
          dest.append(std::string_view("\\\\"));
          break;
        case '\n':
          dest.append(std::string_view("\\n"));
          break;
        case '\t':
          dest.append(std::string_view("\\t"));
          break;
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

void setup_logging(const ServerOptions& options) {
  auto logger = spdlog::stderr_logger_mt("fastformer");
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::from_str(options.log_level));
  if (options.log_format == "json") {
    auto formatter = std::make_unique<spdlog::pattern_formatter>(spdlog::pattern_time_type::utc);
    formatter->add_flag<JsonEscapedMessage>('j').set_pattern(
        R"({"time":"%Y-%m-%dT%H:%M:%S.%fZ","level":"%l","msg":"%j"})");
    spdlog::set_formatter(std::move(formatter));
  } else {
    spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%eZ %^%l%$ %v", spdlog::pattern_time_type::utc);
  }
}

// SIGTERM/SIGINT: the first is written to a pipe that main waits on (a handler, not
// sigwait, because libraries may start threads before main could block the signals in them);
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
  int exit_code = 0;
  std::optional<ServerOptions> options = parse_server_options(argc, argv, exit_code);
  if (!options) return exit_code;
  setup_logging(*options);

  std::optional<TestFaults> test_faults;
  try {
    test_faults = test_faults_from_env();
  } catch (const std::exception& e) {
    spdlog::error("{}: {}", kTestFaultsEnv, e.what());
    return 1;
  }
  if (test_faults) {
    spdlog::warn(
        "TEST FAULT INJECTION ON ({} is set): {}. This is for tests only: unset it in production.",
        kTestFaultsEnv, test_faults->describe());
  }

  // Before start-up, so a SIGTERM while the model loads is not lost: the drain begins once
  // the server is up.
  install_signal_handlers();
  Server server(std::move(*options), std::move(test_faults));
  if (!server.start()) return 1;

  return server.serve(wait_for_signal);
}
