#include "server/grpc/request_conversion.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "server/grpc/raw_message.h"
#include "server/serving/infer_conversion.h"
#include "server/text/tokenizer/unicode.h"

namespace fastformer::rpc {
namespace {

// fastformer.v1's embedding type (a valid EmbeddingType value) as the request layer's.
request::EmbeddingType our_type(int type) {
  switch (type) {
    case v1::EMBEDDING_TYPE_INT8:
      return request::EmbeddingType::kInt8;
    case v1::EMBEDDING_TYPE_UINT8:
      return request::EmbeddingType::kUint8;
    case v1::EMBEDDING_TYPE_BINARY:
      return request::EmbeddingType::kBinary;
    case v1::EMBEDDING_TYPE_UBINARY:
      return request::EmbeddingType::kUbinary;
    default:
      return request::EmbeddingType::kFloat;
  }
}

}  // namespace

namespace {

// The request's options (everything but its sequences) into `input`, each enum checked.
Status read_options(const v1::EncodeRequest& proto, const engine::Model& model,
                    request::EncodeInput* input, request::Prepared* out) {
  if (!v1::Truncation_IsValid(proto.truncation())) {
    return invalid_argument(
        "truncation: unknown value " + std::to_string(proto.truncation()) +
        " (expected TRUNCATION_UNSPECIFIED, TRUNCATION_RIGHT or TRUNCATION_LEFT)");
  }
  input->truncate = proto.truncation() == v1::TRUNCATION_RIGHT  ? request::Truncate::kRight
                    : proto.truncation() == v1::TRUNCATION_LEFT ? request::Truncate::kLeft
                                                                : request::Truncate::kNone;
  input->options = {proto.return_token_embeddings(), proto.return_logits(), proto.normalize()};
  if (!v1::ChunkPooling_IsValid(proto.chunk_pooling())) {
    return invalid_argument("chunk_pooling: unknown value " +
                            std::to_string(proto.chunk_pooling()) +
                            " (expected CHUNK_POOLING_MODEL or CHUNK_POOLING_MEAN)");
  }
  input->options.span_pooling =
      proto.chunk_pooling() == v1::CHUNK_POOLING_MEAN ? SpanPooling::kMean : SpanPooling::kModel;
  if (!v1::Priority_IsValid(proto.priority())) {
    return invalid_argument("priority: unknown value " + std::to_string(proto.priority()) +
                            " (expected PRIORITY_DEFAULT, PRIORITY_INTERACTIVE or PRIORITY_BULK)");
  }
  if (proto.priority() != v1::PRIORITY_DEFAULT) {
    out->priority = proto.priority() == v1::PRIORITY_BULK ? batching::Priority::kBulk
                                                          : batching::Priority::kInteractive;
  }
  if (proto.has_macro_overlap_tokens()) {
    // A uint32 over int32's range is over any model's positions: the request layer's message.
    input->macro_overlap_tokens =
        int32_t(std::min<uint32_t>(proto.macro_overlap_tokens().value(), uint32_t(INT32_MAX)));
  }
  if (auto refused = request::check_options(input->options, model))
    return invalid_argument("return_logits: " + *refused);
  // The embedding types, checked against the model by the request layer (build_request).
  for (const int t : proto.embedding_types()) {
    if (!v1::EmbeddingType_IsValid(t)) {
      return invalid_argument(
          "embedding_types: unknown value " + std::to_string(t) +
          " (expected EMBEDDING_TYPE_FLOAT, _INT8, _UINT8, _BINARY or _UBINARY)");
    }
    input->formats.push_back({request::embedding_type_name(our_type(t)), our_type(t), false});
  }
  if (!proto.prompt_name().empty()) input->prompt_name = proto.prompt_name();
  return Status();
}

// Sequence `i` as a row of `input`: the wire's shape (a Sequence holds any of its three inputs,
// and must hold exactly one) and its chunking, whose spans (uint32 on the wire) are converted
// into `spans` and `chars` (this row's), which the row views until build_request copies them.
Status read_row(const v1::EncodeRequest& proto, int i, request::EncodeInput* input,
                std::vector<TokenSpan>* spans_out, std::vector<TokenSpan>* chars_out) {
  const v1::Sequence& s = proto.sequences(i);
  const std::span<const int32_t> ids{s.token_ids().data(), size_t(s.token_ids_size())};
  const std::span<const float> embeddings{s.input_embeddings().data(),
                                          size_t(s.input_embeddings_size())};
  auto refuse = [&](const char* field, std::string message) {
    return invalid_argument(engine::InputError{size_t(i), field, std::move(message)}.to_string());
  };
  if (!s.text().empty()) {
    if (!ids.empty() || !embeddings.empty()) {
      return refuse("text", std::string("the sequence also has ") +
                                (ids.empty() ? "input_embeddings" : "token_ids") +
                                "; send exactly one of token_ids, input_embeddings and text");
    }
    input->rows.push_back(request::Row::from_text(s.text()));
  } else if (ids.empty() && embeddings.empty()) {
    return refuse("token_ids",
                  "empty sequence: send at least one token id or embedding row, or a non-empty "
                  "text");
  } else if (!ids.empty() && !embeddings.empty()) {
    return refuse("token_ids", "set either token_ids or input_embeddings, not both");
  } else {
    input->rows.push_back(ids.empty() ? request::Row::embeddings(embeddings)
                                      : request::Row::ids(ids));
  }
  if (!s.has_chunking()) return Status();
  const v1::Chunking& c = s.chunking();
  constexpr uint32_t kMax = uint32_t(std::numeric_limits<int32_t>::max());
  std::vector<TokenSpan>& spans = *spans_out;
  for (const v1::TokenSpan& span : c.spans()) {
    // Past int32: out of every sequence's range, as validate_spans then says.
    spans.push_back({int32_t(std::min(span.begin(), kMax)), int32_t(std::min(span.end(), kMax))});
  }
  if (c.window_tokens() > kMax || c.overlap_tokens() > kMax)
    return refuse("chunking", "window_tokens and overlap_tokens must be below 2^31");
  std::vector<TokenSpan>& chars = *chars_out;
  for (const v1::TokenSpan& span : c.char_spans())
    chars.push_back({int32_t(std::min(span.begin(), kMax)), int32_t(std::min(span.end(), kMax))});
  input->rows.back() = input->rows.back()
                           .with_spans(spans)
                           .with_windows(int32_t(c.window_tokens()), int32_t(c.overlap_tokens()))
                           .with_char_chunks(chars, c.sentences());
  return Status();
}

}  // namespace

Status convert_request(const v1::EncodeRequest& proto, const engine::Model& model,
                       const text::Tokenizer* tokenizer, const request::Limits& limits,
                       const request::VersionFiles& files, request::Prepared* out) {
  request::EncodeInput input;
  if (Status s = read_options(proto, model, &input, out); !s.ok()) return s;
  const size_t n = size_t(proto.sequences_size());
  std::vector<std::vector<TokenSpan>> spans(n), chars(n);  // what the rows' chunking views
  input.rows.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (Status s = read_row(proto, int(i), &input, &spans[i], &chars[i]); !s.ok()) return s;
  }
  if (auto problem = request::build_request(input, model, tokenizer, limits, out, &files))
    return invalid_argument(request::format_v1(*problem));
  return Status();
}

Status parse_encode_request(const grpc::ByteBuffer& bytes, v1::EncodeRequest* proto) {
  std::string flat;
  if (parse_raw_message(bytes, proto, &flat)) return Status();
  return {StatusCode::kInvalidArgument, explain_encode_parse_failure(flat)};
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
  // The field numbers are the generated code's, never written out here.
  constexpr int kRequestId = v1::EncodeRequest::kRequestIdFieldNumber;
  constexpr int kSequences = v1::EncodeRequest::kSequencesFieldNumber;
  constexpr int kText = v1::Sequence::kTextFieldNumber;
  int sequence = 0;
  while (const uint32_t tag = in.ReadTag()) {
    const int field = WireFormatLite::GetTagFieldNumber(tag);
    const bool delimited =
        WireFormatLite::GetTagWireType(tag) == WireFormatLite::WIRETYPE_LENGTH_DELIMITED;
    if (!delimited || (field != kRequestId && field != kSequences)) {
      if (!WireFormatLite::SkipField(&in, tag)) return not_protobuf;
      continue;
    }
    std::string value;
    if (!WireFormatLite::ReadBytes(&in, &value)) return not_protobuf;
    if (field == kRequestId) {
      if (auto e = utf8_error(value)) return "request_id: " + *e;
      continue;
    }
    google::protobuf::io::CodedInputStream seq(reinterpret_cast<const uint8_t*>(value.data()),
                                               int(value.size()));
    while (const uint32_t t = seq.ReadTag()) {
      if (WireFormatLite::GetTagFieldNumber(t) == kText &&
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

namespace {

// The float values, unless the request asked only for quantized types.
bool wants_float(const v1::EncodeRequest& proto) {
  if (proto.embedding_types().empty()) return true;
  for (const int t : proto.embedding_types())
    if (t == v1::EMBEDDING_TYPE_FLOAT) return true;
  return false;
}

// `embedding` in each quantized type `proto` asks for.
void quantize_into(const v1::EncodeRequest& proto, std::span<const float> embedding,
                   const request::QuantizationRange* range, v1::QuantizedEmbedding* out) {
  std::vector<uint8_t> bytes;
  for (const int t : proto.embedding_types()) {
    if (t == v1::EMBEDDING_TYPE_FLOAT) continue;
    bytes.clear();
    request::quantize_embedding(our_type(t), embedding, range, &bytes);
    std::string* field = t == v1::EMBEDDING_TYPE_INT8     ? out->mutable_int8()
                         : t == v1::EMBEDDING_TYPE_UINT8  ? out->mutable_uint8()
                         : t == v1::EMBEDDING_TYPE_BINARY ? out->mutable_binary()
                                                          : out->mutable_ubinary();
    field->assign(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  }
}

}  // namespace

void fill_response(const batching::Job& request, const request::Prepared& prepared,
                   const v1::EncodeRequest& proto, const request::Quantization* quantization,
                   v1::EncodeResponse* response) {
  const bool floats = wants_float(proto);
  const bool quantized =
      !proto.embedding_types().empty() && (proto.embedding_types_size() > 1 || !floats);
  for (size_t b = 0; b < request.results.size(); ++b) {
    const EncodedSequence& seq = request.results[b];
    v1::Encoding* e = response->add_encodings();
    const request::QuantizationRange* range =
        quantized && quantization != nullptr
            ? quantization->find(int64_t(seq.embedding.size()), proto.normalize())
            : nullptr;
    if (floats) e->mutable_embedding()->Add(seq.embedding.begin(), seq.embedding.end());
    if (quantized) quantize_into(proto, seq.embedding, range, e->mutable_quantized());
    e->mutable_token_embeddings()->Add(seq.token_embeddings.begin(), seq.token_embeddings.end());
    e->mutable_logits()->Add(seq.logits.begin(), seq.logits.end());
    e->set_num_tokens(static_cast<uint32_t>(seq.num_tokens));
    const size_t width = seq.embedding.size();
    if (width > 0 && !seq.span_embeddings.empty()) {
      const std::span<const TokenSpan> spans = request.sequences[b].spans;
      for (size_t k = 0; k < spans.size(); ++k) {
        v1::Chunk* chunk = e->add_chunks();
        const std::span<const float> span_embedding =
            std::span<const float>(seq.span_embeddings).subspan(k * width, width);
        if (floats) chunk->mutable_embedding()->Add(span_embedding.begin(), span_embedding.end());
        if (quantized) quantize_into(proto, span_embedding, range, chunk->mutable_quantized());
        const TokenSpan tokens = request::caller_tokens(prepared, b, spans[k]);
        chunk->mutable_tokens()->set_begin(uint32_t(tokens.begin));
        chunk->mutable_tokens()->set_end(uint32_t(tokens.end));
        if (const auto chars = request::chunk_characters(prepared, b, spans[k])) {
          chunk->mutable_chars()->set_begin(chars->first);
          chunk->mutable_chars()->set_end(chars->second);
        }
      }
    }
  }
  const auto queued = request.first_compute - request.arrival;
  response->set_queue_time_us(static_cast<uint64_t>(
      std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::microseconds>(queued).count())));
  response->set_compute_time_us(static_cast<uint64_t>(request.compute_us));
}

Status parse_infer_request(const grpc::ByteBuffer& bytes, inference::ModelInferRequest* proto) {
  std::string flat;
  if (parse_raw_message(bytes, proto, &flat)) return Status();
  return invalid_argument(serving::explain_infer_parse_failure(flat));
}

}  // namespace fastformer::rpc
