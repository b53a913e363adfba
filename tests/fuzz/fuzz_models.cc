#include "tests/fuzz/fuzz_models.h"

#include <cmath>
#include <filesystem>
#include <fstream>

#include "server/batching/queue.h"
#include "tests/fuzz/fuzz_input.h"
#include "tests/support/test_models.h"

namespace fastformer::fuzz {
namespace {

void check_batch(const batching::Batch& batch, const engine::ModelConfig& c,
                 bool has_word_embedding) {
  const engine::RaggedBatch& r = batch.ragged;
  const int32_t B = r.num_sequences(), T = r.num_tokens();
  FUZZ_CHECK(B == int32_t(batch.entries.size()) && B > 0);
  FUZZ_CHECK(T == batch.tokens);
  FUZZ_CHECK(T <= kMaxBatchTokens || B == 1);  // over the budget only alone
  FUZZ_CHECK(r.token_ids.size() == size_t(T) && r.mask.size() == size_t(T));
  FUZZ_CHECK(r.position_ids.size() == size_t(T) && r.embedding_index.size() == size_t(T));
  FUZZ_CHECK(r.input_embeddings.size() % size_t(c.hidden_size) == 0);
  const auto rows = int32_t(r.input_embeddings.size() / size_t(c.hidden_size));
  for (int32_t b = 0; b < B; ++b) {
    const int32_t begin = r.cu_seqlens[size_t(b)], end = r.cu_seqlens[size_t(b) + 1];
    FUZZ_CHECK(begin < end && end - begin <= c.max_position_embeddings);
    bool any_real = false;
    for (int32_t t = begin; t < end; ++t) {
      FUZZ_CHECK(r.position_ids[size_t(t)] == t - begin);
      const int32_t id = r.token_ids[size_t(t)];
      if (id == engine::kEmbeddingRow) {
        const int32_t row = r.embedding_index[size_t(t)];
        FUZZ_CHECK(row >= 0 && row < rows && r.mask[size_t(t)] == 1);
      } else {
        FUZZ_CHECK(has_word_embedding && id >= 0 && id < c.vocab_size);
        FUZZ_CHECK(r.mask[size_t(t)] == (id != c.pad_token_id));
      }
      any_real |= r.mask[size_t(t)] != 0;
    }
    FUZZ_CHECK(any_real);
  }
}

// Text for models 0 and 2: a notebook-style WordLevel (lower-case, wordpunct split, truncation
// to 6 tokens) and a BERT-style WordPiece whose "[PAD]" is model 2's pad id 5 (a text of pads).
const char* const kWordLevel = R"({"truncation": {"max_length": 6, "direction": "Right"},
  "normalizer": {"type": "Lowercase"},
  "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "\\w+|[^\\w\\s]+"}, "behavior": "Isolated", "invert": false},
  "model": {"type": "WordLevel", "unk_token": "[UNK]",
            "vocab": {"PADDING": 0, "[UNK]": 1, "a": 2, "b": 3, "c": 4, ".": 5, "é": 6, "ab": 7, "1": 8, "!?": 9}}})";
const char* const kWordPiece = R"({"added_tokens": [
    {"id": 5, "content": "[PAD]", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
    {"id": 1, "content": "[CLS]", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
    {"id": 2, "content": "[SEP]", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}],
  "normalizer": {"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true, "strip_accents": null, "lowercase": true},
  "pre_tokenizer": {"type": "BertPreTokenizer"},
  "post_processor": {"type": "BertProcessing", "sep": ["[SEP]", 2], "cls": ["[CLS]", 1]},
  "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##", "max_input_chars_per_word": 8,
            "vocab": {"[UNK]": 0, "[CLS]": 1, "[SEP]": 2, "a": 3, "##b": 4, "[PAD]": 5, "b": 6, "##a": 7, ".": 8, "e": 9}}})";
const char* const kTokenizers[] = {kWordLevel, nullptr, kWordPiece, nullptr};

}  // namespace

std::vector<Served>& served_models() {
  static std::vector<Served> served = [] {
    static test::TempDir dir;
    std::vector<test::TinyModelSpec> specs(4);
    for (auto& s : specs) {
      s.hidden = 8;
      s.heads = 2;
      s.layers = 1;
      s.intermediate = 8;
      s.max_positions = kMaxPositions;
      s.vocab = 12;
    }
    specs[0].num_labels = 3;          // token ids, classifier head
    specs[1].word_embedding = false;  // input embeddings only
    specs[2].pad_token_id = 5;        // a pad id that is not 0, bare names, F16
    specs[2].bare = true;
    specs[2].dtype = engine::DType::kF16;
    specs[3].shared_layers = true;  // shared layers, BF16, relu
    specs[3].layers = 2;
    specs[3].dtype = engine::DType::kBF16;
    specs[3].activation = "relu";
    const char* const kNames[] = {"ids_head", "embeddings_only", "pad5_f16", "shared_bf16"};
    std::vector<Served> out;
    for (size_t i = 0; i < specs.size(); ++i) {
      Served s;
      const std::filesystem::path model_dir =
          test::write_tiny_model(dir.path(), kNames[i], specs[i]);
      if (kTokenizers[i] != nullptr) std::ofstream(model_dir / "tokenizer.json") << kTokenizers[i];
      s.model = engine::Model::load(model_dir);
      s.tokenizer = text::load_tokenizer(model_dir, *s.model);
      engine::EngineOptions options;
      options.backend = engine::Backend::kCpu;
      options.threads = 1;
      options.max_batch_tokens = 4 * kMaxPositions;
      s.engine = engine::create_engine(s.model, options);
      out.push_back(std::move(s));
    }
    return out;
  }();
  return served;
}

void run_request(Served& served, const std::shared_ptr<batching::Job>& request) {
  const engine::Model& model = *served.model;
  const engine::ModelConfig& c = model.config();
  int completions = 0;
  request->on_complete = [&](batching::Job&) { ++completions; };
  batching::QueueLimits q;
  q.max_batch_tokens = kMaxBatchTokens;
  q.max_batch_sequences = 3;
  q.max_queue_tokens = 1 << 20;
  batching::BatchQueue queue(q, c);
  FUZZ_CHECK(queue.push(request) == batching::Admission::kAdmitted);
  queue.close();
  int64_t batched = 0;
  while (auto batch = queue.next_batch()) {
    check_batch(*batch, c, model.has_word_embedding());
    const auto results = served.engine->encode(batch->ragged, batch->options);
    FUZZ_CHECK(results.size() == batch->entries.size());
    for (size_t b = 0; b < results.size(); ++b) {
      const EncodedSequence& e = results[b];
      const SequenceInput& s = request->sequences[size_t(batch->entries[b].index)];
      FUZZ_CHECK(e.num_tokens == engine::sequence_length(s, c.hidden_size));
      FUZZ_CHECK(int64_t(e.embedding.size()) == c.hidden_size);
      FUZZ_CHECK(int64_t(e.logits.size()) == (request->options.logits ? model.num_labels() : 0));
      FUZZ_CHECK(int64_t(e.token_embeddings.size()) ==
                 (request->options.token_embeddings ? e.num_tokens * c.hidden_size : 0));
      // Token ids look up bounded weights: their embeddings are finite. (Caller-supplied
      // embeddings may be as large as a float goes; those are theirs to keep finite.)
      if (!s.token_ids.empty()) {
        for (float v : e.embedding) FUZZ_CHECK(std::isfinite(v));
      }
      request->results[size_t(batch->entries[b].index)] = e;
    }
    batched += int64_t(batch->entries.size());
  }
  FUZZ_CHECK(batched == int64_t(request->sequences.size()));
  FUZZ_CHECK(queue.queued_tokens() == 0 && completions == 0);
}

}  // namespace fastformer::fuzz
