#include "server/request/outcome.h"

namespace fastformer::request {

Status outcome_status(const batching::Job& request) {
  switch (request.outcome) {
    case batching::Outcome::kOk:
      return Status();
    case batching::Outcome::kDeadlineExceeded:
      return {StatusCode::kDeadlineExceeded, "the deadline passed before the request was computed"};
    case batching::Outcome::kCancelled:
      return {StatusCode::kCancelled, "the call was cancelled"};
    case batching::Outcome::kEngineFailure:
      return {StatusCode::kInternal, "engine failure: " + request.error};
  }
  return {StatusCode::kInternal, "unknown outcome"};
}

}  // namespace fastformer::request
