// The canonical names of gRPC status codes ("OK", "RESOURCE_EXHAUSTED", ...): the spelling of
// the server's metric labels and logs and of the clients' error messages. Built only with the
// server and clients (it needs gRPC); the client library carries it (client.h declares it).
#pragma once

#include <grpcpp/support/status.h>

#include <string>

namespace fastformer {

std::string status_code_name(grpc::StatusCode code);

}  // namespace fastformer
