#include "server/grpc/unimplemented.h"

#include "server/grpc/status.h"

namespace fastformer::rpc {

grpc::ServerGenericBidiReactor* UnimplementedMethods::CreateReactor(
    grpc::GenericCallbackServerContext* context) {
  class Reactor final : public grpc::ServerGenericBidiReactor {
   public:
    explicit Reactor(const grpc::Status& status) { Finish(status); }
    void OnDone() override { delete this; }
  };
  const grpc::Status status(
      grpc::StatusCode::UNIMPLEMENTED,
      "method " + context->method() +
          " is not implemented by fastformer-server; it serves fastformer.v1.Encoder (Encode, "
          "EncodeStream, "
          "GetModelInfo) and inference.GRPCInferenceService (ServerLive, ServerReady, ModelReady, "
          "ServerMetadata, "
          "ModelMetadata, ModelConfig, ModelStatistics, ModelInfer, ModelStreamInfer)");
  // One label for every unknown method: a client cannot grow the metrics' label set.
  intake_.record("Unimplemented", from_grpc(status), batching::Clock::now());
  return new Reactor(status);
}

}  // namespace fastformer::rpc
