// fastformer-loadgen: load for fastformer-server, with latency percentiles (perf_analyzer's
// job, for long-sequence encoding).
//
//   closed loop  --concurrency N          N requests in flight (or N streams with --stream)
//   open loop    --rate R [--arrivals]    R requests/s, Poisson or constant gaps, never waiting
//   sweeps       --sweep-concurrency 1:64:x2, --sweep-rate 100:1000:+100 (one step each value)
//
// Requests hold --sequences-per-request sequences of --lengths tokens, ids drawn as
// fastformer-bench draws them (vocab_size from GetModelInfo), or the texts of a file (--texts,
// one a line, tokenized by the server; tokens counted from the answers). Each step: --warmup
// seconds unmeasured, then --duration seconds measured; see client/loadgen/load_runner.h for
// exactly what is counted. Output: a line of text per step, or --json (an object per line), and
// --csv.
//
// Exit codes: 0 the run completed (whatever the server answered), 1 the server could not be
// reached at the start, 2 bad flags.
#include <CLI/CLI.hpp>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "client/cmd/connection_flags.h"
#include "client/loadgen/load_runner.h"
#include "client/loadgen/load_spec.h"
#include "client/loadgen/request_pool.h"
#include "client/loadgen/step_report.h"
#include "fastformer/client.h"

namespace {

using namespace fastformer;
using cli::kExitFailure;
using cli::kExitUsage;

constexpr const char* kProgram = "fastformer-loadgen";

struct Flags {
  int concurrency = 1;
  double rate = 0;
  std::string arrivals = "poisson";
  double duration_s = 10;
  double warmup_s = 2;
  std::string lengths = "uniform:16:256";
  std::string texts;  ///< a file of texts, one a line: sent instead of token ids
  std::string truncation = "none";
  std::string priority = "default";  ///< EncodeRequest.priority
  int sequences_per_request = 1;
  int pool_requests = 256;
  std::string model_name, model_version;
  bool stream = false;
  bool token_embeddings = false;  // ask for more than the pooled embedding, as a caller may
  bool logits = false;
  std::string sweep_concurrency;
  std::string sweep_rate;
  uint64_t seed = 1;
  int32_t pad_token_id = 0;
  bool json = false;
  std::string csv;
};

// The steps of the run, from the flags; false (reported) on a bad sweep.
bool make_steps(const Flags& f, const cli::ConnectionFlags& connection,
                std::vector<loadgen::LoadStep>* steps) {
  loadgen::LoadStep base;
  base.open_loop = f.rate > 0 || !f.sweep_rate.empty();
  base.concurrency = f.concurrency;
  base.rate = f.rate;
  base.poisson = f.arrivals == "poisson";
  base.stream = f.stream;
  base.warmup_s = f.warmup_s;
  base.duration_s = f.duration_s;
  base.deadline = Milliseconds(connection.deadline_ms);
  base.seed = f.seed;
  std::vector<double> values;
  std::string error;
  if (!f.sweep_concurrency.empty()) {
    if (!loadgen::parse_sweep(f.sweep_concurrency, /*integers=*/true, &values, &error)) {
      cli::print_error(kProgram, "--sweep-concurrency: " + error);
      return false;
    }
    for (double v : values) {
      base.concurrency = int(v);
      steps->push_back(base);
    }
  } else if (!f.sweep_rate.empty()) {
    if (!loadgen::parse_sweep(f.sweep_rate, /*integers=*/false, &values, &error)) {
      cli::print_error(kProgram, "--sweep-rate: " + error);
      return false;
    }
    for (double v : values) {
      base.rate = v;
      steps->push_back(base);
    }
  } else {
    steps->push_back(base);
  }
  return true;
}

// The lines of --texts that hold more than blanks; false (reported) when there are none.
bool read_texts(const std::string& path, std::vector<std::string>* texts) {
  std::ifstream in(path);
  if (!in) {
    cli::print_error(kProgram, "--texts " + path + ": cannot open");
    return false;
  }
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") != std::string::npos) texts->push_back(std::move(line));
  }
  if (texts->empty()) cli::print_error(kProgram, "--texts " + path + ": no text in it");
  return !texts->empty();
}

// The workload must fit the model and the server's limits; false (reported) when it cannot.
bool check_workload(const Flags& f, const loadgen::LengthsSpec& lengths,
                    const v1::ModelInfo& info) {
  if (!f.texts.empty()) {
    // Text lengths are known only after the server's tokenizer: over-long ones fail as errors.
    if (!info.accepts_text()) {
      cli::print_error(kProgram, "--texts: the model " + info.model_name() +
                                     " has no tokenizer.json, so it takes no text");
      return false;
    }
    return true;
  }
  if (!info.accepts_token_ids()) {
    cli::print_error(kProgram,
                     "the model has no word embedding table (it takes input_embeddings); "
                     "the load generator sends token ids");
    return false;
  }
  if (info.vocab_size() < 2) {
    cli::print_error(kProgram, "the model's vocab_size " + std::to_string(info.vocab_size()) +
                                   " leaves no token id besides the pad token");
    return false;
  }
  if (lengths.max_length() > int64_t(info.max_position_embeddings())) {
    cli::print_error(kProgram, "--lengths " + f.lengths + ": sequences of up to " +
                                   std::to_string(lengths.max_length()) +
                                   " tokens exceed the model's max_position_embeddings " +
                                   std::to_string(info.max_position_embeddings()));
    return false;
  }
  const int64_t request_tokens = lengths.max_length() * f.sequences_per_request;
  if (info.max_request_tokens() > 0 && request_tokens > int64_t(info.max_request_tokens())) {
    cli::print_error(kProgram, "--lengths " + f.lengths + " x --sequences-per-request " +
                                   std::to_string(f.sequences_per_request) + ": up to " +
                                   std::to_string(request_tokens) +
                                   " tokens a request exceed the server's max_request_tokens " +
                                   std::to_string(info.max_request_tokens()));
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "fastformer-loadgen: closed- and open-loop load for fastformer-server, with latency "
      "percentiles, throughput and the server's queue and compute time"};
  cli::ConnectionFlags connection;
  cli::add_connection_flags(app, connection);
  Flags f;
  auto* concurrency = app.add_option("--concurrency", f.concurrency,
                                     "closed loop: requests in flight; with --stream, streams "
                                     "(one request in flight on each in closed loop)")
                          ->check(CLI::PositiveNumber)
                          ->capture_default_str();
  auto* rate = app.add_option("--rate", f.rate, "open loop: requests per second")
                   ->check(CLI::PositiveNumber);
  app.add_option("--arrivals", f.arrivals, "open loop: poisson or constant gaps between sends")
      ->check(CLI::IsMember({"poisson", "constant"}))
      ->capture_default_str();
  app.add_option("--duration", f.duration_s, "measured seconds per step")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--warmup", f.warmup_s, "unmeasured seconds before each step")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  auto* lengths_option = app.add_option("--lengths", f.lengths,
                                        "sequence lengths: fixed:L, uniform:MIN:MAX or file:PATH "
                                        "(one length a line, drawn uniformly)")
                             ->capture_default_str();
  app.add_option("--texts", f.texts,
                 "send the texts of this file (one a line, in order, cycled) instead of token "
                 "ids; the model needs a tokenizer.json")
      ->excludes(lengths_option);
  app.add_option("--truncation", f.truncation,
                 "over-long sequences: none (an error), right (keep the first tokens), left "
                 "(keep the last)")
      ->check(CLI::IsMember({"none", "right", "left"}))
      ->capture_default_str();
  app.add_option("--priority", f.priority,
                 "the requests' priority class (EncodeRequest.priority; default: the model's)")
      ->check(CLI::IsMember({"default", "interactive", "bulk"}))
      ->capture_default_str();
  app.add_option("--sequences-per-request", f.sequences_per_request, "sequences in each request")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--model-name", f.model_name,
                 "the model to load (EncodeRequest.model_name; empty: the server's default)");
  app.add_option("--model-version", f.model_version, "its version (empty: the newest READY one)");
  app.add_option("--pool-requests", f.pool_requests, "distinct requests made up front and cycled")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_flag("--stream", f.stream, "send on EncodeStream calls instead of unary Encode");
  app.add_flag("--return-token-embeddings", f.token_embeddings,
               "ask for every token's final hidden state too (larger answers)");
  app.add_flag("--return-logits", f.logits, "ask for the classifier head's logits too");
  auto* sweep_concurrency = app.add_option("--sweep-concurrency", f.sweep_concurrency,
                                           "closed-loop steps A:B:xF or A:B:+S, e.g. 1:64:x2")
                                ->excludes(rate)
                                ->excludes(concurrency);
  app.add_option("--sweep-rate", f.sweep_rate, "open-loop steps (requests/s) A:B:xF or A:B:+S")
      ->excludes(rate)
      ->excludes(sweep_concurrency);
  app.add_option("--seed", f.seed, "seed of the token ids and of Poisson arrivals")
      ->capture_default_str();
  app.add_option("--pad-token-id", f.pad_token_id, "the model's pad token: never sent")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_flag("--json", f.json, "print one JSON object per step (a line each)");
  app.add_option("--csv", f.csv, "also write one CSV row per step to this file");
  if (auto code = cli::parse_command_line(app, argc, argv)) return *code;

  std::vector<loadgen::LoadStep> steps;
  if (!make_steps(f, connection, &steps)) return kExitUsage;
  loadgen::LengthsSpec lengths;
  std::string error;
  if (!loadgen::parse_lengths_spec(f.lengths, &lengths, &error)) {
    cli::print_error(kProgram, "--lengths: " + error);
    return kExitUsage;
  }
  std::vector<std::string> texts;
  if (!f.texts.empty() && !read_texts(f.texts, &texts)) return kExitUsage;
  std::ofstream csv;
  if (!f.csv.empty()) {
    csv.open(f.csv, std::ios::trunc);
    if (!csv) {
      cli::print_error(kProgram, "--csv " + f.csv + ": cannot open for writing");
      return kExitUsage;
    }
  }
  const std::unique_ptr<Client> client = cli::make_client(connection, kProgram);
  if (!client) return kExitUsage;

  v1::ModelInfo info;
  if (const grpc::Status status =
          client->GetModelInfo(&info, std::nullopt, f.model_name, f.model_version);
      !status.ok()) {
    cli::print_error(kProgram, "cannot reach the server at " + connection.target +
                                   ": GetModelInfo failed: " + cli::describe(status));
    return kExitFailure;
  }
  if (!check_workload(f, lengths, info)) return kExitUsage;
  if (f.logits && info.num_labels() == 0) {
    cli::print_error(kProgram,
                     "--return-logits: the model " + info.model_name() + " has no classifier head");
    return kExitUsage;
  }
  auto pool =
      texts.empty()
          ? loadgen::make_request_pool(lengths, info.vocab_size(), f.pad_token_id,
                                       f.sequences_per_request, f.pool_requests, f.seed)
          : loadgen::make_text_request_pool(texts, f.sequences_per_request, f.pool_requests);
  const v1::Truncation truncation = f.truncation == "right"  ? v1::TRUNCATION_RIGHT
                                    : f.truncation == "left" ? v1::TRUNCATION_LEFT
                                                             : v1::TRUNCATION_UNSPECIFIED;
  const v1::Priority priority = f.priority == "interactive" ? v1::PRIORITY_INTERACTIVE
                                : f.priority == "bulk"      ? v1::PRIORITY_BULK
                                                            : v1::PRIORITY_DEFAULT;
  for (auto& pooled : pool) {
    pooled.request.set_return_token_embeddings(f.token_embeddings);
    pooled.request.set_return_logits(f.logits);
    pooled.request.set_truncation(truncation);
    pooled.request.set_priority(priority);
    pooled.request.set_model_name(f.model_name);
    pooled.request.set_model_version(f.model_version);
  }
  const std::string workload = texts.empty() ? f.lengths : "texts:" + f.texts;
  const loadgen::RunInfo run{workload, f.sequences_per_request};
  if (!f.json) {
    std::cout << kProgram << ": " << connection.target << ", model " << info.model_name() << " ("
              << info.backend() << ", " << info.device() << "), "
              << (texts.empty() ? "lengths " + f.lengths
                                : std::to_string(texts.size()) + " texts of " + f.texts)
              << ", " << f.sequences_per_request << " sequences a request, " << steps.size()
              << (steps.size() == 1 ? " step" : " steps") << " of " << f.warmup_s << " s warm-up + "
              << f.duration_s << " s" << std::endl;
  }
  if (csv.is_open()) csv << loadgen::csv_header(steps.front().open_loop) << "\n" << std::flush;
  for (const auto& step : steps) {
    const loadgen::StepResult result = loadgen::run_step(*client, pool, step);
    std::cout << (f.json ? loadgen::step_json(result, run) : loadgen::step_text(result))
              << std::endl;
    if (csv.is_open()) csv << loadgen::csv_row(result) << "\n" << std::flush;
  }
  return 0;
}
