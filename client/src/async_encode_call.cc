#include "client/src/async_encode_call.h"

namespace fastformer::internal {

namespace {
const grpc::Status kClientClosing(grpc::StatusCode::CANCELLED,
                                  "cancelled: the client is being destroyed");
}

AsyncEncodeCall::AsyncEncodeCall(std::shared_ptr<Client::State> state, v1::EncodeRequest request,
                                 Client::EncodeCallback done, std::optional<SystemTime> deadline)
    : live_(state->live_calls),
      state_(std::move(state)),
      request_(std::move(request)),
      done_(std::move(done)),
      deadline_(deadline) {}

void AsyncEncodeCall::start(std::shared_ptr<AsyncEncodeCall> call) {
  bool registered = false;
  {
    std::lock_guard lock(call->state_->mu);
    if (!call->state_->closing) {
      call->state_->calls.emplace(call.get(), call);
      registered = true;
    }
  }
  // Outside the lock: a cancel() in between is seen by start_attempt.
  if (registered)
    call->start_attempt();
  else
    call->done_(kClientClosing, {});
}

void AsyncEncodeCall::cancel() {
  std::lock_guard lock(mu_);
  cancelled_ = true;
  if (context_) context_->TryCancel();
}

void AsyncEncodeCall::start_attempt() {
  ++attempt_;
  response_.Clear();
  auto context = std::make_unique<grpc::ClientContext>();
  state_->prepare(context.get(), deadline_);
  grpc::ClientContext* raw = context.get();
  {
    std::lock_guard lock(mu_);
    if (cancelled_) {
      raw = nullptr;
    } else {
      context_ = std::move(context);  // the previous attempt has ended: its context may go
    }
  }
  if (raw == nullptr) {
    finish(kClientClosing);
    return;
  }
  state_->stub->async()->Encode(raw, &request_, &response_,
                                [self = shared_from_this()](grpc::Status status) {
                                  self->on_attempt_done(std::move(status));
                                });
}

void AsyncEncodeCall::on_attempt_done(grpc::Status status) {
  const Milliseconds backoff = backoff_delay(state_->options.retry, attempt_);
  bool retry = should_retry(state_->options.retry, attempt_, status, backoff, deadline_);
  if (retry) {
    std::lock_guard lock(mu_);
    retry = !cancelled_;
  }
  if (!retry) {
    finish(std::move(status));
    return;
  }
  state_->report_retry("Encode", attempt_, status, backoff);
  state_->retry_timer.post(std::chrono::steady_clock::now() + backoff,
                           [self = shared_from_this(), status](bool on_time) {
                             if (on_time)
                               self->start_attempt();
                             else
                               self->finish(status);
                           });
}

void AsyncEncodeCall::finish(grpc::Status status) {
  const bool ok = status.ok();
  done_(std::move(status), ok ? std::move(response_) : v1::EncodeResponse());
  std::lock_guard lock(state_->mu);
  state_->calls.erase(this);
}

}  // namespace fastformer::internal
