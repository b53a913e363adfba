// The plain sequence and result types shared by the engine, the server and the clients'
// JSON-lines I/O: what a caller hands in for one sequence, what it asks back, and what it
// gets. No model, batch or transport knowledge here.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace fastformer {

// A range of a sequence's tokens [begin, end), counted as the sequence is (special tokens
// included): a chunk of a long document pooled into its own embedding (late chunking).
struct TokenSpan {
  int32_t begin = 0;
  int32_t end = 0;
};

// One sequence as a caller hands it in: exactly one of the two inputs is non-empty.
struct SequenceInput {
  std::span<const int32_t> token_ids;       ///< token ids, pad_token_id marks padding
  std::span<const float> input_embeddings;  ///< [n, hidden_size] row-major, all real tokens
  /// Token ranges to pool one embedding each from this sequence's single pass (late
  /// chunking); they may overlap. Empty: none.
  std::span<const TokenSpan> spans = {};
};

// How a span's tokens are pooled: the model's attention pooler restricted to the span (its
// softmax over the span's tokens), or the mean of their final states.
enum class SpanPooling { kModel, kMean };

// What a caller wants back for one sequence.
struct OutputOptions {
  bool token_embeddings = false;  ///< the last layer's hidden state of every token
  bool logits = false;            ///< the classifier head's output (when the model has one)
  bool normalize = false;         ///< L2-normalise the pooled embedding
  /// The first `dimensions` values of the pooled embedding (re-normalised to length 1 when
  /// `normalize`); 0: all of them. Applied by the request layer (request::apply_dimensions)
  /// once the engine has computed the whole embedding.
  int64_t dimensions = 0;
  /// How the sequence's spans (SequenceInput::spans) are pooled; normalize and dimensions apply
  /// to each span's embedding as to the pooled one.
  SpanPooling span_pooling = SpanPooling::kModel;
};

// What the engine returns for one sequence.
struct EncodedSequence {
  std::vector<float> embedding;         ///< pooled [D] (normalised when asked)
  std::vector<float> token_embeddings;  ///< [n, D] when asked
  std::vector<float> logits;            ///< [num_labels] when asked and present
  std::vector<float> span_embeddings;   ///< [spans, D], one per SequenceInput::spans, in order
  int32_t num_tokens = 0;               ///< tokens in the sequence, pads included
};

}  // namespace fastformer
