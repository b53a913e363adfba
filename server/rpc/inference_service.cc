#include "server/rpc/inference_service.h"

#include "common/status_names.h"
#include "server/rpc/raw_message.h"
#include "server/rpc/stream_reactor.h"

namespace fastformer::rpc {

using batching::Clock;

namespace {

// The protocol's extensions this server implements (ServerMetadata.extensions).
constexpr const char* kExtensions[] = {"model_configuration", "statistics", "parameters"};
constexpr const char* kPlatform = "fastformer";

void set_duration(const InferenceStatistics::Duration& from, inference::StatisticDuration* to) {
  to->set_count(from.count.load(std::memory_order_relaxed));
  to->set_ns(from.ns.load(std::memory_order_relaxed));
}

}  // namespace

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
  if (grpc::Status unavailable = intake_.availability(); !unavailable.ok()) return unavailable;
  return check_model(intake_.engine().model(), name, version);
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
  response->set_name("fastformer-server");
  response->set_version(intake_.config().version);
  for (const char* extension : kExtensions) response->add_extensions(extension);
  return finish(context, "ServerMetadata", start, grpc::Status::OK);
}

grpc::ServerUnaryReactor* InferenceService::ModelMetadata(
    grpc::CallbackServerContext* context, const inference::ModelMetadataRequest* request,
    inference::ModelMetadataResponse* response) {
  const auto start = Clock::now();
  if (grpc::Status s = model_status(request->name(), request->version()); !s.ok()) {
    return finish(context, "ModelMetadata", start, s);
  }
  const engine::Model& model = intake_.engine().model();
  response->set_name(model.config().model_name);
  response->add_versions(kModelVersion);
  response->set_platform(kPlatform);
  auto add = [](const TensorSpec& spec, inference::ModelMetadataResponse::TensorMetadata* tensor) {
    tensor->set_name(spec.name);
    tensor->set_datatype(spec.datatype);
    for (const int64_t d : spec.shape) tensor->add_shape(d);
  };
  for (const TensorSpec& spec : model_inputs(model, intake_.tokenizer()))
    add(spec, response->add_inputs());
  for (const TensorSpec& spec : model_outputs(model, intake_.tokenizer()))
    add(spec, response->add_outputs());
  return finish(context, "ModelMetadata", start, grpc::Status::OK);
}

grpc::ServerUnaryReactor* InferenceService::ModelConfig(
    grpc::CallbackServerContext* context, const inference::ModelConfigRequest* request,
    inference::ModelConfigResponse* response) {
  const auto start = Clock::now();
  if (grpc::Status s = model_status(request->name(), request->version()); !s.ok()) {
    return finish(context, "ModelConfig", start, s);
  }
  const engine::Engine& engine = intake_.engine();
  const ServiceConfig& service = intake_.config();
  inference::ModelConfig* config = response->mutable_config();
  config->set_name(engine.model().config().model_name);
  config->set_platform(kPlatform);
  config->set_backend(kPlatform);
  // Dims leave out the batch dimension, as they do in Triton when max_batch_size > 0.
  config->set_max_batch_size(int32_t(std::min<int64_t>(service.max_batch_sequences, INT32_MAX)));
  for (const TensorSpec& spec : model_inputs(engine.model(), intake_.tokenizer())) {
    inference::ModelInput* input = config->add_input();
    input->set_name(spec.name);
    input->set_data_type(spec.type);
    for (size_t d = 1; d < spec.shape.size(); ++d) input->add_dims(spec.shape[d]);
    input->set_optional(spec.optional);
  }
  for (const TensorSpec& spec : model_outputs(engine.model(), intake_.tokenizer())) {
    inference::ModelOutput* output = config->add_output();
    output->set_name(spec.name);
    output->set_data_type(spec.type);
    for (size_t d = 1; d < spec.shape.size(); ++d) output->add_dims(spec.shape[d]);
  }
  config->mutable_dynamic_batching()->set_max_queue_delay_microseconds(
      uint64_t(service.max_queue_delay_us));
  inference::ModelInstanceGroup* group = config->add_instance_group();
  group->set_name(engine.backend_name());
  group->set_count(1);
  group->set_kind(engine.backend_name() == "cpu" ? inference::ModelInstanceGroup::KIND_CPU
                                                 : inference::ModelInstanceGroup::KIND_GPU);
  auto& parameters = *config->mutable_parameters();
  parameters["dtype"].set_string_value(service.dtype);
  parameters["device"].set_string_value(engine.device_name());
  parameters["max_batch_tokens"].set_string_value(std::to_string(service.max_batch_tokens));
  parameters["max_request_tokens"].set_string_value(
      std::to_string(service.limits.max_request_tokens));
  parameters["max_position_embeddings"].set_string_value(
      std::to_string(engine.model().config().max_position_embeddings));
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
  const InferenceStatistics& from = intake_.statistics();
  inference::ModelStatistics* stats = response->add_model_stats();
  stats->set_name(intake_.engine().model().config().model_name);
  stats->set_version(kModelVersion);
  stats->set_last_inference(from.last_inference_ms.load(std::memory_order_relaxed));
  stats->set_inference_count(from.inference_count.load(std::memory_order_relaxed));
  stats->set_execution_count(from.execution_count.load(std::memory_order_relaxed));
  inference::InferStatistics* infer = stats->mutable_inference_stats();
  set_duration(from.success, infer->mutable_success());
  set_duration(from.fail, infer->mutable_fail());
  set_duration(from.queue, infer->mutable_queue());
  set_duration(from.compute_input, infer->mutable_compute_input());
  set_duration(from.compute_infer, infer->mutable_compute_infer());
  set_duration(from.compute_output, infer->mutable_compute_output());
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
