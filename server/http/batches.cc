// OpenAI's Batch API (issue 50) over the jobs store and runner (server/jobs):
//   POST /v1/batches              {input_file_id, endpoint, completion_window, metadata}
//   GET  /v1/batches              the list, newest first (after, limit)
//   GET  /v1/batches/{id}         one batch object
//   POST /v1/batches/{id}/cancel
// A batch's lines run through POST /v1/embeddings (or Cohere's POST /v2/embed) itself
// (execute_line): the same reader, rules and answers as a live request, in the bulk class.
#include <simdjson.h>
#include <spdlog/spdlog.h>

#include <charconv>

#include "server/http/api.h"

namespace fastformer::http {
namespace {

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// POST /v1/batches' body.
struct NewBatch {
  std::string input_file_id, endpoint, completion_window;
  std::string metadata = "null";  // JSON
};

const std::vector<reader::Field<NewBatch>>& new_batch_fields() {
  using B = NewBatch;
  static const std::vector<reader::Field<B>> fields = {
      reader::string_field<B>(
          "input_file_id", [](B& b, std::string v) { b.input_file_id = std::move(v); }, true),
      reader::string_field<B>(
          "endpoint", [](B& b, std::string v) { b.endpoint = std::move(v); }, true),
      reader::string_field<B>(
          "completion_window", [](B& b, std::string v) { b.completion_window = std::move(v); },
          true),
      {"metadata",
       [](const simdjson::dom::element& v, B& b) -> reader::Why {
         simdjson::dom::object o;
         if (v.get_object().get(o) != simdjson::SUCCESS) return std::string("expected an object");
         size_t n = 0;
         for (const auto field : o) {
           if (++n > 16) return std::string("at most 16 keys");
           if (!field.value.is_string())
             return "\"" + std::string(field.key) + "\": expected a string";
         }
         b.metadata = simdjson::minify(v);
         return std::nullopt;
       }},
  };
  return fields;
}

void write_time(json::Writer& w, const char* name, int64_t t) {
  w.raw(",\"").raw(name).raw("\":");
  if (t > 0) {
    w.number(t);
  } else {
    w.raw("null");
  }
}

// The endpoints a batch may name: OpenAI's embeddings, and Cohere's v2 embed.
bool batch_endpoint(std::string_view endpoint) {
  return endpoint == "/v1/embeddings" || endpoint == "/v2/embed";
}

// What an embeddings answer counted (OpenAI's usage.prompt_tokens, Cohere's
// meta.billed_units.input_tokens), 0 if it says none.
int64_t prompt_tokens_of(const std::string& body) {
  thread_local simdjson::dom::parser parser;
  simdjson::dom::element doc;
  if (parser.parse(body).get(doc) != simdjson::SUCCESS) return 0;
  int64_t n = 0;
  if (doc.at_pointer("/usage/prompt_tokens").get(n) == simdjson::SUCCESS) return n;
  if (doc.at_pointer("/meta/billed_units/input_tokens").get(n) == simdjson::SUCCESS) return n;
  return 0;
}

// A batch line's answer, taken as the endpoint gives it to a client.
class LineResponder final : public Responder {
 public:
  explicit LineResponder(std::function<void(jobs::LineResult)> done) : done_(std::move(done)) {}
  void send(Response response) override {
    jobs::LineResult r{int(response.result_int()), std::move(response.body()), 0};
    if (r.status_code == 200) r.prompt_tokens = prompt_tokens_of(r.body);
    done_(std::move(r));
  }
  void send_file(Response, std::string) override {
    done_({500, R"({"error":{"message":"a file answer in a batch"}})", 0});
  }
  void post(std::function<void()> work) override { work(); }

 private:
  std::function<void(jobs::LineResult)> done_;
};

}  // namespace

void HttpApi::write_batch(json::Writer& w, const jobs::BatchRecord& b) {
  w.raw("{\"id\":").string(b.id).raw(",\"object\":\"batch\",\"endpoint\":").string(b.endpoint);
  w.raw(",\"model\":null,\"errors\":").raw(b.errors_json.empty() ? "null" : b.errors_json);
  w.raw(",\"input_file_id\":").string(b.input_file_id);
  w.raw(",\"completion_window\":\"24h\",\"status\":").string(jobs::batch_status_name(b.status));
  // The output and error files once the batch made them (recorded when it ended).
  auto file = [&](const char* name, const std::string& id) {
    w.raw(",\"").raw(name).raw("\":");
    const auto f = id.empty() ? std::nullopt : options_.jobs->file(id);
    if (f && (f->bytes > 0 || std::string_view(name) == "output_file_id")) {
      w.string(id);
    } else {
      w.raw("null");
    }
  };
  file("output_file_id", b.output_file_id);
  file("error_file_id", b.error_file_id);
  write_time(w, "created_at", b.created_at);
  write_time(w, "in_progress_at", b.in_progress_at);
  write_time(w, "expires_at", b.expires_at);
  write_time(w, "finalizing_at", b.finalizing_at);
  write_time(w, "completed_at", b.completed_at);
  write_time(w, "failed_at", b.failed_at);
  write_time(w, "expired_at", b.expired_at);
  write_time(w, "cancelling_at", b.cancelling_at);
  write_time(w, "cancelled_at", b.cancelled_at);
  w.raw(",\"request_counts\":{\"total\":")
      .number(b.total)
      .raw(",\"completed\":")
      .number(b.completed);
  w.raw(",\"failed\":").number(b.failed).raw("},\"metadata\":").raw(b.metadata_json);
  w.raw(",\"usage\":{\"input_tokens\":").number(b.prompt_tokens);
  w.raw(",\"input_tokens_details\":{\"cached_tokens\":0},\"output_tokens\":0");
  w.raw(",\"output_tokens_details\":{\"reasoning_tokens\":0},\"total_tokens\":");
  w.number(b.total_tokens).raw("}}");
}

int64_t HttpApi::execute_line(const jobs::BatchRecord& batch, const jobs::BatchLine& line,
                              std::function<void(jobs::LineResult)> done) {
  const bool cohere = batch.endpoint == "/v2/embed";
  Request request{bhttp::verb::post, cohere ? "/v2/embed" : "/v1/embeddings", 11};
  request.set(bhttp::field::content_type, "application/json");
  request.body() = line.body;
  // The batch's window is the line's deadline (not the bulk class's --bulk-timeout-ms).
  const auto start = batching::Clock::now();
  const auto deadline =
      batch.expires_at > 0
          ? start + std::chrono::seconds(std::max<int64_t>(1, batch.expires_at - unix_now()))
          : batching::Clock::time_point::max();
  int64_t tokens = 0;
  Call call{cohere ? "batch POST /v2/embed" : "batch POST /v1/embeddings",
            cohere ? Api::kCohere : Api::kOpenAI,
            start,
            std::make_shared<LineResponder>(std::move(done)),
            deadline,
            batching::Priority::kBulk,
            /*job_line=*/true,
            &tokens};
  if (cohere) {
    cohere_embed(request, std::move(call), /*v2=*/true);
  } else {
    openai_embeddings(request, std::move(call));
  }
  return tokens;
}

void HttpApi::batches_create(const Request& request, Call call) {
  if (!files_enabled(call)) return;
  NewBatch body;
  if (auto refused = reader::read_body(request, new_batch_fields(), &body))
    return refuse_body(call, *refused);
  if (!batch_endpoint(body.endpoint)) {
    return fail(call,
                invalid_argument("endpoint: '" + body.endpoint +
                                 "' is not served here: only /v1/embeddings and /v2/embed (this is "
                                 "an encoder)"),
                "endpoint");
  }
  if (body.completion_window != "24h") {
    return fail(call,
                invalid_argument("completion_window: expected \"24h\", got '" +
                                 body.completion_window + "'"),
                "completion_window");
  }
  const auto input = options_.jobs->file(body.input_file_id);
  if (!input) {
    return fail(call, {StatusCode::kNotFound, "No such File object: " + body.input_file_id},
                "input_file_id");
  }
  if (input->purpose != "batch") {
    return fail(call,
                invalid_argument("input_file_id: " + input->id + " has purpose '" + input->purpose +
                                 "', not 'batch'"),
                "input_file_id");
  }
  jobs::BatchRecord b;
  b.id = jobs::Store::new_id("batch_");
  b.endpoint = body.endpoint;
  b.input_file_id = input->id;
  b.metadata_json = body.metadata;
  b.created_at = unix_now();
  b.expires_at = b.created_at + options_.files.completion_window_s;
  if (Status s = options_.jobs->add_batch(b); !s.ok()) return fail(call, s);
  spdlog::info("batch {}: validating {} ({} bytes)", b.id, input->id, input->bytes);
  intake_.metrics().set_jobs(options_.jobs->count_by_status());
  runner_->notify();
  json::Writer w;
  write_batch(w, b);
  answer(call, json_response(bhttp::status::ok, w.take()), Status());
}

void HttpApi::batches_get(Call call, const std::string& id) {
  if (!files_enabled(call)) return;
  const auto b = options_.jobs->batch(id);
  if (!b) return fail(call, {StatusCode::kNotFound, "No such Batch object: " + id}, "id");
  json::Writer w;
  write_batch(w, *b);
  answer(call, json_response(bhttp::status::ok, w.take()), Status());
}

void HttpApi::batches_list(const Request& request, Call call) {
  if (!files_enabled(call)) return;
  const std::string after = query_param(request.target(), "after");
  int64_t limit = 0;
  if (Status s = query_limit(request.target(), 20, 100, &limit); !s.ok())
    return fail(call, s, "limit");
  const std::vector<jobs::BatchRecord> page = options_.jobs->batches(after, limit + 1);
  const size_t n = std::min(page.size(), size_t(limit));
  json::Writer w;
  write_list(w, std::span<const jobs::BatchRecord>(page).first(n), page.size() > n,
             [this](json::Writer& out, const jobs::BatchRecord& b) { write_batch(out, b); });
  answer(call, json_response(bhttp::status::ok, w.take()), Status());
}

void HttpApi::batches_cancel(Call call, const std::string& id) {
  if (!files_enabled(call)) return;
  if (Status s = runner_->cancel(id); !s.ok()) return fail(call, s, "id");
  batches_get(std::move(call), id);
}

void HttpApi::start_jobs() {
  if (runner_) runner_->start();
}

void HttpApi::stop_jobs() {
  if (runner_) runner_->stop();
}

}  // namespace fastformer::http
