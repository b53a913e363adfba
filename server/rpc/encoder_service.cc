#include "server/rpc/encoder_service.h"

#include <deque>
#include <mutex>

#include <spdlog/spdlog.h>

#include "common/status_names.h"

namespace fastformer::rpc {
namespace {

using batching::Clock;

// The call's deadline on the steady clock (max() when the client set none).
Clock::time_point steady_deadline(const grpc::CallbackServerContext* context) {
  const auto deadline = context->deadline();
  if (deadline >= std::chrono::system_clock::time_point::max() - std::chrono::hours(24 * 365)) {
    return Clock::time_point::max();
  }
  return Clock::now() + (deadline - std::chrono::system_clock::now());
}

const grpc::Status kDraining(grpc::StatusCode::UNAVAILABLE, "the server is shutting down");
const grpc::Status kStarting(grpc::StatusCode::UNAVAILABLE, "the server is starting (warm-up); retry shortly");

}  // namespace

grpc::Status EncoderService::availability() const {
  if (draining_.load()) return kDraining;
  if (!serving_.load(std::memory_order_acquire)) return kStarting;
  return grpc::Status::OK;
}

EncoderService::EncoderService(metrics::Metrics& metrics) : metrics_(metrics) {}

void EncoderService::start_serving(ServiceConfig config, const engine::Engine& engine,
                                   batching::BatchQueue& queue) {
  config_ = std::move(config);
  engine_ = &engine;
  queue_ = &queue;
  serving_.store(true, std::memory_order_release);
}

void EncoderService::record(const char* method, const grpc::Status& status, Clock::time_point start) {
  metrics_.record_request(method, status_code_name(status.error_code()),
                          std::chrono::duration<double>(Clock::now() - start).count());
  if (!status.ok() && status.error_code() != grpc::StatusCode::CANCELLED) {
    spdlog::warn("{} failed: {}: {}", method, status_code_name(status.error_code()), status.error_message());
  }
}

grpc::Status EncoderService::admit(const v1::EncodeRequest& proto, grpc::CallbackServerContext* context,
                                   std::shared_ptr<batching::Request> request) {
  // Counted in flight before the draining check: the drain (start_draining, then wait for
  // inflight() == 0) either sees this call or this call sees the drain; never neither.
  count_inflight();
  grpc::Status status = availability();
  if (status.ok()) status = convert_request(proto, engine_->model(), config_.limits, request.get());
  if (!status.ok()) {
    uncount_inflight();
    return status;
  }
  request->arrival = Clock::now();
  request->deadline = steady_deadline(context);
  switch (queue_->push(request)) {
    case batching::Admission::kAdmitted: return grpc::Status::OK;
    case batching::Admission::kQueueFull:
      status = {grpc::StatusCode::RESOURCE_EXHAUSTED,
                "queue full: " + std::to_string(request->tokens) + " more tokens would exceed max_queue_tokens " +
                    std::to_string(queue_->limits().max_queue_tokens) + "; retry later"};
      break;
    case batching::Admission::kClosed: status = kDraining; break;
  }
  uncount_inflight();
  return status;
}

grpc::ServerUnaryReactor* EncoderService::Encode(grpc::CallbackServerContext* context,
                                                 const v1::EncodeRequest* proto,
                                                 v1::EncodeResponse* response) {
  const auto start = Clock::now();
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  auto request = std::make_shared<batching::Request>();
  request->is_cancelled = [context] { return context->IsCancelled(); };
  request->on_complete = [this, reactor, proto, response, start](batching::Request& r) {
    const grpc::Status status = outcome_status(r);
    if (status.ok()) fill_response(r, response);
    response->set_request_id(proto->request_id());
    record("Encode", status, start);
    uncount_inflight();
    reactor->Finish(status);
  };
  const grpc::Status status = admit(*proto, context, request);
  if (!status.ok()) {
    record("Encode", status, start);
    reactor->Finish(status);
  }
  return reactor;
}

// One EncodeStream call: every message read becomes a request; answers are written one at
// a time, in completion order; the call ends when the client closed its side and every
// answer is written. A stream holds at most kMaxPendingMessages messages read and not yet
// written back (queued, computing or waiting to be written): at that bound it is not read
// further until answers are written, so a client that sends without reading cannot pile
// requests or answers up in server memory; HTTP/2 flow control then holds the client.
class EncoderService::StreamReactor final
    : public grpc::ServerBidiReactor<v1::EncodeRequest, v1::EncodeResponse> {
 public:
  StreamReactor(EncoderService* service, grpc::CallbackServerContext* context)
      : service_(service), context_(context) {
    StartRead(&incoming_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      Step step;
      {
        std::lock_guard lock(mu_);
        reads_done_ = true;
        step = next_step_locked();
      }
      run(step);  // may end the call: nothing touches `this` after it
      return;
    }
    const auto start = Clock::now();
    auto message = std::make_shared<v1::EncodeRequest>(std::move(incoming_));
    auto request = std::make_shared<batching::Request>();
    request->is_cancelled = [this] { return cancelled_.load(); };
    {
      std::lock_guard lock(mu_);
      ++outstanding_;  // before StartRead: the call cannot end while this message is open
    }
    request->on_complete = [this, message, start](batching::Request& r) {
      v1::EncodeResponse response;
      const grpc::Status status = outcome_status(r);
      if (status.ok()) fill_response(r, &response);
      service_->uncount_inflight();
      answer(*message, status, start, std::move(response));  // last: may end the call
    };
    const grpc::Status status = service_->admit(*message, context_, request);
    incoming_.Clear();
    bool read_now = false;
    {
      std::lock_guard lock(mu_);
      read_now = pending_locked() < kMaxPendingMessages;
      read_paused_ = !read_now;
    }
    if (read_now) StartRead(&incoming_);
    if (!status.ok()) answer(*message, status, start, {});  // last: may end the call
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
    run(step);
  }

  void OnCancel() override { cancelled_.store(true); }

  void OnDone() override {
    service_->open_streams_.fetch_sub(1);
    service_->metrics_.open_streams.Decrement();
    delete this;
  }

 private:
  // What to do once the lock is released: start the next write, end the call, or nothing.
  struct Step {
    bool read = false;
    const v1::EncodeResponse* write = nullptr;
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
  // another thread at once.
  void run(const Step& step) {
    if (step.read) StartRead(&incoming_);  // never with finish: reads are not done while paused
    if (step.write != nullptr) StartWrite(step.write);
    else if (step.finish) Finish(grpc::Status::OK);
  }

  // Queues the answer to one message (in-band error when `status` is not OK).
  void answer(const v1::EncodeRequest& message, const grpc::Status& status, Clock::time_point start,
              v1::EncodeResponse response) {
    service_->record("EncodeStream", status, start);
    response.set_request_id(message.request_id());
    if (!status.ok()) {
      response.clear_encodings();
      response.mutable_error()->set_code(static_cast<int32_t>(status.error_code()));
      response.mutable_error()->set_message(status.error_message());
    }
    Step step;
    {
      std::lock_guard lock(mu_);
      --outstanding_;
      if (!broken_) writes_.push_back(std::move(response));
      step = next_step_locked();
    }
    run(step);
  }

  EncoderService* service_;
  grpc::CallbackServerContext* context_;
  v1::EncodeRequest incoming_;
  std::mutex mu_;
  std::deque<v1::EncodeResponse> writes_;  // front() is being written while writing_
  int64_t outstanding_ = 0;                // messages read and not yet answered
  bool reads_done_ = false, writing_ = false, broken_ = false, finished_ = false;
  bool read_paused_ = false;  // no read outstanding because kMaxPendingMessages are pending
  std::atomic<bool> cancelled_{false};
  static constexpr size_t kMaxPendingMessages = 256;
};

// A stream over --max-concurrent-streams: ended with `status` before any message is read.
class EncoderService::RejectedStreamReactor final
    : public grpc::ServerBidiReactor<v1::EncodeRequest, v1::EncodeResponse> {
 public:
  explicit RejectedStreamReactor(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

grpc::ServerBidiReactor<v1::EncodeRequest, v1::EncodeResponse>* EncoderService::EncodeStream(
    grpc::CallbackServerContext* context) {
  const auto start = Clock::now();
  // Counted before the check, so concurrent openers never exceed the limit together.
  if (open_streams_.fetch_add(1) >= max_concurrent_streams_ && max_concurrent_streams_ > 0) {
    open_streams_.fetch_sub(1);
    const grpc::Status status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                              "too many open streams: max_concurrent_streams " +
                                  std::to_string(max_concurrent_streams_) +
                                  " EncodeStream calls are open on this server; close one or retry later");
    record("EncodeStream", status, start);
    return new RejectedStreamReactor(status);
  }
  metrics_.open_streams.Increment();
  return new StreamReactor(this, context);
}

grpc::ServerUnaryReactor* EncoderService::GetModelInfo(grpc::CallbackServerContext* context,
                                                       const v1::GetModelInfoRequest*,
                                                       v1::ModelInfo* info) {
  const auto start = Clock::now();
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (const grpc::Status unavailable = availability(); !unavailable.ok()) {
    record("GetModelInfo", unavailable, start);
    reactor->Finish(unavailable);
    return reactor;
  }
  const engine::Model& model = engine_->model();
  const engine::ModelConfig& c = model.config();
  info->set_model_name(c.model_name);
  info->set_hidden_size(uint32_t(c.hidden_size));
  info->set_num_hidden_layers(uint32_t(c.num_hidden_layers));
  info->set_num_attention_heads(uint32_t(c.num_attention_heads));
  info->set_intermediate_size(uint32_t(c.intermediate_size));
  info->set_max_position_embeddings(uint32_t(c.max_position_embeddings));
  info->set_vocab_size(uint32_t(c.vocab_size));
  info->set_num_labels(uint32_t(model.num_labels()));
  info->set_accepts_token_ids(model.has_word_embedding());
  info->set_dtype(config_.dtype);
  info->set_backend(engine_->backend_name());
  info->set_device(engine_->device_name());
  info->set_max_batch_tokens(uint32_t(config_.max_batch_tokens));
  info->set_max_request_tokens(uint32_t(config_.limits.max_request_tokens));
  info->set_server_version(config_.version);
  record("GetModelInfo", grpc::Status::OK, start);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace fastformer::rpc
