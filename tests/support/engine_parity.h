// Shared by the emulated-CUDA and the real-GPU engine tests: a mixed batch (lengths 1..700
// with interior pad tokens, plus an input-embeddings sequence) and the parity rule against
// the CPU engine: float32 within 1e-4 relative; float16/bfloat16 cosine >= 0.999 on pooled
// embeddings and the same argmax of the logits.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "server/engine/engine.h"

namespace fastformer::test {

struct ParityInputs {
  std::vector<std::vector<int32_t>> ids;
  std::vector<std::vector<float>> embeddings;
};

inline ParityInputs make_parity_inputs(const engine::ModelConfig& c,
                                       std::vector<int> lengths = {1, 7, 64, 300, 700}) {
  std::mt19937 rng(7);
  ParityInputs in;
  for (int n : lengths) {
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (auto& id : ids) id = 1 + int32_t(rng() % uint32_t(c.vocab_size - 1));
    if (n > 2) ids[size_t(n / 2)] = c.pad_token_id;  // an interior pad token
    in.ids.push_back(ids);
  }
  std::normal_distribution<float> normal;
  std::vector<float> rows(size_t(40 * c.hidden_size));
  for (auto& v : rows) v = normal(rng);
  in.embeddings.push_back(rows);
  return in;
}

inline std::vector<EncodedSequence> encode_all(engine::Engine& eng, const ParityInputs& in) {
  const engine::ModelConfig& c = eng.model().config();
  engine::RaggedBatch batch;
  for (const auto& ids : in.ids) batch.add({ids, {}}, c);
  for (const auto& rows : in.embeddings) batch.add({{}, rows}, c);
  OutputOptions options;
  options.token_embeddings = true;
  options.logits = eng.model().num_labels() > 0;
  return eng.encode(batch, {&options, 1});
}

inline double cosine(const std::vector<float>& a, const std::vector<float>& b) {
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ab += double(a[i]) * b[i];
    aa += double(a[i]) * a[i];
    bb += double(b[i]) * b[i];
  }
  return ab / std::sqrt(aa * bb);
}

inline double worst_relative_error(const std::vector<float>& x, const std::vector<float>& ref) {
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    worst =
        std::max(worst, std::abs(double(x[i]) - ref[i]) / std::max(1.0, std::abs(double(ref[i]))));
  }
  return worst;
}

// Checks `ours` (an engine serving `dtype`) against `reference` (the CPU engine).
inline void expect_parity(const std::vector<EncodedSequence>& ours,
                          const std::vector<EncodedSequence>& reference, const std::string& dtype) {
  ASSERT_EQ(ours.size(), reference.size());
  for (size_t s = 0; s < ours.size(); ++s) {
    const auto& a = ours[s];
    const auto& r = reference[s];
    ASSERT_EQ(a.num_tokens, r.num_tokens);
    ASSERT_EQ(a.embedding.size(), r.embedding.size());
    ASSERT_EQ(a.token_embeddings.size(), r.token_embeddings.size());
    ASSERT_EQ(a.logits.size(), r.logits.size());
    if (dtype == "float32") {
      EXPECT_LE(worst_relative_error(a.embedding, r.embedding), 1e-4)
          << "pooled embedding of sequence " << s;
      EXPECT_LE(worst_relative_error(a.token_embeddings, r.token_embeddings), 1e-4)
          << "tokens of sequence " << s;
      EXPECT_LE(worst_relative_error(a.logits, r.logits), 1e-4) << "logits of sequence " << s;
    } else {
      EXPECT_GE(cosine(a.embedding, r.embedding), 0.999) << dtype << " sequence " << s;
      if (!r.logits.empty()) {
        EXPECT_EQ(std::max_element(a.logits.begin(), a.logits.end()) - a.logits.begin(),
                  std::max_element(r.logits.begin(), r.logits.end()) - r.logits.begin())
            << dtype << " logits argmax of sequence " << s;
      }
    }
  }
}

}  // namespace fastformer::test
