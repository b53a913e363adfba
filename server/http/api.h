// The HTTP routes over the one intake (server/serving/intake.h): the OpenAI embeddings API
// (openai.cc) and Files API (files.cc, over the jobs store), text-embeddings-inference's routes
// (tei.cc), KServe v2 REST as Triton serves it (kserve_rest.cc) and Cohere's embed API
// (cohere.cc). Each route maps its JSON into
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
#include "server/http/reader.h"
#include "server/jobs/runner.h"
#include "server/jobs/store.h"
#include "server/request/encode_input.h"
#include "server/request/quantize.h"
#include "server/serving/auth.h"
#include "server/serving/intake.h"

namespace fastformer::http {

// The Files API's limits (files.cc; flags --jobs-max-file-bytes, --jobs-max-stored-bytes,
// --jobs-file-ttl-s).
struct FilesOptions {
  int64_t max_file_bytes = int64_t(512) << 20;    ///< one upload
  int64_t max_stored_bytes = int64_t(100) << 30;  ///< every stored file together
  int64_t ttl_seconds = 30 * 24 * 3600;           ///< an upload's default expiry
  int64_t completion_window_s = 24 * 3600;        ///< a batch's window ("24h"; shorter: tests)
  int64_t batch_lines_in_flight = 32;  ///< batches' lines queued at once (the feeder), together
  int64_t batch_queued_tokens = 0;     ///< and their tokens (--jobs-queued-tokens; 0: no bound)
};

struct ApiOptions {
  const serving::TokenAuthenticator* authenticator = nullptr;  ///< null: no token needed
  jobs::Store* jobs = nullptr;  ///< --jobs-dir's store; null: the Files and Batch APIs are off
  FilesOptions files;
};

// Which API a route belongs to: its error shape and status codes.
enum class Api { kOpenAI, kTei, kKServe, kCohere };

// What a route's pattern captured from a path: {model} (or {model...}: the rest of the path,
// slashes and all, as OpenAI's model ids may hold them) and {version}.
struct PathParams {
  std::string model, version, id;
};
// Whether `path` matches `pattern` ("/v2/models/{model}/ready"): literal segments equal, a
// {name} segment any non-empty one, a trailing {name...} the non-empty rest. The one path
// parser of every route.
bool match_path(std::string_view pattern, std::string_view path, PathParams* params);

struct TeiBody;  // tei.cc: a TEI route's body

class HttpApi final : public Handler {
 public:
  HttpApi(serving::Intake& intake, ApiOptions options);
  ~HttpApi() override;
  // The batches' runner (with --jobs-dir): started once the server serves, resuming the
  // unfinished batches; stopped before the drain, its lines in flight answered and committed.
  void start_jobs();
  void stop_jobs();

  void handle(Request& request, std::shared_ptr<Responder> responder) override;
  // POST /v1/files streams its body to disk (files.cc); every other request is read whole.
  Stream stream(const Request& header) override;
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
    /// A batch job's line (execute_line): never promoted to interactive (batching::Job), and
    /// the tokens it queued are written here once it is admitted.
    bool job_line = false;
    int64_t* admitted_tokens = nullptr;
  };
  // What a finished request's answer is made of (runs on an I/O thread).
  using Format = std::function<Response(const batching::Job&)>;

  // The routes, one table: a request is matched against each pattern in order (match_path,
  // the one path parser); the first whose pattern and method match handles it. A path that
  // matches with another method is answered 405 with Allow; none, 404.
  struct Route {
    bhttp::verb verb;          ///< get (which also answers HEAD), post or delete_
    std::string_view pattern;  ///< "/v2/models/{model}/versions/{version}/infer"
    const char* method;        ///< the metrics' method label
    void (*handle)(HttpApi& api, const Request& request, Call call, const PathParams& params);
  };
  static const std::vector<Route>& routes();

 private:
  // Routes (each answers through call.responder exactly once).
  void openai_embeddings(const Request& request, Call call);
  // OpenAI's Files API (files.cc): POST /v1/files is streamed (stream()); with the jobs off,
  // every route answers 501 naming --jobs-dir.
  bool files_enabled(Call& call);
  std::optional<jobs::FileRecord> find_file(Call& call, const std::string& id);  // else 404
  void files_list(const Request& request, Call call);
  void files_get(Call call, const std::string& id);
  void files_content(Call call, const std::string& id);
  void files_delete(Call call, const std::string& id);
  // OpenAI's Batch API (batches.cc), over the same store and the runner.
  void batches_create(const Request& request, Call call);
  void batches_list(const Request& request, Call call);
  void batches_get(Call call, const std::string& id);
  void batches_cancel(Call call, const std::string& id);
  void write_batch(json::Writer& w, const jobs::BatchRecord& b);
  // Runs one batch line's body through POST /v1/embeddings in the bulk class, never promoted,
  // with the batch's expiry as its deadline; `done` gets its status and answer. Returns the
  // tokens it queued (0: refused at once).
  int64_t execute_line(const jobs::BatchRecord& batch, const jobs::BatchLine& line,
                       std::function<void(jobs::LineResult)> done);
  void openai_models(Call call);
  void openai_model(Call call, const std::string& id);  // GET /v1/models/{id}
  // A model that is not served, in OpenAI's words (the names it serves); other statuses as
  // they are.
  Status openai_not_found(const Status& found, const std::string& name) const;
  // Cohere's POST /v1/embed (`v2` false) and /v2/embed (cohere.cc).
  void cohere_embed(const Request& request, Call call, bool v2);
  void tei_embed(const Request& request, Call call, bool all_tokens);
  void tei_predict(const Request& request, Call call);
  void tei_tokenize(const Request& request, Call call);
  void tei_embed_chunks(const Request& request, Call call);
  void tei_info(Call call);
  // Submits a TEI route's request (its rows from body->inputs unless the route made them) with
  // TEI's timing headers on the answer that `answer` makes.
  void tei_submit(Call call, std::shared_ptr<const serving::ServedModel> served,
                  std::shared_ptr<TeiBody> body,
                  std::function<Response(const batching::Job&)> answer);
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
  // Queues what `convert` prepares (build) and answers with format(), or with the error in
  // call.api's shape. `convert` runs inside admission (counted in flight).
  // `param`: the field a refusal by `convert` is about when its Status names none (OpenAI's
  // error param; build() names it). The request goes to `model` (found by find()); format()
  // may use Intake::admitted(done).
  void submit(Call call, std::shared_ptr<const serving::ServedModel> model,
              std::function<Status(request::Prepared*)> convert, Format format,
              const std::string& param = {});
  // A route's wire names for what the request layer refuses by field: its rows ("input"), and
  // its names of dimensions, the embedding types and the prompt.
  struct WireNames {
    const char* rows;
    const char* dimensions = "dimensions";
    const char* embedding_types = "embedding_type";
    const char* prompt = "prompt_name";
  };
  // build_request on `input` for `model`, the refusal worded "<rows>[row]: ..." (or the field's
  // own name) as INVALID_ARGUMENT, with that name as its Status::field. `single`: the input was one
  // value, not an array.
  Status build(const serving::ServedModel& model, const request::EncodeInput& input,
               const WireNames& names, bool single, request::Prepared* out) const;
  // The bearer token check of every route (and of a streamed one, before its body).
  Status authorize(const Request& request, std::string_view path) const;
  // The headers every route takes into `call` (its deadline and priority), or why not.
  static Status read_headers(const Request& request, Call* call);
  // A body's refusal by the reader: INVALID_ARGUMENT, its field as OpenAI's param.
  void refuse_body(Call& call, const reader::Refusal& refusal);

  // The model version `name` (an alias or empty: the default model; Repository::find) and
  // `version` stand for; null, having answered the call with the reason, when none serves.
  std::shared_ptr<const serving::ServedModel> find(Call& call, std::string_view name,
                                                   const std::string& version = {},
                                                   const std::string& param = {});

  serving::Intake& intake_;
  const ApiOptions options_;
  const int64_t created_ = 0;             // /v1/models' "created": when the server started (Unix s)
  std::unique_ptr<jobs::Runner> runner_;  // with --jobs-dir; last: stopped first
};

using reader::Inputs;
// Appends the rows of `inputs` (views into it) to `input`.
void add_rows(const Inputs& inputs, request::EncodeInput* input);

// One embedding in `type` (request/quantize.h) as a JSON value: float as numbers, int8 and
// binary as signed integers, uint8 and ubinary as unsigned ones; with `base64`, the type's
// bytes as a base64 string (float32 little-endian for float). `range`: the calibrated range of
// int8 and uint8 (ServedModel::quantization_range).
void write_embedding(json::Writer& w, request::EmbeddingType type, std::span<const float> e,
                     const request::QuantizationRange* range, bool base64);

// Real tokens of a finished request (pads in id inputs are not counted; special tokens the
// tokenizer adds are): OpenAI's usage and Cohere's billed_units.
int64_t real_tokens(const batching::Job& r, int32_t pad);

// The response of `status` with `body` as application/json.
Response json_response(bhttp::status status, std::string body);
// A query parameter's value in a request target ("" when absent; not percent-decoded: ids and
// numbers).
std::string query_param(std::string_view target, std::string_view name);
// The `limit` query parameter of a list route: `fallback` when absent, else 1 to `max`;
// INVALID_ARGUMENT naming it otherwise.
Status query_limit(std::string_view target, int64_t fallback, int64_t max, int64_t* limit);
// OpenAI's list object, {"object": "list", "data": [...], "first_id", "last_id", "has_more"},
// over `items` (each with an `id`), each written by write(w, item).
template <class T, class Write>
void write_list(json::Writer& w, std::span<const T> items, bool has_more, Write write) {
  w.raw("{\"object\":\"list\",\"data\":[");
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) w.ch(',');
    write(w, items[i]);
  }
  w.raw("],\"first_id\":");
  items.empty() ? (void)w.raw("null") : (void)w.string(items.front().id);
  w.raw(",\"last_id\":");
  items.empty() ? (void)w.raw("null") : (void)w.string(items.back().id);
  w.raw(",\"has_more\":").raw(has_more ? "true" : "false").ch('}');
}
// The error body in `api`'s shape; `param` is OpenAI's param (the field), may be empty.
Response error_response(Api api, bhttp::status status, const std::string& message,
                        const std::string& param = {});
// The HTTP status that a gRPC status stands for in `api`.
bhttp::status http_status(Api api, const Status& status);

}  // namespace fastformer::http
