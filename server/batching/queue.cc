#include "server/batching/queue.h"

#include <algorithm>
#include <utility>

namespace fastformer::batching {

const char* priority_name(Priority priority) {
  return priority == Priority::kBulk ? "bulk" : "interactive";
}

std::optional<Priority> parse_priority(std::string_view name) {
  if (name == "interactive") return Priority::kInteractive;
  if (name == "bulk") return Priority::kBulk;
  return std::nullopt;
}

bool finish_job(Job& request, Outcome outcome, std::string error) {
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
  Job& r = *entry.request;
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

void BatchQueue::release_locked(Priority p, int64_t tokens) {
  tokens_[int(p)] -= tokens;
  if (budget_) budget_->count(p).fetch_sub(tokens);
}

Admission BatchQueue::push(std::shared_ptr<Job> request) {
  int64_t tokens = 0;
  for (const auto& s : request->sequences)
    tokens += engine::sequence_length(s, config_.hidden_size);
  request->tokens = tokens;
  request->remaining.store(static_cast<int32_t>(request->sequences.size()));
  request->results.resize(request->sequences.size());
  const Priority p = request->priority;
  bool report = false;
  {
    std::lock_guard lock(mu_);
    if (closed_) return Admission::kClosed;
    if (tokens_[int(p)] + tokens > limits_.class_limit(p)) return Admission::kQueueFull;
    if (budget_ && budget_->count(p).fetch_add(tokens) + tokens > budget_->limit(p)) {
      budget_->count(p).fetch_sub(tokens);
      return Admission::kServerFull;
    }
    const auto now = Clock::now();
    for (size_t i = 0; i < request->sequences.size(); ++i) {
      const int64_t n = engine::sequence_length(request->sequences[i], config_.hidden_size);
      entries_[int(p)].push_back(QueueEntry{request, static_cast<int32_t>(i), n, now, p});
    }
    tokens_[int(p)] += tokens;
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
  return tokens_[0] + tokens_[1];
}

int64_t BatchQueue::queued_sequences() const {
  std::lock_guard lock(mu_);
  return static_cast<int64_t>(entries_[0].size() + entries_[1].size());
}

int64_t BatchQueue::queued_sequences(Priority p) const {
  std::lock_guard lock(mu_);
  return static_cast<int64_t>(entries_[int(p)].size());
}

bool BatchQueue::fits(int64_t count, int64_t batch_tokens, int64_t tokens) const {
  return count < limits_.max_batch_sequences &&
         (count == 0 || batch_tokens + tokens <= limits_.max_batch_tokens);
}

bool BatchQueue::fits_bulk(int64_t count, int64_t batch_tokens, int64_t tokens, bool mixed) const {
  if (!fits(count, batch_tokens, tokens)) return false;
  return !mixed || batch_tokens + tokens <= limits_.bulk_fill_tokens();
}

bool BatchQueue::record_depth_locked() {
  if (!observer_.on_depth && !observer_.on_class_depth) return false;
  Depth depth;
  for (int c = 0; c < kPriorityClasses; ++c) {
    depth.tokens[c] = tokens_[c];
    depth.sequences[c] = static_cast<int64_t>(entries_[c].size());
  }
  pending_depth_ = depth;
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
      if (observer_.on_depth) {
        observer_.on_depth(depth.tokens[0] + depth.tokens[1],
                           depth.sequences[0] + depth.sequences[1]);
      }
      if (observer_.on_class_depth) {
        for (int c = 0; c < kPriorityClasses; ++c)
          observer_.on_class_depth(Priority(c), depth.tokens[c], depth.sequences[c]);
      }
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
  for (std::deque<QueueEntry>& queue : entries_) {
    while (!queue.empty()) {
      const Outcome reason = dead_reason(queue.front(), now);
      if (reason == Outcome::kOk) break;
      release_locked(queue.front().priority, queue.front().tokens);
      dropped->emplace_back(std::move(queue.front()), reason);
      queue.pop_front();
    }
  }
}

void BatchQueue::promote(Clock::time_point now, std::vector<QueueEntry>* promoted) {
  if (limits_.bulk_promote_after.count() <= 0) return;
  std::deque<QueueEntry>& bulk = entries_[int(Priority::kBulk)];
  std::deque<QueueEntry>& interactive = entries_[int(Priority::kInteractive)];
  // A batch job's lines (Job::promotable false) stay; the bulk work behind them is promoted.
  for (auto it = bulk.begin();
       it != bulk.end() && it->queued_at + limits_.bulk_promote_after <= now;) {
    if (!it->request->promotable) {
      ++it;
      continue;
    }
    QueueEntry e = std::move(*it);
    it = bulk.erase(it);
    e.promoted = true;
    // In arrival order among the interactive entries (it has waited longer than most).
    auto at = std::upper_bound(
        interactive.begin(), interactive.end(), e.queued_at,
        [](Clock::time_point t, const QueueEntry& other) { return t < other.queued_at; });
    promoted->push_back(e);
    interactive.insert(at, std::move(e));
  }
}

std::deque<QueueEntry>* BatchQueue::next_queue() {
  for (std::deque<QueueEntry>& queue : entries_)
    if (!queue.empty()) return &queue;
  return nullptr;
}

Clock::time_point BatchQueue::wake_at() const {
  Clock::time_point at = Clock::time_point::max();
  for (const std::deque<QueueEntry>& queue : entries_)
    if (!queue.empty()) at = std::min(at, queue.front().queued_at + limits_.max_queue_delay);
  const std::deque<QueueEntry>& bulk = entries_[int(Priority::kBulk)];
  if (limits_.bulk_promote_after.count() > 0) {
    const auto first = std::find_if(bulk.begin(), bulk.end(),
                                    [](const QueueEntry& e) { return e.request->promotable; });
    if (first != bulk.end()) at = std::min(at, first->queued_at + limits_.bulk_promote_after);
  }
  return at;
}

void BatchQueue::take_locked(Batch* batch, QueueEntry e) {
  batch->tokens += e.tokens;
  release_locked(e.priority, e.tokens);
  batch->entries.push_back(std::move(e));
}

bool BatchQueue::take_fitting_locked(Batch* batch, Priority p, bool mixed, Clock::time_point now,
                                     std::vector<std::pair<QueueEntry, Outcome>>* dropped) {
  std::deque<QueueEntry>& queue = entries_[int(p)];
  bool took = false;
  for (;;) {
    drop_dead_head(now, dropped);  // sequences behind a head may have died while waiting
    if (queue.empty()) break;
    const auto count = static_cast<int64_t>(batch->entries.size());
    const int64_t tokens = queue.front().tokens;
    if (!(p == Priority::kBulk ? fits_bulk(count, batch->tokens, tokens, mixed)
                               : fits(count, batch->tokens, tokens)))
      break;
    take_locked(batch, std::move(queue.front()));
    queue.pop_front();
    took = true;
  }
  return took;
}

void BatchQueue::stage(Batch* batch, Clock::time_point now, bool report) const {
  batch->ragged.clear();
  batch->options.clear();
  for (const QueueEntry& e : batch->entries) {
    batch->ragged.add(e.request->sequences[size_t(e.index)], config_);
    batch->options.push_back(e.request->options);
    if (report && observer_.on_batched) {
      observer_.on_batched(e, std::chrono::duration<double>(now - e.queued_at).count());
    }
  }
}

std::optional<Batch> BatchQueue::next_batch() {
  std::vector<std::pair<QueueEntry, Outcome>> dropped;
  std::vector<QueueEntry> promoted;
  auto complete_dropped = [&] {
    for (auto& [entry, reason] : dropped) {
      if (observer_.on_dropped &&
          (reason == Outcome::kDeadlineExceeded || reason == Outcome::kCancelled)) {
        observer_.on_dropped(entry, reason);
      }
      finish_job(*entry.request, reason);  // no-op when the request already ended
    }
    dropped.clear();
    if (observer_.on_promoted)
      for (const QueueEntry& e : promoted) observer_.on_promoted(e);
    promoted.clear();
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
    const auto now = Clock::now();
    drop_dead_head(now, &dropped);
    promote(now, &promoted);
    if (!dropped.empty() || !promoted.empty()) {
      unlock_and_report();
      lock.lock();
      continue;
    }
    if (next_queue() == nullptr) {
      if (closed_) return std::nullopt;
      cv_.wait(lock);
      continue;
    }
    // Would the heads already fill a batch (interactive first, then bulk)? If not, it may
    // wait up to max_queue_delay after its oldest entry.
    bool full = false;
    int64_t tokens = 0, count = 0;
    for (int c = 0; c < kPriorityClasses && !full; ++c) {
      const bool mixed = c == int(Priority::kBulk) && count > 0;  // interactive ones taken
      for (const QueueEntry& e : entries_[c]) {
        if (!(c == int(Priority::kBulk) ? fits_bulk(count, tokens, e.tokens, mixed)
                                        : fits(count, tokens, e.tokens))) {
          full = true;
          break;
        }
        tokens += e.tokens;
        ++count;
      }
    }
    full |= tokens >= limits_.max_batch_tokens;
    const auto ready_at = wake_at();
    if (!full && !closed_ && now < ready_at) {
      cv_.wait_until(lock, ready_at);
      continue;
    }
    break;
  }

  // Form the batch: interactive sequences in order, then bulk ones; stop before the budget is
  // exceeded (the first sequence always goes, even alone over the budget); what does not fit
  // stays at its head.
  Batch batch;
  const auto now = Clock::now();
  for (int c = 0; c < kPriorityClasses; ++c) {
    const bool mixed = c == int(Priority::kBulk) && !batch.entries.empty();
    take_fitting_locked(&batch, Priority(c), mixed, now, &dropped);
    // A bulk sequence never goes before an interactive one that did not fit.
    if (!entries_[int(Priority::kInteractive)].empty()) break;
  }
  unlock_and_report();

  // Stage the input while the previous batch may still be computing.
  stage(&batch, now, /*report=*/true);
  if (batch.entries.empty()) return next_batch();  // everything formed was dead: look again
  return batch;
}

void BatchQueue::put_back_last_locked(Batch* batch) {
  QueueEntry back = std::move(batch->entries.back());
  batch->entries.pop_back();
  batch->tokens -= back.tokens;
  tokens_[int(back.priority)] += back.tokens;
  if (budget_) budget_->count(back.priority).fetch_add(back.tokens);
  if (back.priority == Priority::kBulk && !back.promoted) {
    entries_[int(Priority::kBulk)].push_front(std::move(back));
    return;
  }
  std::deque<QueueEntry>& interactive = entries_[int(Priority::kInteractive)];
  auto at = std::upper_bound(
      interactive.begin(), interactive.end(), back.queued_at,
      [](Clock::time_point t, const QueueEntry& other) { return t < other.queued_at; });
  interactive.insert(at, std::move(back));
}

bool BatchQueue::refresh(Batch* batch, Clock::duration lookahead) {
  std::vector<std::pair<QueueEntry, Outcome>> dropped;
  std::vector<QueueEntry> promoted, joined;  // joined: for on_batched, outside the lock
  bool changed = false, report = false;
  const auto now = Clock::now();
  auto key = [](const QueueEntry& e) { return std::pair(e.request.get(), e.index); };
  std::vector<std::pair<Job*, int32_t>> formed;  // the batch's entries before, sorted
  for (const QueueEntry& e : batch->entries) formed.push_back(key(e));
  std::sort(formed.begin(), formed.end());
  {
    std::lock_guard lock(mu_);
    drop_dead_head(now, &dropped);
    // Due by the time this batch ends: promoted now, or they would wait for the next one.
    const Clock::time_point due = now + std::max(lookahead, Clock::duration::zero());
    promote(due, &promoted);
    std::deque<QueueEntry>& interactive = entries_[int(Priority::kInteractive)];
    auto is_bulk = [](const QueueEntry& e) { return e.priority == Priority::kBulk && !e.promoted; };
    // The batch's own bulk sequences past the bound are promoted too (a bulk sequence that
    // fills the end of every batch formed, and is displaced from each when interactive work
    // arrives, is never in its queue when a refresh looks): they stay, before the bulk ones.
    if (limits_.bulk_promote_after.count() > 0) {
      bool overdue = false;
      for (QueueEntry& e : batch->entries) {
        if (is_bulk(e) && e.request->promotable &&
            e.queued_at + limits_.bulk_promote_after <= due) {
          e.promoted = true;
          promoted.push_back(e);
          overdue = true;
        }
      }
      if (overdue) {
        std::stable_partition(batch->entries.begin(), batch->entries.end(),
                              [&](const QueueEntry& e) { return !is_bulk(e); });
        changed = true;
      }
    }
    for (;;) {
      drop_dead_head(now, &dropped);  // as forming a batch does: only live sequences join
      if (interactive.empty()) break;
      const QueueEntry& next = interactive.front();
      const int64_t count = static_cast<int64_t>(batch->entries.size());
      if (fits(count, batch->tokens, next.tokens)) {
        // Joins after the batch's interactive entries, before its bulk ones.
        auto at = std::find_if(batch->entries.begin(), batch->entries.end(), is_bulk);
        QueueEntry e = std::move(interactive.front());
        interactive.pop_front();
        batch->tokens += e.tokens;
        release_locked(e.priority, e.tokens);
        batch->entries.insert(at, std::move(e));
        changed = true;
        continue;
      }
      // No room: the batch's last entry goes back to its queue if it is bulk, or an interactive
      // one that arrived after the waiting head (a promoted bulk sequence is older than most):
      // the batch becomes what forming it now would give, interactive sequences in arrival
      // order first.
      if (batch->entries.empty()) break;
      QueueEntry& last = batch->entries.back();
      const bool newer = !is_bulk(last) && next.queued_at < last.queued_at;
      if (!is_bulk(last) && !newer) break;
      put_back_last_locked(batch);
      changed = true;
    }
    // A batch that now holds interactive sequences keeps bulk ones only within
    // bulk_fill_tokens: the last go back to the head of their queue, in order.
    const bool mixed = std::any_of(batch->entries.begin(), batch->entries.end(),
                                   [&](const QueueEntry& e) { return !is_bulk(e); });
    while (mixed && batch->tokens > limits_.bulk_fill_tokens() && is_bulk(batch->entries.back())) {
      put_back_last_locked(batch);
      changed = true;
    }
    // Room left, and no interactive sequence waiting: bulk work that arrived since the batch
    // was formed fills it, as forming it now would (a closed-loop client answered by the batch
    // before re-sends while this one waits).
    if (interactive.empty())
      changed |= take_fitting_locked(batch, Priority::kBulk, mixed, now, &dropped);
    if (changed || !dropped.empty() || !promoted.empty()) report = record_depth_locked();
  }
  if (changed) {
    for (const QueueEntry& e : batch->entries)
      if (!std::binary_search(formed.begin(), formed.end(), key(e))) joined.push_back(e);
  }
  if (report) report_depths();
  for (auto& [entry, reason] : dropped) {
    if (observer_.on_dropped &&
        (reason == Outcome::kDeadlineExceeded || reason == Outcome::kCancelled)) {
      observer_.on_dropped(entry, reason);
    }
    finish_job(*entry.request, reason);
  }
  if (observer_.on_promoted)
    for (const QueueEntry& e : promoted) observer_.on_promoted(e);
  if (observer_.on_batched) {
    for (const QueueEntry& e : joined)
      observer_.on_batched(e, std::chrono::duration<double>(now - e.queued_at).count());
  }
  if (changed) stage(batch, now, /*report=*/false);  // the others were reported when formed
  return changed;
}

}  // namespace fastformer::batching
