#include "server/http/api.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <boost/beast/core/string.hpp>
#include <cctype>
#include <charconv>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "server/request/outcome.h"

namespace fastformer::http {

using batching::Clock;
using batching::ns_since;

namespace {

// Crash-safety tests (tests/http/test_batches.py): FASTFORMER_JOBS_TEST_KILL_AT=<step>:<n> kills
// the server with SIGKILL, as `kill -9` would, at that step of a batch's runner
// (jobs::RunnerOptions::on_step: validating, written, synced, committed, finalizing) once its
// line count reaches n. Unset (always, outside those tests): nothing.
std::function<void(std::string_view, int64_t)> kill_hook() {
  const char* spec = std::getenv("FASTFORMER_JOBS_TEST_KILL_AT");
  if (spec == nullptr || *spec == '\0') return nullptr;
  const std::string_view text(spec);
  const size_t colon = text.find(':');
  const std::string step(text.substr(0, colon));
  int64_t at = 0;
  if (colon != std::string_view::npos)
    std::from_chars(text.data() + colon + 1, text.data() + text.size(), at);
  spdlog::warn(
      "jobs: FASTFORMER_JOBS_TEST_KILL_AT={}: this server kills itself (SIGKILL) at "
      "batch step {} from line {}, a crash-safety test",
      spec, step, at);
  return [step, at](std::string_view now, int64_t line) {
    if (now == step && line >= at) ::raise(SIGKILL);
  };
}

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
  if (path == "/v1/embed" || path == "/v2/embed") return Api::kCohere;
  if (path.starts_with("/v1/") || path == "/v1") return Api::kOpenAI;
  if (path.starts_with("/v2/") || path == "/v2") return Api::kKServe;
  return Api::kTei;
}

// The routes a 404 lists, from the route table: KServe's for a path under /v2 (but Cohere's
// /v2/embed), else every other API's.
std::string route_list(Api api) {
  const bool kserve = api == Api::kKServe;
  std::string out = kserve ? "KServe v2 routes: " : "routes: ";
  bool first = true;
  for (const HttpApi::Route& r : HttpApi::routes()) {
    if ((api_of(r.pattern) == Api::kKServe) != kserve) continue;
    out += first ? "" : ", ";
    out += std::string(bhttp::to_string(r.verb)) + " ";
    out += r.pattern;
    first = false;
  }
  return kserve ? out : out + "; KServe v2 under /v2";
}

}  // namespace

void write_embedding(json::Writer& w, request::EmbeddingType type, std::span<const float> e,
                     const request::QuantizationRange* range, bool base64) {
  if (type == request::EmbeddingType::kFloat && !base64) {
    w.floats(e);
    return;
  }
  thread_local std::vector<uint8_t> bytes;
  bytes.clear();
  request::quantize_embedding(type, e, range, &bytes);
  if (base64) {
    w.base64(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
    return;
  }
  const bool is_signed = request::embedding_type_signed(type);
  w.ch('[');
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (i > 0) w.ch(',');
    w.number(is_signed ? int64_t(static_cast<int8_t>(bytes[i])) : int64_t(bytes[i]));
  }
  w.ch(']');
}

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
    case Api::kCohere:
      w.raw("{\"message\":").string(message).ch('}');
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
                   .count()) {
  if (options_.jobs != nullptr) {
    // A batch's lines run through POST /v1/embeddings itself (batches.cc, execute_line).
    jobs::RunnerOptions runner;
    runner.max_in_flight = options_.files.batch_lines_in_flight;
    runner.max_queued_tokens = options_.files.batch_queued_tokens;
    runner.on_step = kill_hook();
    metrics::Metrics& m = intake_.metrics();
    runner.on_line = [&m](bool completed) {
      (completed ? m.job_lines_completed : m.job_lines_failed).Increment();
    };
    runner.on_in_flight = [&m](int64_t delta) { m.job_lines_in_flight.Increment(double(delta)); };
    runner.on_queued_tokens = [&m](int64_t delta) { m.job_queued_tokens.Increment(double(delta)); };
    runner.on_change = [this] { intake_.metrics().set_jobs(options_.jobs->count_by_status()); };
    runner_ = std::make_unique<jobs::Runner>(
        *options_.jobs,
        [this](const jobs::BatchRecord& b, const jobs::BatchLine& line,
               std::function<void(jobs::LineResult)> done) {
          return execute_line(b, line, std::move(done));
        },
        runner);
  }
}

HttpApi::~HttpApi() { stop_jobs(); }

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

void HttpApi::refuse_body(Call& call, const reader::Refusal& refusal) {
  fail(call, invalid_argument(refusal.message), refusal.field);
}

Status HttpApi::build(const serving::ServedModel& model, const request::EncodeInput& input,
                      const WireNames& names, bool single, request::Prepared* out) const {
  const request::VersionFiles files = model.config.files();
  const std::optional<request::Problem> problem = request::build_request(
      input, *model.model, model.tokenizer(), model.config.limits, out, &files);
  if (!problem) return Status();
  using request::Field;
  const Field f = problem->field;
  const std::string field = problem->row                  ? names.rows
                            : f == Field::kMacroChunks    ? "macro_overlap_tokens"
                            : f == Field::kPrompt         ? names.prompt
                            : f == Field::kDimensions     ? names.dimensions
                            : f == Field::kEmbeddingTypes ? names.embedding_types
                                                          : names.rows;
  std::string where = field;
  if (problem->row && !single) where += "[" + std::to_string(*problem->row) + "]";
  return invalid_argument(where + ": " +
                          (problem->row ? request::describe(*problem) : problem->message))
      .with_field(field);
}

void HttpApi::submit(Call call, std::shared_ptr<const serving::ServedModel> model,
                     std::function<Status(request::Prepared*)> convert, Format format,
                     const std::string& param) {
  auto request = std::make_shared<batching::Job>();
  std::weak_ptr<batching::Job> weak = request;
  request->on_complete = [this, call, format, weak](batching::Job& r) {
    auto finish = [this, call, format](batching::Job& done) {
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
    if (std::shared_ptr<batching::Job> held = weak.lock()) {
      call.responder->post([finish, held]() { finish(*held); });
    } else {
      finish(r);
    }
  };
  const Status status = intake_.admit(
      call.deadline, model,
      [&](const serving::ServedModel&, request::Prepared* out) {
        const Status converted = convert(out);
        // The route's own class (a KServe `priority` parameter), else the header's.
        if (!out->priority) out->priority = call.priority;
        out->promotable = !call.job_line;
        return converted;
      },
      request);
  if (status.ok() && call.admitted_tokens != nullptr) *call.admitted_tokens = request->tokens;
  if (!status.ok()) {
    const bool invalid = status.code() == StatusCode::kInvalidArgument;
    fail(call, status, !invalid ? "" : status.field().empty() ? param : status.field());
  }
}

bool match_path(std::string_view pattern, std::string_view path, PathParams* params) {
  *params = {};
  if (!pattern.starts_with('/') || !path.starts_with('/')) return false;
  pattern.remove_prefix(1);
  path.remove_prefix(1);
  for (;;) {
    const size_t p_end = std::min(pattern.find('/'), pattern.size());
    const std::string_view want = pattern.substr(0, p_end);
    if (want.starts_with('{') && want.ends_with("...}")) {  // the rest of the path
      if (path.empty()) return false;
      params->model = std::string(path);
      return true;
    }
    const size_t s_end = std::min(path.find('/'), path.size());
    const std::string_view got = path.substr(0, s_end);
    if (want == "{model}" || want == "{version}" || want == "{id}") {
      if (got.empty()) return false;
      (want == "{model}" ? params->model
       : want == "{id}"  ? params->id
                         : params->version) = std::string(got);
    } else if (want != got) {
      return false;
    }
    const bool pattern_done = p_end == pattern.size(), path_done = s_end == path.size();
    if (pattern_done || path_done) return pattern_done && path_done;
    pattern.remove_prefix(p_end + 1);
    path.remove_prefix(s_end + 1);
  }
}

const std::vector<HttpApi::Route>& HttpApi::routes() {
  using V = bhttp::verb;
  using P = const PathParams&;
  using R = const Request&;
  static const std::vector<Route> table = {
      // OpenAI
      {V::post, "/v1/embeddings", "POST /v1/embeddings",
       [](HttpApi& a, R r, Call c, P) { a.openai_embeddings(r, std::move(c)); }},
      // Cohere (before OpenAI's /v1/models: a distinct path either way)
      {V::post, "/v1/embed", "POST /v1/embed",
       [](HttpApi& a, R r, Call c, P) { a.cohere_embed(r, std::move(c), false); }},
      {V::post, "/v2/embed", "POST /v2/embed",
       [](HttpApi& a, R r, Call c, P) { a.cohere_embed(r, std::move(c), true); }},
      // OpenAI's Files API (files.cc; POST /v1/files streams, HttpApi::stream)
      {V::post, "/v1/files", "POST /v1/files",
       [](HttpApi& a, R, Call c, P) { a.files_enabled(c); }},
      {V::get, "/v1/files", "GET /v1/files",
       [](HttpApi& a, R r, Call c, P) { a.files_list(r, std::move(c)); }},
      {V::get, "/v1/files/{id}", "GET /v1/files/{id}",
       [](HttpApi& a, R, Call c, P p) { a.files_get(std::move(c), p.id); }},
      {V::delete_, "/v1/files/{id}", "DELETE /v1/files/{id}",
       [](HttpApi& a, R, Call c, P p) { a.files_delete(std::move(c), p.id); }},
      {V::get, "/v1/files/{id}/content", "GET /v1/files/{id}/content",
       [](HttpApi& a, R, Call c, P p) { a.files_content(std::move(c), p.id); }},
      // OpenAI's Batch API (batches.cc)
      {V::post, "/v1/batches", "POST /v1/batches",
       [](HttpApi& a, R r, Call c, P) { a.batches_create(r, std::move(c)); }},
      {V::get, "/v1/batches", "GET /v1/batches",
       [](HttpApi& a, R r, Call c, P) { a.batches_list(r, std::move(c)); }},
      {V::get, "/v1/batches/{id}", "GET /v1/batches/{id}",
       [](HttpApi& a, R, Call c, P p) { a.batches_get(std::move(c), p.id); }},
      {V::post, "/v1/batches/{id}/cancel", "POST /v1/batches/{id}/cancel",
       [](HttpApi& a, R, Call c, P p) { a.batches_cancel(std::move(c), p.id); }},
      {V::get, "/v1/models", "GET /v1/models",
       [](HttpApi& a, R, Call c, P) { a.openai_models(std::move(c)); }},
      {V::get, "/v1/models/{model...}", "GET /v1/models",
       [](HttpApi& a, R, Call c, P p) { a.openai_model(std::move(c), p.model); }},
      // text-embeddings-inference
      {V::post, "/embed", "POST /embed",
       [](HttpApi& a, R r, Call c, P) { a.tei_embed(r, std::move(c), false); }},
      {V::post, "/embed_all", "POST /embed_all",
       [](HttpApi& a, R r, Call c, P) { a.tei_embed(r, std::move(c), true); }},
      {V::post, "/predict", "POST /predict",
       [](HttpApi& a, R r, Call c, P) { a.tei_predict(r, std::move(c)); }},
      {V::post, "/tokenize", "POST /tokenize",
       [](HttpApi& a, R r, Call c, P) { a.tei_tokenize(r, std::move(c)); }},
      {V::post, "/embed_chunks", "POST /embed_chunks",
       [](HttpApi& a, R r, Call c, P) { a.tei_embed_chunks(r, std::move(c)); }},
      {V::get, "/info", "GET /info", [](HttpApi& a, R, Call c, P) { a.tei_info(std::move(c)); }},
      {V::get, "/health", "GET /health",
       [](HttpApi& a, R, Call c, P) { a.tei_health(std::move(c)); }},
      {V::post, "/", "POST /", [](HttpApi& a, R r, Call c, P) { a.tei_default(r, std::move(c)); }},
      // KServe v2
      {V::get, "/v2", "GET /v2",
       [](HttpApi& a, R, Call c, P) { a.kserve_server_metadata(std::move(c)); }},
      {V::get, "/v2/health/live", "GET /v2/health/live",
       [](HttpApi& a, R, Call c, P) { a.kserve_health(std::move(c), true); }},
      {V::get, "/v2/health/ready", "GET /v2/health/ready",
       [](HttpApi& a, R, Call c, P) { a.kserve_health(std::move(c), false); }},
      {V::get, "/v2/models/stats", "GET /v2/models/{model}/stats",
       [](HttpApi& a, R, Call c, P) { a.kserve_model(std::move(c), "stats", "", ""); }},
      {V::get, "/v2/models/{model}", "GET /v2/models/{model}",
       [](HttpApi& a, R, Call c, P p) { a.kserve_model(std::move(c), "", p.model, ""); }},
      {V::get, "/v2/models/{model}/versions/{version}", "GET /v2/models/{model}",
       [](HttpApi& a, R, Call c, P p) { a.kserve_model(std::move(c), "", p.model, p.version); }},
      {V::get, "/v2/models/{model}/ready", "GET /v2/models/{model}/ready",
       [](HttpApi& a, R, Call c, P p) { a.kserve_model(std::move(c), "ready", p.model, ""); }},
      {V::get, "/v2/models/{model}/versions/{version}/ready", "GET /v2/models/{model}/ready",
       [](HttpApi& a, R, Call c, P p) {
         a.kserve_model(std::move(c), "ready", p.model, p.version);
       }},
      {V::get, "/v2/models/{model}/config", "GET /v2/models/{model}/config",
       [](HttpApi& a, R, Call c, P p) { a.kserve_model(std::move(c), "config", p.model, ""); }},
      {V::get, "/v2/models/{model}/versions/{version}/config", "GET /v2/models/{model}/config",
       [](HttpApi& a, R, Call c, P p) {
         a.kserve_model(std::move(c), "config", p.model, p.version);
       }},
      {V::get, "/v2/models/{model}/stats", "GET /v2/models/{model}/stats",
       [](HttpApi& a, R, Call c, P p) { a.kserve_model(std::move(c), "stats", p.model, ""); }},
      {V::get, "/v2/models/{model}/versions/{version}/stats", "GET /v2/models/{model}/stats",
       [](HttpApi& a, R, Call c, P p) {
         a.kserve_model(std::move(c), "stats", p.model, p.version);
       }},
      {V::post, "/v2/models/{model}/infer", "POST /v2/models/{model}/infer",
       [](HttpApi& a, R r, Call c, P p) { a.kserve_infer(r, std::move(c), p.model, ""); }},
      {V::post, "/v2/models/{model}/versions/{version}/infer", "POST /v2/models/{model}/infer",
       [](HttpApi& a, R r, Call c, P p) { a.kserve_infer(r, std::move(c), p.model, p.version); }},
      {V::post, "/v2/repository/index", "POST /v2/repository/index",
       [](HttpApi& a, R r, Call c, P) { a.kserve_repository(r, std::move(c), "", false); }},
      {V::post, "/v2/repository/models/{model}/load", "POST /v2/repository/models/{model}/load",
       [](HttpApi& a, R r, Call c, P p) { a.kserve_repository(r, std::move(c), p.model, false); }},
      {V::post, "/v2/repository/models/{model}/unload", "POST /v2/repository/models/{model}/unload",
       [](HttpApi& a, R r, Call c, P p) { a.kserve_repository(r, std::move(c), p.model, true); }},
  };
  return table;
}

// The headers every route takes: x-request-timeout-ms (the call's deadline) and x-priority
// (its class).
Status HttpApi::read_headers(const Request& request, Call* call) {
  if (const auto timeout = request.find("x-request-timeout-ms"); timeout != request.end()) {
    const std::string value(timeout->value());
    char* end = nullptr;
    const double ms = std::strtod(value.c_str(), &end);
    if (end == value.c_str() || *end != '\0' || !(ms > 0)) {
      return invalid_argument(
          "x-request-timeout-ms: expected a positive number of "
          "milliseconds, got '" +
          value + "'");
    }
    call->deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double, std::milli>(ms));
  }
  if (const auto priority = request.find("x-priority"); priority != request.end()) {
    // The priority class (docs/operations.md, "Priority classes"), on every route.
    std::string value(priority->value());
    std::transform(value.begin(), value.end(), value.begin(),
                   [](unsigned char c) { return char(std::tolower(c)); });
    call->priority = batching::parse_priority(value);
    if (!call->priority) {
      return invalid_argument("x-priority: expected \"interactive\" or \"bulk\", got '" +
                              std::string(priority->value()) + "'");
    }
  }
  return Status();
}

Status HttpApi::authorize(const Request& request, std::string_view path) const {
  if (options_.authenticator == nullptr) return Status();
  const bool health = path == "/health" || path == "/v2/health/live" || path == "/v2/health/ready";
  std::vector<std::string_view> authorization;
  for (const auto& field : request) {
    if (field.name() == bhttp::field::authorization) authorization.push_back(field.value());
  }
  return options_.authenticator->check(path, health, authorization);
}

void HttpApi::handle(Request& request, std::shared_ptr<Responder> responder) {
  const std::string_view target = request.target();
  const std::string_view path = target.substr(0, target.find('?'));
  const bhttp::verb verb = request.method();
  Call call{"HTTP (no route)",        api_of(path), Clock::now(), std::move(responder),
            Clock::time_point::max(), std::nullopt};

  if (Status s = authorize(request, path); !s.ok()) {
    call.method = "HTTP (unauthenticated)";
    return fail(call, s);
  }
  if (Status s = read_headers(request, &call); !s.ok()) return fail(call, s);
  if (const auto encoding = request.find(bhttp::field::content_encoding);
      encoding != request.end() && !boost::beast::iequals(encoding->value(), "identity")) {
    return fail(call,
                {StatusCode::kUnimplemented, "Content-Encoding " + std::string(encoding->value()) +
                                                 " is not supported; send the body uncompressed"});
  }

  // The first route whose pattern and method match; else a route whose pattern matches with
  // another method (405, naming it), else none (404).
  const Route* wrong_method = nullptr;
  PathParams params;
  for (const Route& route : routes()) {
    if (!match_path(route.pattern, path, &params)) continue;
    const bool verb_ok =
        verb == route.verb || (route.verb == bhttp::verb::get && verb == bhttp::verb::head);
    if (!verb_ok) {
      if (wrong_method == nullptr) wrong_method = &route;
      continue;
    }
    call.method = route.method;
    return route.handle(*this, request, std::move(call), params);
  }
  if (wrong_method != nullptr) {
    call.method = wrong_method->method;
    const std::string allowed(bhttp::to_string(wrong_method->verb));
    Response response = error_response(
        call.api, bhttp::status::method_not_allowed,
        std::string(request.method_string()) + " " + std::string(path) + ": use " + allowed);
    response.set(bhttp::field::allow, allowed);
    return answer(call, std::move(response), invalid_argument("method not allowed"));
  }
  const std::string route = std::string(request.method_string()) + " " + std::string(path);
  fail(call, {StatusCode::kNotFound, "no route " + route + " (" + route_list(call.api) + ")"});
}

void HttpApi::openai_model(Call call, const std::string& id) {
  if (!find(call, id, "", "model")) return;
  json::Writer w;
  w.raw("{\"id\":").string(id).raw(",\"object\":\"model\",\"created\":").number(created_);
  w.raw(",\"owned_by\":\"fastformer\"}");
  answer(call, json_response(bhttp::status::ok, w.take()), Status());
}

void HttpApi::tei_default(const Request& request, Call call) {
  const auto served = find(call, "");
  if (!served) return;
  // TEI's default route: /predict for a classifier, /embed otherwise.
  if (served->model->num_labels() > 0) return tei_predict(request, std::move(call));
  tei_embed(request, std::move(call), false);
}

}  // namespace fastformer::http
