// The fastformer.v1.Encoder service on gRPC's callback API: one handler per RPC. Requests
// are validated and converted here, then admitted to the batch queue; the engine thread
// answers them through each request's completion.
#pragma once

#include <memory>

#include "fastformer/v1/encoder.grpc.pb.h"
#include "server/grpc/status.h"

namespace fastformer::rpc {

// Encode and EncodeStream take the messages' bytes (raw callback methods) and parse them here:
// gRPC answers a unary request that does not parse with UNIMPLEMENTED and no message, and ends
// a stream at a message that does not parse as if the client had closed it (dropping the rest).
// proto3 refuses a `text` that is not UTF-8, so such a message gets INVALID_ARGUMENT naming the
// sequence and the byte (in-band on the stream, which goes on).
class EncoderService final
    : public v1::Encoder::WithRawCallbackMethod_Encode<
          v1::Encoder::WithRawCallbackMethod_EncodeStream<
              v1::Encoder::WithCallbackMethod_GetModelInfo<v1::Encoder::Service>>> {
 public:
  // The service answers UNAVAILABLE from the moment the port opens until the intake serves.
  explicit EncoderService(Intake& intake) : intake_(intake), stream_protocol_{this} {}

  grpc::ServerUnaryReactor* Encode(grpc::CallbackServerContext* context,
                                   const grpc::ByteBuffer* request,
                                   grpc::ByteBuffer* response) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* EncodeStream(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const v1::GetModelInfoRequest* request,
                                         v1::ModelInfo* response) override;

 private:
  // EncodeStream's messages for the shared StreamReactor (stream_reactor.h).
  struct StreamProtocol {
    using Request = grpc::ByteBuffer;
    using Response = grpc::ByteBuffer;
    struct Message {
      grpc::ByteBuffer proto;  // as read
      v1::EncodeRequest parsed;
    };
    static constexpr const char* kMethod = "EncodeStream";
    Status admit(Message& message, grpc::CallbackServerContext* context,
                 const std::shared_ptr<batching::Job>& request);
    grpc::ByteBuffer answer(Message& message, const batching::Job* done, const Status& status);
    EncoderService* service;
  };

  // Validates and admits one request (Intake::admit with the Encode conversion).
  Status admit(const v1::EncodeRequest& proto, grpc::CallbackServerContext* context,
               const std::shared_ptr<batching::Job>& request);

  Intake& intake_;
  StreamProtocol stream_protocol_;
};

}  // namespace fastformer::rpc
