// Fuzz target: the batch-forming rule (server/batching/queue.cc) and the scheduler's
// completion step, driven by a sequence of operations decoded from the input: arrivals,
// deadlines passing, cancellations, batch takes, batch completions (some failing) and
// close. A reference model of the rule predicts every batch and every drop; besides
// agreeing with it, the queue must keep these invariants:
//   - FIFO: sequences are batched in admission order, across all batches;
//   - budgets: a batch holds at most max_batch_sequences sequences and max_batch_tokens
//     tokens, except a single sequence longer than the budget, which runs alone;
//   - admission is all-or-nothing against max_queue_tokens, and refused once closed;
//   - nothing lost, nothing twice: every admitted sequence is batched exactly once or
//     dropped exactly once; every admitted request is answered exactly once, a refused
//     one never;
//   - the queue's token and sequence counts match what it holds, and end at zero.
#include <algorithm>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <stdexcept>
#include <vector>

#include "server/batching/queue.h"
#include "server/batching/scheduler.h"
#include "tests/fuzz/fuzz_input.h"

namespace {

using namespace fastformer;
using batching::Outcome;

constexpr int64_t kHidden = 4;  // input embeddings: rows of 4 values
constexpr size_t kMaxRequests = 64;
constexpr size_t kMaxOps = 512;

engine::ModelConfig config() {
  engine::ModelConfig c;
  c.hidden_size = kHidden;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 1;
  c.intermediate_size = kHidden;
  c.max_position_embeddings = 1000;
  c.vocab_size = 100;
  return c;
}

// Returns one result per sequence, or throws when told to (an engine failure).
class FakeEngine final : public engine::Engine {
 public:
  bool fail = false;
  std::vector<EncodedSequence> encode(const engine::RaggedBatch& batch,
                                      std::span<const OutputOptions>) override {
    if (fail) throw std::runtime_error("injected failure");
    std::vector<EncodedSequence> out(size_t(batch.num_sequences()));
    for (size_t b = 0; b < out.size(); ++b)
      out[b].num_tokens = batch.cu_seqlens[b + 1] - batch.cu_seqlens[b];
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

// Scheduler::run_batch is the completion step the server runs. This scheduler's own queue
// is closed and empty, so its threads end at once; run_batch is then called directly.
struct Completer {
  batching::BatchQueue idle{batching::QueueLimits{}, config()};
  FakeEngine engine;
  std::optional<batching::Scheduler> scheduler;
  Completer() {
    idle.close();
    scheduler.emplace(idle, engine);
    scheduler->join();
  }
};

Completer& completer() {
  static Completer c;
  return c;
}

// One request as the test sees it, and what the model expects of it.
struct Req {
  std::vector<std::vector<int32_t>> ids;
  std::vector<std::vector<float>> embeddings;
  std::shared_ptr<batching::Job> request = std::make_shared<batching::Job>();
  bool admitted = false, deadline_passed = false, cancelled = false;
  int completions = 0;                // on_complete calls seen
  Outcome outcome = Outcome::kOk;     // as on_complete saw it
  bool finished = false;              // model: has it ended?
  Outcome expected = Outcome::kOk;    // model: how it ended
  int remaining = 0;                  // model: sequences not yet computed
  std::vector<int> batched, dropped;  // model: per sequence
};

struct Entry {
  Req* req;
  int32_t index;
  int64_t tokens;
  uint64_t seq_no;  // admission order
};

class Harness {
 public:
  explicit Harness(fuzz::FuzzInput& in) : in_(in) {
    limits_.max_batch_tokens = in.range(1, 64);
    limits_.max_batch_sequences = in.range(1, 8);
    limits_.max_queue_tokens = in.range(1, 256);
    batching::QueueObserver observer;
    observer.on_depth = [this](int64_t tokens, int64_t sequences) {
      depth_tokens_ = tokens;
      depth_sequences_ = sequences;
    };
    observer.on_dropped = [this](const batching::QueueEntry& e, Outcome reason) {
      seen_drops_.push_back({e.request.get(), e.index, reason});
    };
    queue_.emplace(limits_, config(), observer);
  }

  void run() {
    for (size_t op = 0; op < kMaxOps && !in_.empty(); ++op) {
      switch (in_.byte() % 8) {
        case 0:
        case 1:
          arrive();
          break;
        case 2:
          if (Req* r = pick()) pass_deadline(*r);
          break;
        case 3:
          if (Req* r = pick()) cancel(*r);
          break;
        case 4:
        case 5:
          take();
          break;
        case 6: {
          const uint8_t which = in_.byte();  // two reads, in this order (not as arguments)
          complete(which, in_.byte() % 4 == 0);
          break;
        }
        case 7:
          if (in_.byte() % 4 == 0) close();
          break;
      }
      check_accounting();
    }
    // Drain: close, take everything, complete everything.
    close();
    while (take()) {
    }
    while (!running_.empty()) complete(0, false);
    check_accounting();
    FUZZ_CHECK(queue_->queued_tokens() == 0 && queue_->queued_sequences() == 0);
    FUZZ_CHECK(depth_tokens_ == 0 && depth_sequences_ == 0);
    for (const auto& r : reqs_) {
      FUZZ_CHECK(r->completions == (r->admitted ? 1 : 0));
      if (!r->admitted) continue;
      for (size_t i = 0; i < r->batched.size(); ++i) FUZZ_CHECK(r->batched[i] + r->dropped[i] == 1);
    }
  }

 private:
  Req* pick() {
    if (admitted_.empty()) return nullptr;
    return admitted_[in_.byte() % admitted_.size()];
  }

  void arrive() {
    if (reqs_.size() >= kMaxRequests) return;
    auto owned = std::make_unique<Req>();
    Req& r = *owned;
    reqs_.push_back(std::move(owned));
    const int n = int(in_.range(1, 4));
    int64_t tokens = 0;
    for (int i = 0; i < n; ++i) {
      const uint8_t b = in_.byte();
      const int64_t len = 1 + (b & 0x7f) % 40;
      if (b & 0x80) {
        r.embeddings.emplace_back(size_t(len * kHidden), 0.25f);
      } else {
        r.ids.emplace_back(size_t(len), 7);
      }
      tokens += len;
    }
    for (const auto& v : r.ids) r.request->sequences.push_back({v, {}});
    for (const auto& v : r.embeddings) r.request->sequences.push_back({{}, v});
    r.request->is_cancelled = [&r] { return r.cancelled; };
    r.request->on_complete = [&r](batching::Job& req) {
      ++r.completions;
      r.outcome = req.outcome;
    };
    const bool fits = !closed_ && queued_tokens() + tokens <= limits_.max_queue_tokens;
    const batching::Admission got = queue_->push(r.request);
    FUZZ_CHECK(got == (closed_ ? batching::Admission::kClosed
                       : fits  ? batching::Admission::kAdmitted
                               : batching::Admission::kQueueFull));
    if (!fits) return;  // nothing of it queued: check_accounting proves it
    r.admitted = true;
    r.remaining = n;
    r.batched.assign(size_t(n), 0);
    r.dropped.assign(size_t(n), 0);
    for (int i = 0; i < n; ++i) {
      queued_.push_back({&r, i, engine::sequence_length(r.request->sequences[size_t(i)], kHidden),
                         next_seq_no_++});
    }
    admitted_.push_back(&r);
  }

  void pass_deadline(Req& r) {
    std::lock_guard lock(r.request->mu);
    r.request->deadline = batching::Clock::now();
    r.deadline_passed = true;
  }

  void cancel(Req& r) { r.cancelled = true; }

  void close() {
    queue_->close();
    closed_ = true;
  }

  int64_t queued_tokens() const {
    int64_t t = 0;
    for (const Entry& e : queued_) t += e.tokens;
    return t;
  }

  // The model's reason an entry must not be computed (kOk: alive), as the queue decides it.
  static Outcome dead_reason(const Req& r) {
    if (r.finished) return r.expected == Outcome::kOk ? Outcome::kEngineFailure : r.expected;
    if (r.deadline_passed) return Outcome::kDeadlineExceeded;
    if (r.cancelled) return Outcome::kCancelled;
    return Outcome::kOk;
  }

  void finish(Req& r, Outcome outcome) {
    if (r.finished) return;
    r.finished = true;
    r.expected = outcome;
  }

  struct Drop {
    const batching::Job* request;
    int32_t index;
    Outcome reason;
  };

  void drop(const Entry& e, Outcome reason, std::vector<Drop>* drops) {
    e.req->dropped[size_t(e.index)]++;
    drops->push_back({e.req->request.get(), e.index, reason});
    finish(*e.req, reason);
  }

  // Takes one batch; false when the queue answered "closed and empty".
  bool take() {
    const bool any_alive = std::any_of(queued_.begin(), queued_.end(), [](const Entry& e) {
      return dead_reason(*e.req) == Outcome::kOk;
    });
    if (!any_alive && !closed_) return true;  // next_batch would wait for an arrival
    // The model: drop dead entries at the head, then take in order within the budgets,
    // dropping dead entries met on the way; stop at the first live entry that does not fit.
    std::vector<Drop> drops;
    while (!queued_.empty() && dead_reason(*queued_.front().req) != Outcome::kOk) {
      drop(queued_.front(), dead_reason(*queued_.front().req), &drops);
      queued_.pop_front();
    }
    std::vector<Entry> expected;
    int64_t tokens = 0;
    while (!queued_.empty()) {
      const Entry& e = queued_.front();
      if (const Outcome reason = dead_reason(*e.req); reason != Outcome::kOk) {
        drop(e, reason, &drops);
        queued_.pop_front();
        continue;
      }
      const auto count = int64_t(expected.size());
      if (count == limits_.max_batch_sequences ||
          (count > 0 && tokens + e.tokens > limits_.max_batch_tokens))
        break;
      tokens += e.tokens;
      expected.push_back(e);
      queued_.pop_front();
    }

    seen_drops_.clear();
    std::optional<batching::Batch> batch = queue_->next_batch();

    // Drops for deadline or cancellation are observed, in queue order.
    std::vector<Drop> observed;
    for (const Drop& d : drops) {
      if (d.reason == Outcome::kDeadlineExceeded || d.reason == Outcome::kCancelled)
        observed.push_back(d);
    }
    FUZZ_CHECK(seen_drops_.size() == observed.size());
    for (size_t i = 0; i < observed.size(); ++i) {
      FUZZ_CHECK(seen_drops_[i].request == observed[i].request &&
                 seen_drops_[i].index == observed[i].index &&
                 seen_drops_[i].reason == observed[i].reason);
    }
    if (expected.empty()) {
      FUZZ_CHECK(!batch.has_value() && closed_ && queued_.empty());
      return false;
    }
    FUZZ_CHECK(batch.has_value());
    FUZZ_CHECK(batch->entries.size() == expected.size());
    FUZZ_CHECK(int64_t(batch->entries.size()) <= limits_.max_batch_sequences);
    FUZZ_CHECK(batch->tokens <= limits_.max_batch_tokens || batch->entries.size() == 1);
    FUZZ_CHECK(batch->tokens == tokens && batch->ragged.num_tokens() == tokens);
    FUZZ_CHECK(batch->ragged.num_sequences() == int32_t(expected.size()));
    FUZZ_CHECK(batch->options.size() == expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      const Entry& want = expected[i];
      const batching::QueueEntry& got = batch->entries[i];
      FUZZ_CHECK(got.request.get() == want.req->request.get() && got.index == want.index);
      FUZZ_CHECK(got.tokens == want.tokens);
      FUZZ_CHECK(batch->ragged.cu_seqlens[i + 1] - batch->ragged.cu_seqlens[i] == want.tokens);
      FUZZ_CHECK(want.seq_no >= next_batched_seq_no_);  // FIFO across batches
      next_batched_seq_no_ = want.seq_no + 1;
      want.req->batched[size_t(want.index)]++;
    }
    running_.push_back(std::move(*batch));
    running_entries_.push_back(std::move(expected));
    return true;
  }

  void complete(uint8_t which, bool fail) {
    if (running_.empty()) return;
    const size_t j = which % running_.size();
    batching::Batch batch = std::move(running_[j]);
    std::vector<Entry> entries = std::move(running_entries_[j]);
    running_.erase(running_.begin() + std::ptrdiff_t(j));
    running_entries_.erase(running_entries_.begin() + std::ptrdiff_t(j));
    // The model: a failure ends every request of the batch still running; a success
    // counts its sequences down and ends a request when its last one is computed.
    for (const Entry& e : entries) {
      if (fail) {
        finish(*e.req, Outcome::kEngineFailure);
      } else if (--e.req->remaining == 0) {
        finish(*e.req, Outcome::kOk);
      }
    }
    completer().engine.fail = fail;
    completer().scheduler->run_batch(batch, 0);
  }

  void check_accounting() {
    FUZZ_CHECK(queue_->queued_tokens() == queued_tokens());
    FUZZ_CHECK(queue_->queued_sequences() == int64_t(queued_.size()));
    FUZZ_CHECK(queue_->queued_tokens() <= limits_.max_queue_tokens);
    for (const auto& r : reqs_) {
      FUZZ_CHECK(r->completions == (r->finished ? 1 : 0));
      if (r->finished) FUZZ_CHECK(r->outcome == r->expected);
    }
  }

  fuzz::FuzzInput& in_;
  batching::QueueLimits limits_;
  std::optional<batching::BatchQueue> queue_;
  std::vector<std::unique_ptr<Req>> reqs_;
  std::vector<Req*> admitted_;
  std::deque<Entry> queued_;  // the model's queue
  std::vector<batching::Batch> running_;
  std::vector<std::vector<Entry>> running_entries_;
  std::vector<Drop> seen_drops_;
  int64_t depth_tokens_ = 0, depth_sequences_ = 0;
  uint64_t next_seq_no_ = 0, next_batched_seq_no_ = 0;
  bool closed_ = false;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::FuzzInput in(data, size);
  Harness(in).run();
  return 0;
}
