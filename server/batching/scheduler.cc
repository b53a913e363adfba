#include "server/batching/scheduler.h"

#include <algorithm>
#include <chrono>
#include <exception>

namespace fastformer::batching {

ComputePool::ComputePool() {
  worker_ = std::thread([this] { compute_loop(); });
}

ComputePool::~ComputePool() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

void ComputePool::compute_loop() {
  std::unique_lock lock(mu_);
  for (;;) {
    // The staged batch whose lane has waited longest: since its oldest sequence was admitted
    // (a batch's entries are in queue order, so its first is its oldest), or since the lane's
    // previous batch ended, whichever is later. A lane that just ran waits behind every other
    // ready one, so a busy model delays another's batch by at most the one computing.
    Scheduler* pick = nullptr;
    Clock::time_point pick_since{};
    for (Scheduler* lane : lanes_) {
      if (!lane->staged_ || lane->staged_->entries.empty()) continue;
      const Clock::time_point since =
          std::max(lane->staged_->entries.front().queued_at, lane->last_ran_);
      if (pick == nullptr || since < pick_since) {
        pick = lane;
        pick_since = since;
      }
    }
    if (pick == nullptr) {
      if (stopping_) return;
      cv_.wait(lock);
      continue;
    }
    Batch batch = std::move(*pick->staged_);
    // Interactive work that arrived since the batch was formed joins it, or takes its bulk
    // entries' place, before the lane's former forms the next one.
    // Bulk sequences whose promotion bound passes while it computes join it too. Its compute
    // time is guessed from the lane's previous batch, scaled down to a full batch's tokens if
    // that was larger (one sequence over the budget runs alone), never up.
    Clock::duration lookahead{};
    if (pick->last_tokens_ > 0) {
      const double full = double(pick->queue_.limits().max_batch_tokens);
      const double share = std::min(1.0, full / double(pick->last_tokens_));
      lookahead = std::chrono::duration_cast<Clock::duration>(pick->last_took_ * share);
    }
    // A batch that refresh() changed goes up again in encode; unchanged, its staged copy serves.
    const uint64_t staged = pick->queue_.refresh(&batch, lookahead) ? 0 : pick->staged_ticket_;
    pick->staged_.reset();
    pick->staged_ticket_ = 0;
    pick->running_ = true;
    cv_.notify_all();  // the lane's former may stage its next batch
    lock.unlock();
    const auto started = Clock::now();
    pick->run_batch(batch, staged);
    lock.lock();
    pick->running_ = false;
    pick->last_ran_ = Clock::now();
    pick->last_took_ = pick->last_ran_ - started;
    pick->last_tokens_ = batch.tokens;
    cv_.notify_all();  // join() may be waiting for this batch
  }
}

Scheduler::Scheduler(ComputePool& pool, BatchQueue& queue, engine::Engine& engine,
                     BatchObserver observer)
    : pool_(pool), queue_(queue), engine_(engine), observer_(std::move(observer)) {
  {
    std::lock_guard lock(pool_.mu_);
    pool_.lanes_.push_back(this);
  }
  former_ = std::thread([this] { form_loop(); });
}

Scheduler::Scheduler(BatchQueue& queue, engine::Engine& engine, BatchObserver observer)
    : own_pool_(std::make_unique<ComputePool>()),
      pool_(*own_pool_),
      queue_(queue),
      engine_(engine),
      observer_(std::move(observer)) {
  {
    std::lock_guard lock(pool_.mu_);
    pool_.lanes_.push_back(this);
  }
  former_ = std::thread([this] { form_loop(); });
}

Scheduler::~Scheduler() { join(); }

void Scheduler::join() {
  if (former_.joinable()) former_.join();
  std::unique_lock lock(pool_.mu_);
  if (joined_) return;
  pool_.cv_.wait(lock, [&] { return forming_done_ && !staged_.has_value() && !running_; });
  std::erase(pool_.lanes_, this);
  joined_ = true;
}

void Scheduler::form_loop() {
  for (;;) {
    {
      // Form the next batch only once the previous one is taken: at most one batch waits
      // beside the one computing, so batches stay full and deadlines are checked late.
      std::unique_lock lock(pool_.mu_);
      pool_.cv_.wait(lock, [&] { return !staged_.has_value(); });
    }
    std::optional<Batch> batch = queue_.next_batch();
    // Its inputs go to the device now, while the batch before it computes (Engine::stage); a
    // failure to stage only costs the overlap: encode copies them itself.
    uint64_t ticket = 0;
    if (batch) {
      try {
        ticket = engine_.stage(batch->ragged);
      } catch (const std::exception&) {
        ticket = 0;
      }
    }
    std::lock_guard lock(pool_.mu_);
    if (!batch) {
      forming_done_ = true;
      pool_.cv_.notify_all();
      return;
    }
    staged_ = std::move(batch);
    staged_ticket_ = ticket;
    pool_.cv_.notify_all();
  }
}

void Scheduler::run_batch(Batch& batch, uint64_t staged) {
  const auto start = Clock::now();
  std::vector<Job*> requests;  // distinct requests of this batch
  for (const QueueEntry& e : batch.entries) {
    Job* r = e.request.get();
    if (std::find(requests.begin(), requests.end(), r) == requests.end()) requests.push_back(r);
  }
  for (Job* r : requests) {
    std::lock_guard lock(r->mu);
    if (r->first_compute == Clock::time_point{}) r->first_compute = start;
  }
  std::vector<EncodedSequence> results;
  try {
    if (observer_.before_compute) observer_.before_compute(batch);
    results = engine_.encode_staged(batch.ragged, batch.options, staged);
  } catch (const std::exception& e) {
    // Only this batch's requests fail; the server keeps serving.
    if (observer_.on_failure) observer_.on_failure(e.what(), int64_t(batch.entries.size()));
    for (Job* r : requests) finish_job(*r, Outcome::kEngineFailure, e.what());
    return;
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (observer_.on_batch) observer_.on_batch(batch.tokens, int64_t(batch.entries.size()), seconds);
  const auto compute_us = static_cast<int64_t>(seconds * 1e6);
  for (Job* r : requests) {
    std::lock_guard lock(r->mu);
    r->compute_us += compute_us;
  }
  for (size_t i = 0; i < batch.entries.size(); ++i) {
    const QueueEntry& e = batch.entries[i];
    {
      std::lock_guard lock(e.request->mu);
      e.request->results[size_t(e.index)] = std::move(results[i]);
    }
    if (e.request->remaining.fetch_sub(1) == 1) finish_job(*e.request, Outcome::kOk);
  }
}

}  // namespace fastformer::batching
