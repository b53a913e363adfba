// KServe v2 REST's infer body and answer, apart from the route (kserve_rest.cc) so that each is
// unit-tested on its own: the JSON (and, with the binary tensor extension, the bytes after it)
// into the ModelInferRequest the gRPC service would get, and a ModelInferResponse back into
// JSON data or binary outputs.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "inference/grpc_service.pb.h"
#include "server/http/http_server.h"

namespace fastformer::http {

// The header that splits a body (or an answer) into its JSON and its binary tensor bytes.
inline constexpr const char* kHeaderLength = "Inference-Header-Content-Length";

struct RestInferRequest {
  inference::ModelInferRequest proto;  ///< inputs (raw contents), outputs, parameters, id
  std::vector<bool> binary_output;     ///< per named output, or empty: binary_default for all
  bool binary_default = false;         ///< parameters.binary_data_output
  int64_t timeout_us = 0;              ///< parameters.timeout (Triton's, microseconds); 0: none
};

// `body` with `header_length` (the Inference-Header-Content-Length header's value, if sent):
// OK and `out` filled (without the model's name and version, which the route sets), or
// INVALID_ARGUMENT naming the field (inputs[1] (input_ids).shape: ...) and the limit.
Status parse_rest_infer(std::string_view body, std::optional<std::string_view> header_length,
                        RestInferRequest* out);

// The answer to `request` from the finished `response` of model `model` version `version`:
// application/json, or application/octet-stream with kHeaderLength when an output is binary.
Response write_rest_infer(const RestInferRequest& request,
                          const inference::ModelInferResponse& response, const std::string& model,
                          const std::string& version);

}  // namespace fastformer::http
