// The reactor behind EncodeStreamCall: a bidirectional EncodeStream on the callback API.
// Messages are queued and written one at a time; every answer goes to the callback as it is
// read. A hold keeps the call open while the user may still write (until WritesDone, or until
// the server ends its side), so a write never races the end of the call.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>

#include "client/src/client_state.h"

namespace fastformer {

class EncodeStreamCall::Reactor final
    : public grpc::ClientBidiReactor<v1::EncodeRequest, v1::EncodeResponse> {
 public:
  Reactor(std::shared_ptr<Client::State> state, Client::ResponseCallback on_response,
          std::function<void(const grpc::Status&)> on_done,
          std::optional<internal::SystemTime> deadline);

  bool write(v1::EncodeRequest request);
  void writes_done();
  grpc::Status wait();  ///< until OnDone
  void cancel() { context_.TryCancel(); }
  bool ended();

  void OnWriteDone(bool ok) override;
  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  // What to do once the lock is released.
  struct Step {
    const v1::EncodeRequest* write = nullptr;  ///< start this write
    bool release = false;                      ///< release the hold ...
    bool half_close = false;                   ///< ... after StartWritesDone
  };
  Step release_step_locked();
  void run(const Step& step);

  const std::shared_ptr<Client::State> state_;  ///< keeps the stub alive
  const Client::ResponseCallback on_response_;
  const std::function<void(const grpc::Status&)> on_done_;
  grpc::ClientContext context_;
  v1::EncodeResponse incoming_;

  std::mutex mu_;
  std::condition_variable ended_cv_;
  std::deque<v1::EncodeRequest> writes_;  ///< front: the write in flight, while `writing_`
  bool writing_ = false;
  bool broken_ = false;          ///< a write failed: the call is over for writing
  bool server_ended_ = false;    ///< reads are over: the server has ended the call
  bool done_requested_ = false;  ///< WritesDone called
  bool hold_released_ = false;
  bool ended_ = false;  ///< OnDone ran
  grpc::Status status_;
};

}  // namespace fastformer
