#include "server/batching/queue.h"

#include <utility>

namespace fastformer::batching {

bool finish_request(Request& request, Outcome outcome, std::string error) {
  // Under the request's lock, so dead_reason never asks a finished call's context whether
  // it was cancelled (the rpc layer may free that context once the call is answered).
  std::lock_guard lock(request.mu);
  if (request.finished.load()) return false;
  request.finished.store(true);
  request.outcome = outcome;
  request.error = std::move(error);
  if (request.on_complete) request.on_complete(request);
  return true;
}

namespace {

// Why an entry must not be computed, or kOk when it is alive.
Outcome dead_reason(const QueueEntry& entry, Clock::time_point now) {
  Request& r = *entry.request;
  std::lock_guard lock(r.mu);
  if (r.finished.load()) return r.outcome == Outcome::kOk ? Outcome::kEngineFailure : r.outcome;
  if (r.deadline <= now) return Outcome::kDeadlineExceeded;
  if (r.is_cancelled && r.is_cancelled()) return Outcome::kCancelled;
  return Outcome::kOk;
}

}  // namespace

BatchQueue::BatchQueue(QueueLimits limits, const engine::ModelConfig& config, QueueObserver observer)
    : limits_(limits), config_(config), observer_(std::move(observer)) {}

Admission BatchQueue::push(std::shared_ptr<Request> request) {
  int64_t tokens = 0;
  for (const auto& s : request->sequences) tokens += engine::sequence_length(s, config_.hidden_size);
  request->tokens = tokens;
  request->remaining.store(static_cast<int32_t>(request->sequences.size()));
  request->results.resize(request->sequences.size());
  {
    std::lock_guard lock(mu_);
    if (closed_) return Admission::kClosed;
    if (tokens_ + tokens > limits_.max_queue_tokens) return Admission::kQueueFull;
    const auto now = Clock::now();
    for (size_t i = 0; i < request->sequences.size(); ++i) {
      const int64_t n = engine::sequence_length(request->sequences[i], config_.hidden_size);
      entries_.push_back(QueueEntry{request, static_cast<int32_t>(i), n, now});
    }
    tokens_ += tokens;
    publish_depth();
  }
  cv_.notify_one();
  return Admission::kAdmitted;
}

void BatchQueue::close() {
  {
    std::lock_guard lock(mu_);
    closed_ = true;
  }
  cv_.notify_all();
}

int64_t BatchQueue::queued_tokens() const {
  std::lock_guard lock(mu_);
  return tokens_;
}

int64_t BatchQueue::queued_sequences() const {
  std::lock_guard lock(mu_);
  return static_cast<int64_t>(entries_.size());
}

void BatchQueue::publish_depth() {
  if (observer_.on_depth) observer_.on_depth(tokens_, static_cast<int64_t>(entries_.size()));
}

void BatchQueue::drop_dead_head(std::vector<std::pair<QueueEntry, Outcome>>* dropped) {
  const auto now = Clock::now();
  while (!entries_.empty()) {
    const Outcome reason = dead_reason(entries_.front(), now);
    if (reason == Outcome::kOk) break;
    tokens_ -= entries_.front().tokens;
    dropped->emplace_back(std::move(entries_.front()), reason);
    entries_.pop_front();
  }
}

std::optional<Batch> BatchQueue::next_batch() {
  std::vector<std::pair<QueueEntry, Outcome>> dropped;
  auto complete_dropped = [&] {
    for (auto& [entry, reason] : dropped) {
      if (observer_.on_dropped && (reason == Outcome::kDeadlineExceeded || reason == Outcome::kCancelled)) {
        observer_.on_dropped(entry, reason);
      }
      finish_request(*entry.request, reason);  // no-op when the request already ended
    }
    dropped.clear();
  };

  std::unique_lock lock(mu_);
  for (;;) {
    drop_dead_head(&dropped);
    if (!dropped.empty()) {
      publish_depth();
      lock.unlock();
      complete_dropped();
      lock.lock();
      continue;
    }
    if (entries_.empty()) {
      if (closed_) return std::nullopt;
      cv_.wait(lock);
      continue;
    }
    // Would the head already fill a batch? If not, it may wait up to max_queue_delay.
    bool full = false;
    int64_t tokens = 0, count = 0;
    for (const QueueEntry& e : entries_) {
      if (count == limits_.max_batch_sequences || (count > 0 && tokens + e.tokens > limits_.max_batch_tokens)) {
        full = true;
        break;
      }
      tokens += e.tokens;
      ++count;
    }
    full |= tokens >= limits_.max_batch_tokens;
    const auto ready_at = entries_.front().queued_at + limits_.max_queue_delay;
    if (!full && !closed_ && Clock::now() < ready_at) {
      cv_.wait_until(lock, ready_at);
      continue;
    }
    break;
  }

  // Form the batch: in order, stop before the budget is exceeded (the head always goes,
  // even alone over the budget); what does not fit stays at the head.
  Batch batch;
  const auto now = Clock::now();
  while (!entries_.empty()) {
    QueueEntry& e = entries_.front();
    const Outcome reason = dead_reason(e, now);
    if (reason != Outcome::kOk) {
      tokens_ -= e.tokens;
      dropped.emplace_back(std::move(e), reason);
      entries_.pop_front();
      continue;
    }
    const auto count = static_cast<int64_t>(batch.entries.size());
    if (count == limits_.max_batch_sequences ||
        (count > 0 && batch.tokens + e.tokens > limits_.max_batch_tokens)) {
      break;
    }
    batch.tokens += e.tokens;
    tokens_ -= e.tokens;
    batch.entries.push_back(std::move(e));
    entries_.pop_front();
  }
  publish_depth();
  lock.unlock();
  complete_dropped();

  // Stage the input while the previous batch may still be computing.
  for (const QueueEntry& e : batch.entries) {
    batch.ragged.add(e.request->sequences[size_t(e.index)], config_);
    batch.options.push_back(e.request->options);
    if (observer_.on_batched) {
      observer_.on_batched(e, std::chrono::duration<double>(now - e.queued_at).count());
    }
  }
  if (batch.entries.empty()) return next_batch();  // everything formed was dead: look again
  return batch;
}

}  // namespace fastformer::batching
