// fastformer_emulated_encode (a test tool, not shipped): fastformer-encode's JSON-lines input
// and output (common/jsonl_io.h), computed by the CUDA engine on the host emulation
// (server/engine/cuda/emulated_engine.h) in --dtype. It lets a test run the CUDA engine's
// reduced-precision numerics on a real model without a GPU (tests/demo). Inputs are trusted
// test files: a bad line stops the run with exit code 2 and nothing is written for it.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "common/defaults.h"
#include "common/jsonl_io.h"
#include "server/cmd/dtype_flag.h"
#include "server/engine/cuda/emulated_engine.h"
#include "server/engine/engine.h"
#include "server/engine/model.h"

namespace {

using namespace fastformer;

constexpr int kExitBadInput = 2;

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "fastformer_emulated_encode: fastformer-encode on the emulated CUDA engine (tests only)"};
  std::string model_dir, input = "-", output = "-";
  OutputOptions out_options;
  engine::EngineOptions engine_options;
  engine_options.max_batch_tokens = 4096;
  // As fastformer-encode: auto, the CUDA engine's pick for its device (the emulation is an
  // sm_90 device, so bfloat16).
  engine_options.dtype = engine::dtype_from_name(defaults::kDtype);
  app.add_option("--model-dir", model_dir, "model directory (config.json + model.safetensors)")
      ->required();
  add_dtype_flag(app, &engine_options.dtype, "the CUDA engine's dtype (auto: bfloat16 here)");
  app.add_option("--input", input, "input JSON lines, - for stdin")->capture_default_str();
  app.add_option("--output", output, "output JSON lines, - for stdout")->capture_default_str();
  app.add_flag("--return-logits", out_options.logits, "also write the classifier head's logits");
  app.add_option("--max-batch-tokens", engine_options.max_batch_tokens, "tokens per ragged batch")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_flag("--normalize", out_options.normalize,
               "L2-normalise the pooled embedding (and each span's)");
  std::string span_pooling = "model";
  app.add_option("--span-pooling", span_pooling, "a line's spans pooled by: model or mean")
      ->check(CLI::IsMember({"model", "mean"}))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  out_options.span_pooling = span_pooling == "mean" ? SpanPooling::kMean : SpanPooling::kModel;

  std::shared_ptr<const engine::Model> model;
  std::unique_ptr<engine::Engine> eng;
  try {
    model = engine::Model::load(model_dir);
    eng = engine::cuda::create_emulated_cuda_engine(model, engine_options);
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
  const engine::ModelConfig& config = model->config();
  const int64_t D = config.hidden_size;

  std::ifstream in_file;
  if (input != "-") {
    in_file.open(input);
    if (!in_file) {
      std::cerr << "--input " << input << ": cannot open\n";
      return 1;
    }
  }
  std::istream& in = input == "-" ? std::cin : in_file;

  // Every line is read and checked before any is encoded: the emulation is slow, and a bad
  // test file should fail at once.
  std::vector<jsonl::InputLine> lines;
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    std::string error;
    auto parsed = jsonl::parse_input_line(line, D, &error);
    if (parsed) {
      if (auto bad =
              engine::validate_sequence(config, model->has_word_embedding(), parsed->view(), 0)) {
        error = bad->field + ": " + bad->message;
      } else if (engine::sequence_length(parsed->view(), D) > eng->max_batch_tokens()) {
        error = "longer than --max-batch-tokens";
      }
    }
    if (!error.empty()) {
      std::cerr << (input == "-" ? "stdin" : input) << ": line " << number << ": " << error << "\n";
      return kExitBadInput;
    }
    lines.push_back(std::move(*parsed));
  }

  std::FILE* out = output == "-" ? stdout : std::fopen(output.c_str(), "wb");
  if (out == nullptr) {
    std::cerr << "--output " << output << ": cannot open for writing\n";
    return 1;
  }
  const auto start = std::chrono::steady_clock::now();
  int64_t tokens = 0;
  std::string buffer;
  try {
    for (size_t first = 0; first < lines.size();) {
      engine::RaggedBatch batch;
      size_t last = first;
      while (last < lines.size() &&
             batch.num_tokens() + engine::sequence_length(lines[last].view(), D) <=
                 eng->max_batch_tokens()) {
        batch.add(lines[last++].view(), config);
      }
      buffer.clear();
      for (const auto& seq : eng->encode(batch, {&out_options, 1}))
        jsonl::append_output_line(seq, D, &buffer);
      std::fwrite(buffer.data(), 1, buffer.size(), out);
      tokens += batch.num_tokens();
      first = last;
    }
  } catch (const std::exception& e) {
    std::cerr << "encoding failed: " << e.what() << "\n";
    return 1;
  }
  if (out != stdout)
    std::fclose(out);
  else
    std::fflush(out);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cerr << eng->device_name() << ": " << lines.size() << " sequences, " << tokens
            << " tokens in " << seconds << " s\n";
  return 0;
}
