// The Open Inference Protocol (KServe v2) service inference.GRPCInferenceService, as Triton
// speaks it, on the same listener as fastformer.v1.Encoder: health, metadata, config,
// statistics, and ModelInfer / ModelStreamInfer into the same batch queue through the same
// Intake. The tensors are in infer_conversion.h; docs/api.md has the whole contract.
#pragma once

#include <memory>

#include "inference/grpc_service.grpc.pb.h"
#include "server/grpc/status.h"
#include "server/serving/infer_conversion.h"

namespace fastformer::rpc {

// ModelStreamInfer takes its messages' bytes (a raw callback method) and parses them here, as
// EncodeStream does: gRPC would end the stream at a message that does not parse as if the
// client had closed it; here it is answered in-band with INVALID_ARGUMENT naming the field
// and the byte, and the stream goes on.
using InferenceServiceBase = inference::GRPCInferenceService::WithCallbackMethod_ServerLive<
    inference::GRPCInferenceService::WithCallbackMethod_ServerReady<
        inference::GRPCInferenceService::WithCallbackMethod_ModelReady<
            inference::GRPCInferenceService::WithCallbackMethod_ServerMetadata<
                inference::GRPCInferenceService::WithCallbackMethod_ModelMetadata<
                    inference::GRPCInferenceService::WithCallbackMethod_ModelInfer<
                        inference::GRPCInferenceService::WithRawCallbackMethod_ModelStreamInfer<
                            inference::GRPCInferenceService::WithCallbackMethod_ModelConfig<
                                inference::GRPCInferenceService::WithCallbackMethod_ModelStatistics<
                                    inference::GRPCInferenceService::
                                        WithCallbackMethod_RepositoryIndex<
                                            inference::GRPCInferenceService::
                                                WithCallbackMethod_RepositoryModelLoad<
                                                    inference::GRPCInferenceService::
                                                        WithCallbackMethod_RepositoryModelUnload<
                                                            inference::GRPCInferenceService::
                                                                Service>>>>>>>>>>>>;

class InferenceService final : public InferenceServiceBase {
 public:
  explicit InferenceService(Intake& intake) : intake_(intake), stream_protocol_{this} {}

  grpc::ServerUnaryReactor* ServerLive(grpc::CallbackServerContext* context,
                                       const inference::ServerLiveRequest*,
                                       inference::ServerLiveResponse* response) override;
  grpc::ServerUnaryReactor* ServerReady(grpc::CallbackServerContext* context,
                                        const inference::ServerReadyRequest*,
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
  grpc::ServerUnaryReactor* RepositoryIndex(grpc::CallbackServerContext* context,
                                            const inference::RepositoryIndexRequest* request,
                                            inference::RepositoryIndexResponse* response) override;
  grpc::ServerUnaryReactor* RepositoryModelLoad(
      grpc::CallbackServerContext* context, const inference::RepositoryModelLoadRequest* request,
      inference::RepositoryModelLoadResponse* response) override;
  grpc::ServerUnaryReactor* RepositoryModelUnload(
      grpc::CallbackServerContext* context, const inference::RepositoryModelUnloadRequest* request,
      inference::RepositoryModelUnloadResponse* response) override;
  grpc::ServerUnaryReactor* ModelInfer(grpc::CallbackServerContext* context,
                                       const inference::ModelInferRequest* request,
                                       inference::ModelInferResponse* response) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* ModelStreamInfer(
      grpc::CallbackServerContext* context) override;

 private:
  // ModelStreamInfer's messages for the shared StreamReactor (stream_reactor.h).
  struct StreamProtocol {
    using Request = grpc::ByteBuffer;
    using Response = grpc::ByteBuffer;
    struct Message {
      grpc::ByteBuffer proto;  // as read
      inference::ModelInferRequest parsed;
      InferCall call;
    };
    static constexpr const char* kMethod = "ModelStreamInfer";
    Status admit(Message& message, grpc::CallbackServerContext* context,
                 const std::shared_ptr<batching::Job>& request);
    Response answer(Message& message, const batching::Job* done, const Status& status);
    InferenceService* service;
  };

  // Validates and admits one ModelInferRequest (Intake::admit with the v2 conversion).
  Status admit(const inference::ModelInferRequest& proto, InferCall* call,
               grpc::CallbackServerContext* context, const std::shared_ptr<batching::Job>& request);
  // Answers a unary call at once with `status` (recorded under `method`).
  grpc::ServerUnaryReactor* finish(grpc::CallbackServerContext* context, const char* method,
                                   batching::Clock::time_point start, const Status& status);

  Intake& intake_;
  StreamProtocol stream_protocol_;
};

}  // namespace fastformer::rpc
