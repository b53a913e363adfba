// Runs batches from the queue through the engine, one at a time, while the next batch is
// formed and staged on a second thread, so the engine never idles while work is queued.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

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

class Scheduler {
 public:
  Scheduler(BatchQueue& queue, engine::Engine& engine, BatchObserver observer = {});
  ~Scheduler();  // joins; call queue.close() first to drain

  // Runs one batch synchronously on the calling thread and completes its requests: what the
  // compute thread does with every batch (the batch-queue fuzzer calls it directly).
  void run_batch(Batch& batch);

  // Waits until the queue is closed and every batch has run.
  void join();

 private:
  void form_loop();
  void compute_loop();

  BatchQueue& queue_;
  engine::Engine& engine_;
  BatchObserver observer_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<Batch> staged_;  // the next batch, formed while the current one computes
  bool forming_done_ = false;
  std::thread former_, worker_;
};

}  // namespace fastformer::batching
