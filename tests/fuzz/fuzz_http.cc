// Fuzz target: HTTP bytes (start line, headers, body) -> Boost.Beast's request parser, as the
// listener runs it (body and header limits) -> the routes of server/http/api.h (OpenAI, TEI,
// KServe v2 REST) -> the intake and the batch queue -> the CPU engine -> the response. Every
// request is answered exactly once: a parse failure with the transport's refusal, anything
// else with a status and, for errors, a JSON body in the route's shape. Nothing accepted is
// lost: after the queue is drained every admitted request has its answer.
//
// Input: byte 0 picks the model (bits 0-1), max_request_tokens (bits 2-3) and
// max_request_inputs (bits 4-5); the rest is the HTTP request. The models are those of
// fuzz_models.h, named "ids_head", "embeddings_only", "pad5_f16" and "shared_bf16"; the
// served name "alias" is accepted besides each one's own.
#include <array>
#include <boost/beast/core/buffers_to_string.hpp>
#include <boost/beast/http/parser.hpp>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/batching/scheduler.h"
#include "server/http/api.h"
#include "server/metrics/metrics.h"
#include "tests/fuzz/fuzz_input.h"
#include "tests/fuzz/fuzz_models.h"

using namespace fastformer;
namespace bhttp = boost::beast::http;

namespace {

// Where the answer of one request goes: kept for the checks; post() runs the work at once.
struct Capture final : http::Responder {
  std::vector<http::Response> answers;
  void send(http::Response response) override { answers.push_back(std::move(response)); }
  void send_file(http::Response head, std::string path) override {
    head.body() = "<file " + path + ">";
    answers.push_back(std::move(head));
  }
  void post(std::function<void()> work) override { work(); }
};

// Scheduler::run_batch completes the batches drained from the intake's queue on this thread;
// the completer's own queue is closed and empty, so its threads end at once.
struct Completer {
  batching::BatchQueue idle;
  std::optional<batching::Scheduler> scheduler;
  explicit Completer(fuzz::Served& served) : idle(batching::QueueLimits{}, served.model->config()) {
    idle.close();
    scheduler.emplace(idle, *served.engine);
    scheduler->join();
  }
};

Completer& completer(size_t model) {
  static std::array<std::unique_ptr<Completer>, 4> completers;
  if (!completers[model])
    completers[model] = std::make_unique<Completer>(fuzz::served_models()[model]);
  return *completers[model];
}

metrics::Metrics& shared_metrics() {
  static metrics::Metrics m;
  return m;
}

// An error answer is JSON in its API's shape (an "error" key; Cohere's routes: "message"), never
// empty. The KServe readiness probes (GET /v2/health/ready, /v2/models/{model}[/versions/
// {version}]/ready) answer "not ready", an unknown model's included, as Triton does: 400 with
// no body (tritonclient's is_server_ready and is_model_ready read the status only).
void check_answer(const http::Response& r, std::string_view target) {
  const unsigned status = unsigned(r.result());
  FUZZ_CHECK(status >= 200 && status < 600);
  if (status < 400) return;
  const std::string_view path = target.substr(0, target.find('?'));
  if (status == 400 && r.body().empty() && path.starts_with("/v2/") && path.ends_with("/ready"))
    return;
  FUZZ_CHECK(r[bhttp::field::content_type] == "application/json");
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  FUZZ_CHECK(!parser.parse(r.body()).get(root));
  simdjson::dom::element error;
  FUZZ_CHECK(!root["error"].get(error) || !root["message"].get(error));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::FuzzInput in(data, size);
  const uint8_t choice = in.byte();
  const size_t which = choice & 3;
  fuzz::Served& served = fuzz::served_models()[which];
  const engine::ModelConfig& c = served.model->config();

  batching::QueueLimits q;
  q.max_batch_tokens = fuzz::kMaxBatchTokens;
  q.max_batch_sequences = 3;
  q.max_queue_tokens = 1 << 20;
  // One model version without files or a lane: this thread forms and runs its batches.
  auto version = std::make_shared<serving::ServedModel>();
  version->name = c.model_name;
  // (GCC 12 misreads a literal assign to a string member here: -Wrestrict)
  static const std::string kVersion = "1", kNoDir = "/nonexistent";
  version->version = kVersion;
  version->dir = kNoDir;  // no labels: LABEL_i
  version->model = served.model;
  version->engine = std::shared_ptr<engine::Engine>(served.engine.get(), [](engine::Engine*) {});
  version->queue = std::make_unique<batching::BatchQueue>(q, c);
  version->settings.max_batch_sequences = 8;
  version->settings.max_batch_tokens = fuzz::kMaxBatchTokens;
  serving::ServiceConfig& config = version->config;
  config.limits.max_request_tokens = std::array<int64_t, 4>{1, 16, 40, 64}[(choice >> 2) & 3];
  config.limits.max_request_inputs = std::array<int64_t, 4>{0, 1, 3, 8}[(choice >> 4) & 3];
  config.tokenizer = served.tokenizer;
  static const std::string kServerVersion = "fuzz";
  config.version = kServerVersion;
  batching::BatchQueue& queue = *version->queue;
  repository::RepositoryOptions repository_options;
  repository_options.aliases = {"alias"};  // --served-model-name
  repository::Repository repository(repository_options, shared_metrics());
  repository.serve(std::move(version));
  serving::Intake intake(shared_metrics());
  intake.start_serving(repository, "fuzz");
  http::HttpApi api(intake, http::ApiOptions{});

  // The listener's parser, with its limits scaled to the fuzzer's inputs.
  bhttp::request_parser<bhttp::string_body> parser;
  parser.header_limit(4096);
  parser.body_limit(16384);
  const std::string_view bytes = in.rest();
  boost::beast::error_code ec;
  size_t used = 0;
  while (!ec && used < bytes.size() && !parser.is_done()) {
    used += parser.put(boost::asio::buffer(bytes.data() + used, bytes.size() - used), ec);
    if (ec == bhttp::error::need_more) {
      ec = {};
      break;
    }
  }
  // A connection closed before its first byte carries no request, and the listener answers
  // none (Beast's read ends with end_of_stream); put_eof asserts got_some() in builds with
  // assertions (the Debug-plus-O1 sanitizer tree), so it is not called then.
  if (!ec && !parser.got_some()) return 0;
  if (!ec && !parser.is_done()) parser.put_eof(ec);
  auto capture = std::make_shared<Capture>();
  std::string target;
  if (ec || !parser.is_done()) {
    target = parser.is_header_done() ? std::string(parser.get().target()) : "";
    capture->send(api.refuse(target, bhttp::status::bad_request, "malformed HTTP request"));
    target.clear();  // a refusal is an error in JSON whatever its target
  } else {
    http::Request request = parser.release();
    target = std::string(request.target());
    api.handle(request, capture);
  }
  // Drain what was admitted: every admitted request is answered, none twice.
  queue.close();
  while (auto batch = queue.next_batch()) completer(which).scheduler->run_batch(*batch, 0);
  FUZZ_CHECK(intake.inflight() == 0);
  FUZZ_CHECK(capture->answers.size() == 1);
  check_answer(capture->answers[0], target);
  return 0;
}
