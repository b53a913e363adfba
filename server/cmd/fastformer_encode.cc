// fastformer-encode: the offline encoder. Reads JSON lines (one sequence each: token ids, input
// embeddings, or a text that the model directory's tokenizer.json turns into ids), encodes
// them in ragged batches of at most --max-batch-tokens tokens, writes one JSON line per
// input line, in input order. A bad line stops the run with exit code 2 and a message
// naming its line number; every line before it has been written.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/defaults.h"
#include "common/jsonl_io.h"
#include "server/cmd/dtype_flag.h"
#include "server/engine/engine.h"
#include "server/engine/error.h"
#include "server/engine/model.h"
#include "server/request/encode_input.h"

namespace {

using namespace fastformer;

constexpr int kExitBadInput = 2;

// One parsed line, the request the request layer prepared from it and the job over that.
struct Pending {
  jsonl::InputLine line;
  std::shared_ptr<const request::Prepared> prepared;
  std::shared_ptr<batching::Job> request;
};

// The line through the server's request rules (server/request/encode_input.h): text, truncation,
// the vocabulary and position checks. Returns the line's error (without its number), if any.
std::optional<std::string> prepare_line(const engine::Model& model,
                                        const text::Tokenizer* tokenizer,
                                        request::Truncate truncate, const OutputOptions& options,
                                        std::optional<int32_t> macro_overlap,
                                        const request::VersionFiles& files,
                                        const std::optional<std::string>& prompt_name,
                                        Pending* pending) {
  const jsonl::InputLine& line = pending->line;
  request::EncodeInput input;
  input.truncate = truncate;
  input.macro_overlap_tokens = macro_overlap;
  input.options = options;
  input.prompt_name = prompt_name;
  input.rows.push_back((line.text                ? request::Row::from_text(*line.text)
                        : line.token_ids.empty() ? request::Row::embeddings(line.input_embeddings)
                                                 : request::Row::ids(line.token_ids))
                           .with_spans(line.spans));
  auto prepared = std::make_shared<request::Prepared>();
  const request::Limits one_line{std::numeric_limits<int64_t>::max()};  // --max-batch-tokens
  if (auto problem =
          request::build_request(input, model, tokenizer, one_line, prepared.get(), &files)) {
    return request::describe(*problem);
  }
  pending->prepared = prepared;
  pending->request = request::make_job(std::move(prepared));
  return std::nullopt;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fastformer-encode: embed JSON-lines sequences with a Fastformer model, no server"};
  std::string model_dir, backend_name = defaults::kBackend, input = "-", output = "-",
                         truncation = "none";
  OutputOptions out_options;
  engine::EngineOptions engine_options;  // the shared defaults (common/defaults.h)
  engine_options.dtype = engine::dtype_from_name(defaults::kDtype);
  app.add_option("--model-dir", model_dir, "model directory (config.json + model.safetensors)")
      ->required()
      ->envname("FASTFORMER_MODEL_DIR");
  app.add_option("--backend", backend_name, "auto, cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  add_dtype_flag(app, &engine_options.dtype,
                 "auto, float32, float16 or bfloat16 (auto: bfloat16 on a CPU with AVX512_BF16/AMX "
                 "or a GPU of compute capability 8.0+, float32 elsewhere)");
  app.add_option("--input", input, "input JSON lines, - for stdin")->capture_default_str();
  app.add_option("--output", output, "output JSON lines, - for stdout")->capture_default_str();
  app.add_flag("--return-token-embeddings", out_options.token_embeddings,
               "also write each token's final hidden state");
  app.add_flag("--return-logits", out_options.logits, "also write the classifier head's logits");
  app.add_flag("--normalize", out_options.normalize,
               "L2-normalise the pooled embedding (and each span's)");
  std::string span_pooling = "model";
  app.add_option("--span-pooling", span_pooling,
                 "how a line's \"spans\" are pooled: model (the model's attention pooler over "
                 "the span's tokens) or mean (their final states' mean)")
      ->check(CLI::IsMember({"model", "mean"}))
      ->capture_default_str();
  app.add_option("--truncation", truncation,
                 "sequences over max_position_embeddings: none (an error), right (keep the first "
                 "tokens), left (keep the last); a text keeps its special tokens")
      ->check(CLI::IsMember({"none", "right", "left"}))
      ->capture_default_str();
  std::optional<int32_t> macro_overlap;
  app.add_option("--macro-overlap-tokens", macro_overlap,
                 "macro-chunks: a line over max_position_embeddings P runs as passes of P tokens "
                 "overlapping by this many, each span pooled from the pass that holds it with the "
                 "most context, the line's embedding the mean of its passes' (unset: such a line "
                 "is an error)")
      ->check(CLI::NonNegativeNumber);
  std::optional<std::string> prompt_name;
  app.add_option("--prompt-name", prompt_name,
                 "one of the model's prompts (config_sentence_transformers.json) put before every "
                 "text line (docs/api.md, \"Prompts\"); unset: its default_prompt_name, if any");
  app.add_option("--max-batch-tokens", engine_options.max_batch_tokens,
                 "tokens per ragged batch (and the engine's buffer size)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--threads", engine_options.threads, "CPU threads, 0 = all cores")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  out_options.span_pooling = span_pooling == "mean" ? SpanPooling::kMean : SpanPooling::kModel;

  auto log = spdlog::stderr_color_st("encode");
  spdlog::set_default_logger(log);
  engine::parse_backend(backend_name, &engine_options.backend);

  std::shared_ptr<const engine::Model> model;
  std::shared_ptr<const text::Tokenizer> tokenizer;
  std::shared_ptr<const request::Prompts> prompts;
  std::unique_ptr<engine::Engine> eng;
  try {
    model = engine::Model::load(model_dir);
    tokenizer = text::load_tokenizer(model_dir, *model);
    prompts = request::Prompts::load(model_dir);
    std::string why;
    eng = engine::create_engine(model, engine_options, &why);
    spdlog::info("model {}: {} parameters ({}), backend {} ({}), max batch tokens {}",
                 model->config().model_name, model->parameter_count(), model->stored_dtype(),
                 eng->device_name(), why, eng->max_batch_tokens());
    if (engine_options.dtype == engine::Dtype::kAuto) {
      spdlog::info("dtype auto: {} ({})", engine::dtype_name(eng->dtype().dtype), eng->dtype().why);
    }
    if (tokenizer != nullptr) {
      spdlog::info("tokenizer: {}", tokenizer->description());
    }
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
  if (auto refused = request::check_options(out_options, *model)) {
    spdlog::error("--return-logits: {}", *refused);
    return kExitBadInput;
  }
  const request::Truncate truncate = truncation == "right"  ? request::Truncate::kRight
                                     : truncation == "left" ? request::Truncate::kLeft
                                                            : request::Truncate::kNone;
  const engine::ModelConfig& config = model->config();
  const int64_t D = config.hidden_size;

  std::ifstream in_file;
  std::istream* in = &std::cin;
  if (input != "-") {
    in_file.open(input);
    if (!in_file) {
      spdlog::error("--input {}: cannot open", input);
      return 1;
    }
    in = &in_file;
  }
  std::FILE* out = stdout;
  if (output != "-") {
    out = std::fopen(output.c_str(), "wb");
    if (out == nullptr) {
      spdlog::error("--output {}: cannot open for writing", output);
      return 1;
    }
  }

  std::vector<Pending> pending;  // lines of the batch being formed
  int64_t pending_tokens = 0;
  std::string buffer;
  auto flush = [&]() {
    if (pending.empty()) return;
    // The lines' sequences (a line over the positions has several: its macro-chunks) in
    // batches of at most --max-batch-tokens, then each line's result.
    engine::RaggedBatch batch;
    std::vector<std::pair<batching::Job*, size_t>> where;
    int64_t tokens = 0;
    auto run = [&]() {
      if (where.empty()) return;
      auto encoded = eng->encode(batch, {&out_options, 1});
      for (size_t i = 0; i < where.size(); ++i)
        where[i].first->results[where[i].second] = std::move(encoded[i]);
      batch = {};
      where.clear();
      tokens = 0;
    };
    for (const Pending& p : pending) {
      p.request->results.resize(p.request->sequences.size());
      for (size_t s = 0; s < p.request->sequences.size(); ++s) {
        const int64_t n = engine::sequence_length(p.request->sequences[s], D);
        if (tokens + n > eng->max_batch_tokens()) run();
        batch.add(p.request->sequences[s], config);
        where.emplace_back(p.request.get(), s);
        tokens += n;
      }
    }
    run();
    buffer.clear();
    for (const Pending& p : pending) {
      request::merge_passes(*p.prepared, p.request.get());
      jsonl::append_output_line(p.request->results[0], D, &buffer);
    }
    std::fwrite(buffer.data(), 1, buffer.size(), out);
    pending.clear();
    pending_tokens = 0;
  };

  // The model directory's prompts, as the server reads them (no quantization here: floats out).
  const request::VersionFiles files{prompts.get(), nullptr, {}};
  std::string line;
  int64_t line_number = 0, sequences = 0;
  int status = 0;
  try {
    while (std::getline(*in, line)) {
      ++line_number;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank line
      std::string error;
      std::optional<Pending> parsed;
      if (auto read = jsonl::parse_input_line(line, D, &error)) {
        parsed = Pending{std::move(*read), nullptr, nullptr};
        if (auto bad = prepare_line(*model, tokenizer.get(), truncate, out_options, macro_overlap,
                                    files, prompt_name, &*parsed)) {
          error = *bad;
          parsed.reset();
        }
      }
      int64_t n = 0, longest = 0;  // the line's tokens (its passes'), and its longest pass
      if (parsed) {
        for (const SequenceInput& s : parsed->request->sequences) {
          n += engine::sequence_length(s, D);
          longest = std::max(longest, engine::sequence_length(s, D));
        }
      }
      if (parsed && longest > eng->max_batch_tokens()) {
        error = "sequence of " + std::to_string(longest) + " tokens exceeds --max-batch-tokens " +
                std::to_string(eng->max_batch_tokens());
        parsed.reset();
      }
      if (!parsed) {
        flush();  // everything before the bad line is written
        spdlog::error("{}: line {}: {}", input == "-" ? "stdin" : input, line_number, error);
        status = kExitBadInput;
        break;
      }
      if (pending_tokens + n > eng->max_batch_tokens()) flush();
      pending.push_back(std::move(*parsed));
      pending_tokens += n;
      ++sequences;
    }
    if (status == 0) flush();
  } catch (const std::exception& e) {
    spdlog::error("encoding failed: {}", e.what());
    status = 1;
  }
  if (out != stdout)
    std::fclose(out);
  else
    std::fflush(out);
  if (status == 0) spdlog::info("encoded {} sequences", sequences);
  return status;
}
