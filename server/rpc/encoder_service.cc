#include "server/rpc/encoder_service.h"

#include "server/rpc/stream_reactor.h"

namespace fastformer::rpc {

using batching::Clock;

grpc::Status EncoderService::admit(const v1::EncodeRequest& proto, grpc::CallbackServerContext* context,
                                   const std::shared_ptr<batching::Request>& request) {
  return intake_.admit(
      context,
      [&] { return convert_request(proto, intake_.engine().model(), intake_.config().limits, request.get()); },
      request);
}

grpc::ServerUnaryReactor* EncoderService::Encode(grpc::CallbackServerContext* context,
                                                 const v1::EncodeRequest* proto,
                                                 v1::EncodeResponse* response) {
  const auto start = Clock::now();
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  auto request = std::make_shared<batching::Request>();
  request->is_cancelled = [context] { return context->IsCancelled(); };
  request->on_complete = [this, reactor, proto, response, start](batching::Request& r) {
    const grpc::Status status = outcome_status(r);
    const auto filling = Clock::now();
    if (status.ok()) fill_response(r, response);
    intake_.record_inference(r, status.ok(), start, ns_since(filling));
    response->set_request_id(proto->request_id());
    intake_.record("Encode", status, start);
    intake_.answered();
    reactor->Finish(status);
  };
  const grpc::Status status = admit(*proto, context, request);
  if (!status.ok()) {
    intake_.record("Encode", status, start);
    reactor->Finish(status);
  }
  return reactor;
}

grpc::Status EncoderService::StreamProtocol::admit(Message& message, grpc::CallbackServerContext* context,
                                                  const std::shared_ptr<batching::Request>& request) {
  return service->admit(message.proto, context, request);
}

v1::EncodeResponse EncoderService::StreamProtocol::answer(Message& message, const batching::Request* done,
                                                          const grpc::Status& status) {
  v1::EncodeResponse response;
  response.set_request_id(message.proto.request_id());
  if (status.ok()) {
    fill_response(*done, &response);
  } else {
    response.mutable_error()->set_code(static_cast<int32_t>(status.error_code()));
    response.mutable_error()->set_message(status.error_message());
  }
  return response;
}

grpc::ServerBidiReactor<v1::EncodeRequest, v1::EncodeResponse>* EncoderService::EncodeStream(
    grpc::CallbackServerContext* context) {
  return open_stream(&stream_protocol_, &intake_, context);
}

grpc::ServerUnaryReactor* EncoderService::GetModelInfo(grpc::CallbackServerContext* context,
                                                       const v1::GetModelInfoRequest*,
                                                       v1::ModelInfo* info) {
  const auto start = Clock::now();
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (const grpc::Status unavailable = intake_.availability(); !unavailable.ok()) {
    intake_.record("GetModelInfo", unavailable, start);
    reactor->Finish(unavailable);
    return reactor;
  }
  const engine::Engine& engine = intake_.engine();
  const ServiceConfig& config = intake_.config();
  const engine::Model& model = engine.model();
  const engine::ModelConfig& c = model.config();
  info->set_model_name(c.model_name);
  info->set_hidden_size(uint32_t(c.hidden_size));
  info->set_num_hidden_layers(uint32_t(c.num_hidden_layers));
  info->set_num_attention_heads(uint32_t(c.num_attention_heads));
  info->set_intermediate_size(uint32_t(c.intermediate_size));
  info->set_max_position_embeddings(uint32_t(c.max_position_embeddings));
  info->set_vocab_size(uint32_t(c.vocab_size));
  info->set_num_labels(uint32_t(model.num_labels()));
  info->set_accepts_token_ids(model.has_word_embedding());
  info->set_dtype(config.dtype);
  info->set_backend(engine.backend_name());
  info->set_device(engine.device_name());
  info->set_max_batch_tokens(uint32_t(config.max_batch_tokens));
  info->set_max_request_tokens(uint32_t(config.limits.max_request_tokens));
  info->set_server_version(config.version);
  info->set_accepts_text(model.tokenizer() != nullptr);
  if (model.tokenizer() != nullptr) info->set_tokenizer(model.tokenizer()->description());
  intake_.record("GetModelInfo", grpc::Status::OK, start);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace fastformer::rpc
