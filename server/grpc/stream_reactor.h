// The bidirectional streams of both APIs (Encoder.EncodeStream and the protocol's
// ModelStreamInfer) over one reactor: every message read becomes a request in the batch
// queue; answers are written one at a time, in completion order, errors in-band; the call
// ends when the client closed its side and every answer is written.
//
// A stream holds at most kMaxPendingMessages messages read and not yet written back (queued,
// computing or waiting to be written): at that bound it is not read further until answers
// are written, so a client that sends without reading cannot pile requests or answers up in
// server memory; HTTP/2 flow control then holds the client.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <deque>
#include <memory>
#include <mutex>

#include "server/grpc/status.h"
#include "server/serving/intake.h"

namespace fastformer::rpc {

// Protocol: what one API's stream does with a message. It has
//   using Request, Response;          the stream's message types
//   struct Message { Request proto; ... };  one message's state, kept until it is answered
//   static constexpr const char* kMethod;   the metrics' method label
//   Status admit(Message&, grpc::CallbackServerContext*, const
//   std::shared_ptr<batching::Job>&);
//       Intake::admit with the API's conversion
//   Response answer(Message&, const batching::Job* done, const Status&);
//       the answer: from `done`'s results when the status is OK, else the in-band error
//       (`done` is null for a message refused at admission)
template <class Protocol>
class StreamReactor final
    : public grpc::ServerBidiReactor<typename Protocol::Request, typename Protocol::Response> {
  using Request = typename Protocol::Request;
  using Response = typename Protocol::Response;
  using Message = typename Protocol::Message;
  using Clock = batching::Clock;

 public:
  StreamReactor(Protocol* protocol, Intake* intake, grpc::CallbackServerContext* context)
      : protocol_(protocol), intake_(intake), context_(context) {
    this->StartRead(&incoming_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      Step step;
      {
        std::lock_guard lock(mu_);
        reads_done_ = true;
        step = next_step_locked();
      }
      run(this, step);  // may end the call: nothing touches `this` after it
      return;
    }
    const auto start = Clock::now();
    auto message = std::make_shared<Message>();
    message->proto = std::move(incoming_);
    auto request = std::make_shared<batching::Job>();
    request->is_cancelled = [this] { return cancelled_.load(); };
    {
      std::lock_guard lock(mu_);
      ++outstanding_;  // before StartRead: the call cannot end while this message is open
    }
    request->on_complete = [this, message, start](batching::Job& r) {
      const Status status = outcome_status(r);
      const auto filling = Clock::now();
      Response response = protocol_->answer(*message, &r, status);
      intake_->complete(Protocol::kMethod, r, status, start, ns_since(filling));
      queue_answer(std::move(response));  // last: may end the call
    };
    const Status status = protocol_->admit(*message, context_, request);
    incoming_.Clear();
    bool read_now = false;
    {
      std::lock_guard lock(mu_);
      read_now = pending_locked() < kMaxPendingMessages;
      read_paused_ = !read_now;
    }
    if (read_now) this->StartRead(&incoming_);
    if (!status.ok()) {
      intake_->record(Protocol::kMethod, status, start);
      queue_answer(protocol_->answer(*message, nullptr, status));  // last
    }
  }

  void OnWriteDone(bool ok) override {
    Step step;
    {
      std::lock_guard lock(mu_);
      writes_.pop_front();
      if (!ok) broken_ = true;  // the client is gone: the remaining answers have nowhere to go
      if (broken_) writes_.clear();
      writing_ = false;
      step = next_step_locked();
    }
    run(this, step);
  }

  void OnCancel() override { cancelled_.store(true); }

  void OnDone() override {
    intake_->close_stream();
    delete this;
  }

 private:
  // What to do once the lock is released: start the next write, end the call, or nothing.
  struct Step {
    bool read = false;
    const Response* write = nullptr;
    bool finish = false;
  };

  // Messages read and not yet written back: admitted and unanswered, or answered and unwritten.
  size_t pending_locked() const { return static_cast<size_t>(outstanding_) + writes_.size(); }

  Step next_step_locked() {
    Step step;
    if (read_paused_ && pending_locked() < kMaxPendingMessages) {
      read_paused_ = false;  // the reader was held back by pending messages: resume it
      step.read = true;
    }
    if (!writing_ && !writes_.empty()) {
      writing_ = true;
      step.write = &writes_.front();  // stable: deque push_back keeps references valid
    } else if (reads_done_ && outstanding_ == 0 && !writing_ && writes_.empty() && !finished_) {
      finished_ = true;
      step.finish = true;
    }
    return step;
  }

  // Outside the lock, as the caller's last action: Finish may run OnDone (delete this) on
  // another thread at once. Static, and touching nothing for an empty step: once the lock is
  // released with nothing left to do here, another thread may already have written the last
  // answer, ended the call and deleted the reactor, so not even a member call may follow (the
  // sanitizers' e2e run caught queue_answer calling a member run() on a deleted reactor). A
  // step that does something keeps the reactor alive: its write holds writing_, its finish
  // is this thread's alone, and its read means the reads are not done.
  static void run(StreamReactor* self, const Step& step) {
    if (step.read)
      self->StartRead(&self->incoming_);  // never with finish: reads are not done while paused
    if (step.write != nullptr)
      self->StartWrite(step.write);
    else if (step.finish)
      self->Finish(grpc::Status::OK);
  }

  // Queues the answer to one message.
  void queue_answer(Response response) {
    Step step;
    {
      std::lock_guard lock(mu_);
      --outstanding_;
      if (!broken_) writes_.push_back(std::move(response));
      step = next_step_locked();
    }
    run(this, step);
  }

  Protocol* protocol_;
  Intake* intake_;
  grpc::CallbackServerContext* context_;
  Request incoming_;
  std::mutex mu_;
  std::deque<Response> writes_;  // front() is being written while writing_
  int64_t outstanding_ = 0;      // messages read and not yet answered
  bool reads_done_ = false, writing_ = false, broken_ = false, finished_ = false;
  bool read_paused_ = false;  // no read outstanding because kMaxPendingMessages are pending
  std::atomic<bool> cancelled_{false};
  static constexpr size_t kMaxPendingMessages = 256;
};

// A stream over the server's max_concurrent_streams: ended with `status` before any message
// is read.
template <class Request, class Response>
class RejectedStreamReactor final : public grpc::ServerBidiReactor<Request, Response> {
 public:
  explicit RejectedStreamReactor(const Status& status) { this->Finish(to_grpc(status)); }
  void OnDone() override { delete this; }
};

// The reactor for a new stream of `Protocol`: a StreamReactor, or a rejected one when the
// server already has max_concurrent_streams streams open.
template <class Protocol>
grpc::ServerBidiReactor<typename Protocol::Request, typename Protocol::Response>* open_stream(
    Protocol* protocol, Intake* intake, grpc::CallbackServerContext* context) {
  const auto start = batching::Clock::now();
  if (Status refused = intake->open_stream(Protocol::kMethod); !refused.ok()) {
    intake->record(Protocol::kMethod, refused, start);
    return new RejectedStreamReactor<typename Protocol::Request, typename Protocol::Response>(
        refused);
  }
  return new StreamReactor<Protocol>(protocol, intake, context);
}

}  // namespace fastformer::rpc
