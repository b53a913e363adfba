#include "server/engine/cpu/thread_pool.h"

#include <algorithm>

namespace fastformer::engine {

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < std::max(threads, 1); ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::run_pieces() {
  for (;;) {
    const int64_t begin = next_.fetch_add(grain_);
    if (begin >= n_) return;
    (*job_)(begin, std::min(begin + grain_, n_));
  }
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock lock(mu_);
      work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    run_pieces();
    {
      std::lock_guard lock(mu_);
      if (--busy_ == 0) done_cv_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain,
                              const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  if (workers_.empty() || n <= grain) {
    fn(0, n);
    return;
  }
  {
    std::lock_guard lock(mu_);
    job_ = &fn;
    n_ = n;
    grain_ = grain;
    next_.store(0);
    busy_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  work_cv_.notify_all();
  run_pieces();
  std::unique_lock lock(mu_);
  done_cv_.wait(lock, [&] { return busy_ == 0; });
  job_ = nullptr;
}

}  // namespace fastformer::engine
