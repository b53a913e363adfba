// One admitted Encode call (or one EncodeStream message) as the batcher sees it: its
// sequences, what to return, its deadline, and where its answers go. Nothing here knows
// gRPC; the rpc layer fills a Job from the proto and converts the results back.
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

// What a job's sequences view, kept alive and unchanged by the job until it ends. Whoever
// makes jobs derives the owner of that storage from it (request::Prepared, which the serving
// core extends with the model version the job was admitted to).
class KeepAlive {
 public:
  virtual ~KeepAlive() = default;
};

// One admitted request (an Encode call, a stream message, an HTTP request) as the batcher
// computes it: its sequences, what to return, its class and deadline, and where its answers go.
struct Job {
  std::vector<SequenceInput> sequences;  ///< views into *keep (or, when keep is null, the
                                         ///< caller's storage: the batcher's own tests)
  OutputOptions options;                 ///< what to return for every sequence
  Clock::time_point arrival{};           ///< when the request was admitted
  uint64_t input_ns = 0;                 ///< time the API layer took to convert the call
  Clock::time_point deadline = Clock::time_point::max();  ///< the call's deadline
  Priority priority = Priority::kInteractive;             ///< its class
  /// false: never batched as interactive after bulk_promote_after (a batch job's line: it has
  /// a 24 h window, and must not go ahead of queries); bulk work behind it still is.
  bool promotable = true;
  std::function<bool()> is_cancelled;  ///< true once the client gave up (may be empty)
  // Called exactly once, from the engine or batcher thread, when the job ends.
  std::function<void(Job&)> on_complete;
  /// What `sequences` view, immutable, and what the job was admitted to: held until its answer
  /// is made (serving::Intake::complete releases it then; else it goes with the job).
  mutable std::shared_ptr<const KeepAlive> keep;

  // Filled in as the job runs.
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

// Ends `job` with `outcome` unless it already ended; returns true if this call ended it.
bool finish_job(Job& job, Outcome outcome, std::string error = {});

}  // namespace fastformer::batching
