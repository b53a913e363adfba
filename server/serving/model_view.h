// The served model as the Open Inference Protocol (KServe v2) shows it: server metadata, model
// metadata, config and statistics, filled once here for both transports (the gRPC service in
// inference_service.cc and the REST routes of server/http/kserve_rest.cc).
#pragma once

#include <string>
#include <vector>

#include "inference/grpc_service.pb.h"
#include "server/serving/intake.h"

namespace fastformer::serving {

// The protocol's extensions every transport implements (ServerMetadata.extensions); REST adds
// binary_tensor_data.
inline constexpr const char* kExtensions[] = {"model_configuration", "statistics", "parameters",
                                              "model_repository"};
inline constexpr const char* kPlatform = "fastformer";

// Valid once serving (intake.availability() OK).
void fill_server_metadata(const Intake& intake, inference::ServerMetadataResponse* response);
// Of one model version (Intake::find).
void fill_model_metadata(const Intake& intake, const ServedModel& model,
                         inference::ModelMetadataResponse* response);
void fill_model_config(const ServedModel& model, inference::ModelConfig* config);
void fill_model_statistics(const ServedModel& model, inference::ModelStatistics* stats);
// ModelStatistics' answer: every READY version for an empty name; else the named model's
// versions (all READY ones for an empty version). NOT_FOUND / UNAVAILABLE as find() says.
Status fill_statistics(const Intake& intake, const std::string& name, const std::string& version,
                       inference::ModelStatisticsResponse* response);
// Whether a load (unload: `unload`) of `model` may go ahead: OK, or UNAVAILABLE while starting
// or draining, FAILED_PRECONDITION outside --model-control-mode explicit, INVALID_ARGUMENT for
// no model name or a parameter we do not act on (unload_dependents is accepted: nothing here
// depends on another model).
Status repository_control(const Intake& intake, const std::string& model,
                          const std::vector<std::string>& parameters, bool unload);
// RepositoryIndex's answer.
void fill_repository_index(const Intake& intake, bool ready_only,
                           inference::RepositoryIndexResponse* response);

}  // namespace fastformer::serving
