// EncodeRequest (proto) -> validated batching::Request, applying truncation and the
// request limits. A request that can never succeed gets INVALID_ARGUMENT naming the
// sequence index and the field; nothing of it is queued.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <grpcpp/support/status.h>

#include "fastformer/v1/encoder.pb.h"
#include "server/batching/request.h"
#include "server/engine/model.h"

namespace fastformer::rpc {

struct RequestLimits {
  int64_t max_request_tokens = 0;  ///< tokens over all sequences of one request
};

// Fills `out` (sequences are views into `proto`, which must outlive the request).
grpc::Status convert_request(const v1::EncodeRequest& proto, const engine::Model& model,
                             const RequestLimits& limits, batching::Request* out);

// Copies the results of a finished request into `response` (encodings, timings).
void fill_response(const batching::Request& request, v1::EncodeResponse* response);

// The status a finished request answers with.
grpc::Status outcome_status(const batching::Request& request);

}  // namespace fastformer::rpc
