// One admitted Encode call (or one EncodeStream message) as the batcher sees it: its
// sequences, what to return, its deadline, and where its answers go. Nothing here knows
// gRPC; the rpc layer fills a Request from the proto and converts the results back.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/engine/engine.h"
#include "server/engine/ragged_batch.h"

namespace fastformer::batching {

using Clock = std::chrono::steady_clock;

// Nanoseconds from `from` to now (0 if the clock has not moved past it).
inline uint64_t ns_since(Clock::time_point from) {
  return uint64_t(std::max<int64_t>(
      0, std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - from).count()));
}

// How a request ended. There is no "shutting down": the drain answers every admitted request
// (or, at the shutdown timeout, the process exits without them), and calls refused while
// draining never reach the queue.
enum class Outcome { kOk, kDeadlineExceeded, kCancelled, kEngineFailure };

// A request's priority class (docs/operations.md, "Priority classes"): a batch takes the
// interactive sequences first, in arrival order, and fills the rest of its budget with bulk
// ones; a bulk sequence that has waited the queue's bulk_promote_after is batched as an
// interactive one. Each class has its own queue limit.
enum class Priority : uint8_t { kInteractive = 0, kBulk = 1 };
inline constexpr int kPriorityClasses = 2;
// "interactive", "bulk".
const char* priority_name(Priority priority);
// The class a name denotes ("interactive" or "bulk"), or nothing.
std::optional<Priority> parse_priority(std::string_view name);

struct Request {
  std::vector<SequenceInput> sequences;        ///< views into storage the caller keeps alive
  OutputOptions options;                       ///< what to return for every sequence
  Clock::time_point arrival{};                 ///< when the request was admitted
  uint64_t input_ns = 0;                       ///< time the API layer took to convert the call
  std::vector<std::vector<int32_t>> text_ids;  ///< ids made by the intake (texts, narrowed ids)
  std::vector<std::vector<TokenSpan>> spans;   ///< chunks made by the intake (windows), per row
  /// Spans a protocol converted from its wire types (rows view them); kept as long as the rows.
  std::vector<std::vector<TokenSpan>> given_spans;
  std::vector<std::vector<TokenSpan>> given_char_spans;  ///< the same, character spans
  /// A chunked text row's tokens' character ranges (code points; empty for other rows), for
  /// each chunk's character range in the answer.
  std::vector<std::vector<std::pair<uint32_t, uint32_t>>> text_offsets;
  /// Rows tokenized after a prompt: where its tokens are in each (at, count; empty when no
  /// row has one). The caller's token positions skip them (text::PromptTokens).
  std::vector<std::pair<int32_t, int32_t>> prompt_tokens;
  /// Rows longer than max_position_embeddings run as several passes (macro-chunks,
  /// EncodeInput::macro_overlap_tokens). Empty when every row is one sequence; else one entry
  /// per row, and `rows` holds the rows as sent (the whole ids, spans in the row's positions),
  /// which request::merge_passes puts back in `sequences` once their results are merged.
  struct RowPasses {
    int32_t first = 0;  ///< the row's first sequence
    int32_t count = 1;  ///< its sequences (passes)
    // With count > 1 (a row of one sequence needs none of these):
    std::vector<int32_t> starts;      ///< each pass's first token in the row
    std::vector<int32_t> span_pass;   ///< per span of the row: the pass it is pooled from
    std::vector<int32_t> span_index;  ///< and its index among that pass's spans
  };
  std::vector<RowPasses> passes;
  std::vector<SequenceInput> rows;
  /// The rows as the protocols read them: `sequences`, or `rows` while they are split.
  const std::vector<SequenceInput>& row_inputs() const { return passes.empty() ? sequences : rows; }
  int64_t texts = 0;         ///< text sequences tokenized by the API layer
  uint64_t tokenize_ns = 0;  ///< the time that took
  Clock::time_point deadline = Clock::time_point::max();  ///< the call's deadline
  /// The class the call asked for (a protocol's field or parameter, the x-priority header,
  /// Cohere's input_type); unset: the model's default. The intake resolves it into `priority`.
  std::optional<Priority> asked_priority;
  Priority priority = Priority::kInteractive;  ///< its class
  std::function<bool()> is_cancelled;          ///< true once the client gave up (may be empty)
  // Called exactly once, from the engine or batcher thread, when the request ends.
  std::function<void(Request&)> on_complete;
  // What the request was admitted to (the model version), kept alive until its answer is
  // made: the API layer releases it then (rpc::Intake::complete), or finish_request does.
  mutable std::shared_ptr<const void> owner;

  // Filled in as the request runs.
  std::vector<EncodedSequence> results;  ///< one per sequence, in order
  Outcome outcome = Outcome::kOk;
  std::string error;                  ///< why, for kEngineFailure
  Clock::time_point first_compute{};  ///< start of the first batch holding it
  int64_t compute_us = 0;             ///< summed compute time of its batches
  int64_t tokens = 0;                 ///< sum of sequence lengths

  // Internal bookkeeping of the batcher.
  std::atomic<int32_t> remaining{0};  ///< sequences not yet computed
  std::atomic<bool> finished{false};  ///< on_complete has been (or is being) called
  std::mutex mu;                      ///< guards results, compute_us and ending
};

// Ends `request` with `outcome` unless it already ended; returns true if this call ended it.
bool finish_request(Request& request, Outcome outcome, std::string error = {});

}  // namespace fastformer::batching
