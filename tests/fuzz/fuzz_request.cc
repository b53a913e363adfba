// Fuzz target: bytes -> fastformer.v1.EncodeRequest -> convert_request (validation,
// truncation, request limits) -> the admission queue -> the ragged batches the engine
// runs -> the CPU engine -> the response. A request is either refused with
// INVALID_ARGUMENT or becomes batches that respect every model limit and encode.
//
// Input: byte 0 picks the model (bits 0-1), max_request_tokens (bits 2-3) and
// max_request_spans (bits 4-5); the rest is the serialized EncodeRequest. Late chunking's
// Sequence.chunking (token spans, character spans, sentences, windows) is part of the message:
// an accepted request's chunks lie inside their sequences, hold a real token, and each comes
// back as one Chunk.
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "server/grpc/request_conversion.h"
#include "server/request/outcome.h"
#include "tests/fuzz/fuzz_input.h"
#include "tests/fuzz/fuzz_models.h"

using namespace fastformer;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::FuzzInput in(data, size);
  const uint8_t choice = in.byte();
  fuzz::Served& served = fuzz::served_models()[choice & 3];
  const engine::Model& model = *served.model;
  const engine::ModelConfig& c = model.config();
  request::Limits limits;
  limits.max_request_tokens = std::array<int64_t, 4>{1, 16, 40, 64}[(choice >> 2) & 3];
  limits.max_request_spans = std::array<int64_t, 4>{0, 1, 4, 16}[(choice >> 4) & 3];

  const std::string_view bytes = in.rest();
  v1::EncodeRequest proto;
  if (!proto.ParseFromArray(bytes.data(), int(bytes.size()))) {
    // What the server answers instead (a text that is not UTF-8, or not protobuf at all).
    FUZZ_CHECK(!rpc::explain_encode_parse_failure(std::string(bytes)).empty());
    return 0;
  }

  // No calibrated ranges here: INT8 and UINT8 are refused by convert_request (as is an unknown
  // type, or BINARY on a hidden size that is not a multiple of 8), the other types answered.
  // Converted from a copy freed before the job runs: the Prepared owns what it views (ASan).
  auto prepared = std::make_shared<request::Prepared>();
  auto wire = std::make_unique<v1::EncodeRequest>(proto);
  const Status status =
      rpc::convert_request(*wire, model, served.tokenizer.get(), limits, {}, prepared.get());
  wire.reset();
  if (!status.ok()) {
    FUZZ_CHECK(status.code() == StatusCode::kInvalidArgument);
    FUZZ_CHECK(!status.message().empty());
    return 0;
  }
  // Accepted: every sequence within the model's limits, the request within its own.
  // One sequence a row, or (macro-chunks) a row over the positions in several passes.
  const std::shared_ptr<batching::Job> request = request::make_job(prepared);
  FUZZ_CHECK(int(prepared->rows.size()) == proto.sequences_size());
  FUZZ_CHECK(prepared->passes.empty() || proto.has_macro_overlap_tokens());
  int64_t total = 0, spans = 0;
  for (size_t i = 0; i < request->sequences.size(); ++i) {
    const SequenceInput& s = request->sequences[i];
    FUZZ_CHECK(!engine::validate_sequence(c, model.has_word_embedding(), s, i));
    const int64_t n = engine::sequence_length(s, c.hidden_size);
    for (const TokenSpan& span : s.spans)
      FUZZ_CHECK(0 <= span.begin && span.begin < span.end && span.end <= n);
    total += n;
    if (prepared->passes.empty()) spans += int64_t(s.spans.size());
  }
  for (const SequenceInput& row : prepared->rows) {
    if (!prepared->passes.empty()) spans += int64_t(row.spans.size());
    const int64_t n = engine::sequence_length(row, c.hidden_size);
    for (const TokenSpan& span : row.spans)
      FUZZ_CHECK(0 <= span.begin && span.begin < span.end && span.end <= n);
  }
  FUZZ_CHECK(total <= limits.max_request_tokens);
  FUZZ_CHECK(limits.max_request_spans == 0 || spans <= limits.max_request_spans);
  FUZZ_CHECK(!request->options.logits || model.num_labels() > 0);

  // Through the queue, as the server batches it, and the engine.
  fuzz::run_request(served, request);
  request::merge_passes(*prepared, request.get());  // as the serving core does before any door

  v1::EncodeResponse response;
  rpc::fill_response(*request, *prepared, proto, nullptr, &response);
  FUZZ_CHECK(response.encodings_size() == proto.sequences_size());
  for (int i = 0; i < response.encodings_size(); ++i) {
    FUZZ_CHECK(response.encodings(i).chunks_size() ==
               int(request->sequences[size_t(i)].spans.size()));
    for (const v1::Chunk& chunk : response.encodings(i).chunks())
      FUZZ_CHECK(chunk.embedding_size() == response.encodings(i).embedding_size());
  }
  FUZZ_CHECK(request::outcome_status(*request).ok());
  return 0;
}
