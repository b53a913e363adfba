#include "client/src/encode_stream_reactor.h"

namespace fastformer {

EncodeStreamCall::Reactor::Reactor(std::shared_ptr<Client::State> state,
                                   Client::ResponseCallback on_response,
                                   std::function<void(const grpc::Status&)> on_done,
                                   std::optional<internal::SystemTime> deadline)
    : state_(std::move(state)), on_response_(std::move(on_response)), on_done_(std::move(on_done)) {
  state_->prepare(&context_, deadline);
  state_->stub->async()->EncodeStream(&context_, this);
  AddHold();
  StartRead(&incoming_);
  StartCall();
}

// The hold goes once nothing is being written and no more will be: the user called WritesDone,
// a write failed, or the server has ended the call. Until then a write may start.
EncodeStreamCall::Reactor::Step EncodeStreamCall::Reactor::release_step_locked() {
  Step step;
  if (!writing_ && !hold_released_ && (done_requested_ || broken_ || server_ended_)) {
    hold_released_ = true;
    step.release = true;
    step.half_close = !broken_ && !server_ended_;
  }
  return step;
}

void EncodeStreamCall::Reactor::run(const Step& step) {
  if (step.write != nullptr) StartWrite(step.write);
  if (step.half_close) StartWritesDone();
  if (step.release) RemoveHold();
}

bool EncodeStreamCall::Reactor::write(v1::EncodeRequest request) {
  Step step;
  {
    std::lock_guard lock(mu_);
    if (hold_released_ || done_requested_ || broken_ || server_ended_) return false;
    writes_.push_back(std::move(request));
    if (!writing_) {
      writing_ = true;                // the hold stays while writing_
      step.write = &writes_.front();  // stable: a deque keeps references on push_back
    }
  }
  run(step);
  return true;
}

void EncodeStreamCall::Reactor::writes_done() {
  Step step;
  {
    std::lock_guard lock(mu_);
    done_requested_ = true;
    step = release_step_locked();
  }
  run(step);
}

void EncodeStreamCall::Reactor::OnWriteDone(bool ok) {
  Step step;
  {
    std::lock_guard lock(mu_);
    writes_.pop_front();
    if (!ok) {
      broken_ = true;  // the call has ended: nothing more can be written
      writes_.clear();
    }
    if (!writes_.empty()) {
      step.write = &writes_.front();
    } else {
      writing_ = false;
      step = release_step_locked();
    }
  }
  run(step);
}

void EncodeStreamCall::Reactor::OnReadDone(bool ok) {
  if (ok) {
    on_response_(incoming_);
    incoming_.Clear();
    StartRead(&incoming_);
    return;
  }
  Step step;
  {
    std::lock_guard lock(mu_);
    server_ended_ = true;  // its status is on the way: stop writing and let OnDone come
    step = release_step_locked();
  }
  run(step);
}

void EncodeStreamCall::Reactor::OnDone(const grpc::Status& status) {
  if (on_done_) on_done_(status);
  std::lock_guard lock(mu_);
  status_ = status;
  ended_ = true;
  ended_cv_.notify_all();  // under the lock: the waiter may destroy this as soon as it wakes
}

grpc::Status EncodeStreamCall::Reactor::wait() {
  std::unique_lock lock(mu_);
  ended_cv_.wait(lock, [&] { return ended_; });
  return status_;
}

bool EncodeStreamCall::Reactor::ended() {
  std::lock_guard lock(mu_);
  return ended_;
}

// ---- EncodeStreamCall --------------------------------------------------------------------

EncodeStreamCall::EncodeStreamCall(std::unique_ptr<Reactor> reactor)
    : reactor_(std::move(reactor)) {}

EncodeStreamCall::~EncodeStreamCall() {
  if (!reactor_->ended()) reactor_->cancel();
  reactor_->writes_done();
  reactor_->wait();
}

bool EncodeStreamCall::Write(v1::EncodeRequest request) {
  return reactor_->write(std::move(request));
}

void EncodeStreamCall::WritesDone() { reactor_->writes_done(); }

grpc::Status EncodeStreamCall::Finish() {
  reactor_->writes_done();
  return reactor_->wait();
}

void EncodeStreamCall::Cancel() { reactor_->cancel(); }

}  // namespace fastformer
