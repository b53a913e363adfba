#include "server/grpc/encoder_service.h"

#include "server/grpc/raw_message.h"
#include "server/grpc/request_conversion.h"
#include "server/grpc/stream_reactor.h"

namespace fastformer::rpc {

using batching::Clock;

Status EncoderService::admit(const v1::EncodeRequest& proto, grpc::CallbackServerContext* context,
                             const std::shared_ptr<batching::Job>& request) {
  return intake_.admit(
      steady_deadline(context), proto.model_name(), proto.model_version(),
      [&](const ServedModel& model, request::Prepared* out) {
        return convert_request(proto, *model.model, model.tokenizer(), model.config.limits,
                               model.config.files(), out);
      },
      request);
}

grpc::ServerUnaryReactor* EncoderService::Encode(grpc::CallbackServerContext* context,
                                                 const grpc::ByteBuffer* bytes,
                                                 grpc::ByteBuffer* out) {
  const auto start = Clock::now();
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  // The parsed request (which the answer echoes) and the response being made.
  struct Call {
    v1::EncodeRequest proto;
    v1::EncodeResponse response;
  };
  auto call = std::make_shared<Call>();
  if (const Status invalid = parse_encode_request(*bytes, &call->proto); !invalid.ok()) {
    intake_.record("Encode", invalid, start);
    reactor->Finish(to_grpc(invalid));
    return reactor;
  }
  auto request = std::make_shared<batching::Job>();
  request->is_cancelled = [context] { return context->IsCancelled(); };
  request->on_complete = [this, reactor, call, out, start](batching::Job& r) {
    Status status = outcome_status(r);
    const auto filling = Clock::now();
    if (status.ok()) {
      const Admitted& admitted = Intake::admitted(r);
      fill_response(r, admitted, call->proto, admitted.model->config.quantization.get(),
                    &call->response);
      call->response.set_request_id(call->proto.request_id());
      call->response.set_model_name(admitted.model->name);
      call->response.set_model_version(admitted.model->version);
      bool own = false;
      status = from_grpc(
          grpc::SerializationTraits<v1::EncodeResponse>::Serialize(call->response, out, &own));
    }
    intake_.complete("Encode", r, status, start, ns_since(filling));
    reactor->Finish(to_grpc(status));
  };
  const Status status = admit(call->proto, context, request);
  if (!status.ok()) {
    intake_.record("Encode", status, start);
    reactor->Finish(to_grpc(status));
  }
  return reactor;
}

Status EncoderService::StreamProtocol::admit(Message& message, grpc::CallbackServerContext* context,
                                             const std::shared_ptr<batching::Job>& request) {
  if (Status invalid = parse_stream_message(message.proto, &message.parsed, parse_encode_request);
      !invalid.ok()) {
    return invalid;
  }
  message.proto.Clear();
  return service->admit(message.parsed, context, request);
}

grpc::ByteBuffer EncoderService::StreamProtocol::answer(Message& message, const batching::Job* done,
                                                        const Status& status) {
  v1::EncodeResponse response;
  response.set_request_id(message.parsed.request_id());
  if (status.ok()) {
    const Admitted& admitted = Intake::admitted(*done);
    fill_response(*done, admitted, message.parsed, admitted.model->config.quantization.get(),
                  &response);
    response.set_model_name(admitted.model->name);
    response.set_model_version(admitted.model->version);
  } else {
    response.set_model_name(message.parsed.model_name());
    response.set_model_version(message.parsed.model_version());
    response.mutable_error()->set_code(static_cast<int32_t>(status.code()));
    response.mutable_error()->set_message(status.message());
  }
  return serialize_raw_message(response, kMethod);
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* EncoderService::EncodeStream(
    grpc::CallbackServerContext* context) {
  return open_stream(&stream_protocol_, &intake_, context);
}

grpc::ServerUnaryReactor* EncoderService::GetModelInfo(grpc::CallbackServerContext* context,
                                                       const v1::GetModelInfoRequest* request,
                                                       v1::ModelInfo* info) {
  const auto start = Clock::now();
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  Status unavailable;
  const auto served = intake_.find(request->model_name(), request->model_version(), &unavailable);
  if (!served) {
    intake_.record("GetModelInfo", unavailable, start);
    reactor->Finish(to_grpc(unavailable));
    return reactor;
  }
  const engine::Engine& engine = *served->engine;
  const ServiceConfig& config = served->config;
  const engine::Model& model = *served->model;
  const engine::ModelConfig& c = model.config();
  info->set_model_name(served->name);
  info->set_model_version(served->version);
  info->set_hidden_size(uint32_t(c.hidden_size));
  info->set_num_hidden_layers(uint32_t(c.num_hidden_layers));
  info->set_num_attention_heads(uint32_t(c.num_attention_heads));
  info->set_intermediate_size(uint32_t(c.intermediate_size));
  info->set_max_position_embeddings(uint32_t(c.max_position_embeddings));
  info->set_vocab_size(uint32_t(c.vocab_size));
  info->set_num_labels(uint32_t(model.num_labels()));
  for (int64_t i = 0; i < model.num_labels(); ++i) info->add_labels(served->label(size_t(i)));
  if (const request::Prompts* prompts = served->config.prompts.get()) {
    for (const auto& [name, text] : prompts->by_name) (*info->mutable_prompts())[name] = text;
    info->set_default_prompt_name(prompts->default_name.value_or(""));
  }
  info->set_accepts_token_ids(model.has_word_embedding());
  info->set_dtype(engine::dtype_name(engine.dtype().dtype));  // as served: never "auto"
  info->set_backend(engine.backend_name());
  info->set_device(engine.device_name());
  for (const std::string& site : engine.gemm_report()) info->add_gemm_kernels(site);
  info->set_max_batch_tokens(uint32_t(served->settings.max_batch_tokens));
  info->set_max_request_tokens(uint32_t(config.limits.max_request_tokens));
  info->set_server_version(config.version);
  info->set_accepts_text(served->tokenizer() != nullptr);
  if (served->tokenizer() != nullptr) info->set_tokenizer(served->tokenizer()->description());
  intake_.record("GetModelInfo", Status(), start);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace fastformer::rpc
