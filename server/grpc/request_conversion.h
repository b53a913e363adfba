// EncodeRequest (proto) -> validated request::Prepared: the wire's shape here, the request
// rules in server/request/encode_input.h. A request that can never succeed gets INVALID_ARGUMENT
// naming the sequence index and the field; nothing of it is queued.
#pragma once

#include <grpcpp/support/byte_buffer.h>

#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "fastformer/v1/encoder.pb.h"
#include "inference/grpc_service.pb.h"
#include "server/batching/job.h"
#include "server/engine/model.h"
#include "server/request/encode_input.h"
#include "server/request/quantize.h"

namespace fastformer::rpc {

// Parses an EncodeRequest from gRPC's bytes; INVALID_ARGUMENT explaining why it does not parse.
Status parse_encode_request(const grpc::ByteBuffer& bytes, v1::EncodeRequest* proto);
// The same for a ModelInferRequest (ModelStreamInfer's raw messages), explained by
// serving::explain_infer_parse_failure.
Status parse_infer_request(const grpc::ByteBuffer& bytes, inference::ModelInferRequest* proto);

// Why bytes that should hold an EncodeRequest do not parse: the first request_id or
// sequences[i].text that is not UTF-8 (proto3 refuses those), or that they are not protobuf.
std::string explain_encode_parse_failure(const std::string& bytes);

// Fills `out` (a fresh Prepared, which owns what it keeps: `proto` may go once this returns).
// `tokenizer`: the model's (null when it takes no text); `files`: the version's prompts and
// ranges.
Status convert_request(const v1::EncodeRequest& proto, const engine::Model& model,
                       const text::Tokenizer* tokenizer, const request::Limits& limits,
                       const request::VersionFiles& files, request::Prepared* out);

// Copies the results of a finished job (over `prepared`) into `response` (encodings in
// `proto`'s embedding_types, which build_request accepted with `quantization`; timings).
void fill_response(const batching::Job& request, const request::Prepared& prepared,
                   const v1::EncodeRequest& proto, const request::Quantization* quantization,
                   v1::EncodeResponse* response);

}  // namespace fastformer::rpc
