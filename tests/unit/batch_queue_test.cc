// The batch-forming rule and admission: FIFO at sequence granularity, token and sequence
// budgets, a long sequence alone, all-or-nothing admission against max_queue_tokens,
// deadlines and cancellation dropped before compute, draining; and the scheduler: results
// land in request order, an engine failure fails only its batch; and the whole batcher under
// concurrent producers, cancellers and deadlines (run under ThreadSanitizer by make test-tsan).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include "server/batching/queue.h"
#include "server/batching/scheduler.h"

namespace fastformer::batching {
namespace {

using namespace std::chrono_literals;

engine::ModelConfig config() {
  engine::ModelConfig c;
  c.hidden_size = 4;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 1;
  c.intermediate_size = 4;
  c.max_position_embeddings = 1000;
  c.vocab_size = 100;
  return c;
}

// A request of sequences with the given lengths; the ids live in `storage`.
struct TestRequest {
  std::vector<std::vector<int32_t>> storage;
  std::shared_ptr<Job> request = std::make_shared<Job>();
  std::atomic<int> completions{0};
  Outcome outcome = Outcome::kOk;

  explicit TestRequest(std::vector<int> lengths, int32_t first_id = 1) {
    for (int n : lengths) storage.emplace_back(size_t(n), first_id);
    for (const auto& ids : storage) request->sequences.push_back({ids, {}});
    request->on_complete = [this](Job& r) {
      outcome = r.outcome;
      ++completions;
    };
  }
};

QueueLimits limits(int64_t batch_tokens, int64_t batch_sequences = 100,
                   int64_t queue_tokens = 100000) {
  QueueLimits l;
  l.max_batch_tokens = batch_tokens;
  l.max_batch_sequences = batch_sequences;
  l.max_queue_tokens = queue_tokens;
  return l;
}

std::vector<std::pair<Job*, int32_t>> members(const Batch& batch) {
  std::vector<std::pair<Job*, int32_t>> out;
  for (const auto& e : batch.entries) out.emplace_back(e.request.get(), e.index);
  return out;
}

TEST(BatchQueueTest, SequencesOfSeveralRequestsShareABatchInArrivalOrder) {
  BatchQueue queue(limits(100), config());
  TestRequest a({10, 20}), b({30});
  ASSERT_EQ(queue.push(a.request), Admission::kAdmitted);
  ASSERT_EQ(queue.push(b.request), Admission::kAdmitted);
  auto batch = queue.next_batch();
  ASSERT_TRUE(batch);
  using P = std::pair<Job*, int32_t>;
  EXPECT_EQ(members(*batch),
            (std::vector<P>{{a.request.get(), 0}, {a.request.get(), 1}, {b.request.get(), 0}}));
  EXPECT_EQ(batch->tokens, 60);
  EXPECT_EQ(batch->ragged.num_sequences(), 3);
  EXPECT_EQ(batch->ragged.cu_seqlens, (std::vector<int32_t>{0, 10, 30, 60}));
  EXPECT_EQ(queue.queued_tokens(), 0);
}

TEST(BatchQueueTest, StopsBeforeTheTokenBudgetAndNothingOvertakes) {
  BatchQueue queue(limits(50), config());
  // 30 fits, 40 does not (70 > 50), and the 5 behind it must not overtake it.
  TestRequest a({30, 40, 5});
  queue.push(a.request);
  auto first = queue.next_batch();
  ASSERT_EQ(first->entries.size(), 1u);
  EXPECT_EQ(first->entries[0].index, 0);
  auto second = queue.next_batch();
  ASSERT_EQ(second->entries.size(), 2u);
  EXPECT_EQ(second->entries[0].index, 1);
  EXPECT_EQ(second->entries[1].index, 2);
}

TEST(BatchQueueTest, RespectsTheSequenceBudget) {
  BatchQueue queue(limits(1000, 2), config());
  TestRequest a({1, 1, 1, 1, 1});
  queue.push(a.request);
  EXPECT_EQ(queue.next_batch()->entries.size(), 2u);
  EXPECT_EQ(queue.next_batch()->entries.size(), 2u);
  EXPECT_EQ(queue.next_batch()->entries.size(), 1u);
}

TEST(BatchQueueTest, ASequenceLongerThanTheBudgetRunsAlone) {
  BatchQueue queue(limits(50), config());
  TestRequest a({10}), b({200}), c({10});
  queue.push(a.request);
  queue.push(b.request);
  queue.push(c.request);
  EXPECT_EQ(queue.next_batch()->tokens, 10);
  auto alone = queue.next_batch();
  ASSERT_EQ(alone->entries.size(), 1u);
  EXPECT_EQ(alone->tokens, 200);
  EXPECT_EQ(queue.next_batch()->tokens, 10);
}

TEST(BatchQueueTest, AdmissionIsAllOrNothingAgainstMaxQueueTokens) {
  BatchQueue queue(limits(1000, 100, 100), config());
  TestRequest a({60}), b({30, 30}), c({40});
  EXPECT_EQ(queue.push(a.request), Admission::kAdmitted);
  EXPECT_EQ(queue.push(b.request), Admission::kQueueFull);  // 60 + 60 > 100: none of it queued
  EXPECT_EQ(queue.queued_tokens(), 60);
  EXPECT_EQ(queue.queued_sequences(), 1);
  EXPECT_EQ(queue.push(c.request), Admission::kAdmitted);  // exactly 100 fits
  EXPECT_EQ(queue.queued_tokens(), 100);
}

TEST(BatchQueueTest, ExpiredAndCancelledSequencesAreDroppedBeforeCompute) {
  int dropped_deadline = 0, dropped_cancelled = 0;
  QueueObserver observer;
  observer.on_dropped = [&](const QueueEntry&, Outcome reason) {
    (reason == Outcome::kDeadlineExceeded ? dropped_deadline : dropped_cancelled)++;
  };
  BatchQueue queue(limits(1000), config(), observer);
  TestRequest expired({5, 5}), cancelled({7}), alive({9});
  expired.request->deadline = Clock::now() - 1ms;
  cancelled.request->is_cancelled = [] { return true; };
  queue.push(expired.request);
  queue.push(cancelled.request);
  queue.push(alive.request);
  auto batch = queue.next_batch();
  ASSERT_EQ(batch->entries.size(), 1u);
  EXPECT_EQ(batch->entries[0].request, alive.request);
  EXPECT_EQ(expired.completions, 1);  // answered once, not once per sequence
  EXPECT_EQ(expired.outcome, Outcome::kDeadlineExceeded);
  EXPECT_EQ(cancelled.outcome, Outcome::kCancelled);
  EXPECT_EQ(dropped_deadline, 2);
  EXPECT_EQ(dropped_cancelled, 1);
  EXPECT_EQ(alive.completions, 0);
}

// The depth observer runs under no lock of the queue (this one reads the queue, which would
// deadlock under its lock) and gets every change in order, one call at a time, so its last
// report is the current depth even while producers and the batch former change it at once:
// the fastformer_queue_* gauges never end on a stale value.
TEST(BatchQueueTest, DepthIsReportedOutsideTheLockOneCallAtATimeEndingOnTheCurrentDepth) {
  constexpr int kProducers = 4, kPerProducer = 200;
  BatchQueue* queue_ptr = nullptr;
  std::atomic<int> in_observer{0};
  std::vector<std::pair<int64_t, int64_t>> reports;  // written by one call at a time
  QueueObserver observer;
  observer.on_depth = [&](int64_t tokens, int64_t sequences) {
    EXPECT_EQ(in_observer.fetch_add(1), 0) << "on_depth called concurrently";
    EXPECT_GE(queue_ptr->queued_tokens(), 0);
    reports.emplace_back(tokens, sequences);
    in_observer.fetch_sub(1);
  };
  BatchQueue queue(limits(/*batch_tokens=*/64, /*batch_sequences=*/8), config(), observer);
  queue_ptr = &queue;
  std::atomic<int> batches{0};
  std::thread former([&] {
    while (queue.next_batch()) ++batches;
  });
  std::vector<std::unique_ptr<TestRequest>> requests;
  std::mutex requests_mu;
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      for (int i = 0; i < kPerProducer; ++i) {
        auto r = std::make_unique<TestRequest>(std::vector<int>{1 + (p * kPerProducer + i) % 20});
        ASSERT_EQ(queue.push(r->request), Admission::kAdmitted);
        std::lock_guard lock(requests_mu);
        requests.push_back(std::move(r));
      }
    });
  }
  for (auto& t : producers) t.join();
  queue.close();
  former.join();
  ASSERT_FALSE(reports.empty());
  // At most one report per change (changes during a report collapse into the newest).
  EXPECT_LE(reports.size(), size_t(kProducers * kPerProducer + batches.load()));
  EXPECT_EQ(reports.back(), (std::pair<int64_t, int64_t>{0, 0}));
}

TEST(BatchQueueTest, ANonFullBatchWaitsUpToTheQueueDelay) {
  QueueLimits l = limits(100);
  l.max_queue_delay = 500ms;  // wide margins: this also runs under TSan on a loaded machine
  BatchQueue queue(l, config());
  TestRequest a({10}), b({20});
  queue.push(a.request);
  std::thread later([&] {
    std::this_thread::sleep_for(10ms);
    queue.push(b.request);
  });
  const auto start = Clock::now();
  auto batch = queue.next_batch();
  later.join();
  EXPECT_GE(Clock::now() - start, 400ms);
  EXPECT_EQ(batch->entries.size(), 2u);  // the late arrival joined the waiting batch
}

TEST(BatchQueueTest, AFullBatchDoesNotWait) {
  QueueLimits l = limits(20);
  l.max_queue_delay = 5s;
  BatchQueue queue(l, config());
  TestRequest a({10, 10, 10});
  queue.push(a.request);
  const auto start = Clock::now();
  EXPECT_EQ(queue.next_batch()->tokens, 20);
  EXPECT_LT(Clock::now() - start, 1s);
}

TEST(BatchQueueTest, CloseRefusesNewWorkAndDrainsWhatIsQueued) {
  QueueLimits l = limits(10);
  l.max_queue_delay = 10s;  // draining must not wait for it
  BatchQueue queue(l, config());
  TestRequest a({5}), b({5});
  queue.push(a.request);
  queue.close();
  EXPECT_EQ(queue.push(b.request), Admission::kClosed);
  EXPECT_EQ(queue.next_batch()->entries.size(), 1u);
  EXPECT_FALSE(queue.next_batch().has_value());
}

// An engine that records batches and fails the ones asked to.
class FakeEngine final : public engine::Engine {
 public:
  std::vector<int> batch_sizes;
  int fail_batch = -1;

  std::vector<EncodedSequence> encode(const engine::RaggedBatch& batch,
                                      std::span<const OutputOptions>) override {
    const int n = static_cast<int>(batch_sizes.size());
    batch_sizes.push_back(batch.num_sequences());
    if (n == fail_batch) throw std::runtime_error("injected failure");
    std::vector<EncodedSequence> out(size_t(batch.num_sequences()));
    for (int b = 0; b < batch.num_sequences(); ++b) {
      out[size_t(b)].num_tokens = batch.cu_seqlens[size_t(b) + 1] - batch.cu_seqlens[size_t(b)];
    }
    return out;
  }
  std::string backend_name() const override { return "fake"; }
  std::string device_name() const override { return "fake"; }
  const engine::DtypeChoice& dtype() const override {
    static const engine::DtypeChoice float32;
    return float32;
  }
  int64_t max_batch_tokens() const override { return 1 << 20; }
  const engine::Model& model() const override { throw std::logic_error("no model"); }
};

TEST(SchedulerTest, ResultsLandInRequestOrderAcrossBatches) {
  BatchQueue queue(limits(25), config());
  FakeEngine eng;
  TestRequest a({10, 20, 5}), b({3});
  queue.push(a.request);
  queue.push(b.request);
  {
    Scheduler scheduler(queue, eng);
    queue.close();
  }  // joins after draining
  EXPECT_EQ(a.outcome, Outcome::kOk);
  EXPECT_EQ(a.completions, 1);
  ASSERT_EQ(a.request->results.size(), 3u);
  EXPECT_EQ(a.request->results[0].num_tokens, 10);
  EXPECT_EQ(a.request->results[1].num_tokens, 20);
  EXPECT_EQ(a.request->results[2].num_tokens, 5);
  EXPECT_EQ(b.request->results[0].num_tokens, 3);
  EXPECT_GE(eng.batch_sizes.size(), 2u);  // the request spanned batches
}

TEST(SchedulerTest, AnEngineFailureFailsOnlyItsBatch) {
  BatchQueue queue(limits(10), config());
  FakeEngine eng;
  eng.fail_batch = 1;
  TestRequest a({10}), b({10}), c({10});
  queue.push(a.request);
  queue.push(b.request);
  queue.push(c.request);
  {
    Scheduler scheduler(queue, eng);
    queue.close();
  }
  EXPECT_EQ(a.outcome, Outcome::kOk);
  EXPECT_EQ(b.outcome, Outcome::kEngineFailure);
  EXPECT_EQ(b.request->error, "injected failure");
  EXPECT_EQ(c.outcome, Outcome::kOk);
  EXPECT_EQ(a.completions + b.completions + c.completions, 3);
}

// The server's batching path with every thread it has: producers pushing (the gRPC handlers),
// a canceller flipping is_cancelled (clients going away), deadlines passing, the scheduler's
// forming and compute threads, a non-zero queue delay, an engine that fails now and then.
// Every admitted request ends exactly once, with its own results when OK; the queue ends
// empty. Under ThreadSanitizer (make test-tsan) any unsynchronised access on these paths is
// reported.
TEST(SchedulerTest, ConcurrentProducersCancellationsAndDeadlinesEndEveryRequestOnce) {
  constexpr int kProducers = 4, kPerProducer = 150;
  QueueLimits l = limits(/*batch_tokens=*/64, /*batch_sequences=*/8, /*queue_tokens=*/2048);
  l.max_queue_delay = 200us;
  BatchQueue queue(l, config());
  FakeEngine eng;
  eng.fail_batch = 7;

  struct Tracked {
    std::unique_ptr<TestRequest> req;
    std::shared_ptr<std::atomic<bool>> cancel = std::make_shared<std::atomic<bool>>(false);
    std::vector<int> lengths;
  };
  std::vector<std::vector<Tracked>> admitted(kProducers);
  std::atomic<int> producers_done{0};
  std::mutex cancel_mu;
  std::vector<std::shared_ptr<std::atomic<bool>>> cancellable;
  {
    Scheduler scheduler(queue, eng);
    std::vector<std::thread> producers;
    for (int p = 0; p < kProducers; ++p) {
      producers.emplace_back([&, p] {
        std::mt19937 rng(1234u + unsigned(p));
        for (int i = 0; i < kPerProducer; ++i) {
          Tracked t;
          const int n_seq = 1 + int(rng() % 3);
          for (int s = 0; s < n_seq; ++s)
            t.lengths.push_back(1 + int(rng() % 90));  // some > 64: alone
          t.req = std::make_unique<TestRequest>(t.lengths);
          auto flag = t.cancel;
          t.req->request->is_cancelled = [flag] { return flag->load(); };
          if (rng() % 10 == 0)
            t.req->request->deadline = Clock::now() + std::chrono::microseconds(rng() % 500);
          Admission a;
          while ((a = queue.push(t.req->request)) == Admission::kQueueFull)
            std::this_thread::sleep_for(50us);
          ASSERT_EQ(a, Admission::kAdmitted);
          if (rng() % 5 == 0) {
            std::lock_guard lock(cancel_mu);
            cancellable.push_back(t.cancel);
          }
          admitted[size_t(p)].push_back(std::move(t));
        }
        ++producers_done;
      });
    }
    std::thread canceller([&] {
      while (producers_done.load() < kProducers) {
        {
          std::lock_guard lock(cancel_mu);
          for (auto& c : cancellable) c->store(true);
          cancellable.clear();
        }
        std::this_thread::sleep_for(100us);
      }
    });
    for (auto& t : producers) t.join();
    canceller.join();
    queue.close();
  }  // the scheduler drains and joins

  int ok = 0, ended = 0;
  for (const auto& per : admitted) {
    for (const Tracked& t : per) {
      ASSERT_EQ(t.req->completions.load(), 1)
          << "a request ended " << t.req->completions.load() << " times";
      ++ended;
      switch (t.req->outcome) {
        case Outcome::kOk:
          ++ok;
          ASSERT_EQ(t.req->request->results.size(), t.lengths.size());
          for (size_t s = 0; s < t.lengths.size(); ++s)
            EXPECT_EQ(t.req->request->results[s].num_tokens, t.lengths[s]);
          break;
        case Outcome::kCancelled:
          EXPECT_TRUE(t.cancel->load());
          break;
        case Outcome::kDeadlineExceeded:
          EXPECT_NE(t.req->request->deadline, Clock::time_point::max());
          break;
        case Outcome::kEngineFailure:
          EXPECT_EQ(t.req->request->error, "injected failure");
          break;
      }
    }
  }
  EXPECT_EQ(ended, kProducers * kPerProducer);
  EXPECT_GT(ok, ended / 2);
  EXPECT_EQ(queue.queued_tokens(), 0);
  EXPECT_EQ(queue.queued_sequences(), 0);
}

// A gate the engines' batches wait at until the test opens it, and the log of which engine ran.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  std::vector<int> log;

  void wait_until_ran(size_t n) {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return log.size() == n; });
  }
  void open_it() {
    {
      std::lock_guard lock(mu);
      open = true;
    }
    cv.notify_all();
  }
};

// An engine whose batches wait at the gate, logging its id as each one starts.
class GatedEngine final : public engine::Engine {
 public:
  GatedEngine(int id, Gate& gate) : id_(id), gate_(gate) {}
  std::vector<EncodedSequence> encode(const engine::RaggedBatch& batch,
                                      std::span<const OutputOptions>) override {
    std::unique_lock lock(gate_.mu);
    gate_.log.push_back(id_);
    gate_.cv.notify_all();
    gate_.cv.wait(lock, [&] { return gate_.open; });
    return std::vector<EncodedSequence>(size_t(batch.num_sequences()));
  }
  std::string backend_name() const override { return "fake"; }
  std::string device_name() const override { return "fake"; }
  const engine::DtypeChoice& dtype() const override {
    static const engine::DtypeChoice float32;
    return float32;
  }
  int64_t max_batch_tokens() const override { return 1 << 20; }
  const engine::Model& model() const override { throw std::logic_error("no model"); }

 private:
  int id_;
  Gate& gate_;
};

// Three models on one compute pool: while model 0's batch computes, model 2's request arrives,
// then model 1's. Both are staged; neither lane has run yet, so the pool runs the one that
// waited longest first (model 2), whatever order the lanes joined the pool in.
TEST(ComputePoolTest, RunsTheStagedBatchThatWaitedLongestFirst) {
  Gate gate;
  ComputePool pool;
  std::vector<std::unique_ptr<BatchQueue>> queues;
  std::vector<std::unique_ptr<GatedEngine>> engines;
  std::vector<std::unique_ptr<Scheduler>> lanes;
  for (int i = 0; i < 3; ++i) {
    queues.push_back(std::make_unique<BatchQueue>(limits(100), config()));
    engines.push_back(std::make_unique<GatedEngine>(i, gate));
    lanes.push_back(std::make_unique<Scheduler>(pool, *queues.back(), *engines.back()));
  }
  TestRequest first({5}), older({5}), newer({5});
  queues[0]->push(first.request);
  gate.wait_until_ran(1);  // model 0 computes, held at the gate
  queues[2]->push(older.request);
  std::this_thread::sleep_for(2ms);
  queues[1]->push(newer.request);
  // Wait until both are staged (formed and waiting for the pool), then open the gate.
  while (queues[1]->queued_sequences() + queues[2]->queued_sequences() > 0)
    std::this_thread::sleep_for(1ms);
  std::this_thread::sleep_for(20ms);
  gate.open_it();
  for (auto& q : queues) q->close();
  lanes.clear();  // joins every lane after its batches ran
  EXPECT_EQ(gate.log, (std::vector<int>{0, 2, 1}));
  EXPECT_EQ(first.completions + older.completions + newer.completions, 3);
}

// Model 0 has a backlog of batches; model 1's request arrives while one of them computes. It
// runs next, before the rest of model 0's backlog (admitted earlier): a lane that just ran
// waits behind every other ready lane.
TEST(ComputePoolTest, ABusyModelDelaysAnotherByOneBatchAtMost) {
  Gate gate;
  ComputePool pool;
  BatchQueue busy(limits(10), config()), other(limits(10), config());
  GatedEngine busy_engine(0, gate), other_engine(1, gate);
  auto busy_lane = std::make_unique<Scheduler>(pool, busy, busy_engine);
  auto other_lane = std::make_unique<Scheduler>(pool, other, other_engine);
  std::vector<std::unique_ptr<TestRequest>> backlog;
  for (int i = 0; i < 4; ++i) {
    backlog.push_back(std::make_unique<TestRequest>(std::vector<int>{10}));  // a batch each
    busy.push(backlog.back()->request);
  }
  gate.wait_until_ran(1);  // the first computes, held at the gate
  TestRequest late({5});
  other.push(late.request);
  while (other.queued_sequences() > 0) std::this_thread::sleep_for(1ms);
  std::this_thread::sleep_for(20ms);  // staged beside model 0's next batch
  gate.open_it();
  busy.close();
  other.close();
  busy_lane.reset();
  other_lane.reset();
  EXPECT_EQ(gate.log, (std::vector<int>{0, 1, 0, 0, 0}));
  EXPECT_EQ(late.completions, 1);
}

// A budget shared by two queues: a request that fits its own queue but not what both hold
// is refused as kServerFull, and the budget is given back as batches form.
TEST(ComputePoolTest, ASharedBudgetLimitsEveryQueueTogether) {
  auto budget = std::make_shared<QueueBudget>(30);
  BatchQueue a(limits(100, 100, 25), config(), {}, budget);
  BatchQueue b(limits(100, 100, 25), config(), {}, budget);
  TestRequest r1({20}), r2({15}), r3({10}), r4({26});
  EXPECT_EQ(a.push(r1.request), Admission::kAdmitted);
  EXPECT_EQ(b.push(r2.request), Admission::kServerFull);  // 35 over the shared 30
  EXPECT_EQ(b.push(r3.request), Admission::kAdmitted);
  EXPECT_EQ(b.push(r4.request), Admission::kQueueFull);  // 26 over b's own 25
  EXPECT_EQ(budget->tokens.load(), 30);
  a.close();
  ASSERT_TRUE(a.next_batch().has_value());
  EXPECT_EQ(budget->tokens.load(), 10);
  EXPECT_EQ(b.push(r2.request), Admission::kAdmitted);
  EXPECT_EQ(budget->tokens.load(), 25);
}

// ---- priority classes (queue.h): interactive first, bulk fills, per-class limits, promotion,
// and a formed batch refreshed when interactive work arrives after it.

std::shared_ptr<Job> with_priority(TestRequest& r, Priority p) {
  r.request->priority = p;
  return r.request;
}

TEST(BatchQueuePriorityTest, InteractiveFirstThenBulkFillsTheBudget) {
  QueueLimits l = limits(10);
  l.max_queue_delay = 0us;
  l.mixed_batch_tokens = 10;  // bulk may fill a batch with a query in it whole
  BatchQueue queue(l, config());
  TestRequest bulk1({4}), bulk2({4}), query({4});
  ASSERT_EQ(queue.push(with_priority(bulk1, Priority::kBulk)), Admission::kAdmitted);
  ASSERT_EQ(queue.push(with_priority(bulk2, Priority::kBulk)), Admission::kAdmitted);
  ASSERT_EQ(queue.push(with_priority(query, Priority::kInteractive)), Admission::kAdmitted);
  EXPECT_EQ(queue.queued_sequences(Priority::kBulk), 2);
  auto batch = queue.next_batch();
  ASSERT_TRUE(batch);
  using P = std::pair<Job*, int32_t>;
  // The query first though it came last; the first bulk sequence fills (8 of 10 tokens).
  EXPECT_EQ(members(*batch), (std::vector<P>{{query.request.get(), 0}, {bulk1.request.get(), 0}}));
  batch = queue.next_batch();
  ASSERT_TRUE(batch);
  EXPECT_EQ(members(*batch), (std::vector<P>{{bulk2.request.get(), 0}}));
}

// A batch with interactive sequences in it takes bulk ones only up to mixed_batch_tokens (by
// default half the batch budget), when formed and when refreshed; without interactive work, or
// from interactive sequences alone, it fills the whole budget.
TEST(BatchQueuePriorityTest, BulkFillsABatchWithQueriesOnlyToTheMixedBudget) {
  QueueLimits l = limits(16);
  l.max_queue_delay = 0us;
  EXPECT_EQ(l.bulk_fill_tokens(), 8);  // the default: half of 16
  BatchQueue queue(l, config());
  TestRequest bulk({4, 4, 4, 4, 4, 4}), query({2});
  ASSERT_EQ(queue.push(with_priority(bulk, Priority::kBulk)), Admission::kAdmitted);
  ASSERT_EQ(queue.push(with_priority(query, Priority::kInteractive)), Admission::kAdmitted);
  using P = std::pair<Job*, int32_t>;
  Job* b = bulk.request.get();
  auto batch = queue.next_batch();  // the query (2), then bulk while the total stays <= 8
  ASSERT_TRUE(batch);
  EXPECT_EQ(members(*batch), (std::vector<P>{{query.request.get(), 0}, {b, 0}}));
  EXPECT_EQ(batch->tokens, 6);
  // Bulk alone fills the whole budget (16).
  batch = queue.next_batch();
  ASSERT_TRUE(batch);
  EXPECT_EQ(members(*batch), (std::vector<P>{{b, 1}, {b, 2}, {b, 3}, {b, 4}}));
  // A query that arrives before it runs joins it, and the bulk sequences past 8 tokens go back
  // to the head of their queue, in order.
  TestRequest late({2});
  ASSERT_EQ(queue.push(with_priority(late, Priority::kInteractive)), Admission::kAdmitted);
  EXPECT_TRUE(queue.refresh(&*batch));
  EXPECT_EQ(members(*batch), (std::vector<P>{{late.request.get(), 0}, {b, 1}}));
  EXPECT_EQ(batch->tokens, 6);
  EXPECT_EQ(batch->ragged.num_tokens(), 6);
  EXPECT_EQ(queue.queued_sequences(Priority::kBulk), 4);
  EXPECT_EQ(queue.queued_tokens(), 16);
  batch = queue.next_batch();
  ASSERT_TRUE(batch);
  EXPECT_EQ(members(*batch), (std::vector<P>{{b, 2}, {b, 3}, {b, 4}, {b, 5}}));
  // Interactive sequences alone still fill the whole budget.
  TestRequest queries({4, 4, 4, 4});
  ASSERT_EQ(queue.push(with_priority(queries, Priority::kInteractive)), Admission::kAdmitted);
  batch = queue.next_batch();
  ASSERT_TRUE(batch);
  EXPECT_EQ(batch->tokens, 16);
}

TEST(BatchQueuePriorityTest, EachClassHasItsOwnQueueLimit) {
  QueueLimits l = limits(100, 100, /*queue_tokens=*/50);
  l.max_bulk_queue_tokens = 20;
  BatchQueue queue(l, config());
  TestRequest bulk1({15}), bulk2({10}), query({40});
  ASSERT_EQ(queue.push(with_priority(bulk1, Priority::kBulk)), Admission::kAdmitted);
  EXPECT_EQ(queue.push(with_priority(bulk2, Priority::kBulk)), Admission::kQueueFull);  // 25 > 20
  EXPECT_EQ(queue.push(with_priority(query, Priority::kInteractive)), Admission::kAdmitted);
  EXPECT_EQ(l.class_limit(Priority::kBulk), 20);
  EXPECT_EQ(l.class_limit(Priority::kInteractive), 50);
  // The same on a budget shared by queues: its bulk share.
  auto budget = std::make_shared<QueueBudget>(50, 20);
  BatchQueue shared(limits(100), config(), {}, budget);
  TestRequest b3({15}), b4({10}), q2({40});
  ASSERT_EQ(shared.push(with_priority(b3, Priority::kBulk)), Admission::kAdmitted);
  EXPECT_EQ(shared.push(with_priority(b4, Priority::kBulk)), Admission::kServerFull);
  EXPECT_EQ(shared.push(with_priority(q2, Priority::kInteractive)), Admission::kAdmitted);
  EXPECT_EQ(budget->bulk_tokens.load(), 15);
  EXPECT_EQ(budget->tokens.load(), 40);
}

TEST(BatchQueuePriorityTest, BulkWaitingPastTheBoundIsPromotedInArrivalOrder) {
  QueueLimits l = limits(4);  // one 4-token sequence a batch
  l.bulk_promote_after = 30ms;
  std::atomic<int> promoted{0};
  QueueObserver observer;
  observer.on_promoted = [&](const QueueEntry&) { ++promoted; };
  BatchQueue queue(l, config(), observer);
  TestRequest bulk({4});
  ASSERT_EQ(queue.push(with_priority(bulk, Priority::kBulk)), Admission::kAdmitted);
  std::this_thread::sleep_for(40ms);
  TestRequest query({4});
  ASSERT_EQ(queue.push(with_priority(query, Priority::kInteractive)), Admission::kAdmitted);
  auto batch = queue.next_batch();
  ASSERT_TRUE(batch);
  // Promoted, and older than the query: it goes first.
  ASSERT_EQ(batch->entries.size(), 1u);
  EXPECT_EQ(batch->entries[0].request.get(), bulk.request.get());
  EXPECT_TRUE(batch->entries[0].promoted);
  EXPECT_EQ(promoted.load(), 1);
  // Without promotion (0) a bulk sequence waits behind every interactive one.
  QueueLimits never = limits(4);
  never.bulk_promote_after = 0ms;
  BatchQueue fifo(never, config());
  TestRequest b2({4}), q2({4});
  ASSERT_EQ(fifo.push(with_priority(b2, Priority::kBulk)), Admission::kAdmitted);
  std::this_thread::sleep_for(10ms);
  ASSERT_EQ(fifo.push(with_priority(q2, Priority::kInteractive)), Admission::kAdmitted);
  batch = fifo.next_batch();
  ASSERT_TRUE(batch);
  EXPECT_EQ(batch->entries[0].request.get(), q2.request.get());
}

// A batch job's line (Job::promotable false) is never promoted, however long it waits: the query
// that came later goes first, and a promotable bulk request behind the line passes it.
TEST(BatchQueuePriorityTest, ABatchJobsLineIsNeverPromotedAndBulkBehindItIs) {
  QueueLimits l = limits(4);  // one 4-token sequence a batch
  l.bulk_promote_after = 30ms;
  l.max_queue_delay = 0us;
  BatchQueue queue(l, config());
  TestRequest line({4}), bulk({4});
  line.request->promotable = false;
  ASSERT_EQ(queue.push(with_priority(line, Priority::kBulk)), Admission::kAdmitted);
  ASSERT_EQ(queue.push(with_priority(bulk, Priority::kBulk)), Admission::kAdmitted);
  std::this_thread::sleep_for(40ms);
  TestRequest query({4});
  ASSERT_EQ(queue.push(with_priority(query, Priority::kInteractive)), Admission::kAdmitted);
  using P = std::pair<Job*, int32_t>;
  std::vector<P> order;
  for (int i = 0; i < 3; ++i) {
    auto batch = queue.next_batch();
    ASSERT_TRUE(batch);
    ASSERT_EQ(batch->entries.size(), 1u);
    order.push_back(members(*batch)[0]);
    EXPECT_EQ(batch->entries[0].promoted, batch->entries[0].request == bulk.request);
  }
  // The promoted bulk request is older than the query; the job's line waits for both.
  EXPECT_EQ(
      order,
      (std::vector<P>{{bulk.request.get(), 0}, {query.request.get(), 0}, {line.request.get(), 0}}));
}

TEST(BatchQueuePriorityTest, RefreshLetsInteractiveWorkJoinOrDisplaceBulk) {
  QueueLimits l = limits(12);
  l.mixed_batch_tokens = 12;
  BatchQueue queue(l, config());
  TestRequest bulk({4, 4, 4});
  ASSERT_EQ(queue.push(with_priority(bulk, Priority::kBulk)), Admission::kAdmitted);
  auto batch = queue.next_batch();  // staged: the three bulk sequences, 12 of 12 tokens
  ASSERT_TRUE(batch);
  ASSERT_EQ(batch->entries.size(), 3u);
  EXPECT_FALSE(queue.refresh(&*batch));  // nothing waits: unchanged
  TestRequest query({4});
  ASSERT_EQ(queue.push(with_priority(query, Priority::kInteractive)), Admission::kAdmitted);
  EXPECT_TRUE(queue.refresh(&*batch));
  using P = std::pair<Job*, int32_t>;
  // The query first; the last bulk sequence back at the head of its queue.
  EXPECT_EQ(
      members(*batch),
      (std::vector<P>{{query.request.get(), 0}, {bulk.request.get(), 0}, {bulk.request.get(), 1}}));
  EXPECT_EQ(batch->tokens, 12);
  EXPECT_EQ(batch->ragged.num_sequences(), 3);
  EXPECT_EQ(batch->ragged.num_tokens(), 12);
  EXPECT_EQ(queue.queued_sequences(Priority::kBulk), 1);
  EXPECT_EQ(queue.queued_tokens(), 4);
  auto next = queue.next_batch();
  ASSERT_TRUE(next);
  EXPECT_EQ(members(*next), (std::vector<P>{{bulk.request.get(), 2}}));
}

// A bulk sequence promoted while a batch of newer interactive ones is staged takes the newest's
// place: the batch is what forming it now would give (arrival order among interactive work).
TEST(BatchQueuePriorityTest, RefreshPutsAPromotedSequenceBeforeNewerOnes) {
  QueueLimits l = limits(8);
  l.bulk_promote_after = 30ms;
  BatchQueue queue(l, config());
  TestRequest bulk({4});
  ASSERT_EQ(queue.push(with_priority(bulk, Priority::kBulk)), Admission::kAdmitted);
  std::this_thread::sleep_for(5ms);
  TestRequest q1({4}), q2({4});
  ASSERT_EQ(queue.push(with_priority(q1, Priority::kInteractive)), Admission::kAdmitted);
  ASSERT_EQ(queue.push(with_priority(q2, Priority::kInteractive)), Admission::kAdmitted);
  auto batch = queue.next_batch();  // q1 and q2 (8 of 8 tokens); the bulk one waits
  ASSERT_TRUE(batch);
  using P = std::pair<Job*, int32_t>;
  ASSERT_EQ(members(*batch), (std::vector<P>{{q1.request.get(), 0}, {q2.request.get(), 0}}));
  std::this_thread::sleep_for(40ms);  // past the bound: promoted at the refresh
  EXPECT_TRUE(queue.refresh(&*batch));
  EXPECT_EQ(members(*batch), (std::vector<P>{{q1.request.get(), 0}, {bulk.request.get(), 0}}));
  auto next = queue.next_batch();
  ASSERT_TRUE(next);
  EXPECT_EQ(members(*next), (std::vector<P>{{q2.request.get(), 0}}));
}

// A bulk sequence that fills the end of a staged batch (the interactive work was one sequence
// short of a full one) and passes the bound there is promoted by the refresh and keeps its
// place: displaced from every batch by newer interactive work, and put back in its queue
// unpromoted, it would wait one batch more than the bound allows.
TEST(BatchQueuePriorityTest, RefreshPromotesAnOverdueBulkSequenceInTheBatch) {
  QueueLimits l = limits(8);
  l.bulk_promote_after = 30ms;
  l.mixed_batch_tokens = 8;
  std::atomic<int> promoted{0};
  QueueObserver observer;
  observer.on_promoted = [&](const QueueEntry&) { ++promoted; };
  BatchQueue queue(l, config(), observer);
  TestRequest bulk({4});
  ASSERT_EQ(queue.push(with_priority(bulk, Priority::kBulk)), Admission::kAdmitted);
  TestRequest q1({4});
  ASSERT_EQ(queue.push(with_priority(q1, Priority::kInteractive)), Admission::kAdmitted);
  auto batch = queue.next_batch();  // q1, then the bulk sequence fills (8 of 8 tokens)
  ASSERT_TRUE(batch);
  using P = std::pair<Job*, int32_t>;
  ASSERT_EQ(members(*batch), (std::vector<P>{{q1.request.get(), 0}, {bulk.request.get(), 0}}));
  std::this_thread::sleep_for(40ms);  // past the bound while staged
  TestRequest q2({4});
  ASSERT_EQ(queue.push(with_priority(q2, Priority::kInteractive)), Admission::kAdmitted);
  EXPECT_TRUE(queue.refresh(&*batch));  // changed: its bulk sequence is now promoted
  EXPECT_EQ(members(*batch), (std::vector<P>{{q1.request.get(), 0}, {bulk.request.get(), 0}}));
  EXPECT_TRUE(batch->entries[1].promoted);
  EXPECT_EQ(promoted.load(), 1);
  EXPECT_EQ(queue.queued_sequences(Priority::kInteractive), 1);  // q2 waits for the next batch
  EXPECT_EQ(queue.queued_sequences(Priority::kBulk), 0);
  // Before the bound the same batch gives its bulk sequence up to newer interactive work.
  TestRequest bulk2({4}), q3({4});
  BatchQueue early(l, config());
  ASSERT_EQ(early.push(with_priority(bulk2, Priority::kBulk)), Admission::kAdmitted);
  ASSERT_EQ(early.push(with_priority(q3, Priority::kInteractive)), Admission::kAdmitted);
  auto b2 = early.next_batch();
  ASSERT_TRUE(b2);
  TestRequest q4({4});
  ASSERT_EQ(early.push(with_priority(q4, Priority::kInteractive)), Admission::kAdmitted);
  EXPECT_TRUE(early.refresh(&*b2));
  EXPECT_EQ(members(*b2), (std::vector<P>{{q3.request.get(), 0}, {q4.request.get(), 0}}));
  EXPECT_EQ(early.queued_sequences(Priority::kBulk), 1);
}

// The scheduler end to end: a bulk sequence behind a steady flood of interactive batches (20 ms
// each, every batch full) starts computing by its promotion bound, in the last batch to start
// before it (the refresh looks one batch ahead).
class SlowEngine final : public engine::Engine {
 public:
  std::vector<EncodedSequence> encode(const engine::RaggedBatch& batch,
                                      std::span<const OutputOptions>) override {
    std::this_thread::sleep_for(20ms);
    return std::vector<EncodedSequence>(size_t(batch.num_sequences()));
  }
  std::string backend_name() const override { return "slow"; }
  std::string device_name() const override { return "slow"; }
  const engine::DtypeChoice& dtype() const override {
    static const engine::DtypeChoice float32;
    return float32;
  }
  int64_t max_batch_tokens() const override { return 1 << 20; }
  const engine::Model& model() const override { throw std::logic_error("no model"); }
};

TEST(SchedulerPriorityTest, APromotedBulkSequenceStartsByItsBound) {
  QueueLimits l = limits(16);
  l.bulk_promote_after = 100ms;
  BatchQueue queue(l, config());
  SlowEngine eng;
  TestRequest probe({1});
  const auto pushed = Clock::now();
  ASSERT_EQ(queue.push(with_priority(probe, Priority::kBulk)), Admission::kAdmitted);
  std::vector<std::unique_ptr<TestRequest>> flood;  // 20 full batches, 400 ms of work
  for (int i = 0; i < 20; ++i) {
    flood.push_back(std::make_unique<TestRequest>(std::vector<int>{4, 4, 4, 4}));
    ASSERT_EQ(queue.push(flood.back()->request), Admission::kAdmitted);
  }
  {
    Scheduler scheduler(queue, eng);
    queue.close();
  }
  ASSERT_EQ(probe.outcome, Outcome::kOk);
  const auto waited =
      std::chrono::duration_cast<std::chrono::milliseconds>(probe.request->first_compute - pushed);
  // In the batch that starts in the last 20 ms before the bound (the batches' length), with
  // some slack for a busy machine; behind the flood it would have waited 400 ms, and promoted
  // only once overdue up to 120 ms.
  EXPECT_GE(waited, 100ms - 20ms - 5ms) << "waited " << waited.count() << " ms";
  EXPECT_LE(waited, 100ms + 15ms) << "waited " << waited.count() << " ms";
  std::printf(
      "promoted bulk sequence: computed %lld ms after admission (bound 100 ms, batches of 20 ms)\n",
      static_cast<long long>(waited.count()));
}

TEST(BatchQueuePriorityTest, NamesRoundTrip) {
  for (Priority p : {Priority::kInteractive, Priority::kBulk})
    EXPECT_EQ(parse_priority(priority_name(p)), p);
  EXPECT_FALSE(parse_priority("urgent"));
}

}  // namespace
}  // namespace fastformer::batching
