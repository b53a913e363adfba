#include "client/src/retry.h"

#include <algorithm>
#include <cmath>
#include <random>

namespace fastformer::internal {

Milliseconds backoff_delay(const RetryPolicy& policy, int attempt) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  const double base = std::min(double(policy.max_backoff.count()),
                               double(policy.initial_backoff.count()) *
                                   std::pow(policy.multiplier, std::max(0, attempt - 1)));
  const double jitter = std::clamp(policy.jitter, 0.0, 1.0);
  std::uniform_real_distribution<double> scale(1.0 - jitter, 1.0 + jitter);
  return Milliseconds(std::max<int64_t>(0, std::llround(base * scale(rng))));
}

bool should_retry(const RetryPolicy& policy, int attempt, const grpc::Status& status,
                  Milliseconds backoff, std::optional<SystemTime> deadline) {
  if (attempt >= policy.max_attempts || !is_retryable(status.error_code())) return false;
  return !deadline || std::chrono::system_clock::now() + backoff < *deadline;
}

DelayQueue::~DelayQueue() { stop(); }

void DelayQueue::post(std::chrono::steady_clock::time_point when, Task task) {
  {
    std::lock_guard lock(mu_);
    if (!stopped_) {
      entries_.push({when, posted_++, std::move(task)});
      if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
      wake_.notify_one();
      return;
    }
  }
  task(false);
}

void DelayQueue::stop() {
  std::thread thread;
  {
    std::lock_guard lock(mu_);
    stopped_ = true;
    thread = std::move(thread_);
    wake_.notify_one();
  }
  if (thread.joinable()) thread.join();
}

void DelayQueue::run() {
  std::unique_lock lock(mu_);
  while (true) {
    if (entries_.empty()) {
      if (stopped_) return;
      wake_.wait(lock);
      continue;
    }
    if (!stopped_ && std::chrono::steady_clock::now() < entries_.top().when) {
      wake_.wait_until(lock, entries_.top().when);
      continue;
    }
    Task task = entries_.top().task;  // top() is const: copy, then pop
    entries_.pop();
    const bool on_time = !stopped_;
    lock.unlock();
    task(on_time);
    lock.lock();
  }
}

}  // namespace fastformer::internal
