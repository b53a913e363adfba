// A real fastformer-server for the client tests: started on free loopback ports with a model
// directory, waited for until health says SERVING, stopped (SIGTERM, then SIGKILL) on
// destruction. The binary is $FASTFORMER_BIN_DIR/fastformer-server, else the one this build
// made. The child dies with the test process (PR_SET_PDEATHSIG).
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <string>
#include <vector>

namespace fastformer::test {

// A loopback port nothing listens on (bound, then released).
int free_port();

class ServerProcess {
 public:
  ServerProcess(const std::filesystem::path& model_dir, const std::vector<std::string>& flags,
                const std::filesystem::path& log_path);
  ~ServerProcess();
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  std::string target() const { return "127.0.0.1:" + std::to_string(port_); }
  std::string log_tail(size_t chars = 4000) const;

 private:
  void wait_serving();
  void stop();

  int port_ = 0;
  int metrics_port_ = 0;
  pid_t pid_ = -1;
  std::filesystem::path log_path_;
};

}  // namespace fastformer::test
