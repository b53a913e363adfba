#include "server/serving/model_view.h"

#include <algorithm>
#include <climits>

#include "server/serving/infer_conversion.h"

namespace fastformer::serving {
namespace {

void set_duration(const InferenceStatistics::Duration& from, inference::StatisticDuration* to) {
  to->set_count(from.count.load(std::memory_order_relaxed));
  to->set_ns(from.ns.load(std::memory_order_relaxed));
}

}  // namespace

void fill_server_metadata(const Intake& intake, inference::ServerMetadataResponse* response) {
  response->set_name("fastformer-server");
  response->set_version(intake.server_version());
  for (const char* extension : kExtensions) response->add_extensions(extension);
}

void fill_model_metadata(const Intake& intake, const ServedModel& served,
                         inference::ModelMetadataResponse* response) {
  const engine::Model& model = *served.model;
  response->set_name(served.name);
  // Every READY version of the model, as Triton lists them; the tensors are `served`'s.
  for (const auto& version : intake.repository().serving())
    if (version->name == served.name) *response->add_versions() = version->version;
  if (response->versions_size() == 0) *response->add_versions() = served.version;
  response->set_platform(kPlatform);
  auto add = [](const TensorSpec& spec, inference::ModelMetadataResponse::TensorMetadata* tensor) {
    tensor->set_name(spec.name);
    tensor->set_datatype(spec.datatype);
    for (const int64_t d : spec.shape) tensor->add_shape(d);
  };
  for (const TensorSpec& spec : model_inputs(model, served.tokenizer()))
    add(spec, response->add_inputs());
  for (const TensorSpec& spec : model_outputs(model, served.tokenizer()))
    add(spec, response->add_outputs());
}

void fill_model_config(const ServedModel& served, inference::ModelConfig* config) {
  const engine::Engine& engine = *served.engine;
  const ServiceConfig& service = served.config;
  config->set_name(served.name);
  config->set_platform(kPlatform);
  config->set_backend(kPlatform);
  *config->mutable_version_policy() = served.settings.version_policy;
  // Dims leave out the batch dimension, as they do in Triton when max_batch_size > 0.
  config->set_max_batch_size(
      int32_t(std::min<int64_t>(served.settings.max_batch_sequences, INT32_MAX)));
  for (const TensorSpec& spec : model_inputs(*served.model, served.tokenizer())) {
    inference::ModelInput* input = config->add_input();
    input->set_name(spec.name);
    input->set_data_type(spec.type);
    for (size_t d = 1; d < spec.shape.size(); ++d) input->add_dims(spec.shape[d]);
    input->set_optional(spec.optional);
  }
  for (const TensorSpec& spec : model_outputs(*served.model, served.tokenizer())) {
    inference::ModelOutput* output = config->add_output();
    output->set_name(spec.name);
    output->set_data_type(spec.type);
    for (size_t d = 1; d < spec.shape.size(); ++d) output->add_dims(spec.shape[d]);
  }
  config->mutable_dynamic_batching()->set_max_queue_delay_microseconds(
      uint64_t(served.settings.max_queue_delay_us));
  // The two priority classes as Triton's levels: 1 interactive, 2 bulk.
  config->mutable_dynamic_batching()->set_priority_levels(2);
  config->mutable_dynamic_batching()->set_default_priority_level(
      served.settings.default_priority == batching::Priority::kInteractive ? 1 : 2);
  inference::ModelInstanceGroup* group = config->add_instance_group();
  group->set_name(engine.backend_name());
  group->set_count(1);
  group->set_kind(engine.backend_name() == "cpu" ? inference::ModelInstanceGroup::KIND_CPU
                                                 : inference::ModelInstanceGroup::KIND_GPU);
  auto& parameters = *config->mutable_parameters();
  parameters["dtype"].set_string_value(engine::dtype_name(engine.dtype().dtype));  // never "auto"
  parameters["device"].set_string_value(engine.device_name());
  // Which kernel runs each GEMM site, a line each (--cpu-gemm auto's choice and figures).
  std::string gemm_kernels;
  for (const std::string& site : engine.gemm_report())
    gemm_kernels += (gemm_kernels.empty() ? "" : "\n") + site;
  parameters["gemm_kernels"].set_string_value(gemm_kernels);
  // The prompts as config.pbtxt's "prompts" parameter takes them (the parameters' prompt_name).
  if (served.config.prompts)
    parameters["prompts"].set_string_value(served.config.prompts->to_json());
  parameters["max_batch_tokens"].set_string_value(std::to_string(served.settings.max_batch_tokens));
  parameters["max_request_tokens"].set_string_value(
      std::to_string(service.limits.max_request_tokens));
  parameters["max_queue_tokens"].set_string_value(std::to_string(served.settings.max_queue_tokens));
  parameters["max_position_embeddings"].set_string_value(
      std::to_string(served.model->config().max_position_embeddings));
  // The classifier head's class names, as every protocol shows them (ServedModel::label):
  // label_0, label_1, ... (a config's parameters are strings, one value each).
  for (int64_t i = 0; i < served.model->num_labels(); ++i)
    parameters["label_" + std::to_string(i)].set_string_value(served.label(size_t(i)));
}

void fill_model_statistics(const ServedModel& served, inference::ModelStatistics* stats) {
  const InferenceStatistics& from = served.statistics;
  stats->set_name(served.name);
  stats->set_version(served.version);
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

Status fill_statistics(const Intake& intake, const std::string& name, const std::string& version,
                       inference::ModelStatisticsResponse* response) {
  if (Status unavailable = intake.availability(); !unavailable.ok()) return unavailable;
  if (!name.empty() && !version.empty()) {
    Status status;
    const auto served = intake.find(name, version, &status);
    if (!served) return status;
    fill_model_statistics(*served, response->add_model_stats());
    return Status();
  }
  std::string model;  // the model's own name (`name` may be an alias); empty: every model
  if (!name.empty()) {
    Status status;
    const auto found = intake.find(name, "", &status);
    if (!found) return status;  // NOT_FOUND / no READY version
    model = found->name;
  }
  for (const auto& served : intake.repository().serving()) {
    if (model.empty() || served->name == model)
      fill_model_statistics(*served, response->add_model_stats());
  }
  return Status();
}

Status repository_control(const Intake& intake, const std::string& model,
                          const std::vector<std::string>& parameters, bool unload) {
  if (Status unavailable = intake.availability(); !unavailable.ok()) return unavailable;
  if (intake.repository().mode() != repository::ControlMode::kExplicit) {
    return {StatusCode::kFailedPrecondition,
            std::string("model_name '") + model + "': explicit model " +
                (unload ? "unload" : "load") + " is not allowed: the server runs with " +
                (intake.repository().mode() == repository::ControlMode::kPoll
                     ? "--model-control-mode poll (it loads what the repository holds)"
                     : "--model-control-mode none (its models are fixed at start)") +
                "; start it with --model-control-mode explicit"};
  }
  if (model.empty()) {
    return {StatusCode::kInvalidArgument,
            "model_name: empty; name the model to " + std::string(unload ? "unload" : "load")};
  }
  for (const std::string& key : parameters) {
    if (unload && key == "unload_dependents") continue;
    return {StatusCode::kInvalidArgument,
            "parameters '" + key + "': not supported by this server (" +
                (unload ? "unload takes unload_dependents only"
                        : "load reads <model>/config.pbtxt and the version directories "
                          "from the repository") +
                ")"};
  }
  return Status();
}

void fill_repository_index(const Intake& intake, bool ready_only,
                           inference::RepositoryIndexResponse* response) {
  for (const repository::IndexEntry& e : intake.repository().index(ready_only)) {
    auto* model = response->add_models();
    model->set_name(e.name);
    model->set_version(e.version);
    model->set_state(repository::state_name(e.state));
    model->set_reason(e.reason);
  }
}

}  // namespace fastformer::serving
