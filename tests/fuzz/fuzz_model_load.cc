// Fuzz target: a model directory (config.json + model.safetensors) through Model::load, the
// loader the server runs at start-up. Any input must either load or throw ModelError;
// a model that loads must encode a short sequence on the CPU engine.
//
// Input: the config.json text, the marker line "\n--model.safetensors--\n", then the bytes
// of model.safetensors (no marker: the whole input is config.json and the weights file is
// empty). Both files are written to a scratch directory (tmpfs when there is one).
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "server/engine/engine.h"
#include "server/engine/error.h"
#include "server/engine/model.h"
#include "tests/fuzz/fuzz_input.h"

namespace {

using namespace fastformer;

constexpr std::string_view kMarker = "\n--model.safetensors--\n";

std::filesystem::path scratch_dir() {
  static const std::filesystem::path dir = [] {
    const std::filesystem::path shm = "/dev/shm";
    std::string tmpl = ((std::filesystem::is_directory(shm) && ::access(shm.c_str(), W_OK) == 0)
                            ? shm
                            : std::filesystem::temp_directory_path()) /
                       "fastformer_fuzz_model_XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) std::abort();
    std::filesystem::path p = tmpl;
    static const std::string keep = p.string();
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(keep, ec);
    });
    return p;
  }();
  return dir;
}

void write(const std::filesystem::path& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) std::abort();
}

// A loaded model serves: one short sequence through the CPU engine.
void encode_once(std::shared_ptr<const engine::Model> model) {
  const engine::ModelConfig& c = model->config();
  engine::EngineOptions options;
  options.backend = engine::Backend::kCpu;
  options.threads = 1;
  options.max_batch_tokens = 8;
  auto eng = engine::create_engine(model, options);
  const int64_t n = std::min<int64_t>(3, c.max_position_embeddings);
  std::vector<int32_t> ids;
  std::vector<float> embeddings;
  SequenceInput input;
  if (model->has_word_embedding()) {
    for (int64_t t = 0; t < n; ++t) ids.push_back(int32_t((c.pad_token_id + 1 + t) % c.vocab_size));
    if (ids[0] == c.pad_token_id) ids[0] = int32_t((c.pad_token_id + 1) % c.vocab_size);
    input.token_ids = ids;
  } else {
    embeddings.assign(size_t(n * c.hidden_size), 0.5f);
    input.input_embeddings = embeddings;
  }
  if (engine::validate_sequence(c, model->has_word_embedding(), input, 0))
    return;  // vocab 1, all pad
  engine::RaggedBatch batch;
  batch.add(input, c);
  OutputOptions out;
  out.token_embeddings = true;
  out.logits = model->num_labels() > 0;
  const auto results = eng->encode(batch, {&out, 1});
  FUZZ_CHECK(results.size() == 1);
  FUZZ_CHECK(int64_t(results[0].embedding.size()) == c.hidden_size);
  FUZZ_CHECK(int64_t(results[0].token_embeddings.size()) == n * c.hidden_size);
  FUZZ_CHECK(int64_t(results[0].logits.size()) == model->num_labels());
  FUZZ_CHECK(results[0].num_tokens == n);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t cut = input.find(kMarker);
  const std::string_view config = cut == std::string_view::npos ? input : input.substr(0, cut);
  const std::string_view weights =
      cut == std::string_view::npos ? std::string_view{} : input.substr(cut + kMarker.size());
  const std::filesystem::path dir = scratch_dir();
  write(dir / "config.json", config);
  write(dir / "model.safetensors", weights);
  std::shared_ptr<const engine::Model> model;
  try {
    model = engine::Model::load(dir);
  } catch (const engine::ModelError&) {
    return 0;  // refused with a message: the expected outcome for a bad directory
  }
  // Loaded: the weights are consistent with config.json.
  const engine::ModelWeights& w = model->weights();
  FUZZ_CHECK(int64_t(w.layers.size()) == model->config().num_hidden_layers);
  FUZZ_CHECK(w.position_embeddings != nullptr);
  FUZZ_CHECK(model->parameter_count() > 0);
  encode_once(model);
  return 0;
}
