// What build_request makes of one request (encode_input.h): the sequences the batcher computes
// and everything they view, owned here. A Prepared is built once, in place, and then only read:
// it is held as std::shared_ptr<const Prepared> (the batching::Job's keep-alive), never copied
// or moved, so the views into its own storage stay valid for as long as anything holds it, and
// the protocol's storage (a proto, a JSON body) is free once build_request returns.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "server/batching/job.h"
#include "server/engine/engine.h"

namespace fastformer::request {

// How a row longer than max_position_embeddings runs as several passes (macro-chunks,
// EncodeInput::macro_overlap_tokens).
struct RowPasses {
  int32_t first = 0;  ///< the row's first sequence
  int32_t count = 1;  ///< its sequences (passes)
  // With count > 1 (a row of one sequence needs none of these):
  std::vector<int32_t> starts;      ///< each pass's first token in the row
  std::vector<int32_t> span_pass;   ///< per span of the row: the pass it is pooled from
  std::vector<int32_t> span_index;  ///< and its index among that pass's spans
};

class Prepared : public batching::KeepAlive {
 public:
  Prepared() = default;
  Prepared(const Prepared&) = delete;  // the views point into this object's storage
  Prepared& operator=(const Prepared&) = delete;

  /// What the batcher computes: one sequence per row, or a split row's passes.
  std::vector<SequenceInput> sequences;
  /// The rows as sent (their whole ids, spans in the row's positions): what the protocols
  /// answer per row, and `sequences` once request::merge_passes put a split row back.
  std::vector<SequenceInput> rows;
  /// Empty when every row is one sequence; else one plan per row.
  std::vector<RowPasses> passes;
  OutputOptions options;  ///< what to return for every row
  /// The class the call asked for (a protocol's field or parameter, Cohere's input_type);
  /// unset: the header's (HTTP), else the model's default. The serving core resolves it.
  std::optional<batching::Priority> priority;
  bool promotable = true;  ///< batching::Job::promotable (false: a batch job's line)
  /// A chunked text row's tokens' character ranges (code points; empty for other rows), for
  /// each chunk's character range in the answer (chunk_characters).
  std::vector<std::vector<std::pair<uint32_t, uint32_t>>> text_offsets;
  /// Rows tokenized after a prompt: where its tokens are in each (at, count; empty when no
  /// row has one). The caller's token positions skip them (caller_tokens).
  std::vector<std::pair<int32_t, int32_t>> prompt_tokens;
  int64_t texts = 0;         ///< text rows tokenized here
  uint64_t tokenize_ns = 0;  ///< the time that took

  // The storage `sequences` and `rows` view: each inner vector's buffer is filled before a view
  // is taken and never changed after, so it stays where it is however the outer vector grows.
  std::vector<std::vector<int32_t>> ids;       ///< token ids: tokenized, or copied as sent
  std::vector<std::vector<float>> embeddings;  ///< input embeddings, copied as sent
  std::vector<std::vector<TokenSpan>> spans;   ///< spans: the caller's copied, chunks, passes'
};

// A job for the batcher over `prepared`: its sequences and options, holding it.
inline std::shared_ptr<batching::Job> make_job(std::shared_ptr<const Prepared> prepared) {
  auto job = std::make_shared<batching::Job>();
  job->sequences = prepared->sequences;
  job->options = prepared->options;
  job->keep = std::move(prepared);
  return job;
}

}  // namespace fastformer::request
