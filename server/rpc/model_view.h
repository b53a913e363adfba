// The served model as the Open Inference Protocol (KServe v2) shows it: server metadata, model
// metadata, config and statistics, filled once here for both transports (the gRPC service in
// inference_service.cc and the REST routes of server/http/kserve_rest.cc).
#pragma once

#include <grpcpp/support/status.h>

#include <string>

#include "inference/grpc_service.pb.h"
#include "server/rpc/intake.h"

namespace fastformer::rpc {

// The protocol's extensions every transport implements (ServerMetadata.extensions); REST adds
// binary_tensor_data.
inline constexpr const char* kExtensions[] = {"model_configuration", "statistics", "parameters"};
inline constexpr const char* kPlatform = "fastformer";

// UNAVAILABLE while starting or draining, else check_model's verdict on name and version.
grpc::Status model_status(const Intake& intake, const std::string& name,
                          const std::string& version);

// Valid once serving (intake.availability() OK).
void fill_server_metadata(const Intake& intake, inference::ServerMetadataResponse* response);
void fill_model_metadata(const Intake& intake, inference::ModelMetadataResponse* response);
void fill_model_config(const Intake& intake, inference::ModelConfig* config);
void fill_model_statistics(const Intake& intake, inference::ModelStatistics* stats);

}  // namespace fastformer::rpc
