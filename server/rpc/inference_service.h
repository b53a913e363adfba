// The Open Inference Protocol (KServe v2) service inference.GRPCInferenceService, as Triton
// speaks it, on the same listener as fastformer.v1.Encoder: health, metadata, config,
// statistics, and ModelInfer / ModelStreamInfer into the same batch queue through the same
// Intake. The tensors are in infer_conversion.h; docs/api.md has the whole contract.
#pragma once

#include <memory>

#include "inference/grpc_service.grpc.pb.h"
#include "server/rpc/infer_conversion.h"
#include "server/rpc/intake.h"

namespace fastformer::rpc {

class InferenceService final : public inference::GRPCInferenceService::CallbackService {
 public:
  explicit InferenceService(Intake& intake) : intake_(intake), stream_protocol_{this} {}

  grpc::ServerUnaryReactor* ServerLive(grpc::CallbackServerContext* context, const inference::ServerLiveRequest*,
                                       inference::ServerLiveResponse* response) override;
  grpc::ServerUnaryReactor* ServerReady(grpc::CallbackServerContext* context, const inference::ServerReadyRequest*,
                                        inference::ServerReadyResponse* response) override;
  grpc::ServerUnaryReactor* ModelReady(grpc::CallbackServerContext* context,
                                       const inference::ModelReadyRequest* request,
                                       inference::ModelReadyResponse* response) override;
  grpc::ServerUnaryReactor* ServerMetadata(grpc::CallbackServerContext* context,
                                           const inference::ServerMetadataRequest*,
                                           inference::ServerMetadataResponse* response) override;
  grpc::ServerUnaryReactor* ModelMetadata(grpc::CallbackServerContext* context,
                                          const inference::ModelMetadataRequest* request,
                                          inference::ModelMetadataResponse* response) override;
  grpc::ServerUnaryReactor* ModelConfig(grpc::CallbackServerContext* context,
                                        const inference::ModelConfigRequest* request,
                                        inference::ModelConfigResponse* response) override;
  grpc::ServerUnaryReactor* ModelStatistics(grpc::CallbackServerContext* context,
                                            const inference::ModelStatisticsRequest* request,
                                            inference::ModelStatisticsResponse* response) override;
  grpc::ServerUnaryReactor* ModelInfer(grpc::CallbackServerContext* context,
                                       const inference::ModelInferRequest* request,
                                       inference::ModelInferResponse* response) override;
  grpc::ServerBidiReactor<inference::ModelInferRequest, inference::ModelStreamInferResponse>* ModelStreamInfer(
      grpc::CallbackServerContext* context) override;

 private:
  // ModelStreamInfer's messages for the shared StreamReactor (stream_reactor.h).
  struct StreamProtocol {
    using Request = inference::ModelInferRequest;
    using Response = inference::ModelStreamInferResponse;
    struct Message {
      inference::ModelInferRequest proto;
      InferCall call;
    };
    static constexpr const char* kMethod = "ModelStreamInfer";
    grpc::Status admit(Message& message, grpc::CallbackServerContext* context,
                       const std::shared_ptr<batching::Request>& request);
    Response answer(Message& message, const batching::Request* done, const grpc::Status& status);
    InferenceService* service;
  };

  // Validates and admits one ModelInferRequest (Intake::admit with the v2 conversion).
  grpc::Status admit(const inference::ModelInferRequest& proto, InferCall* call, grpc::CallbackServerContext* context,
                     const std::shared_ptr<batching::Request>& request);
  // Answers a unary call at once with `status` (recorded under `method`).
  grpc::ServerUnaryReactor* finish(grpc::CallbackServerContext* context, const char* method,
                                   batching::Clock::time_point start, const grpc::Status& status);
  // UNAVAILABLE while starting or draining, else check_model's verdict on name and version.
  grpc::Status model_status(const std::string& name, const std::string& version) const;

  Intake& intake_;
  StreamProtocol stream_protocol_;
};

}  // namespace fastformer::rpc
