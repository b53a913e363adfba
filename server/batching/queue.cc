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

BatchQueue::BatchQueue(QueueLimits limits, const engine::ModelConfig& config,
                       QueueObserver observer, std::shared_ptr<QueueBudget> budget)
    : limits_(limits),
      config_(config),
      budget_(std::move(budget)),
      observer_(std::move(observer)) {}

void BatchQueue::release_locked(int64_t tokens) {
  tokens_ -= tokens;
  if (budget_) budget_->tokens.fetch_sub(tokens);
}

Admission BatchQueue::push(std::shared_ptr<Request> request) {
  int64_t tokens = 0;
  for (const auto& s : request->sequences)
    tokens += engine::sequence_length(s, config_.hidden_size);
  request->tokens = tokens;
  request->remaining.store(static_cast<int32_t>(request->sequences.size()));
  request->results.resize(request->sequences.size());
  bool report = false;
  {
    std::lock_guard lock(mu_);
    if (closed_) return Admission::kClosed;
    if (tokens_ + tokens > limits_.max_queue_tokens) return Admission::kQueueFull;
    if (budget_ && budget_->tokens.fetch_add(tokens) + tokens > budget_->max_tokens) {
      budget_->tokens.fetch_sub(tokens);
      return Admission::kServerFull;
    }
    const auto now = Clock::now();
    for (size_t i = 0; i < request->sequences.size(); ++i) {
      const int64_t n = engine::sequence_length(request->sequences[i], config_.hidden_size);
      entries_.push_back(QueueEntry{request, static_cast<int32_t>(i), n, now});
    }
    tokens_ += tokens;
    report = record_depth_locked();
  }
  cv_.notify_one();
  if (report) report_depths();
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

bool BatchQueue::fits(int64_t count, int64_t batch_tokens, int64_t tokens) const {
  return count < limits_.max_batch_sequences &&
         (count == 0 || batch_tokens + tokens <= limits_.max_batch_tokens);
}

bool BatchQueue::record_depth_locked() {
  if (!observer_.on_depth) return false;
  pending_depth_ = Depth{tokens_, static_cast<int64_t>(entries_.size())};
  if (reporting_depth_) return false;  // that thread reports this depth, after its current one
  reporting_depth_ = true;
  return true;
}

void BatchQueue::report_depths() {
  // One reporter at a time, and it reports the newest depth last: a gauge set from two
  // threads at once could otherwise end on an older depth than the current one. Depths
  // recorded while it reports replace each other in one slot, so the work and the memory
  // stay bounded however fast others change the queue.
  std::unique_lock lock(mu_);
  while (pending_depth_) {
    const Depth depth = *pending_depth_;
    pending_depth_.reset();
    lock.unlock();
    try {
      observer_.on_depth(depth.tokens, depth.sequences);
    } catch (...) {
      lock.lock();
      reporting_depth_ = false;  // the next change reports again
      throw;
    }
    lock.lock();
  }
  reporting_depth_ = false;
}

void BatchQueue::drop_dead_head(Clock::time_point now,
                                std::vector<std::pair<QueueEntry, Outcome>>* dropped) {
  while (!entries_.empty()) {
    const Outcome reason = dead_reason(entries_.front(), now);
    if (reason == Outcome::kOk) break;
    release_locked(entries_.front().tokens);
    dropped->emplace_back(std::move(entries_.front()), reason);
    entries_.pop_front();
  }
}

std::optional<Batch> BatchQueue::next_batch() {
  std::vector<std::pair<QueueEntry, Outcome>> dropped;
  auto complete_dropped = [&] {
    for (auto& [entry, reason] : dropped) {
      if (observer_.on_dropped &&
          (reason == Outcome::kDeadlineExceeded || reason == Outcome::kCancelled)) {
        observer_.on_dropped(entry, reason);
      }
      finish_request(*entry.request, reason);  // no-op when the request already ended
    }
    dropped.clear();
  };

  std::unique_lock lock(mu_);
  // After a change under the lock: releases it, then reports the depth and completes the
  // dropped requests (observers and completions run under no lock).
  auto unlock_and_report = [&] {
    const bool report = record_depth_locked();
    lock.unlock();
    if (report) report_depths();
    complete_dropped();
  };
  for (;;) {
    drop_dead_head(Clock::now(), &dropped);
    if (!dropped.empty()) {
      unlock_and_report();
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
      if (!fits(count, tokens, e.tokens)) {
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
  for (;;) {
    drop_dead_head(now, &dropped);  // sequences behind the head may have died while waiting
    if (entries_.empty()) break;
    QueueEntry& e = entries_.front();
    if (!fits(static_cast<int64_t>(batch.entries.size()), batch.tokens, e.tokens)) break;
    batch.tokens += e.tokens;
    release_locked(e.tokens);
    batch.entries.push_back(std::move(e));
    entries_.pop_front();
  }
  unlock_and_report();

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
