// Retry timing for the client: the backoff rule of RetryPolicy and a timer thread that runs
// the next attempt of an asynchronous call when its wait is over.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <queue>
#include <thread>
#include <vector>

#include "fastformer/client.h"

namespace fastformer::internal {

using SystemTime = std::chrono::system_clock::time_point;

// The wait after failed attempt `attempt` (from 1), jitter included.
Milliseconds backoff_delay(const RetryPolicy& policy, int attempt);

// Whether attempt `attempt` + 1 should follow: a retryable code, attempts left, and a wait of
// `backoff` that ends before the call's deadline.
bool should_retry(const RetryPolicy& policy, int attempt, const grpc::Status& status,
                  Milliseconds backoff, std::optional<SystemTime> deadline);

// Runs each posted task on one thread (started at the first post) once its time has come.
// stop() runs every waiting task at once with `on_time` false, and post() after stop() runs
// the task on the caller's thread, also with false: every task runs exactly once.
class DelayQueue {
 public:
  using Task = std::function<void(bool on_time)>;
  ~DelayQueue();
  void post(std::chrono::steady_clock::time_point when, Task task);
  void stop();

 private:
  struct Entry {
    std::chrono::steady_clock::time_point when;
    uint64_t order;  ///< posting order, so equal times run first-posted first
    Task task;
    bool operator>(const Entry& other) const {
      return when != other.when ? when > other.when : order > other.order;
    }
  };
  void run();

  std::mutex mu_;
  std::condition_variable wake_;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> entries_;
  uint64_t posted_ = 0;
  bool stopped_ = false;
  std::thread thread_;
};

}  // namespace fastformer::internal
