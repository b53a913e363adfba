// The admission queue and the batch-forming rule.
//
// Requests are admitted whole (or not at all) and split into sequences, queued in arrival
// order, one queue per priority class (request.h, Priority). A batch takes interactive
// sequences from their head, in order, while it stays within the token and sequence budgets,
// then fills the rest with bulk ones the same way; a sequence longer than the token budget
// runs alone. A bulk sequence queued for bulk_promote_after joins the interactive queue in its
// arrival order (refresh promotes the ones whose bound passes while the batch computes, so each
// starts by its bound); a batch job's line (Job::promotable false) is never promoted, and the bulk
// sequences behind it pass it when they are. Sequences of expired, cancelled or already failed
// requests are dropped at the heads, before compute. Within a class nothing overtakes an earlier
// sequence: an entry that does not fit stays at the head. A batch formed before interactive work
// arrived is refreshed before it runs (refresh): that work joins it, and bulk sequences at its end
// make room.
#pragma once

#include <algorithm>
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
#include "server/batching/job.h"

namespace fastformer::batching {

struct QueueLimits {
  int64_t max_batch_tokens = defaults::kMaxBatchTokens;        ///< token budget of one batch
  int64_t max_batch_sequences = defaults::kMaxBatchSequences;  ///< sequence budget of one batch
  int64_t max_queue_tokens = defaults::kMaxQueueTokens;  ///< admitted but not yet batched tokens
  std::chrono::microseconds max_queue_delay{
      defaults::kMaxQueueDelayUs};  ///< how long a non-full batch may wait
  /// Bulk sequences' own limit of admitted, not yet batched tokens (0: max_queue_tokens, which
  /// is the interactive class's): a full bulk queue refuses bulk work while queries still enter.
  int64_t max_bulk_queue_tokens = 0;
  /// A bulk sequence queued this long is batched as an interactive one (0: never).
  std::chrono::milliseconds bulk_promote_after{defaults::kBulkPromoteAfterMs};
  /// In a batch that holds interactive sequences, bulk ones fill it only up to this many
  /// tokens in all (0: half of max_batch_tokens), so a query's own batch computes in about
  /// half a full one's time; interactive sequences alone may fill max_batch_tokens.
  int64_t mixed_batch_tokens = 0;
  int64_t bulk_fill_tokens() const {
    return mixed_batch_tokens > 0 ? std::min(mixed_batch_tokens, max_batch_tokens)
                                  : std::max<int64_t>(1, max_batch_tokens / 2);
  }
  int64_t class_limit(Priority p) const {
    return p == Priority::kBulk && max_bulk_queue_tokens > 0 ? max_bulk_queue_tokens
                                                             : max_queue_tokens;
  }
};

// One queued sequence.
struct QueueEntry {
  std::shared_ptr<Job> request;                ///< the request it belongs to
  int32_t index = 0;                           ///< its position in the request
  int64_t tokens = 0;                          ///< its length
  Clock::time_point queued_at{};               ///< when it was admitted
  Priority priority = Priority::kInteractive;  ///< the class it was admitted to (and counts in)
  bool promoted = false;                       ///< a bulk entry moved to the interactive queue
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
  std::function<void(int64_t tokens, int64_t sequences)> on_depth;  ///< after changes
  /// The same per class (with on_depth, from the same reports): interactive holds promoted
  /// bulk sequences; tokens count in the class they were admitted to.
  std::function<void(Priority priority, int64_t tokens, int64_t sequences)> on_class_depth;
  std::function<void(const QueueEntry&)> on_promoted;  ///< a bulk entry moved to interactive
  std::function<void(const QueueEntry&, Outcome reason)> on_dropped;  ///< deadline / cancelled
  std::function<void(const QueueEntry&, double queue_seconds)> on_batched;
};

// kQueueFull: this queue's max_queue_tokens; kServerFull: the budget shared by every queue.
enum class Admission { kAdmitted, kQueueFull, kServerFull, kClosed };

// A token budget several queues share (--max-queue-tokens over every model's queue): tokens
// admitted and not yet batched, in any of them, per class (bulk: its own share).
struct QueueBudget {
  explicit QueueBudget(int64_t max, int64_t max_bulk = 0)
      : max_tokens(max), max_bulk_tokens(max_bulk > 0 ? max_bulk : max) {}
  const int64_t max_tokens;       ///< the interactive class's
  const int64_t max_bulk_tokens;  ///< the bulk class's
  std::atomic<int64_t> tokens{0};
  std::atomic<int64_t> bulk_tokens{0};
  int64_t limit(Priority p) const { return p == Priority::kBulk ? max_bulk_tokens : max_tokens; }
  std::atomic<int64_t>& count(Priority p) { return p == Priority::kBulk ? bulk_tokens : tokens; }
};

class BatchQueue {
 public:
  // `budget`, if any, is shared with other queues: a request is admitted only within both.
  BatchQueue(QueueLimits limits, const engine::ModelConfig& config, QueueObserver observer = {},
             std::shared_ptr<QueueBudget> budget = nullptr);

  // Admits every sequence of `request` or none, to its priority class: kQueueFull when its
  // tokens would push that class over its limit (QueueLimits::class_limit), kServerFull over
  // the shared budget's, kClosed once draining started.
  Admission push(std::shared_ptr<Job> request);

  // Blocks until a batch is ready (honouring max_queue_delay), or returns nullopt once the
  // queue is closed and empty.
  std::optional<Batch> next_batch();

  // Just before `batch` (formed by next_batch) computes: interactive sequences (promoted ones
  // included) that wait join it within the budgets, bulk sequences at its end going back to
  // the head of the bulk queue, in order, to make room. Returns whether it changed (its input
  // is then staged again). Its own interactive sequences always stay. `lookahead`, the time
  // the batch is expected to compute: bulk sequences (queued or in it) whose promotion bound
  // passes within it are promoted now, so none waits past its bound for the next batch.
  bool refresh(Batch* batch, Clock::duration lookahead = Clock::duration::zero());

  // Stops admissions; next_batch drains what is queued, then returns nullopt.
  void close();

  int64_t queued_tokens() const;
  int64_t queued_sequences() const;
  int64_t queued_sequences(Priority p) const;  ///< in the class's queue (promoted: interactive)
  const QueueLimits& limits() const { return limits_; }
  int64_t budget_limit(Priority p = Priority::kInteractive) const {
    return budget_ ? budget_->limit(p) : limits_.class_limit(p);
  }

 private:
  struct Depth {
    int64_t tokens[kPriorityClasses] = {};
    int64_t sequences[kPriorityClasses] = {};
  };

  // Whether a sequence of `tokens` may join a batch of `count` sequences and `batch_tokens`
  // tokens: within both budgets, or first in the batch (a long sequence runs alone).
  bool fits(int64_t count, int64_t batch_tokens, int64_t tokens) const;
  // Takes the class's sequences from its head into `batch` while they fit (fits, or fits_bulk
  // with `mixed`), dropping dead heads on the way; whether it took any.
  bool take_fitting_locked(Batch* batch, Priority p, bool mixed, Clock::time_point now,
                           std::vector<std::pair<QueueEntry, Outcome>>* dropped);
  // Puts the last entry of a formed batch back in its queue (refresh): bulk at the head of
  // the bulk queue, interactive (promoted) in arrival order; its tokens count as queued again.
  void put_back_last_locked(Batch* batch);
  // The same for a bulk sequence: within bulk_fill_tokens when the batch holds interactive
  // sequences (`mixed`).
  bool fits_bulk(int64_t count, int64_t batch_tokens, int64_t tokens, bool mixed) const;
  // Drops the entries at the heads that are dead at `now`; returns them for completion
  // outside the lock.
  void drop_dead_head(Clock::time_point now, std::vector<std::pair<QueueEntry, Outcome>>* dropped);
  // Moves the bulk entries queued bulk_promote_after before `now` into the interactive queue,
  // in arrival order; returns them for on_promoted outside the lock.
  void promote(Clock::time_point now, std::vector<QueueEntry>* promoted);
  // The next entry a batch takes: the interactive head, else the bulk head (null: none).
  std::deque<QueueEntry>* next_queue();
  // When the oldest waiting entry becomes due for a non-full batch, or for promotion.
  Clock::time_point wake_at() const;
  // Adds `e` (taken off its queue) to `batch` and releases its tokens.
  void take_locked(Batch* batch, QueueEntry e);
  // Stages `batch`'s input (ragged, options) from its entries; `report`: each to on_batched.
  void stage(Batch* batch, Clock::time_point now, bool report) const;
  // Under mu_, after a change: records the depth for on_depth. Returns true when the caller
  // must call report_depths once it released mu_ (no other thread is reporting).
  [[nodiscard]] bool record_depth_locked();
  // Without mu_: calls on_depth with the newest recorded depth until none is pending.
  void report_depths();

  // Under mu_: takes `tokens` of class `p` off this queue's depth and the shared budget.
  void release_locked(Priority p, int64_t tokens);

  const QueueLimits limits_;
  const engine::ModelConfig config_;
  const std::shared_ptr<QueueBudget> budget_;
  QueueObserver observer_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<QueueEntry> entries_[kPriorityClasses];  // by class; promoted: interactive
  int64_t tokens_[kPriorityClasses] = {};             // by the class each was admitted to
  bool closed_ = false;
  std::optional<Depth> pending_depth_;  // the newest depth not yet reported to on_depth
  bool reporting_depth_ = false;        // a thread is in report_depths
};

}  // namespace fastformer::batching
