// The fastformer.v1.Encoder service on gRPC's callback API: one handler per RPC. Requests
// are validated and converted here, then admitted to the batch queue; the engine thread
// answers them through each request's completion.
#pragma once

#include <memory>
#include <string>

#include "fastformer/v1/encoder.grpc.pb.h"
#include "server/rpc/intake.h"

namespace fastformer::rpc {

// Encode takes the request's bytes (a raw callback method) and parses them itself: gRPC
// answers a request that does not parse with UNIMPLEMENTED and no message, and proto3 refuses
// a `text` that is not UTF-8, so the parse failure is explained here (INVALID_ARGUMENT naming
// the sequence and the byte).
class EncoderService final : public v1::Encoder::WithRawCallbackMethod_Encode<v1::Encoder::CallbackService> {
 public:
  // The service answers UNAVAILABLE from the moment the port opens until the intake serves.
  explicit EncoderService(Intake& intake) : intake_(intake), stream_protocol_{this} {}

  grpc::ServerUnaryReactor* Encode(grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
                                   grpc::ByteBuffer* response) override;
  grpc::ServerBidiReactor<v1::EncodeRequest, v1::EncodeResponse>* EncodeStream(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const v1::GetModelInfoRequest* request,
                                         v1::ModelInfo* response) override;

 private:
  // EncodeStream's messages for the shared StreamReactor (stream_reactor.h).
  struct StreamProtocol {
    using Request = v1::EncodeRequest;
    using Response = v1::EncodeResponse;
    struct Message {
      v1::EncodeRequest proto;
    };
    static constexpr const char* kMethod = "EncodeStream";
    grpc::Status admit(Message& message, grpc::CallbackServerContext* context,
                       const std::shared_ptr<batching::Request>& request);
    v1::EncodeResponse answer(Message& message, const batching::Request* done, const grpc::Status& status);
    EncoderService* service;
  };

  // Validates and admits one request (Intake::admit with the Encode conversion).
  grpc::Status admit(const v1::EncodeRequest& proto, grpc::CallbackServerContext* context,
                     const std::shared_ptr<batching::Request>& request);

  Intake& intake_;
  StreamProtocol stream_protocol_;
};

// Why bytes that should hold an EncodeRequest do not parse: the first request_id or
// sequences[i].text that is not UTF-8, or that they are not protobuf at all.
std::string explain_encode_parse_failure(const std::string& bytes);

}  // namespace fastformer::rpc
