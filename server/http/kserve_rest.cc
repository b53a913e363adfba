// KServe v2 REST as Triton serves it, over the same model view (server/serving/model_view.h)
// and the same ModelInferRequest conversion (server/serving/infer_conversion.h) as the gRPC
// service: an infer body's JSON becomes a ModelInferRequest with raw input contents, and the
// response's raw outputs become JSON data or, with the binary tensor extension, bytes after
// the JSON (parse_rest_infer and write_rest_infer, kserve_rest.h).
#include "server/http/kserve_rest.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>

#include <cstring>

#include "server/http/api.h"
#include "server/http/proto_json.h"
#include "server/serving/infer_conversion.h"
#include "server/serving/model_view.h"

namespace fastformer::http {

using batching::Clock;
namespace pb = google::protobuf;

namespace {

// A JSON parameter value into an InferParameter, or why it cannot be one.
std::optional<std::string> read_parameter(const simdjson::dom::element& v, const std::string& where,
                                          inference::InferParameter* p) {
  bool b = false;
  int64_t i = 0;
  double d = 0;
  std::string_view s;
  if (!v.get_bool().get(b)) {
    p->set_bool_param(b);
  } else if (!v.get_int64().get(i)) {
    p->set_int64_param(i);
  } else if (!v.get_double().get(d)) {
    p->set_double_param(d);
  } else if (!v.get_string().get(s)) {
    p->set_string_param(std::string(s));
  } else {
    return where + ": expected a boolean, a number or a string, got " + json::type_name(v);
  }
  return std::nullopt;
}

// Appends `data` (nested arrays of elements) to `raw` as little-endian `datatype` elements.
std::optional<std::string> flatten(const simdjson::dom::element& data, const std::string& datatype,
                                   const std::string& where, std::string* raw, int64_t* count) {
  simdjson::dom::array array;
  if (!data.get_array().get(array)) {
    for (const simdjson::dom::element item : array) {
      if (auto e = flatten(item, datatype, where, raw, count)) return e;
    }
    return std::nullopt;
  }
  auto put = [&](const auto value) {
    raw->append(reinterpret_cast<const char*>(&value), sizeof value);
    ++*count;
  };
  if (datatype == "INT64" || datatype == "INT32") {
    int64_t v = 0;
    if (data.get_int64().get(v)) return where + ": expected integers, got " + json::type_name(data);
    if (datatype == "INT64") {
      put(v);
    } else {
      if (v < INT32_MIN || v > INT32_MAX)
        return where + ": " + std::to_string(v) + " is not an INT32";
      put(int32_t(v));
    }
  } else if (datatype == "FP32") {
    double v = 0;
    if (data.get_double().get(v)) return where + ": expected numbers, got " + json::type_name(data);
    put(float(v));
  } else if (datatype == "BYTES") {
    std::string_view v;
    if (data.get_string().get(v)) return where + ": expected strings, got " + json::type_name(data);
    put(uint32_t(v.size()));
    --*count;
    raw->append(v);
  } else {
    return where + ": datatype " + datatype +
           " cannot be sent as JSON data here (this model's inputs are INT64, INT32, FP32 and "
           "BYTES)";
  }
  return std::nullopt;
}

// The raw bytes of an output tensor as JSON data.
void data_json(const std::string& datatype, const std::string& raw, json::Writer& w) {
  if (datatype == "FP32") {
    std::vector<float> values(raw.size() / 4);
    std::memcpy(values.data(), raw.data(), values.size() * 4);
    w.floats(values);
    return;
  }
  w.ch('[');
  if (datatype == "INT64") {
    for (size_t i = 0; i + 8 <= raw.size(); i += 8) {
      int64_t v;
      std::memcpy(&v, raw.data() + i, 8);
      if (i > 0) w.ch(',');
      w.number(v);
    }
  } else if (datatype == "INT32") {
    for (size_t i = 0; i + 4 <= raw.size(); i += 4) {
      int32_t v;
      std::memcpy(&v, raw.data() + i, 4);
      if (i > 0) w.ch(',');
      w.number(int64_t(v));
    }
  } else if (datatype == "INT8" || datatype == "UINT8") {  // the quantized embedding types
    for (size_t i = 0; i < raw.size(); ++i) {
      if (i > 0) w.ch(',');
      const auto byte = static_cast<uint8_t>(raw[i]);
      w.number(datatype == "INT8" ? int64_t(static_cast<int8_t>(byte)) : int64_t(byte));
    }
  }
  w.ch(']');
}

}  // namespace

void HttpApi::kserve_server_metadata(Call call) {
  if (Status s = intake_.availability(); !s.ok()) return fail(call, s);
  inference::ServerMetadataResponse metadata;
  serving::fill_server_metadata(intake_, &metadata);
  metadata.add_extensions("binary_tensor_data");
  json::Writer w;
  proto_json(metadata, w);
  answer(call, json_response(bhttp::status::ok, w.take()), Status());
}

void HttpApi::kserve_health(Call call, bool live) {
  // Live while the process answers; ready once warm and until draining (400 otherwise, as
  // Triton answers).
  const bool up = live || intake_.ready();
  Response response{up ? bhttp::status::ok : bhttp::status::bad_request, 11};
  answer(call, std::move(response), Status());
}

void HttpApi::kserve_model(Call call, std::string_view what, const std::string& model,
                           const std::string& version) {
  json::Writer w;
  if (model.empty()) {  // GET /v2/models/stats: every model's
    inference::ModelStatisticsResponse stats;
    if (Status s = serving::fill_statistics(intake_, "", "", &stats); !s.ok()) return fail(call, s);
    proto_json(stats, w);
    return answer(call, json_response(bhttp::status::ok, w.take()), Status());
  }
  Status status;
  const auto served = intake_.find(model, version, &status);
  if (what == "ready") {
    Response response{status.ok() ? bhttp::status::ok : bhttp::status::bad_request, 11};
    return answer(call, std::move(response), Status());
  }
  if (!status.ok()) return fail(call, status);
  if (what.empty()) {
    inference::ModelMetadataResponse metadata;
    serving::fill_model_metadata(intake_, *served, &metadata);
    proto_json(metadata, w);
  } else if (what == "config") {
    inference::ModelConfig config;  // Triton answers the config itself, not its wrapper
    serving::fill_model_config(*served, &config);
    proto_json(config, w);
  } else {
    inference::ModelStatisticsResponse stats;
    if (Status s = serving::fill_statistics(intake_, model, version, &stats); !s.ok())
      return fail(call, s);
    proto_json(stats, w);
  }
  answer(call, json_response(bhttp::status::ok, w.take()), Status());
}

void HttpApi::kserve_repository(const Request& http_request, Call call, const std::string& model,
                                bool unload) {
  const bool index = model.empty();
  if (Status s = intake_.availability(); !s.ok()) return fail(call, s);
  // The body is optional (tritonclient sends none for the index): {"ready": bool} for the
  // index, {"parameters": {...}} for load and unload.
  thread_local simdjson::dom::parser parser;
  simdjson::dom::object body;
  const bool has_body = !http_request.body().empty();
  if (has_body) {
    simdjson::dom::element root;
    if (auto e = json::parse(parser, http_request.body(), &root))
      return fail(call, invalid_argument(*e));
    if (root.get_object().get(body)) {
      return fail(call,
                  invalid_argument(std::string("the request body must be a JSON object, got ") +
                                   json::type_name(root)));
    }
  }
  simdjson::dom::element v;
  if (index) {
    bool ready = false;
    if (has_body && !body["ready"].get(v) && v.get_bool().get(ready)) {
      return fail(call, invalid_argument("ready: expected true or false"));
    }
    inference::RepositoryIndexResponse response;
    serving::fill_repository_index(intake_, ready, &response);
    json::Writer w;
    w.ch('[');
    for (int i = 0; i < response.models_size(); ++i) {
      const auto& m = response.models(i);
      if (i > 0) w.ch(',');
      w.raw("{\"name\":").string(m.name()).raw(",\"version\":").string(m.version());
      w.raw(",\"state\":").string(m.state()).raw(",\"reason\":").string(m.reason()).ch('}');
    }
    w.ch(']');
    return answer(call, json_response(bhttp::status::ok, w.take()), Status());
  }
  std::vector<std::string> parameters;
  if (has_body && !body["parameters"].get(v)) {
    simdjson::dom::object p;
    if (v.get_object().get(p))
      return fail(call, invalid_argument("parameters: expected an object"));
    for (const auto [key, value] : p) parameters.emplace_back(key);
  }
  if (Status s = serving::repository_control(intake_, model, parameters, unload); !s.ok())
    return fail(call, s);
  // Answered on the connection's I/O thread once the repository has done it.
  auto done = [this, call](const Status& status) mutable {
    call.responder->post([this, call, status]() mutable {
      if (!status.ok()) return fail(call, status);
      answer(call, json_response(bhttp::status::ok, "{}"), Status());
    });
  };
  if (unload)
    intake_.repository().unload(model, std::move(done));
  else
    intake_.repository().load(model, std::move(done));
}

namespace {

// An infer body's `parameters`: binary_data_output and timeout are the REST API's own, the rest
// become the request's InferParameters.
Status read_rest_parameters(const simdjson::dom::element& v, RestInferRequest* out) {
  simdjson::dom::object parameters;
  if (v.get_object().get(parameters)) return invalid_argument("parameters: expected an object");
  for (const auto [key, value] : parameters) {
    if (key == "binary_data_output") {
      if (value.get_bool().get(out->binary_default))
        return invalid_argument("parameters.binary_data_output: expected true or false");
    } else if (key == "timeout") {  // microseconds, as Triton's
      int64_t us = 0;
      if (value.get_int64().get(us) || us <= 0)
        return invalid_argument("parameters.timeout: expected a positive number of microseconds");
      out->timeout_us = us;
    } else {
      inference::InferParameter p;
      if (auto e = read_parameter(value, "parameters." + std::string(key), &p))
        return invalid_argument(*e);
      (*out->proto.mutable_parameters())[std::string(key)] = p;
    }
  }
  return Status();
}

// One of `inputs` (`where`: "inputs[i]"): name, datatype, shape, parameters, and its data as
// JSON or (binary_data_size) the next bytes of `binary` from *offset.
Status read_rest_input(const simdjson::dom::element& item, const std::string& where,
                       std::string_view binary, size_t* offset, RestInferRequest* out) {
  inference::ModelInferRequest& proto = out->proto;
  simdjson::dom::object in;
  simdjson::dom::element v;
  std::string_view s;
  if (item.get_object().get(in)) return invalid_argument(where + ": expected an object");
  inference::ModelInferRequest::InferInputTensor* tensor = proto.add_inputs();
  if (in["name"].get(v) || v.get_string().get(s))
    return invalid_argument(where + ".name: is required (a string)");
  tensor->set_name(std::string(s));
  const std::string named = where + " (" + tensor->name() + ")";
  if (in["datatype"].get(v) || v.get_string().get(s))
    return invalid_argument(named + ".datatype: is required (a string)");
  tensor->set_datatype(std::string(s));
  simdjson::dom::array shape;
  if (in["shape"].get(v) || v.get_array().get(shape))
    return invalid_argument(named + ".shape: is required (an array of integers)");
  for (const simdjson::dom::element d : shape) {
    int64_t n = 0;
    if (d.get_int64().get(n)) return invalid_argument(named + ".shape: expected integers");
    tensor->add_shape(n);
  }
  std::string* raw = proto.add_raw_input_contents();
  int64_t binary_size = -1;
  if (!in["parameters"].get(v)) {
    simdjson::dom::object parameters;
    if (v.get_object().get(parameters))
      return invalid_argument(named + ".parameters: expected an object");
    for (const auto [key, value] : parameters) {
      if (key == "binary_data_size") {
        if (value.get_int64().get(binary_size) || binary_size < 0)
          return invalid_argument(named + ".parameters.binary_data_size: expected a size");
        continue;
      }
      inference::InferParameter p;
      if (auto e = read_parameter(value, named + ".parameters." + std::string(key), &p))
        return invalid_argument(*e);
      (*tensor->mutable_parameters())[std::string(key)] = p;
    }
  }
  if (binary_size >= 0) {
    if (*offset + size_t(binary_size) > binary.size()) {
      return invalid_argument(
          named + ".parameters.binary_data_size: " + std::to_string(binary_size) +
          " bytes at offset " + std::to_string(*offset) + " run past the " +
          std::to_string(binary.size()) + " binary bytes after the JSON (" + kHeaderLength + ")");
    }
    raw->assign(binary.substr(*offset, size_t(binary_size)));
    *offset += size_t(binary_size);
    return Status();
  }
  if (in["data"].get(v))
    return invalid_argument(named + ".data: is required (or parameters.binary_data_size)");
  int64_t count = 0;
  if (auto e = flatten(v, tensor->datatype(), named + ".data", raw, &count))
    return invalid_argument(*e);
  return Status();
}

// `outputs`: each by name, and whether it is answered as binary data.
Status read_rest_outputs(const simdjson::dom::element& v, RestInferRequest* out) {
  simdjson::dom::array outputs;
  if (v.get_array().get(outputs)) return invalid_argument("outputs: expected an array");
  size_t k = 0;
  for (const simdjson::dom::element item : outputs) {
    const std::string where = "outputs[" + std::to_string(k++) + "]";
    simdjson::dom::object output;
    simdjson::dom::element e;
    std::string_view s;
    if (item.get_object().get(output) || output["name"].get(e) || e.get_string().get(s))
      return invalid_argument(where + ".name: is required (a string)");
    out->proto.add_outputs()->set_name(std::string(s));
    bool binary_output = out->binary_default;
    if (!output["parameters"].get(e)) {
      simdjson::dom::object parameters;
      if (e.get_object().get(parameters))
        return invalid_argument(where + ".parameters: expected an object");
      for (const auto [key, value] : parameters) {
        if (key == "binary_data") {
          if (value.get_bool().get(binary_output))
            return invalid_argument(where + ".parameters.binary_data: expected true or false");
        } else if (key == "classification") {
          return invalid_argument(where +
                                  ".parameters.classification: the classification "
                                  "extension is not supported; ask for logits");
        }
      }
    }
    out->binary_output.push_back(binary_output);
  }
  return Status();
}

}  // namespace

Status parse_rest_infer(std::string_view body, std::optional<std::string_view> header_length,
                        RestInferRequest* out) {
  // The JSON header, then (binary tensor extension) the tensors' bytes.
  std::string_view binary;
  if (header_length) {
    const std::string value(*header_length);
    char* end = nullptr;
    const unsigned long long n = std::strtoull(value.c_str(), &end, 10);
    if (end == value.c_str() || *end != '\0' || n > body.size()) {
      return invalid_argument(std::string(kHeaderLength) + ": '" + value +
                              "' is not a length within the body's " + std::to_string(body.size()) +
                              " bytes");
    }
    binary = body.substr(size_t(n));
    body = body.substr(0, size_t(n));
  }
  thread_local simdjson::dom::parser parser;
  simdjson::dom::element root;
  if (auto e = json::parse(parser, body, &root)) return invalid_argument(*e);
  simdjson::dom::object object;
  if (root.get_object().get(object)) {
    return invalid_argument(std::string("the request body must be a JSON object, got ") +
                            json::type_name(root));
  }
  *out = {};
  simdjson::dom::element v;
  if (!object["id"].get(v)) {
    std::string_view id;
    if (v.get_string().get(id)) return invalid_argument("id: expected a string");
    out->proto.set_id(std::string(id));
  }
  if (!object["parameters"].get(v)) {
    if (Status s = read_rest_parameters(v, out); !s.ok()) return s;
  }
  simdjson::dom::array inputs;
  if (object["inputs"].get(v)) return invalid_argument("inputs: is required");
  if (v.get_array().get(inputs)) return invalid_argument("inputs: expected an array");
  size_t offset = 0, i = 0;
  for (const simdjson::dom::element item : inputs) {
    const std::string where = "inputs[" + std::to_string(i++) + "]";
    if (Status s = read_rest_input(item, where, binary, &offset, out); !s.ok()) return s;
  }
  if (offset != binary.size()) {
    return invalid_argument("the body has " + std::to_string(binary.size() - offset) +
                            " binary bytes after the JSON that no input's binary_data_size "
                            "claims");
  }
  if (!object["outputs"].get(v)) return read_rest_outputs(v, out);
  return Status();
}

Response write_rest_infer(const RestInferRequest& request,
                          const inference::ModelInferResponse& response, const std::string& model,
                          const std::string& version) {
  json::Writer w;
  w.raw("{\"model_name\":").string(model);
  w.raw(",\"model_version\":").string(version);
  if (!request.proto.id().empty()) w.raw(",\"id\":").string(request.proto.id());
  w.raw(",\"outputs\":[");
  std::string tail;
  for (int k = 0; k < response.outputs_size(); ++k) {
    const auto& out = response.outputs(k);
    const std::string& raw = response.raw_output_contents(k);
    // Outputs named in the request answer in its order (fill_infer_response keeps it).
    const bool binary = request.binary_output.empty() ? request.binary_default
                                                      : (size_t(k) < request.binary_output.size() &&
                                                         request.binary_output[size_t(k)]);
    if (k > 0) w.ch(',');
    w.raw("{\"name\":").string(out.name()).raw(",\"datatype\":").string(out.datatype());
    w.raw(",\"shape\":[");
    for (int d = 0; d < out.shape_size(); ++d) {
      if (d > 0) w.ch(',');
      w.number(out.shape(d));
    }
    w.ch(']');
    if (binary) {
      w.raw(",\"parameters\":{\"binary_data_size\":").number(int64_t(raw.size())).raw("}}");
      tail.append(raw);
    } else {
      w.raw(",\"data\":");
      data_json(out.datatype(), raw, w);
      w.ch('}');
    }
  }
  w.raw("]}");
  if (tail.empty()) return json_response(bhttp::status::ok, w.take());
  const size_t header = w.str().size();
  Response http{bhttp::status::ok, 11};
  http.set(bhttp::field::content_type, "application/octet-stream");
  http.set(kHeaderLength, std::to_string(header));
  http.body() = w.take();
  http.body().append(tail);
  return http;
}

void HttpApi::kserve_infer(const Request& http_request, Call call, const std::string& model,
                           const std::string& version) {
  const auto served = find(call, model, version);
  if (!served) return;
  struct Keep {
    RestInferRequest rest;
    serving::InferCall call;
  };
  auto keep = std::make_shared<Keep>();
  std::optional<std::string_view> header_length;
  if (const auto length = http_request.find(kHeaderLength); length != http_request.end())
    header_length = length->value();
  if (Status s = parse_rest_infer(http_request.body(), header_length, &keep->rest); !s.ok())
    return fail(call, s);
  keep->rest.proto.set_model_name(served->name);
  keep->rest.proto.set_model_version(version);
  if (keep->rest.timeout_us > 0) {
    call.deadline =
        std::min(call.deadline, Clock::now() + std::chrono::microseconds(keep->rest.timeout_us));
  }
  submit(
      call, served,
      [keep, served](request::Prepared* out) {
        keep->call.quantization = served->config.quantization;
        keep->call.quantization_file = served->config.quantization_file;
        keep->call.prompts = served->config.prompts;
        return serving::convert_infer_request(
            keep->rest.proto, *served->model, served->tokenizer(), served->config.limits,
            served->settings.max_batch_sequences, &keep->call, out);
      },
      [keep](const batching::Job& r) {
        const serving::ServedModel& answered = serving::Intake::served(r);
        inference::ModelInferResponse response;
        serving::fill_infer_response(keep->call, r, *answered.model, &response);
        return write_rest_infer(keep->rest, response, answered.name, answered.version);
      });
}

}  // namespace fastformer::http
