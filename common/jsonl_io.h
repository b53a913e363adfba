// The JSON-lines formats of fastformer-encode and fastformer-client encode.
//
// Input, one sequence a line: {"token_ids": [1, 2, 3]}, {"input_embeddings": [[...], ...]} or
// {"text": "..."} (tokenized by whoever encodes it: fastformer-encode, or the server).
// Any of them may carry "spans": [[begin, end], ...], token ranges (special tokens counted) to
// pool an embedding each from the sequence's one pass (late chunking).
// Output, in input order: {"embedding": [...], "num_tokens": n} plus "token_embeddings"
// ([[...], ...]), "logits" ([...]) and "span_embeddings" ([[...], ...], one per span) when
// asked.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/sequence.h"

namespace fastformer::jsonl {

// A parsed input line; owns the storage the SequenceInput view points at.
struct InputLine {
  std::vector<int32_t> token_ids;
  std::vector<float> input_embeddings;  ///< flattened rows
  int64_t rows = 0;                     ///< embedding rows
  std::optional<std::string> text;      ///< a text line (not empty), to be tokenized
  std::vector<TokenSpan> spans;         ///< "spans": [[begin, end], ...] token ranges to pool

  SequenceInput view() const { return {token_ids, input_embeddings, spans}; }
};

// Parses one line. On failure returns nullopt and sets `error` (without the line number).
// `hidden_size` checks that every embedding row has the model's width.
std::optional<InputLine> parse_input_line(const std::string& line, int64_t hidden_size,
                                          std::string* error);

// Appends one output line (with its trailing newline) to `out`.
void append_output_line(const EncodedSequence& seq, int64_t hidden_size, std::string* out);

}  // namespace fastformer::jsonl
