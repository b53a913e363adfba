#include "server/engine/ragged_batch.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace fastformer::engine {

int64_t sequence_length(const SequenceInput& s, int64_t hidden_size) {
  if (!s.token_ids.empty()) return static_cast<int64_t>(s.token_ids.size());
  return static_cast<int64_t>(s.input_embeddings.size()) / std::max<int64_t>(hidden_size, 1);
}

std::string id_outside_vocabulary(int64_t id, int64_t vocab_size) {
  return "has id " + std::to_string(id) + ", outside [0, vocab_size " + std::to_string(vocab_size) +
         ")";
}

std::optional<InputError> validate_sequence(const ModelConfig& c, bool has_word_embedding,
                                            const SequenceInput& s, size_t index) {
  auto error = [&](const char* field, std::string message) {
    return InputError{index, field, std::move(message)};
  };
  const bool has_ids = !s.token_ids.empty();
  const bool has_embeddings = !s.input_embeddings.empty();
  if (has_ids && has_embeddings) {
    return error("token_ids", "set either token_ids or input_embeddings, not both");
  }
  if (!has_ids && !has_embeddings) {
    return error("token_ids", "empty sequence: send at least one token id or embedding row");
  }
  const std::string max_len = std::to_string(c.max_position_embeddings);
  if (has_ids) {
    if (!has_word_embedding) {
      return error("token_ids",
                   "this model has no word embedding table; send input_embeddings instead");
    }
    if (static_cast<int64_t>(s.token_ids.size()) > c.max_position_embeddings) {
      return error("token_ids", std::to_string(s.token_ids.size()) +
                                    " tokens exceed max_position_embeddings " + max_len);
    }
    bool any_real = false;
    for (size_t t = 0; t < s.token_ids.size(); ++t) {
      const int32_t id = s.token_ids[t];
      if (id < 0 || id >= c.vocab_size) {
        return error("token_ids",
                     "token " + std::to_string(t) + " " + id_outside_vocabulary(id, c.vocab_size));
      }
      any_real |= id != c.pad_token_id;
    }
    if (!any_real) {
      return error("token_ids", "every token is the pad token (pad_token_id " +
                                    std::to_string(c.pad_token_id) + "): nothing to encode");
    }
    return validate_spans(c, s, index);
  }
  const int64_t D = c.hidden_size;
  if (static_cast<int64_t>(s.input_embeddings.size()) % D != 0) {
    return error("input_embeddings", std::to_string(s.input_embeddings.size()) +
                                         " values is not a whole number of rows of hidden_size " +
                                         std::to_string(D));
  }
  const int64_t n = static_cast<int64_t>(s.input_embeddings.size()) / D;
  if (n > c.max_position_embeddings) {
    return error("input_embeddings",
                 std::to_string(n) + " rows exceed max_position_embeddings " + max_len);
  }
  for (size_t i = 0; i < s.input_embeddings.size(); ++i) {
    if (!std::isfinite(s.input_embeddings[i])) {
      return error("input_embeddings", "row " + std::to_string(i / D) + " column " +
                                           std::to_string(i % D) + " is not finite (NaN or Inf)");
    }
  }
  return validate_spans(c, s, index);
}

std::optional<InputError> validate_spans(const ModelConfig& c, const SequenceInput& s,
                                         size_t index) {
  const int64_t n = sequence_length(s, c.hidden_size);
  for (size_t i = 0; i < s.spans.size(); ++i) {
    const TokenSpan span = s.spans[i];
    const std::string what = "span " + std::to_string(i) + " [" + std::to_string(span.begin) +
                             ", " + std::to_string(span.end) + ")";
    auto error = [&](const std::string& why) {
      return InputError{index, "spans", what + " " + why};
    };
    if (span.begin < 0 || span.end > n)
      return error("is outside the sequence's " + std::to_string(n) + " tokens [0, " +
                   std::to_string(n) + ")");
    if (span.end < span.begin) return error("is reversed (end before begin)");
    if (span.end == span.begin) return error("is empty");
    if (!s.token_ids.empty()) {
      bool any_real = false;
      for (int32_t t = span.begin; t < span.end && !any_real; ++t)
        any_real = s.token_ids[size_t(t)] != c.pad_token_id;
      if (!any_real)
        return error("holds only pad tokens (pad_token_id " + std::to_string(c.pad_token_id) +
                     "): nothing to pool");
    }
  }
  return std::nullopt;
}

void RaggedBatch::add(const SequenceInput& s, const ModelConfig& c) {
  const int32_t start = cu_seqlens.back();
  int32_t n;
  if (!s.token_ids.empty()) {
    n = static_cast<int32_t>(s.token_ids.size());
    for (int32_t id : s.token_ids) {
      token_ids.push_back(id);
      embedding_index.push_back(-1);
      mask.push_back(id != c.pad_token_id ? 1 : 0);
    }
    for (int32_t t = 0; t < n; ++t) position_ids.push_back(t);
  } else {
    n = static_cast<int32_t>(s.input_embeddings.size() / c.hidden_size);
    const int32_t first_row = static_cast<int32_t>(input_embeddings.size() / c.hidden_size);
    input_embeddings.insert(input_embeddings.end(), s.input_embeddings.begin(),
                            s.input_embeddings.end());
    for (int32_t t = 0; t < n; ++t) {
      token_ids.push_back(kEmbeddingRow);
      embedding_index.push_back(first_row + t);
      mask.push_back(1);
      position_ids.push_back(t);
    }
  }
  cu_seqlens.push_back(start + n);
  for (const TokenSpan& span : s.spans) spans.push_back({start + span.begin, start + span.end});
  span_first.push_back(static_cast<int32_t>(spans.size()));
}

RaggedBatch RaggedBatch::sequences(int32_t first, int32_t last, int64_t hidden_size) const {
  RaggedBatch part;
  const int32_t row0 = cu_seqlens[size_t(first)], row1 = cu_seqlens[size_t(last)];
  auto rows = [&](const auto& v) { return std::vector(v.begin() + row0, v.begin() + row1); };
  part.token_ids = rows(token_ids);
  part.mask = rows(mask);
  part.position_ids = rows(position_ids);
  part.embedding_index = rows(embedding_index);
  // A sequence's input embeddings are consecutive rows (add), so the part's are one range.
  int32_t e0 = -1, e1 = -1;
  for (int32_t& e : part.embedding_index) {
    if (e < 0) continue;
    if (e0 < 0) e0 = e;
    e1 = e + 1;
    e -= e0;
  }
  if (e0 >= 0) {
    part.input_embeddings.assign(input_embeddings.begin() + e0 * hidden_size,
                                 input_embeddings.begin() + e1 * hidden_size);
  }
  for (int32_t b = first; b < last; ++b)
    part.cu_seqlens.push_back(cu_seqlens[size_t(b) + 1] - row0);
  for (int32_t i = span_first[size_t(first)]; i < span_first[size_t(last)]; ++i)
    part.spans.push_back({spans[size_t(i)].begin - row0, spans[size_t(i)].end - row0});
  for (int32_t b = first; b < last; ++b)
    part.span_first.push_back(span_first[size_t(b) + 1] - span_first[size_t(first)]);
  return part;
}

void RaggedBatch::clear() {
  cu_seqlens.assign(1, 0);
  token_ids.clear();
  embedding_index.clear();
  input_embeddings.clear();
  mask.clear();
  position_ids.clear();
  spans.clear();
  span_first.assign(1, 0);
}

}  // namespace fastformer::engine
