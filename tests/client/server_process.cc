#include "tests/client/server_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <thread>

#include "fastformer/client.h"

extern char** environ;

namespace fastformer::test {
namespace {

using namespace std::chrono_literals;

std::string server_binary() {
  if (const char* dir = std::getenv("FASTFORMER_BIN_DIR"); dir != nullptr && *dir != '\0') {
    return (std::filesystem::path(dir) / "fastformer-server").string();
  }
  return FASTFORMER_SERVER_BINARY;
}

bool accepts_connections(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

}  // namespace

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(fd);
    throw std::runtime_error("cannot bind a loopback port");
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

ServerProcess::ServerProcess(const std::filesystem::path& model_dir,
                             const std::vector<std::string>& flags,
                             const std::filesystem::path& log_path)
    : port_(free_port()), metrics_port_(free_port()), log_path_(log_path) {
  while (metrics_port_ == port_) metrics_port_ = free_port();
  std::vector<std::string> args = {server_binary(),
                                   "--model-dir",
                                   model_dir.string(),
                                   "--listen",
                                   target(),
                                   "--metrics-listen",
                                   "127.0.0.1:" + std::to_string(metrics_port_),
                                   "--http-listen",
                                   "127.0.0.1:0",
                                   "--backend",
                                   "cpu"};
  args.insert(args.end(), flags.begin(), flags.end());
  if (std::find(flags.begin(), flags.end(), "--threads") == flags.end()) {
    args.insert(args.end(), {"--threads", "1"});
  }
  // float32 unless a test names its dtype: the checks against the reference are float32's,
  // and the default, auto, is bfloat16 on a CPU with AVX512_BF16 or AMX.
  if (std::find(flags.begin(), flags.end(), "--dtype") == flags.end()) {
    args.insert(args.end(), {"--dtype", "float32"});
  }
  // Everything the child needs is made before fork: after it, only async-signal-safe calls.
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_strings;  // FASTFORMER_* would become the server's flag defaults
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "FASTFORMER_", 11) != 0) env_strings.emplace_back(*e);
  }
  std::vector<char*> envp;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  const int log_fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log_fd < 0) throw std::runtime_error("cannot write " + log_path.string());
  const pid_t parent = ::getpid();
  pid_ = ::fork();
  if (pid_ == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    ::dup2(log_fd, STDOUT_FILENO);
    ::dup2(log_fd, STDERR_FILENO);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  ::close(log_fd);
  if (pid_ < 0) throw std::runtime_error("fork failed");
  try {
    wait_serving();
  } catch (...) {
    stop();
    throw;
  }
}

ServerProcess::~ServerProcess() { stop(); }

void ServerProcess::wait_serving() {
  const auto give_up = std::chrono::steady_clock::now() + 60s;
  const auto fail = [&](const std::string& why) {
    throw std::runtime_error("fastformer-server (" + server_binary() + ") " + why + "\nlog:\n" +
                             log_tail());
  };
  const auto exited = [&] {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) != pid_) return false;
    pid_ = -1;
    return true;
  };
  // The port first: a channel that tried before the server listened backs off for seconds.
  while (!accepts_connections(port_)) {
    if (exited()) fail("exited during start-up");
    if (std::chrono::steady_clock::now() > give_up) fail("not listening after 60 s");
    std::this_thread::sleep_for(5ms);
  }
  ClientOptions options;
  options.target = target();
  Client client(options);
  HealthStatus health = HealthStatus::kUnknown;
  // The encoder's service, not the server's "": gRPC's default health service answers ""
  // SERVING from BuildAndStart until the server sets it NOT_SERVING a moment later, and a
  // probe in that window would start the tests before the model is warm (a named service is
  // NOT_FOUND until the server sets it).
  while ((health = client.Health("fastformer.v1.Encoder", nullptr, 1000ms)) !=
         HealthStatus::kServing) {
    if (exited()) fail("exited before SERVING");
    if (std::chrono::steady_clock::now() > give_up) {
      fail(std::string("not SERVING after 60 s (health ") + health_status_name(health) + ")");
    }
    std::this_thread::sleep_for(10ms);
  }
}

void ServerProcess::stop() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGTERM);
  const auto give_up = std::chrono::steady_clock::now() + 10s;
  int status = 0;
  while (::waitpid(pid_, &status, WNOHANG) != pid_) {
    if (std::chrono::steady_clock::now() > give_up) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
      break;
    }
    std::this_thread::sleep_for(5ms);
  }
  pid_ = -1;
}

std::string ServerProcess::log_tail(size_t chars) const {
  std::ifstream in(log_path_, std::ios::binary);
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  return text.size() <= chars ? text : "...\n" + text.substr(text.size() - chars);
}

}  // namespace fastformer::test
