#include "common/status_names.h"

#include <absl/status/status.h>

namespace fastformer {

std::string status_code_name(grpc::StatusCode code) {
  // gRPC's codes are absl's (same numbers and names).
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

}  // namespace fastformer
