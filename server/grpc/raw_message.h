// Messages of the raw callback methods (Encode, EncodeStream, ModelStreamInfer): read as
// bytes and parsed here, so a message that does not parse gets INVALID_ARGUMENT that says
// why (gRPC would answer a unary call UNIMPLEMENTED with no message and end a stream as if
// the client had closed it, dropping the rest), and answers serialized here.
#pragma once

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/proto_buffer_reader.h>
#include <grpcpp/support/proto_buffer_writer.h>
#include <grpcpp/support/status.h>

#include <cstddef>
#include <string>
#include <vector>

#include "common/status.h"

namespace fastformer::rpc {

// Parses `bytes` into `proto`: true when it parses; else false, and `flat` holds the bytes
// (for the explanation of what is wrong with them).
template <class Proto>
bool parse_raw_message(const grpc::ByteBuffer& bytes, Proto* proto, std::string* flat) {
  grpc::ByteBuffer input(bytes);  // shares the slices; the reader consumes its own copy
  grpc::ProtoBufferReader reader(&input);
  if (proto->ParseFromZeroCopyStream(&reader)) return true;
  std::vector<grpc::Slice> slices;
  flat->clear();
  if (bytes.Dump(&slices).ok()) {
    for (const grpc::Slice& slice : slices)
      flat->append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  return false;
}

// A stream message's bytes parsed by `parse` (parse_encode_request, parse_infer_request):
// on failure the partial parse is cleared, since it may hold the bad string and the in-band
// answer, which echoes its id, must serialize.
template <class Proto, class Parse>
Status parse_stream_message(const grpc::ByteBuffer& bytes, Proto* parsed, Parse parse) {
  Status status = parse(bytes, parsed);
  if (!status.ok()) parsed->Clear();
  return status;
}

// Logs that an answer of `bytes` bytes to `method` did not serialize (raw_message.cc: the
// conversions that include this header without serializing link no logger).
void log_unserializable(const char* method, size_t bytes);

// `message` as a raw method's answer (`method` names it in the log if it cannot be).
template <class Proto>
grpc::ByteBuffer serialize_raw_message(const Proto& message, const char* method) {
  grpc::ByteBuffer bytes;
  bool own = false;
  if (!grpc::SerializationTraits<Proto>::Serialize(message, &bytes, &own).ok()) {
    log_unserializable(method, message.ByteSizeLong());
  }
  return bytes;
}

}  // namespace fastformer::rpc
