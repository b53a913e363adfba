#include "server/rpc/request_conversion.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "server/rpc/raw_message.h"
#include "server/rpc/text_input.h"
#include "server/text/tokenizer/unicode.h"

namespace fastformer::rpc {

grpc::Status convert_request(const v1::EncodeRequest& proto, const engine::Model& model,
                             const text::Tokenizer* tokenizer, const RequestLimits& limits,
                             batching::Request* out) {
  const engine::ModelConfig& c = model.config();
  if (proto.sequences_size() == 0) {
    return {grpc::StatusCode::INVALID_ARGUMENT, "sequences: the request has no sequences"};
  }
  if (!v1::Truncation_IsValid(proto.truncation())) {
    return {grpc::StatusCode::INVALID_ARGUMENT,
            "truncation: unknown value " + std::to_string(proto.truncation()) +
                " (expected TRUNCATION_UNSPECIFIED, TRUNCATION_RIGHT or TRUNCATION_LEFT)"};
  }
  if (proto.return_logits() && model.num_labels() == 0) {
    return {grpc::StatusCode::INVALID_ARGUMENT,
            "return_logits: this model has no classifier head (dense_linear)"};
  }
  const int64_t max_len = c.max_position_embeddings, D = c.hidden_size;
  const Truncate truncate = proto.truncation() == v1::TRUNCATION_RIGHT  ? Truncate::kRight
                            : proto.truncation() == v1::TRUNCATION_LEFT ? Truncate::kLeft
                                                                        : Truncate::kNone;
  auto invalid = [](int i, const char* field, const std::string& message) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        engine::InputError{size_t(i), field, message}.to_string());
  };
  int64_t total = 0;
  out->sequences.clear();
  out->sequences.reserve(size_t(proto.sequences_size()));
  // Views into text_ids must not move: one slot per text, reserved up front.
  out->text_ids.clear();
  out->text_ids.reserve(
      size_t(std::count_if(proto.sequences().begin(), proto.sequences().end(),
                           [](const v1::Sequence& s) { return !s.text().empty(); })));
  for (int i = 0; i < proto.sequences_size(); ++i) {
    const v1::Sequence& s = proto.sequences(i);
    SequenceInput in{{s.token_ids().data(), size_t(s.token_ids_size())},
                     {s.input_embeddings().data(), size_t(s.input_embeddings_size())}};
    if (s.text().empty() && in.token_ids.empty() && in.input_embeddings.empty()) {
      return invalid(
          i, "token_ids",
          "empty sequence: send at least one token id or embedding row, or a non-empty text");
    }
    if (!s.text().empty()) {
      if (!in.token_ids.empty() || !in.input_embeddings.empty()) {
        return invalid(i, "text",
                       std::string("the sequence also has ") +
                           (in.token_ids.empty() ? "input_embeddings" : "token_ids") +
                           "; send exactly one of token_ids, input_embeddings and text");
      }
      std::vector<int32_t>& ids = out->text_ids.emplace_back();
      if (auto error = tokenize_text(tokenizer, c, s.text(), truncate, &ids, out))
        return invalid(i, "text", *error);
      in.token_ids = ids;
      total += int64_t(ids.size());
      if (total > limits.max_request_tokens) break;  // reported below, without tokenizing the rest
      out->sequences.push_back(in);
      continue;
    }
    // Truncation applies only to a well-formed single-kind sequence; anything else is left
    // for validate_sequence to reject with its own message.
    if (proto.truncation() != v1::TRUNCATION_UNSPECIFIED &&
        (in.token_ids.empty() != in.input_embeddings.empty())) {
      const bool keep_last = proto.truncation() == v1::TRUNCATION_LEFT;
      if (static_cast<int64_t>(in.token_ids.size()) > max_len) {
        in.token_ids =
            keep_last ? in.token_ids.last(size_t(max_len)) : in.token_ids.first(size_t(max_len));
      }
      if (!in.input_embeddings.empty() && in.input_embeddings.size() % size_t(D) == 0 &&
          static_cast<int64_t>(in.input_embeddings.size()) > max_len * D) {
        const size_t keep = size_t(max_len * D);
        in.input_embeddings =
            keep_last ? in.input_embeddings.last(keep) : in.input_embeddings.first(keep);
      }
    }
    if (auto error = engine::validate_sequence(c, model.has_word_embedding(), in, size_t(i))) {
      return {grpc::StatusCode::INVALID_ARGUMENT, error->to_string()};
    }
    total += engine::sequence_length(in, D);
    if (total > limits.max_request_tokens) break;
    out->sequences.push_back(in);
  }
  if (total > limits.max_request_tokens) {
    return {grpc::StatusCode::INVALID_ARGUMENT,
            "sequences: the request has " +
                std::string(out->sequences.size() + 1 < size_t(proto.sequences_size()) ? "at least "
                                                                                       : "") +
                std::to_string(total) + " tokens, over max_request_tokens " +
                std::to_string(limits.max_request_tokens)};
  }
  out->options.token_embeddings = proto.return_token_embeddings();
  out->options.logits = proto.return_logits();
  out->options.normalize = proto.normalize();
  return grpc::Status::OK;
}

grpc::Status parse_encode_request(const grpc::ByteBuffer& bytes, v1::EncodeRequest* proto) {
  std::string flat;
  if (parse_raw_message(bytes, proto, &flat)) return grpc::Status::OK;
  return {grpc::StatusCode::INVALID_ARGUMENT, explain_encode_parse_failure(flat)};
}

std::string explain_encode_parse_failure(const std::string& bytes) {
  using google::protobuf::internal::WireFormatLite;
  const std::string not_protobuf =
      "the request is not a fastformer.v1.EncodeRequest (its bytes do not parse as one)";
  auto utf8_error = [](const std::string& value) -> std::optional<std::string> {
    try {
      tokenizer::decode_utf8(value);
    } catch (const tokenizer::TokenizerError& e) {
      return std::string(e.what());
    }
    return std::nullopt;
  };
  google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(bytes.data()),
                                            int(bytes.size()));
  int sequence = 0;
  while (const uint32_t tag = in.ReadTag()) {
    const int field = WireFormatLite::GetTagFieldNumber(tag);
    const bool delimited =
        WireFormatLite::GetTagWireType(tag) == WireFormatLite::WIRETYPE_LENGTH_DELIMITED;
    if (!delimited || (field != 1 && field != 2)) {
      if (!WireFormatLite::SkipField(&in, tag)) return not_protobuf;
      continue;
    }
    std::string value;
    if (!WireFormatLite::ReadBytes(&in, &value)) return not_protobuf;
    if (field == 1) {
      if (auto e = utf8_error(value)) return "request_id: " + *e;
      continue;
    }
    google::protobuf::io::CodedInputStream seq(reinterpret_cast<const uint8_t*>(value.data()),
                                               int(value.size()));
    while (const uint32_t t = seq.ReadTag()) {
      if (WireFormatLite::GetTagFieldNumber(t) == 3 &&
          WireFormatLite::GetTagWireType(t) == WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
        std::string text;
        if (!WireFormatLite::ReadBytes(&seq, &text)) return not_protobuf;
        if (auto e = utf8_error(text))
          return engine::InputError{size_t(sequence), "text", *e}.to_string();
      } else if (!WireFormatLite::SkipField(&seq, t)) {
        return not_protobuf;
      }
    }
    ++sequence;
  }
  return not_protobuf;
}

void fill_response(const batching::Request& request, v1::EncodeResponse* response) {
  for (const EncodedSequence& seq : request.results) {
    v1::Encoding* e = response->add_encodings();
    e->mutable_embedding()->Add(seq.embedding.begin(), seq.embedding.end());
    e->mutable_token_embeddings()->Add(seq.token_embeddings.begin(), seq.token_embeddings.end());
    e->mutable_logits()->Add(seq.logits.begin(), seq.logits.end());
    e->set_num_tokens(static_cast<uint32_t>(seq.num_tokens));
  }
  const auto queued = request.first_compute - request.arrival;
  response->set_queue_time_us(static_cast<uint64_t>(
      std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::microseconds>(queued).count())));
  response->set_compute_time_us(static_cast<uint64_t>(request.compute_us));
}

grpc::Status outcome_status(const batching::Request& request) {
  switch (request.outcome) {
    case batching::Outcome::kOk:
      return grpc::Status::OK;
    case batching::Outcome::kDeadlineExceeded:
      return {grpc::StatusCode::DEADLINE_EXCEEDED,
              "the deadline passed before the request was computed"};
    case batching::Outcome::kCancelled:
      return {grpc::StatusCode::CANCELLED, "the call was cancelled"};
    case batching::Outcome::kEngineFailure:
      return {grpc::StatusCode::INTERNAL, "engine failure: " + request.error};
  }
  return {grpc::StatusCode::INTERNAL, "unknown outcome"};
}

}  // namespace fastformer::rpc
