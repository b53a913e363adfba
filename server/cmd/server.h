// fastformer-server's parts, in the order they start: /metrics, transport security, the gRPC
// port (health NOT_SERVING), the HTTP port, the model repository (each start-up model version
// loaded and warmed up, with its queue and its lane on the compute pool), then SERVING.
// Signals are main's: SIGHUP re-reads the tokens (and rescans the repository in poll mode),
// the others drain.
#pragma once

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "server/cmd/server_options.h"
#include "server/cmd/test_faults.h"
#include "server/grpc/encoder_service.h"
#include "server/grpc/inference_service.h"
#include "server/grpc/server_credentials.h"
#include "server/grpc/unimplemented.h"
#include "server/http/api.h"
#include "server/http/http_server.h"
#include "server/jobs/store.h"
#include "server/metrics/metrics.h"
#include "server/repository/repository.h"
#include "server/serving/auth.h"
#include "server/serving/intake.h"
#include "server/text/text.h"

namespace fastformer {

class Server {
 public:
  // Registers the metrics; starts nothing.
  Server(ServerOptions options, std::optional<TestFaults> test_faults);

  // Opens /metrics and the gRPC port, loads the model, builds and warms up the engine and
  // starts the batcher; health turns SERVING last. Returns false, having logged why, when the
  // server cannot start (exit code 1).
  [[nodiscard]] bool start();

  // After start: serves until `next_signal` (which blocks until a signal arrives and returns
  // its number) returns anything but SIGHUP; each SIGHUP re-reads --auth-token-file. Then
  // drains and returns drain()'s exit code.
  [[nodiscard]] int serve(const std::function<int()>& next_signal);

  // SIGHUP: re-reads --auth-token-file; rescans the repository in poll mode.
  void reload();

  // After start: health NOT_SERVING, new calls UNAVAILABLE, and waits up to
  // --shutdown-timeout-s until every admitted request is answered; then stops gRPC and the
  // batcher and returns exit code 0. `cause` (the signal) is logged. If admitted work is left
  // at the timeout, logs it, cancels the open calls and ends the process at once with exit
  // code 1: the scheduler and gRPC would wait for that work when destroyed.
  [[nodiscard]] int drain(const std::string& cause);

 private:
  bool open_metrics();
  bool secure();
  bool listen();
  bool listen_http();
  bool load_models();
  void start_serving();
  void set_health(bool serving);
  void update_health();  // after a repository change
  // Logs a start-up failure after the port opened and closes it.
  void fail_start(const std::string& what);

  const ServerOptions options_;
  const std::optional<TestFaults> test_faults_;
  // Destroyed bottom-up: the scheduler before the queue and the engine it runs on, gRPC before
  // the service it calls, and the metrics everything records into last.
  metrics::Metrics metrics_;
  std::unique_ptr<metrics::MetricsServer> metrics_server_;
  serving::AuthMetrics auth_metrics_;
  std::unique_ptr<rpc::ServerSecurity> security_;
  serving::Intake intake_;  // what both services share: admission, drain, statistics
  rpc::EncoderService service_;
  rpc::InferenceService inference_service_;
  rpc::UnimplementedMethods unimplemented_;
  std::unique_ptr<grpc::Server> grpc_server_;
  std::unique_ptr<jobs::Store> jobs_store_;              // --jobs-dir's; null: off
  std::unique_ptr<http::HttpApi> http_api_;              // the HTTP routes, over intake_
  std::unique_ptr<http::HttpServer> http_server_;        // null without --http-listen
  grpc::HealthCheckServiceInterface* health_ = nullptr;  // owned by grpc_server_
  // Its models' queues and lanes, over the compute pool it owns; closed by the drain.
  std::unique_ptr<repository::Repository> repository_;
  std::mutex health_mu_;
  bool draining_ = false;  // under health_mu_
};

}  // namespace fastformer
