// A small fork-join pool for the CPU engine's element-wise and reduction passes.
// Between jobs a worker (and the caller, waiting for the workers) spins for at most kSpin, then
// sleeps on a condition variable: the forward graph issues its ops back to back, and waking a
// sleeping thread costs tens of microseconds (more in a VM), so an idle pool holds its cores
// for at most kSpin after each job, and yields them meanwhile to any other thread ready to run. The
// GEMMs run inside the pool's pieces, oneDNN kept to the calling thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace fastformer::engine {

class ThreadPool {
 public:
  explicit ThreadPool(int threads);  // threads - 1 workers; the caller is the last one
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  static constexpr std::chrono::microseconds kSpin{100};

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(begin, end) over [0, n) in pieces of about `grain` indices, spread over the
  // pool; returns when every piece is done.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void worker_loop();
  void run_pieces();

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  // Changed under mu_ (so a worker between its check and its wait misses no notify), read
  // without it by the spinning workers.
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> stop_{false};
  std::atomic<int> busy_{0};  // workers still in the current job
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t n_ = 0, grain_ = 1;
  std::atomic<int64_t> next_{0};
};

}  // namespace fastformer::engine
