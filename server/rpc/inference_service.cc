#include "server/rpc/inference_service.h"

#include "common/status_names.h"
#include "server/rpc/model_view.h"
#include "server/rpc/raw_message.h"
#include "server/rpc/stream_reactor.h"

namespace fastformer::rpc {

using batching::Clock;

grpc::ServerUnaryReactor* InferenceService::finish(grpc::CallbackServerContext* context,
                                                   const char* method, Clock::time_point start,
                                                   const grpc::Status& status) {
  intake_.record(method, status, start);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

grpc::Status InferenceService::model_status(const std::string& name,
                                            const std::string& version) const {
  return rpc::model_status(intake_, name, version);
}

grpc::ServerUnaryReactor* InferenceService::ServerLive(grpc::CallbackServerContext* context,
                                                       const inference::ServerLiveRequest*,
                                                       inference::ServerLiveResponse* response) {
  response->set_live(true);  // the process answers: live, even while it warms up or drains
  return finish(context, "ServerLive", Clock::now(), grpc::Status::OK);
}

grpc::ServerUnaryReactor* InferenceService::ServerReady(grpc::CallbackServerContext* context,
                                                        const inference::ServerReadyRequest*,
                                                        inference::ServerReadyResponse* response) {
  response->set_ready(intake_.availability().ok());
  return finish(context, "ServerReady", Clock::now(), grpc::Status::OK);
}

grpc::ServerUnaryReactor* InferenceService::ModelReady(grpc::CallbackServerContext* context,
                                                       const inference::ModelReadyRequest* request,
                                                       inference::ModelReadyResponse* response) {
  // Not ready (rather than an error) while starting or draining, or for a model this server does
  // not serve, as Triton answers: model_status covers all three.
  response->set_ready(model_status(request->name(), request->version()).ok());
  return finish(context, "ModelReady", Clock::now(), grpc::Status::OK);
}

grpc::ServerUnaryReactor* InferenceService::ServerMetadata(
    grpc::CallbackServerContext* context, const inference::ServerMetadataRequest*,
    inference::ServerMetadataResponse* response) {
  const auto start = Clock::now();
  if (grpc::Status unavailable = intake_.availability(); !unavailable.ok()) {
    return finish(context, "ServerMetadata", start, unavailable);
  }
  fill_server_metadata(intake_, response);
  return finish(context, "ServerMetadata", start, grpc::Status::OK);
}

grpc::ServerUnaryReactor* InferenceService::ModelMetadata(
    grpc::CallbackServerContext* context, const inference::ModelMetadataRequest* request,
    inference::ModelMetadataResponse* response) {
  const auto start = Clock::now();
  if (grpc::Status s = model_status(request->name(), request->version()); !s.ok()) {
    return finish(context, "ModelMetadata", start, s);
  }
  fill_model_metadata(intake_, response);
  return finish(context, "ModelMetadata", start, grpc::Status::OK);
}

grpc::ServerUnaryReactor* InferenceService::ModelConfig(
    grpc::CallbackServerContext* context, const inference::ModelConfigRequest* request,
    inference::ModelConfigResponse* response) {
  const auto start = Clock::now();
  if (grpc::Status s = model_status(request->name(), request->version()); !s.ok()) {
    return finish(context, "ModelConfig", start, s);
  }
  fill_model_config(intake_, response->mutable_config());
  return finish(context, "ModelConfig", start, grpc::Status::OK);
}

grpc::ServerUnaryReactor* InferenceService::ModelStatistics(
    grpc::CallbackServerContext* context, const inference::ModelStatisticsRequest* request,
    inference::ModelStatisticsResponse* response) {
  const auto start = Clock::now();
  if (grpc::Status unavailable = intake_.availability(); !unavailable.ok()) {
    return finish(context, "ModelStatistics", start, unavailable);
  }
  // An empty name asks for every model: ours.
  if (!request->name().empty()) {
    if (grpc::Status s = model_status(request->name(), request->version()); !s.ok()) {
      return finish(context, "ModelStatistics", start, s);
    }
  }
  fill_model_statistics(intake_, response->add_model_stats());
  return finish(context, "ModelStatistics", start, grpc::Status::OK);
}

grpc::Status InferenceService::admit(const inference::ModelInferRequest& proto, InferCall* call,
                                     grpc::CallbackServerContext* context,
                                     const std::shared_ptr<batching::Request>& request) {
  return intake_.admit(
      context,
      [&] {
        return convert_infer_request(proto, intake_.engine().model(), intake_.tokenizer(),
                                     intake_.config().limits, intake_.config().max_batch_sequences,
                                     call, request.get());
      },
      request);
}

grpc::ServerUnaryReactor* InferenceService::ModelInfer(grpc::CallbackServerContext* context,
                                                       const inference::ModelInferRequest* proto,
                                                       inference::ModelInferResponse* response) {
  const auto start = Clock::now();
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  auto call = std::make_shared<InferCall>();
  auto request = std::make_shared<batching::Request>();
  request->is_cancelled = [context] { return context->IsCancelled(); };
  request->on_complete = [this, reactor, proto, response, call, start](batching::Request& r) {
    const grpc::Status status = outcome_status(r);
    const auto filling = Clock::now();
    if (status.ok()) {
      response->set_model_name(proto->model_name());
      response->set_model_version(kModelVersion);
      response->set_id(proto->id());
      fill_infer_response(*call, r, intake_.engine().model(), response);
    }
    intake_.complete("ModelInfer", r, status, start, ns_since(filling));
    reactor->Finish(status);
  };
  const grpc::Status status = admit(*proto, call.get(), context, request);
  if (!status.ok()) {
    intake_.record("ModelInfer", status, start);
    reactor->Finish(status);
  }
  return reactor;
}

grpc::Status InferenceService::StreamProtocol::admit(
    Message& message, grpc::CallbackServerContext* context,
    const std::shared_ptr<batching::Request>& request) {
  if (grpc::Status invalid =
          parse_stream_message(message.proto, &message.parsed, parse_infer_request);
      !invalid.ok()) {
    return invalid;
  }
  message.proto.Clear();
  return service->admit(message.parsed, &message.call, context, request);
}

grpc::ByteBuffer InferenceService::StreamProtocol::answer(Message& message,
                                                          const batching::Request* done,
                                                          const grpc::Status& status) {
  inference::ModelStreamInferResponse answer;
  inference::ModelInferResponse* response = answer.mutable_infer_response();
  response->set_model_name(message.parsed.model_name());
  response->set_model_version(kModelVersion);
  response->set_id(message.parsed.id());
  if (status.ok()) {
    fill_infer_response(message.call, *done, service->intake_.engine().model(), response);
  } else {
    // In-band, as the protocol's streams carry errors; the stream goes on.
    answer.set_error_message(status_code_name(status.error_code()) + ": " + status.error_message());
  }
  return serialize_raw_message(answer, kMethod);
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* InferenceService::ModelStreamInfer(
    grpc::CallbackServerContext* context) {
  return open_stream(&stream_protocol_, &intake_, context);
}

}  // namespace fastformer::rpc
