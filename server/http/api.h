// The HTTP routes over the one intake (server/rpc/intake.h): the OpenAI embeddings API
// (openai.cc), text-embeddings-inference's routes (tei.cc), KServe v2 REST as Triton serves
// it (kserve_rest.cc) and Cohere's embed API (cohere.cc). Each route maps its JSON into
// request::EncodeInput (or, for KServe, the same ModelInferRequest the gRPC service converts), so
// every request rule, limit, metric and the drain are the gRPC services'. docs/api.md ("HTTP") is
// the contract.
//
// Errors come in each API's own shape: OpenAI's {"error":{message,type,param,code}}, TEI's
// {"error","error_type"}, KServe's {"error"} and Cohere's {"message"}; the status codes are each
// API's (api.cc, http_status).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "server/http/http_server.h"
#include "server/http/json.h"
#include "server/request/encode_input.h"
#include "server/request/quantize.h"
#include "server/serving/auth.h"
#include "server/serving/intake.h"

namespace fastformer::http {

struct ApiOptions {
  const serving::TokenAuthenticator* authenticator = nullptr;  ///< null: no token needed
};

// Which API a route belongs to: its error shape and status codes.
enum class Api { kOpenAI, kTei, kKServe, kCohere };

// What a route's pattern captured from a path: {model} (or {model...}: the rest of the path,
// slashes and all, as OpenAI's model ids may hold them) and {version}.
struct PathParams {
  std::string model, version;
};
// Whether `path` matches `pattern` ("/v2/models/{model}/ready"): literal segments equal, a
// {name} segment any non-empty one, a trailing {name...} the non-empty rest. The one path
// parser of every route.
bool match_path(std::string_view pattern, std::string_view path, PathParams* params);

class HttpApi final : public Handler {
 public:
  HttpApi(serving::Intake& intake, ApiOptions options);

  void handle(Request& request, std::shared_ptr<Responder> responder) override;
  Response refuse(std::string_view target, bhttp::status status,
                  const std::string& message) override;

  // One call in flight: when it arrived, its route (the `method` label) and API, and where
  // its answer goes.
  struct Call {
    const char* method;
    Api api;
    batching::Clock::time_point start;
    std::shared_ptr<Responder> responder;
    batching::Clock::time_point deadline = batching::Clock::time_point::max();
    /// The x-priority header's class (every route); unset: the route's own choice, else the
    /// model's default.
    std::optional<batching::Priority> priority;
  };
  // What a finished request's answer is made of (runs on an I/O thread).
  using Format = std::function<Response(const batching::Request&)>;

  // The routes, one table: a request is matched against each pattern in order (match_path,
  // the one path parser); the first whose pattern and method match handles it. A path that
  // matches with another method is answered 405 with Allow; none, 404.
  struct Route {
    bhttp::verb verb;          ///< get (which also answers HEAD) or post
    std::string_view pattern;  ///< "/v2/models/{model}/versions/{version}/infer"
    const char* method;        ///< the metrics' method label
    void (*handle)(HttpApi& api, const Request& request, Call call, const PathParams& params);
  };
  static const std::vector<Route>& routes();

 private:
  // Routes (each answers through call.responder exactly once).
  void openai_embeddings(const Request& request, Call call);
  void openai_models(Call call);
  void openai_model(Call call, const std::string& id);  // GET /v1/models/{id}
  // Cohere's POST /v1/embed (`v2` false) and /v2/embed (cohere.cc).
  void cohere_embed(const Request& request, Call call, bool v2);
  void tei_embed(const Request& request, Call call, bool all_tokens);
  void tei_predict(const Request& request, Call call);
  void tei_tokenize(const Request& request, Call call);
  void tei_embed_chunks(const Request& request, Call call);
  void tei_info(Call call);
  void tei_health(Call call);
  void tei_default(const Request& request, Call call);  // POST /: predict or embed
  void kserve_server_metadata(Call call);
  void kserve_health(Call call, bool live);
  // GET /v2/models/{m}[/versions/{v}][/ready|/config|/stats], `what` "", "ready", "config" or
  // "stats"; an empty model: /v2/models/stats (every model's).
  void kserve_model(Call call, std::string_view what, const std::string& model,
                    const std::string& version);
  void kserve_infer(const Request& request, Call call, const std::string& model,
                    const std::string& version);
  // POST /v2/repository/index (`model` empty), /v2/repository/models/{m}/load and .../unload.
  void kserve_repository(const Request& request, Call call, const std::string& model, bool unload);

  // Answers at once (and records the call with the status the answer stands for).
  void answer(Call& call, Response response, const Status& status);
  void fail(Call& call, const Status& status, const std::string& param = {});
  // Queues `input` (rows viewing storage `keep` owns) and answers with format(), or with the
  // error in call.api's shape. `convert` runs inside admission (counted in flight).
  // `param`: the field a refusal by `convert` is about (OpenAI's error param).
  // The request goes to `model` (found by find()); format() may use Intake::served(done).
  void submit(Call call, std::shared_ptr<const serving::ServedModel> model,
              std::shared_ptr<void> keep, std::function<Status(batching::Request*)> convert,
              Format format, const std::string& param = {});
  // build_request on `input` for `model`, the refusal worded "<param>[row]: ..." as
  // INVALID_ARGUMENT. `single`: the input was one value, not an array (no row index).
  Status build(const serving::ServedModel& model, const request::EncodeInput& input,
               const char* param, bool single, batching::Request* out) const;

  // The model version `name` (an alias or empty: the default model; Repository::find) and
  // `version` stand for; null, having answered the call with the reason, when none serves.
  std::shared_ptr<const serving::ServedModel> find(Call& call, std::string_view name,
                                                   const std::string& version = {},
                                                   const std::string& param = {});

  serving::Intake& intake_;
  const ApiOptions options_;
  const int64_t created_ = 0;  // /v1/models' "created": when the server started (Unix s)
};

// The text or token-id inputs of OpenAI's `input` and TEI's `inputs`: a string, an array of
// strings, an array of ids or an array of arrays of ids. `single`: a lone string or id array.
struct Inputs {
  std::vector<std::string> texts;
  std::vector<std::vector<int64_t>> ids;
  bool single = false;
  size_t size() const { return texts.size() + ids.size(); }
};
// The request's body as a JSON object (parsed by `parser`, which must outlive `body`), or why
// not: the one reading of a JSON body for the OpenAI, TEI and Cohere routes.
std::optional<std::string> read_object(simdjson::dom::parser& parser, const Request& request,
                                       simdjson::dom::object* body);
// Why `value` is not such an input (naming `field`), or nothing.
std::optional<std::string> read_inputs(const simdjson::dom::element& value, const char* field,
                                       Inputs* out);
// The rows of `inputs` (views into it).
request::EncodeInput encode_input(const Inputs& inputs);
// The optional `macro_overlap_tokens` of a JSON body (POST /v1/embeddings and /embed_chunks):
// a non-negative integer, or an error naming the field; absent or null leaves it unset.
std::optional<std::string> read_macro_overlap(const simdjson::dom::object& body,
                                              std::optional<int32_t>* overlap);

// One embedding in `type` (request/quantize.h) as a JSON value: float as numbers, int8 and
// binary as signed integers, uint8 and ubinary as unsigned ones; with `base64`, the type's
// bytes as a base64 string (float32 little-endian for float). `range`: the calibrated range of
// int8 and uint8 (ServedModel::quantization_range).
void write_embedding(json::Writer& w, request::EmbeddingType type, std::span<const float> e,
                     const request::QuantizationRange* range, bool base64);

// Real tokens of a finished request (pads in id inputs are not counted; special tokens the
// tokenizer adds are): OpenAI's usage and Cohere's billed_units.
int64_t real_tokens(const batching::Request& r, int32_t pad);

// The response of `status` with `body` as application/json.
Response json_response(bhttp::status status, std::string body);
// The error body in `api`'s shape; `param` is OpenAI's param (the field), may be empty.
Response error_response(Api api, bhttp::status status, const std::string& message,
                        const std::string& param = {});
// The HTTP status that a gRPC status stands for in `api`.
bhttp::status http_status(Api api, const Status& status);

}  // namespace fastformer::http
