// Runs batches through the engine, one at a time, while the next batch is formed and staged
// on a second thread, so the engine never idles while work is queued.
//
// Several models share one ComputePool: each served model version has its own queue and its
// own Scheduler (a lane), whose forming thread stages at most one batch; the pool's single
// compute thread runs the staged batches one at a time, always taking the one whose lane has
// waited longest: since the batch's oldest sequence was admitted or since the lane's previous
// batch ended, whichever is later. A busy model therefore delays another model's ready batch by
// at most the batch computing when it became ready, and two busy models alternate batches
// (docs/design.md: several models, one engine).
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "server/batching/queue.h"
#include "server/engine/engine.h"

namespace fastformer::batching {

struct BatchObserver {
  // After a batch computed: its tokens, sequences and compute time.
  std::function<void(int64_t tokens, int64_t sequences, double seconds)> on_batch;
  // After the engine failed on a batch (the batch's requests end with kEngineFailure).
  std::function<void(const std::string& reason, int64_t sequences)> on_failure;
  // Called just before the engine runs a batch; an exception it throws fails the batch exactly
  // as an engine failure would. Test-only fault injection (FASTFORMER_TEST_FAULTS); unset in
  // production.
  std::function<void(const Batch& batch)> before_compute;
};

class Scheduler;

// The one compute thread that the lanes' staged batches run on, oldest first.
class ComputePool {
 public:
  ComputePool();
  ~ComputePool();  // every lane must have been joined

  ComputePool(const ComputePool&) = delete;
  ComputePool& operator=(const ComputePool&) = delete;

 private:
  friend class Scheduler;
  void compute_loop();

  std::mutex mu_;  // guards every lane's staged batch and state, and lanes_
  std::condition_variable cv_;
  std::vector<Scheduler*> lanes_;
  bool stopping_ = false;
  std::thread worker_;
};

class Scheduler {
 public:
  // A lane of `pool`: forms batches from `queue` and runs them on `engine`.
  Scheduler(ComputePool& pool, BatchQueue& queue, engine::Engine& engine,
            BatchObserver observer = {});
  // One model alone: a lane of a pool of its own.
  Scheduler(BatchQueue& queue, engine::Engine& engine, BatchObserver observer = {});
  ~Scheduler();  // joins; call queue.close() first to drain

  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Runs one batch synchronously on the calling thread and completes its requests: what the
  // compute thread does with every batch (the batch-queue fuzzer calls it directly).
  // `staged`: the engine's ticket of the batch's inputs, copied while the batch before it
  // computed (Engine::stage); 0 when not staged or changed since.
  void run_batch(Batch& batch, uint64_t staged);

  // Waits until the queue is closed and every batch of it has run; then leaves the pool.
  void join();

 private:
  friend class ComputePool;
  void form_loop();

  std::unique_ptr<ComputePool> own_pool_;  // the second constructor's; destroyed last
  ComputePool& pool_;
  BatchQueue& queue_;
  engine::Engine& engine_;
  BatchObserver observer_;
  // Under pool_.mu_:
  std::optional<Batch> staged_;   // the next batch, formed while another one computes
  uint64_t staged_ticket_ = 0;    // its inputs' copy on the engine (Engine::stage), or 0
  bool forming_done_ = false;     // the queue is closed and empty: no more batches
  bool running_ = false;          // the pool is computing one of this lane's batches
  Clock::time_point last_ran_{};  // when its previous batch ended
  Clock::duration last_took_{};   // how long its previous batch computed, and its tokens:
  int64_t last_tokens_ = 0;       // the guess of how long the next batch computes
  bool joined_ = false;
  std::thread former_;
};

}  // namespace fastformer::batching
