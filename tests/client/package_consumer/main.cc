// Uses the installed client: builds a request, calls a port nothing listens on, and expects
// UNAVAILABLE. Prints "ok" and exits 0 when all holds.
#include <fastformer/client.h>

#include <cstdio>
#include <cstdlib>

int main(int argc, char** argv) {
  fastformer::ClientOptions options;
  options.target = argc > 1 ? argv[1] : "127.0.0.1:1";
  options.deadline = std::chrono::seconds(5);
  fastformer::Client client(options);
  const fastformer::v1::EncodeRequest request = fastformer::Client::MakeRequest({{101, 7, 102}});
  fastformer::v1::EncodeResponse response;
  const grpc::Status status = client.Encode(request, &response);
  grpc::Status health_status;
  const auto health = client.Health("", &health_status);
  std::printf("Encode: %s; health: %s (%s)\n",
              fastformer::status_code_name(status.error_code()).c_str(),
              fastformer::health_status_name(health), health_status.error_message().c_str());
  const bool ok = request.sequences_size() == 1 &&
                  status.error_code() == grpc::StatusCode::UNAVAILABLE &&
                  health == fastformer::HealthStatus::kUnknown;
  std::printf("%s\n", ok ? "ok" : "unexpected");
  return ok ? EXIT_SUCCESS : EXIT_FAILURE;
}
