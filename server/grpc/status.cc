#include "server/grpc/status.h"

#include <chrono>

namespace fastformer::rpc {

// The neutral codes are the canonical ones, with gRPC's numbers.
#define FASTFORMER_SAME_CODE(ours, theirs) \
  static_assert(int(StatusCode::ours) == int(grpc::StatusCode::theirs))
FASTFORMER_SAME_CODE(kOk, OK);
FASTFORMER_SAME_CODE(kCancelled, CANCELLED);
FASTFORMER_SAME_CODE(kUnknown, UNKNOWN);
FASTFORMER_SAME_CODE(kInvalidArgument, INVALID_ARGUMENT);
FASTFORMER_SAME_CODE(kDeadlineExceeded, DEADLINE_EXCEEDED);
FASTFORMER_SAME_CODE(kNotFound, NOT_FOUND);
FASTFORMER_SAME_CODE(kAlreadyExists, ALREADY_EXISTS);
FASTFORMER_SAME_CODE(kPermissionDenied, PERMISSION_DENIED);
FASTFORMER_SAME_CODE(kResourceExhausted, RESOURCE_EXHAUSTED);
FASTFORMER_SAME_CODE(kFailedPrecondition, FAILED_PRECONDITION);
FASTFORMER_SAME_CODE(kAborted, ABORTED);
FASTFORMER_SAME_CODE(kOutOfRange, OUT_OF_RANGE);
FASTFORMER_SAME_CODE(kUnimplemented, UNIMPLEMENTED);
FASTFORMER_SAME_CODE(kInternal, INTERNAL);
FASTFORMER_SAME_CODE(kUnavailable, UNAVAILABLE);
FASTFORMER_SAME_CODE(kDataLoss, DATA_LOSS);
FASTFORMER_SAME_CODE(kUnauthenticated, UNAUTHENTICATED);
#undef FASTFORMER_SAME_CODE

grpc::Status to_grpc(const Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return {static_cast<grpc::StatusCode>(status.code()), status.message()};
}

Status from_grpc(const grpc::Status& status) {
  if (status.ok()) return {};
  return {static_cast<StatusCode>(status.error_code()), status.error_message()};
}

batching::Clock::time_point steady_deadline(const grpc::CallbackServerContext* context) {
  using batching::Clock;
  const auto deadline = context->deadline();
  if (deadline >= std::chrono::system_clock::time_point::max() - std::chrono::hours(24 * 365)) {
    return Clock::time_point::max();
  }
  return Clock::now() + (deadline - std::chrono::system_clock::now());
}

}  // namespace fastformer::rpc
