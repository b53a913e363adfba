// The protocol-neutral outcome of a call: a canonical code and a message. Every layer below
// the front doors (the repository, the serving core) speaks it; each front door maps it to
// its own codes in one function (server/grpc/status.h: gRPC's; server/http/api.cc,
// http_status: each HTTP API's). The codes are the canonical ones (gRPC's and absl's, with
// their numbers), because those are what the clients, the logs and the metric labels name.
//
// It lives in common/ rather than in server/serving/ because the repository, below the
// serving core, answers with it too (it replaced repository::Error).
#pragma once

#include <string>
#include <utility>

namespace fastformer {

enum class StatusCode : int {
  kOk = 0,
  kCancelled = 1,
  kUnknown = 2,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kAlreadyExists = 6,
  kPermissionDenied = 7,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kAborted = 10,
  kOutOfRange = 11,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
  kDataLoss = 15,
  kUnauthenticated = 16,
};

// "OK", "INVALID_ARGUMENT", ...: the spelling of the metric labels and the logs.
const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status Ok() { return {}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  /// The request field a refusal is about, by its wire name and without an index ("input",
  /// "dimensions"), for an API that reports it apart (OpenAI's error `param`); empty: unknown.
  const std::string& field() const { return field_; }
  Status with_field(std::string field) && {
    field_ = std::move(field);
    return std::move(*this);
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
  std::string field_;
};

// INVALID_ARGUMENT with `message`: what every refusal of a request's field is.
inline Status invalid_argument(std::string message) {
  return {StatusCode::kInvalidArgument, std::move(message)};
}

}  // namespace fastformer
