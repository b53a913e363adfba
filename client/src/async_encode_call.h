// One EncodeAsync call: attempts on the callback API, waits between them on the client's
// retry timer, and the user's callback exactly once at the end.
#pragma once

#include <memory>
#include <mutex>
#include <optional>

#include "client/src/client_state.h"

namespace fastformer::internal {

class AsyncEncodeCall : public std::enable_shared_from_this<AsyncEncodeCall> {
 public:
  AsyncEncodeCall(std::shared_ptr<Client::State> state, v1::EncodeRequest request,
                  Client::EncodeCallback done, std::optional<SystemTime> deadline);

  // Registers the call with the client and starts the first attempt (or, when the client is
  // closing, answers CANCELLED at once).
  static void start(std::shared_ptr<AsyncEncodeCall> call);
  // Cancels the attempt in flight and any further one.
  void cancel();

 private:
  void start_attempt();
  void on_attempt_done(grpc::Status status);
  void finish(grpc::Status status);

  const LiveCalls::Token live_;  // first: released last
  const std::shared_ptr<Client::State> state_;
  const v1::EncodeRequest request_;
  v1::EncodeResponse response_;
  Client::EncodeCallback done_;
  const std::optional<SystemTime> deadline_;
  int attempt_ = 0;  ///< attempts started; only touched between attempts

  std::mutex mu_;
  std::unique_ptr<grpc::ClientContext> context_;  ///< the current attempt's
  bool cancelled_ = false;
};

}  // namespace fastformer::internal
