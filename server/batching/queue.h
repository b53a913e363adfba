// The admission queue and the batch-forming rule.
//
// Requests are admitted whole (or not at all) and split into sequences, queued in arrival
// order. A batch takes sequences from the head, in order, while it stays within the token
// and sequence budgets; a sequence longer than the token budget runs alone. Sequences of
// expired, cancelled or already failed requests are dropped at the head, before compute.
// Nothing overtakes an earlier sequence: an entry that does not fit stays at the head.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "common/defaults.h"
#include "server/batching/request.h"

namespace fastformer::batching {

struct QueueLimits {
  int64_t max_batch_tokens = defaults::kMaxBatchTokens;        ///< token budget of one batch
  int64_t max_batch_sequences = defaults::kMaxBatchSequences;  ///< sequence budget of one batch
  int64_t max_queue_tokens = defaults::kMaxQueueTokens;  ///< admitted but not yet batched tokens
  std::chrono::microseconds max_queue_delay{
      defaults::kMaxQueueDelayUs};  ///< how long a non-full batch may wait
};

// One queued sequence.
struct QueueEntry {
  std::shared_ptr<Request> request;  ///< the request it belongs to
  int32_t index = 0;                 ///< its position in the request
  int64_t tokens = 0;                ///< its length
  Clock::time_point queued_at{};     ///< when it was admitted
};

struct Batch {
  std::vector<QueueEntry> entries;     ///< in queue order
  engine::RaggedBatch ragged;          ///< the staged input, entries[i] is sequence i
  std::vector<OutputOptions> options;  ///< per sequence
  int64_t tokens = 0;
};

// Observers for metrics, called under no lock of the queue (an observer may take its own
// locks, or call back into the queue). on_depth reports the depth after a change, one call
// at a time, and the last call always holds the current depth even when threads push and
// form batches at once; changes that happen while a call runs are reported as one, the
// newest.
struct QueueObserver {
  std::function<void(int64_t tokens, int64_t sequences)> on_depth;    ///< after changes
  std::function<void(const QueueEntry&, Outcome reason)> on_dropped;  ///< deadline / cancelled
  std::function<void(const QueueEntry&, double queue_seconds)> on_batched;
};

// kQueueFull: this queue's max_queue_tokens; kServerFull: the budget shared by every queue.
enum class Admission { kAdmitted, kQueueFull, kServerFull, kClosed };

// A token budget several queues share (--max-queue-tokens over every model's queue): tokens
// admitted and not yet batched, in any of them.
struct QueueBudget {
  explicit QueueBudget(int64_t max) : max_tokens(max) {}
  const int64_t max_tokens;
  std::atomic<int64_t> tokens{0};
};

class BatchQueue {
 public:
  // `budget`, if any, is shared with other queues: a request is admitted only within both.
  BatchQueue(QueueLimits limits, const engine::ModelConfig& config, QueueObserver observer = {},
             std::shared_ptr<QueueBudget> budget = nullptr);

  // Admits every sequence of `request` or none: kQueueFull when its tokens would push the
  // queue over max_queue_tokens, kClosed once draining started.
  Admission push(std::shared_ptr<Request> request);

  // Blocks until a batch is ready (honouring max_queue_delay), or returns nullopt once the
  // queue is closed and empty.
  std::optional<Batch> next_batch();

  // Stops admissions; next_batch drains what is queued, then returns nullopt.
  void close();

  int64_t queued_tokens() const;
  int64_t queued_sequences() const;
  const QueueLimits& limits() const { return limits_; }
  int64_t budget_limit() const { return budget_ ? budget_->max_tokens : limits_.max_queue_tokens; }

 private:
  struct Depth {
    int64_t tokens = 0;
    int64_t sequences = 0;
  };

  // Whether a sequence of `tokens` may join a batch of `count` sequences and `batch_tokens`
  // tokens: within both budgets, or first in the batch (a long sequence runs alone).
  bool fits(int64_t count, int64_t batch_tokens, int64_t tokens) const;
  // Drops the entries at the head that are dead at `now`; returns them for completion
  // outside the lock.
  void drop_dead_head(Clock::time_point now, std::vector<std::pair<QueueEntry, Outcome>>* dropped);
  // Under mu_, after a change: records the depth for on_depth. Returns true when the caller
  // must call report_depths once it released mu_ (no other thread is reporting).
  [[nodiscard]] bool record_depth_locked();
  // Without mu_: calls on_depth with the newest recorded depth until none is pending.
  void report_depths();

  // Under mu_: takes `tokens` off this queue's depth and the shared budget.
  void release_locked(int64_t tokens);

  const QueueLimits limits_;
  const engine::ModelConfig config_;
  const std::shared_ptr<QueueBudget> budget_;
  QueueObserver observer_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<QueueEntry> entries_;
  int64_t tokens_ = 0;
  bool closed_ = false;
  std::optional<Depth> pending_depth_;  // the newest depth not yet reported to on_depth
  bool reporting_depth_ = false;        // a thread is in report_depths
};

}  // namespace fastformer::batching
