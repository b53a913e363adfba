#include "server/engine/cpu/thread_pool.h"

#include <algorithm>
#include <chrono>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace fastformer::engine {

namespace {

inline void cpu_relax() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}

// Spins until `done()` or kSpin has passed; true when done() held. After its first few
// hundred nanoseconds the spin yields the core between checks, so a thread of another process
// (or gRPC's) that is ready to run gets it: the spin only holds a core nobody else wants.
template <class Done>
bool spin_until(const Done& done) {
  const auto until = std::chrono::steady_clock::now() + ThreadPool::kSpin;
  for (int i = 1;; ++i) {
    if (done()) return true;
    if (i < 64) {
      cpu_relax();
    } else {
      std::this_thread::yield();
      if (i % 8 == 0 && std::chrono::steady_clock::now() >= until) return false;
    }
  }
}

}  // namespace

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < std::max(threads, 1); ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mu_);  // set under the lock: a worker between its check and its wait
    stop_.store(true, std::memory_order_release);
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
    // The next job usually follows within microseconds (the graph's ops back to back): look for
    // it a while before sleeping, as waking a sleeping thread costs tens of microseconds.
    auto posted = [&] {
      return stop_.load(std::memory_order_acquire) ||
             generation_.load(std::memory_order_acquire) != seen;
    };
    if (!spin_until(posted)) {
      std::unique_lock lock(mu_);
      work_cv_.wait(lock, posted);
    }
    if (stop_.load(std::memory_order_acquire)) return;
    seen = generation_.load(std::memory_order_acquire);
    run_pieces();
    if (busy_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard lock(mu_);
      done_cv_.notify_one();
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
    busy_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
  }
  work_cv_.notify_all();
  run_pieces();
  if (!spin_until([&] { return busy_.load(std::memory_order_acquire) == 0; })) {
    std::unique_lock lock(mu_);
    done_cv_.wait(lock, [&] { return busy_.load(std::memory_order_acquire) == 0; });
  }
  std::lock_guard lock(mu_);
  job_ = nullptr;
}

}  // namespace fastformer::engine
