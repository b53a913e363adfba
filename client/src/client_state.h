// What a Client shares with its calls in flight: the channel and stubs, the options, the
// retry timer and the registry of asynchronous calls (so the destructor can cancel them).
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "client/src/retry.h"
#include "fastformer/client.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace fastformer {

namespace internal {

class AsyncEncodeCall;

// Counts the asynchronous call objects alive. The Client's destructor waits until none is:
// the last of them is destroyed on a gRPC callback thread, and must not take the channel with
// it (a channel destroyed on one of its own callback threads breaks gRPC's reference counts).
class LiveCalls {
 public:
  // Held by each call object, as its first member: released after everything else it holds.
  class Token {
   public:
    explicit Token(std::shared_ptr<LiveCalls> live) : live_(std::move(live)) {
      std::lock_guard lock(live_->mu_);
      ++live_->count_;
    }
    ~Token() {
      std::lock_guard lock(live_->mu_);
      if (--live_->count_ == 0) live_->none_.notify_all();
    }
    Token(const Token&) = delete;
    Token& operator=(const Token&) = delete;

   private:
    const std::shared_ptr<LiveCalls> live_;
  };

  void wait_none() {
    std::unique_lock lock(mu_);
    none_.wait(lock, [&] { return count_ == 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable none_;
  int64_t count_ = 0;
};

}  // namespace internal

struct Client::State {
  ClientOptions options;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Encoder::Stub> stub;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_stub;
  internal::DelayQueue retry_timer;

  const std::shared_ptr<internal::LiveCalls> live_calls = std::make_shared<internal::LiveCalls>();

  std::mutex mu;
  ///< the asynchronous calls not yet answered, for the destructor to cancel
  std::unordered_map<internal::AsyncEncodeCall*, std::shared_ptr<internal::AsyncEncodeCall>> calls;
  bool closing = false;  ///< the Client is being destroyed: no new attempts

  // The absolute deadline of a call: `per_call` if given, else options.deadline; none for 0.
  std::optional<internal::SystemTime> deadline_for(std::optional<Milliseconds> per_call) const;
  // Sets the deadline and the authorization metadata of one attempt.
  void prepare(grpc::ClientContext* context, std::optional<internal::SystemTime> deadline) const;
  // Tells options.on_retry, if set.
  void report_retry(const char* method, int attempt, const grpc::Status& status,
                    Milliseconds backoff) const;
};

}  // namespace fastformer
