#include "server/grpc/inference_service.h"

#include "server/grpc/raw_message.h"
#include "server/grpc/request_conversion.h"
#include "server/grpc/stream_reactor.h"
#include "server/serving/model_view.h"

namespace fastformer::rpc {

using batching::Clock;

grpc::ServerUnaryReactor* InferenceService::finish(grpc::CallbackServerContext* context,
                                                   const char* method, Clock::time_point start,
                                                   const Status& status) {
  intake_.record(method, status, start);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(to_grpc(status));
  return reactor;
}

grpc::ServerUnaryReactor* InferenceService::ServerLive(grpc::CallbackServerContext* context,
                                                       const inference::ServerLiveRequest*,
                                                       inference::ServerLiveResponse* response) {
  response->set_live(true);  // the process answers: live, even while it warms up or drains
  return finish(context, "ServerLive", Clock::now(), Status());
}

grpc::ServerUnaryReactor* InferenceService::ServerReady(grpc::CallbackServerContext* context,
                                                        const inference::ServerReadyRequest*,
                                                        inference::ServerReadyResponse* response) {
  response->set_ready(intake_.ready());
  return finish(context, "ServerReady", Clock::now(), Status());
}

grpc::ServerUnaryReactor* InferenceService::ModelReady(grpc::CallbackServerContext* context,
                                                       const inference::ModelReadyRequest* request,
                                                       inference::ModelReadyResponse* response) {
  // Not ready (rather than an error) while starting or draining, or for a model this server does
  // not serve, as Triton answers: model_status covers all three.
  Status status;
  response->set_ready(intake_.find(request->name(), request->version(), &status) != nullptr);
  return finish(context, "ModelReady", Clock::now(), Status());
}

grpc::ServerUnaryReactor* InferenceService::ServerMetadata(
    grpc::CallbackServerContext* context, const inference::ServerMetadataRequest*,
    inference::ServerMetadataResponse* response) {
  const auto start = Clock::now();
  if (Status unavailable = intake_.availability(); !unavailable.ok()) {
    return finish(context, "ServerMetadata", start, unavailable);
  }
  serving::fill_server_metadata(intake_, response);
  return finish(context, "ServerMetadata", start, Status());
}

grpc::ServerUnaryReactor* InferenceService::ModelMetadata(
    grpc::CallbackServerContext* context, const inference::ModelMetadataRequest* request,
    inference::ModelMetadataResponse* response) {
  const auto start = Clock::now();
  Status s;
  const auto served = intake_.find(request->name(), request->version(), &s);
  if (!served) return finish(context, "ModelMetadata", start, s);
  serving::fill_model_metadata(intake_, *served, response);
  return finish(context, "ModelMetadata", start, Status());
}

grpc::ServerUnaryReactor* InferenceService::ModelConfig(
    grpc::CallbackServerContext* context, const inference::ModelConfigRequest* request,
    inference::ModelConfigResponse* response) {
  const auto start = Clock::now();
  Status s;
  const auto served = intake_.find(request->name(), request->version(), &s);
  if (!served) return finish(context, "ModelConfig", start, s);
  serving::fill_model_config(*served, response->mutable_config());
  return finish(context, "ModelConfig", start, Status());
}

grpc::ServerUnaryReactor* InferenceService::ModelStatistics(
    grpc::CallbackServerContext* context, const inference::ModelStatisticsRequest* request,
    inference::ModelStatisticsResponse* response) {
  const auto start = Clock::now();
  return finish(context, "ModelStatistics", start,
                serving::fill_statistics(intake_, request->name(), request->version(), response));
}

grpc::ServerUnaryReactor* InferenceService::RepositoryIndex(
    grpc::CallbackServerContext* context, const inference::RepositoryIndexRequest* request,
    inference::RepositoryIndexResponse* response) {
  const auto start = Clock::now();
  if (Status unavailable = intake_.availability(); !unavailable.ok()) {
    return finish(context, "RepositoryIndex", start, unavailable);
  }
  serving::fill_repository_index(intake_, request->ready(), response);
  return finish(context, "RepositoryIndex", start, Status());
}

grpc::ServerUnaryReactor* InferenceService::RepositoryModelLoad(
    grpc::CallbackServerContext* context, const inference::RepositoryModelLoadRequest* request,
    inference::RepositoryModelLoadResponse*) {
  const auto start = Clock::now();
  std::vector<std::string> parameters;
  for (const auto& [key, value] : request->parameters()) parameters.push_back(key);
  Status refused = serving::repository_control(intake_, request->model_name(), parameters, false);
  if (!refused.ok()) return finish(context, "RepositoryModelLoad", start, refused);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  // Answered from the repository's thread once the load (and the swap) is done.
  intake_.repository().load(request->model_name(), [this, reactor, start](const Status& status) {
    intake_.record("RepositoryModelLoad", status, start);
    reactor->Finish(to_grpc(status));
  });
  return reactor;
}

grpc::ServerUnaryReactor* InferenceService::RepositoryModelUnload(
    grpc::CallbackServerContext* context, const inference::RepositoryModelUnloadRequest* request,
    inference::RepositoryModelUnloadResponse*) {
  const auto start = Clock::now();
  std::vector<std::string> parameters;
  for (const auto& [key, value] : request->parameters()) parameters.push_back(key);
  Status refused = serving::repository_control(intake_, request->model_name(), parameters, true);
  if (!refused.ok()) return finish(context, "RepositoryModelUnload", start, refused);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  // Answered once the model's admitted requests ended and it is freed.
  intake_.repository().unload(request->model_name(), [this, reactor, start](const Status& status) {
    intake_.record("RepositoryModelUnload", status, start);
    reactor->Finish(to_grpc(status));
  });
  return reactor;
}

Status InferenceService::admit(const inference::ModelInferRequest& proto, InferCall* call,
                               grpc::CallbackServerContext* context,
                               const std::shared_ptr<batching::Job>& request) {
  return intake_.admit(
      steady_deadline(context), proto.model_name(), proto.model_version(),
      [&](const ServedModel& model, request::Prepared* out) {
        call->quantization = model.config.quantization;
        call->quantization_file = model.config.quantization_file;
        call->prompts = model.config.prompts;
        return serving::convert_infer_request(proto, *model.model, model.tokenizer(),
                                              model.config.limits,
                                              model.settings.max_batch_sequences, call, out);
      },
      request);
}

grpc::ServerUnaryReactor* InferenceService::ModelInfer(grpc::CallbackServerContext* context,
                                                       const inference::ModelInferRequest* proto,
                                                       inference::ModelInferResponse* response) {
  const auto start = Clock::now();
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  auto call = std::make_shared<InferCall>();
  auto request = std::make_shared<batching::Job>();
  request->is_cancelled = [context] { return context->IsCancelled(); };
  request->on_complete = [this, reactor, proto, response, call, start](batching::Job& r) {
    const Status status = outcome_status(r);
    const auto filling = Clock::now();
    if (status.ok()) {
      const ServedModel& served = Intake::served(r);
      response->set_model_name(served.name);
      response->set_model_version(served.version);
      response->set_id(proto->id());
      serving::fill_infer_response(*call, r, *served.model, response);
    }
    intake_.complete("ModelInfer", r, status, start, ns_since(filling));
    reactor->Finish(to_grpc(status));
  };
  const Status status = admit(*proto, call.get(), context, request);
  if (!status.ok()) {
    intake_.record("ModelInfer", status, start);
    reactor->Finish(to_grpc(status));
  }
  return reactor;
}

Status InferenceService::StreamProtocol::admit(Message& message,
                                               grpc::CallbackServerContext* context,
                                               const std::shared_ptr<batching::Job>& request) {
  if (Status invalid = parse_stream_message(message.proto, &message.parsed, parse_infer_request);
      !invalid.ok()) {
    return invalid;
  }
  message.proto.Clear();
  return service->admit(message.parsed, &message.call, context, request);
}

grpc::ByteBuffer InferenceService::StreamProtocol::answer(Message& message,
                                                          const batching::Job* done,
                                                          const Status& status) {
  inference::ModelStreamInferResponse answer;
  inference::ModelInferResponse* response = answer.mutable_infer_response();
  response->set_id(message.parsed.id());
  if (status.ok()) {
    const ServedModel& served = Intake::served(*done);
    response->set_model_name(served.name);
    response->set_model_version(served.version);
    serving::fill_infer_response(message.call, *done, *served.model, response);
  } else {
    response->set_model_name(message.parsed.model_name());
    response->set_model_version(message.parsed.model_version());
    // In-band, as the protocol's streams carry errors; the stream goes on.
    answer.set_error_message(std::string(status_code_name(status.code())) + ": " +
                             status.message());
  }
  return serialize_raw_message(answer, kMethod);
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* InferenceService::ModelStreamInfer(
    grpc::CallbackServerContext* context) {
  return open_stream(&stream_protocol_, &intake_, context);
}

}  // namespace fastformer::rpc
