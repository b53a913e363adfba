#include "client/loadgen/load_runner.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>

#include "common/workload.h"

namespace fastformer::loadgen {
namespace {

using Clock = std::chrono::steady_clock;

grpc::Status status_of(const v1::EncodeResponse& answer) {
  if (!answer.has_error()) return grpc::Status::OK;
  return {static_cast<grpc::StatusCode>(answer.error().code()), answer.error().message()};
}

// Adds every answer to the step's result, in the phase its request was sent in.
class Recorder {
 public:
  Recorder(StepResult* result, Clock::time_point measure_from)
      : result_(result), measure_from_(measure_from) {}

  void record(Clock::time_point sent, const grpc::Status& status,
              const v1::EncodeResponse& response, const PooledRequest& request) {
    const Clock::time_point now = Clock::now();
    std::lock_guard lock(mu_);
    if (sent < measure_from_) {
      ++result_->warmup_requests;
      if (!status.ok()) ++result_->warmup_errors[status_code_name(status.error_code())];
      return;
    }
    ++result_->requests;
    last_answer_ = std::max(last_answer_, now);
    if (!status.ok()) {
      ++result_->errors[status_code_name(status.error_code())];
      return;
    }
    ++result_->succeeded;
    result_->sequences += request.sequences;
    // The server's count: a text's tokens are known only from its answer.
    for (const auto& encoding : response.encodings()) result_->tokens += encoding.num_tokens();
    result_->latency.record(
        std::chrono::duration_cast<std::chrono::nanoseconds>(now - sent).count());
    result_->server_queue.record(int64_t(response.queue_time_us()) * 1000);
    result_->server_compute.record(int64_t(response.compute_time_us()) * 1000);
  }

  void note_send_lag(Clock::duration lag) {
    const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(lag).count();
    std::lock_guard lock(mu_);
    result_->max_send_lag_ns = std::max(result_->max_send_lag_ns, ns);
  }

  void finish(Clock::time_point stop_at) {
    std::lock_guard lock(mu_);
    result_->elapsed_s =
        std::chrono::duration<double>(std::max(stop_at, last_answer_) - measure_from_).count();
  }

 private:
  std::mutex mu_;
  StepResult* result_;
  const Clock::time_point measure_from_;
  Clock::time_point last_answer_{};
};

// Counts work in flight; wait() returns once none is left.
class Inflight {
 public:
  void add() {
    std::lock_guard lock(mu_);
    ++count_;
  }
  void done() {
    std::lock_guard lock(mu_);
    if (--count_ == 0) zero_.notify_all();
  }
  void wait() {
    std::unique_lock lock(mu_);
    zero_.wait(lock, [&] { return count_ == 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable zero_;
  int64_t count_ = 0;
};

// Everything one step's senders share.
struct StepContext {
  Client& client;
  const std::vector<PooledRequest>& pool;
  const LoadStep& step;
  Recorder& recorder;
  Clock::time_point start;    ///< warm-up begins
  Clock::time_point stop_at;  ///< no request is sent from here on
  std::atomic<uint64_t> next{0};

  const PooledRequest& next_request() { return pool[next.fetch_add(1) % pool.size()]; }
  // A stream's deadline covers the whole step, plus the per-request deadline for the last ones.
  std::optional<Milliseconds> stream_deadline() const {
    if (!step.deadline || step.deadline->count() <= 0) return Milliseconds(0);
    return std::chrono::duration_cast<Milliseconds>(stop_at - start) + *step.deadline;
  }
};

// ---- closed loop -------------------------------------------------------------------------

// Each of `concurrency` slots sends its next request when the previous one is answered.
void run_closed_unary(StepContext& ctx) {
  Inflight slots;
  std::function<void()> issue = [&] {
    const Clock::time_point sent = Clock::now();
    if (sent >= ctx.stop_at) {
      slots.done();
      return;
    }
    const PooledRequest& request = ctx.next_request();
    ctx.client.EncodeAsync(
        request.request,
        [&ctx, &issue, &request, sent](grpc::Status status, v1::EncodeResponse response) {
          ctx.recorder.record(sent, status, response, request);
          issue();
        },
        ctx.step.deadline);
  };
  for (int i = 0; i < ctx.step.concurrency; ++i) slots.add();
  for (int i = 0; i < ctx.step.concurrency; ++i) issue();
  slots.wait();
}

// One stream per slot, one message in flight on each.
class StreamSlot {
 public:
  std::unique_ptr<EncodeStreamCall> call;

  // A message is on its way.
  void sent(Clock::time_point at, const PooledRequest* request) {
    std::lock_guard lock(mu_);
    sent_at_ = at;
    awaited_ = request;
  }
  // The message awaiting its answer (and when it was sent), now answered or lost; null if none.
  std::pair<Clock::time_point, const PooledRequest*> take() {
    std::lock_guard lock(mu_);
    return {sent_at_, std::exchange(awaited_, nullptr)};
  }
  // True the first time only: the slot is done sending.
  bool finish() {
    std::lock_guard lock(mu_);
    return !std::exchange(finished_, true);
  }

 private:
  std::mutex mu_;
  Clock::time_point sent_at_;
  const PooledRequest* awaited_ = nullptr;
  bool finished_ = false;
};

// The status of a message a stream never answered: the stream's own, or UNKNOWN if it ended OK.
grpc::Status unanswered(const grpc::Status& stream_status) {
  if (!stream_status.ok()) return stream_status;
  return {grpc::StatusCode::UNKNOWN, "the stream ended without answering the message"};
}

void run_closed_stream(StepContext& ctx) {
  Inflight slots;
  std::vector<std::unique_ptr<StreamSlot>> all;
  const auto finish = [&](StreamSlot& slot) {
    if (slot.finish()) slots.done();
  };
  // Sends the slot's next message; false when the step is over or the stream has ended.
  const auto send_next = [&](StreamSlot& slot) {
    const Clock::time_point now = Clock::now();
    if (now >= ctx.stop_at) return false;
    const PooledRequest& request = ctx.next_request();
    slot.sent(now, &request);
    if (slot.call->Write(request.request)) return true;
    slot.take();  // not sent: nothing to count
    return false;
  };
  for (int i = 0; i < ctx.step.concurrency; ++i) {
    all.push_back(std::make_unique<StreamSlot>());
    slots.add();
  }
  for (auto& owned : all) {
    StreamSlot* slot = owned.get();
    const auto on_response = [&, slot](const v1::EncodeResponse& response) {
      if (const auto [sent, request] = slot->take(); request != nullptr) {
        ctx.recorder.record(sent, status_of(response), response, *request);
      }
      if (!send_next(*slot)) finish(*slot);
    };
    const auto on_done = [&, slot](const grpc::Status& status) {
      if (const auto [sent, request] = slot->take(); request != nullptr) {
        ctx.recorder.record(sent, unanswered(status), {}, *request);
      }
      finish(*slot);
    };
    slot->call = ctx.client.OpenEncodeStream(on_response, ctx.stream_deadline(), on_done);
  }
  for (auto& slot : all) {
    if (!send_next(*slot)) finish(*slot);
  }
  slots.wait();
  for (auto& slot : all) slot->call->Finish();
}

// ---- open loop ---------------------------------------------------------------------------

// Send times from the step's start: constant gaps of 1/rate, or exponential ones (Poisson
// arrivals) drawn with splitmix64 from the step's seed.
class Arrivals {
 public:
  Arrivals(const LoadStep& step) : step_(step), rng_(step.seed) {}
  Clock::duration next() {
    double offset_s = 0;
    if (step_.poisson) {
      const double u = double(rng_.next() >> 11) * 0x1.0p-53;  // [0, 1)
      poisson_s_ += -std::log1p(-u) / step_.rate;
      offset_s = poisson_s_;
    } else {
      offset_s = double(count_) / step_.rate;
    }
    ++count_;
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(offset_s));
  }

 private:
  const LoadStep& step_;
  SplitMix64 rng_;
  double poisson_s_ = 0;
  uint64_t count_ = 0;
};

// Messages in flight on one stream of the open loop, by request_id.
struct OpenStream {
  std::unique_ptr<EncodeStreamCall> call;
  std::mutex mu;
  std::unordered_map<std::string, std::pair<Clock::time_point, const PooledRequest*>> waiting;
  bool ended = false;
  grpc::Status end_status;
};

// Runs the schedule on this thread; `send` must not wait for the answer.
template <class Send>
void run_schedule(StepContext& ctx, Send&& send) {
  Arrivals arrivals(ctx.step);
  for (uint64_t k = 0;; ++k) {
    const Clock::time_point scheduled = ctx.start + arrivals.next();
    if (scheduled >= ctx.stop_at) break;
    std::this_thread::sleep_until(
        scheduled);  // at once when behind: latency still counts from `scheduled`
    const Clock::time_point now = Clock::now();
    if (now > scheduled) ctx.recorder.note_send_lag(now - scheduled);
    send(k, scheduled, ctx.next_request());
  }
}

void run_open_unary(StepContext& ctx) {
  Inflight inflight;
  run_schedule(ctx, [&](uint64_t, Clock::time_point scheduled, const PooledRequest& request) {
    inflight.add();
    ctx.client.EncodeAsync(
        request.request,
        [&ctx, &inflight, &request, scheduled](grpc::Status status, v1::EncodeResponse response) {
          ctx.recorder.record(scheduled, status, response, request);
          inflight.done();
        },
        ctx.step.deadline);
  });
  inflight.wait();
}

void run_open_stream(StepContext& ctx) {
  Inflight inflight;
  std::vector<std::unique_ptr<OpenStream>> streams;
  for (int i = 0; i < std::max(1, ctx.step.concurrency); ++i) {
    streams.push_back(std::make_unique<OpenStream>());
    OpenStream* stream = streams.back().get();
    const auto on_response = [&, stream](const v1::EncodeResponse& response) {
      std::pair<Clock::time_point, const PooledRequest*> entry{};
      {
        std::lock_guard lock(stream->mu);
        auto it = stream->waiting.find(response.request_id());
        if (it == stream->waiting.end()) return;
        entry = it->second;
        stream->waiting.erase(it);
      }
      ctx.recorder.record(entry.first, status_of(response), response, *entry.second);
      inflight.done();
    };
    const auto on_done = [&, stream](const grpc::Status& status) {
      const grpc::Status failed = unanswered(status);
      std::unordered_map<std::string, std::pair<Clock::time_point, const PooledRequest*>> lost;
      {
        std::lock_guard lock(stream->mu);
        stream->ended = true;
        stream->end_status = failed;
        lost.swap(stream->waiting);
      }
      for (const auto& [id, entry] : lost) {
        ctx.recorder.record(entry.first, failed, {}, *entry.second);
        inflight.done();
      }
    };
    stream->call = ctx.client.OpenEncodeStream(on_response, ctx.stream_deadline(), on_done);
  }
  run_schedule(ctx, [&](uint64_t k, Clock::time_point scheduled, const PooledRequest& request) {
    OpenStream& stream = *streams[k % streams.size()];
    v1::EncodeRequest message = request.request;
    message.set_request_id(std::to_string(k));
    inflight.add();
    grpc::Status ended;
    {
      std::lock_guard lock(stream.mu);
      if (stream.ended)
        ended = stream.end_status;
      else
        stream.waiting.emplace(message.request_id(), std::make_pair(scheduled, &request));
    }
    if (!ended.ok()) {  // the stream is gone: this request fails as it did
      ctx.recorder.record(scheduled, ended, {}, request);
      inflight.done();
      return;
    }
    stream.call->Write(std::move(message));  // if refused, the stream's end counts it
  });
  inflight.wait();
  for (auto& stream : streams) stream->call->Finish();
}

}  // namespace

StepResult run_step(Client& client, const std::vector<PooledRequest>& pool, const LoadStep& step) {
  StepResult result;
  result.step = step;
  const Clock::time_point start = Clock::now();
  const auto seconds = [](double s) {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  };
  const Clock::time_point measure_from = start + seconds(step.warmup_s);
  Recorder recorder(&result, measure_from);
  StepContext ctx{client, pool, step, recorder, start, measure_from + seconds(step.duration_s)};
  if (step.open_loop) {
    step.stream ? run_open_stream(ctx) : run_open_unary(ctx);
  } else {
    step.stream ? run_closed_stream(ctx) : run_closed_unary(ctx);
  }
  recorder.finish(ctx.stop_at);
  return result;
}

}  // namespace fastformer::loadgen
