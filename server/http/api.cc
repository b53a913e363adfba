#include "server/http/api.h"

#include <spdlog/spdlog.h>

#include <boost/beast/core/string.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "server/request/outcome.h"

namespace fastformer::http {

using batching::Clock;
using batching::ns_since;

namespace {

const char* openai_type(bhttp::status status) {
  switch (status) {
    case bhttp::status::unauthorized:
      return "authentication_error";
    case bhttp::status::not_found:
      return "not_found_error";
    case bhttp::status::too_many_requests:
      return "rate_limit_error";
    default:
      break;
  }
  return unsigned(status) >= 500 ? "server_error" : "invalid_request_error";
}

const char* tei_type(bhttp::status status) {
  switch (status) {
    case bhttp::status::too_many_requests:
      return "Overloaded";
    case bhttp::status::service_unavailable:
      return "Unhealthy";
    case bhttp::status::unauthorized:
      return "Unauthorized";
    case bhttp::status::not_found:
      return "NotFound";
    default:
      break;
  }
  return unsigned(status) >= 500 ? "Backend" : "Validation";
}

// Which API a path belongs to, for errors before (or without) a route.
Api api_of(std::string_view path) {
  if (path.starts_with("/v1/") || path == "/v1") return Api::kOpenAI;
  if (path.starts_with("/v2/") || path == "/v2") return Api::kKServe;
  return Api::kTei;
}

std::vector<std::string> split_path(std::string_view path) {
  std::vector<std::string> parts;
  size_t at = 1;
  while (at <= path.size()) {
    const size_t slash = path.find('/', at);
    const size_t end = slash == std::string_view::npos ? path.size() : slash;
    parts.emplace_back(path.substr(at, end - at));
    at = end + 1;
  }
  return parts;
}

}  // namespace

Response json_response(bhttp::status status, std::string body) {
  Response response{status, 11};
  response.set(bhttp::field::content_type, "application/json");
  response.body() = std::move(body);
  return response;
}

Response error_response(Api api, bhttp::status status, const std::string& message,
                        const std::string& param) {
  json::Writer w;
  switch (api) {
    case Api::kOpenAI:
      w.raw("{\"error\":{\"message\":")
          .string(message)
          .raw(",\"type\":")
          .string(openai_type(status));
      w.raw(",\"param\":");
      param.empty() ? w.null() : w.string(param);
      w.raw(",\"code\":");
      if (status == bhttp::status::not_found && param == "model") {
        w.string("model_not_found");
      } else if (status == bhttp::status::unauthorized) {
        w.string("invalid_api_key");
      } else {
        w.null();
      }
      w.raw("}}");
      break;
    case Api::kTei:
      w.raw("{\"error\":").string(message).raw(",\"error_type\":").string(tei_type(status)).ch('}');
      break;
    case Api::kKServe:
      w.raw("{\"error\":").string(message).ch('}');
      break;
  }
  Response response = json_response(status, w.take());
  if (status == bhttp::status::too_many_requests || status == bhttp::status::service_unavailable) {
    response.set(bhttp::field::retry_after, "1");
  }
  if (status == bhttp::status::unauthorized) response.set(bhttp::field::www_authenticate, "Bearer");
  return response;
}

bhttp::status http_status(Api api, const Status& status) {
  switch (status.code()) {
    case StatusCode::kOk:
      return bhttp::status::ok;
    case StatusCode::kInvalidArgument:
    case StatusCode::kFailedPrecondition:
    case StatusCode::kOutOfRange:
      return api == Api::kTei ? bhttp::status::unprocessable_entity : bhttp::status::bad_request;
    case StatusCode::kNotFound:
      return bhttp::status::not_found;
    case StatusCode::kResourceExhausted:
      return bhttp::status::too_many_requests;
    case StatusCode::kUnavailable:
      return bhttp::status::service_unavailable;
    case StatusCode::kDeadlineExceeded:
      return bhttp::status::gateway_timeout;
    case StatusCode::kUnauthenticated:
      return bhttp::status::unauthorized;
    case StatusCode::kPermissionDenied:
      return bhttp::status::forbidden;
    case StatusCode::kUnimplemented:
      return bhttp::status::not_implemented;
    case StatusCode::kCancelled:
      return bhttp::status::bad_request;
    default:
      return bhttp::status::internal_server_error;
  }
}

HttpApi::HttpApi(serving::Intake& intake, ApiOptions options)
    : intake_(intake),
      options_(std::move(options)),
      created_(std::chrono::duration_cast<std::chrono::seconds>(
                   std::chrono::system_clock::now().time_since_epoch())
                   .count()) {}

std::vector<std::string> HttpApi::read_labels(const std::string& model_dir) {
  namespace fs = std::filesystem;
  // Labels are a courtesy: a file that is missing, not a regular file or not JSON gives none
  // (the model's own load reports a broken config.json, naming it).
  auto read = [](const fs::path& path) -> nlohmann::json {
    std::error_code ec;
    if (!fs::is_regular_file(path, ec)) return nullptr;
    try {
      std::ifstream in(path);
      if (!in) return nullptr;
      return nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    } catch (const std::exception&) {
      return nullptr;
    }
  };
  std::vector<std::string> labels;
  const nlohmann::json config = read(fs::path(model_dir) / "config.json");
  if (config.is_object() && config.contains("id2label") && config["id2label"].is_object()) {
    for (const auto& [key, value] : config["id2label"].items()) {
      char* end = nullptr;
      const long id = std::strtol(key.c_str(), &end, 10);
      if (end == key.c_str() || *end != '\0' || id < 0 || id > 1 << 20 || !value.is_string())
        continue;
      if (size_t(id) >= labels.size()) labels.resize(size_t(id) + 1);
      labels[size_t(id)] = value.get<std::string>();
    }
    if (!labels.empty()) return labels;
  }
  const nlohmann::json file = read(fs::path(model_dir) / "labels.json");
  if (file.is_object() && file.contains("labels") && file["labels"].is_array()) {
    for (const auto& value : file["labels"]) {
      labels.push_back(value.is_string() ? value.get<std::string>() : value.dump());
    }
  }
  return labels;
}

std::string HttpApi::label(const serving::ServedModel& model, size_t index) const {
  std::lock_guard lock(labels_mu_);
  auto it = labels_.find(model.dir);
  if (it == labels_.end()) it = labels_.emplace(model.dir, read_labels(model.dir)).first;
  if (index < it->second.size() && !it->second[index].empty()) return it->second[index];
  return "LABEL_" + std::to_string(index);  // as Hugging Face names labels it was not told
}

std::shared_ptr<const serving::ServedModel> HttpApi::find(Call& call, std::string_view name,
                                                          const std::string& version,
                                                          const std::string& param) {
  Status status;
  auto served = intake_.find(std::string(name), version, &status);
  if (!served) fail(call, status, status.code() == StatusCode::kNotFound ? param : "");
  return served;
}

void HttpApi::answer(Call& call, Response response, const Status& status) {
  intake_.record(call.method, status, call.start);
  call.responder->send(std::move(response));
}

void HttpApi::fail(Call& call, const Status& status, const std::string& param) {
  answer(call, error_response(call.api, http_status(call.api, status), status.message(), param),
         status);
}

Response HttpApi::refuse(std::string_view target, bhttp::status status,
                         const std::string& message) {
  const std::string_view path = target.substr(0, target.find('?'));
  const StatusCode code = status == bhttp::status::service_unavailable ? StatusCode::kUnavailable
                          : status == bhttp::status::payload_too_large ||
                                  status == bhttp::status::request_header_fields_too_large
                              ? StatusCode::kResourceExhausted
                          : unsigned(status) >= 500 ? StatusCode::kInternal
                                                    : StatusCode::kInvalidArgument;
  intake_.record("HTTP (refused before routing)", {code, message}, Clock::now());
  Response response = error_response(api_of(path), status, message);
  response.keep_alive(false);
  return response;
}

Status HttpApi::build(const serving::ServedModel& model, const request::EncodeInput& input,
                      const char* param, bool single, batching::Request* out) const {
  const std::optional<request::Problem> problem =
      request::build_request(input, *model.model, model.tokenizer(), model.config.limits, out);
  if (!problem) return Status();
  std::string where = param;
  if (problem->row && !single) where += "[" + std::to_string(*problem->row) + "]";
  return invalid_argument(where + ": " +
                          (problem->row ? request::describe(*problem) : problem->message));
}

void HttpApi::submit(Call call, std::shared_ptr<const serving::ServedModel> model,
                     std::shared_ptr<void> keep, std::function<Status(batching::Request*)> convert,
                     Format format, const std::string& param) {
  auto request = std::make_shared<batching::Request>();
  std::weak_ptr<batching::Request> weak = request;
  request->on_complete = [this, call, keep, format, weak](batching::Request& r) {
    auto finish = [this, call, keep, format](batching::Request& done) {
      const Status status = request::outcome_status(done);
      const auto filling = Clock::now();
      Response response =
          status.ok() ? format(done)
                      : error_response(call.api, http_status(call.api, status), status.message());
      const uint64_t output_ns = ns_since(filling);
      if (status.ok()) {
        // Microseconds, for overhead measurements (TEI's x-*-time headers are whole ms).
        const auto queued = std::chrono::duration_cast<std::chrono::microseconds>(
            done.first_compute - done.arrival);
        response.set("x-fastformer-queue-us", std::to_string(std::max<int64_t>(0, queued.count())));
        response.set("x-fastformer-compute-us", std::to_string(done.compute_us));
        // Which model version answered (every API: OpenAI's and TEI's bodies have no version).
        response.set("x-fastformer-model", serving::Intake::served(done).name);
        response.set("x-fastformer-model-version", serving::Intake::served(done).version);
      }
      call.responder->send(std::move(response));
      intake_.complete(call.method, done, status, call.start, output_ns);
    };
    // The answer is made on the connection's I/O thread, so that printing floats does not
    // hold up the batcher; the batcher holds the request while it calls this.
    if (std::shared_ptr<batching::Request> held = weak.lock()) {
      call.responder->post([finish, held]() { finish(*held); });
    } else {
      finish(r);
    }
  };
  const Status status = intake_.admit(
      call.deadline, model, [&](const serving::ServedModel&) { return convert(request.get()); },
      request);
  if (!status.ok()) {
    fail(call, status, status.code() == StatusCode::kInvalidArgument ? param : "");
  }
}

void HttpApi::handle(Request& request, std::shared_ptr<Responder> responder) {
  const std::string_view target = request.target();
  const std::string_view path = target.substr(0, target.find('?'));
  const bhttp::verb verb = request.method();
  const bool get = verb == bhttp::verb::get || verb == bhttp::verb::head;
  const bool post = verb == bhttp::verb::post;
  Call call{"HTTP (no route)", api_of(path), Clock::now(), std::move(responder)};

  const bool health = path == "/health" || path == "/v2/health/live" || path == "/v2/health/ready";
  if (options_.authenticator != nullptr) {
    std::vector<std::string_view> authorization;
    for (const auto& field : request) {
      if (field.name() == bhttp::field::authorization) authorization.push_back(field.value());
    }
    if (Status s = options_.authenticator->check(path, health, authorization); !s.ok()) {
      call.method = "HTTP (unauthenticated)";
      return fail(call, s);
    }
  }
  if (const auto timeout = request.find("x-request-timeout-ms"); timeout != request.end()) {
    const std::string value(timeout->value());
    char* end = nullptr;
    const double ms = std::strtod(value.c_str(), &end);
    if (end == value.c_str() || *end != '\0' || !(ms > 0)) {
      return fail(call, invalid_argument("x-request-timeout-ms: expected a positive number of "
                                         "milliseconds, got '" +
                                         value + "'"));
    }
    call.deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double, std::milli>(ms));
  }
  if (const auto encoding = request.find(bhttp::field::content_encoding);
      encoding != request.end() && !boost::beast::iequals(encoding->value(), "identity")) {
    return fail(call,
                {StatusCode::kUnimplemented, "Content-Encoding " + std::string(encoding->value()) +
                                                 " is not supported; send the body uncompressed"});
  }

  auto wrong_method = [&](const char* allowed) {
    Response response = error_response(
        call.api, bhttp::status::method_not_allowed,
        std::string(request.method_string()) + " " + std::string(path) + ": use " + allowed);
    response.set(bhttp::field::allow, allowed);
    answer(call, std::move(response), invalid_argument("method not allowed"));
  };
  // OpenAI and TEI: fixed paths.
  if (path == "/v1/embeddings") {
    call.method = "POST /v1/embeddings";
    return post ? openai_embeddings(request, std::move(call)) : wrong_method("POST");
  }
  if (path == "/v1/models" || path.starts_with("/v1/models/")) {
    call.method = "GET /v1/models";
    if (!get) return wrong_method("GET");
    if (path != "/v1/models") {
      const std::string id(path.substr(std::string_view("/v1/models/").size()));
      if (!find(call, id, "", "model")) return;
      json::Writer w;
      w.raw("{\"id\":").string(id).raw(",\"object\":\"model\",\"created\":").number(created_);
      w.raw(",\"owned_by\":\"fastformer\"}");
      return answer(call, json_response(bhttp::status::ok, w.take()), Status());
    }
    return openai_models(std::move(call));
  }
  if (path == "/embed" || path == "/embed_all") {
    call.method = path == "/embed" ? "POST /embed" : "POST /embed_all";
    return post ? tei_embed(request, std::move(call), path == "/embed_all") : wrong_method("POST");
  }
  if (path == "/predict") {
    call.method = "POST /predict";
    return post ? tei_predict(request, std::move(call)) : wrong_method("POST");
  }
  if (path == "/tokenize") {
    call.method = "POST /tokenize";
    return post ? tei_tokenize(request, std::move(call)) : wrong_method("POST");
  }
  if (path == "/info") {
    call.method = "GET /info";
    return get ? tei_info(std::move(call)) : wrong_method("GET");
  }
  if (path == "/health") {
    call.method = "GET /health";
    return get ? tei_health(std::move(call)) : wrong_method("GET");
  }
  if (path == "/") {
    call.method = "POST /";
    if (!post) return wrong_method("POST");
    const auto served = find(call, "");
    if (!served) return;
    // TEI's default route: /predict for a classifier, /embed otherwise.
    if (served->model->num_labels() > 0) return tei_predict(request, std::move(call));
    return tei_embed(request, std::move(call), false);
  }
  // KServe v2: /v2, /v2/health/..., /v2/models/{m}[/versions/{v}][/ready|config|stats|infer].
  if (path == "/v2" || path.starts_with("/v2/")) {
    const std::vector<std::string> parts = split_path(path);
    if (parts.size() >= 2 && parts[1] == "repository") {
      call.method = parts.size() == 3 ? "POST /v2/repository/index"
                    : parts.size() == 5 && parts[4] == "load"
                        ? "POST /v2/repository/models/{model}/load"
                        : "POST /v2/repository/models/{model}/unload";
      if (!post) return wrong_method("POST");
      return kserve_repository(request, std::move(call), parts);
    }
    const bool infer = parts.size() >= 4 && parts[1] == "models" && parts.back() == "infer";
    if (infer) {
      call.method = "POST /v2/models/{model}/infer";
      if (!post) return wrong_method("POST");
      std::string version;
      if (parts.size() == 6 && parts[3] == "versions") {
        version = parts[4];
      } else if (parts.size() != 4) {
        call.method = "HTTP (no route)";
        return fail(call, {StatusCode::kNotFound, "no route " + std::string(path)});
      }
      return kserve_infer(request, std::move(call), parts[2], version);
    }
    if (!get) return wrong_method("GET");
    return kserve_get(request, std::move(call), parts);
  }
  fail(call, {StatusCode::kNotFound,
              "no route " + std::string(request.method_string()) + " " + std::string(path) +
                  " (routes: POST /v1/embeddings, GET /v1/models, POST /embed, /embed_all, "
                  "/predict, /tokenize, /, GET /info, /health, and KServe v2 under /v2)"});
}

}  // namespace fastformer::http
