#include "server/rpc/model_view.h"

#include <algorithm>
#include <climits>

#include "server/rpc/infer_conversion.h"

namespace fastformer::rpc {
namespace {

void set_duration(const InferenceStatistics::Duration& from, inference::StatisticDuration* to) {
  to->set_count(from.count.load(std::memory_order_relaxed));
  to->set_ns(from.ns.load(std::memory_order_relaxed));
}

}  // namespace

grpc::Status model_status(const Intake& intake, const std::string& name,
                          const std::string& version) {
  if (grpc::Status unavailable = intake.availability(); !unavailable.ok()) return unavailable;
  return check_model(intake.engine().model(), name, version);
}

void fill_server_metadata(const Intake& intake, inference::ServerMetadataResponse* response) {
  response->set_name("fastformer-server");
  response->set_version(intake.config().version);
  for (const char* extension : kExtensions) response->add_extensions(extension);
}

void fill_model_metadata(const Intake& intake, inference::ModelMetadataResponse* response) {
  const engine::Model& model = intake.engine().model();
  response->set_name(model.config().model_name);
  static const std::string version =
      kModelVersion;  // (GCC 12 misreads a literal assign here: -Wrestrict)
  *response->add_versions() = version;
  response->set_platform(kPlatform);
  auto add = [](const TensorSpec& spec, inference::ModelMetadataResponse::TensorMetadata* tensor) {
    tensor->set_name(spec.name);
    tensor->set_datatype(spec.datatype);
    for (const int64_t d : spec.shape) tensor->add_shape(d);
  };
  for (const TensorSpec& spec : model_inputs(model, intake.tokenizer()))
    add(spec, response->add_inputs());
  for (const TensorSpec& spec : model_outputs(model, intake.tokenizer()))
    add(spec, response->add_outputs());
}

void fill_model_config(const Intake& intake, inference::ModelConfig* config) {
  const engine::Engine& engine = intake.engine();
  const ServiceConfig& service = intake.config();
  config->set_name(engine.model().config().model_name);
  config->set_platform(kPlatform);
  config->set_backend(kPlatform);
  // Dims leave out the batch dimension, as they do in Triton when max_batch_size > 0.
  config->set_max_batch_size(int32_t(std::min<int64_t>(service.max_batch_sequences, INT32_MAX)));
  for (const TensorSpec& spec : model_inputs(engine.model(), intake.tokenizer())) {
    inference::ModelInput* input = config->add_input();
    input->set_name(spec.name);
    input->set_data_type(spec.type);
    for (size_t d = 1; d < spec.shape.size(); ++d) input->add_dims(spec.shape[d]);
    input->set_optional(spec.optional);
  }
  for (const TensorSpec& spec : model_outputs(engine.model(), intake.tokenizer())) {
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
}

void fill_model_statistics(const Intake& intake, inference::ModelStatistics* stats) {
  const InferenceStatistics& from = intake.statistics();
  stats->set_name(intake.engine().model().config().model_name);
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
}

}  // namespace fastformer::rpc
