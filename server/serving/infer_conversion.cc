#include "server/serving/infer_conversion.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>

#include "server/text/tokenizer/unicode.h"

namespace fastformer::serving {
namespace {

using InputTensorProto = inference::ModelInferRequest::InferInputTensor;
using request::Truncate;

std::string shape_string(const google::protobuf::RepeatedField<int64_t>& shape) {
  std::string s = "[";
  for (int i = 0; i < shape.size(); ++i) s += (i > 0 ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// One input of the request: its description and its raw bytes (null when sent typed).
struct Input {
  const InputTensorProto* tensor = nullptr;
  const std::string* raw = nullptr;
};

// The number of elements of `input`'s shape, which must have `dims` dimensions, all positive.
Status element_count(const Input& input, int dims, int64_t* count) {
  const InputTensorProto& t = *input.tensor;
  if (t.shape_size() != dims) {
    return invalid_argument(t.name() + ": shape " + shape_string(t.shape()) + " has " +
                            std::to_string(t.shape_size()) + " dimensions; expected " +
                            std::to_string(dims) +
                            (dims == 2 ? " ([batch, length])" : " ([batch, length, hidden])"));
  }
  int64_t n = 1;
  for (const int64_t d : t.shape()) {
    if (d <= 0)
      return invalid_argument(t.name() + ": shape " + shape_string(t.shape()) +
                              " has a dimension below 1");
    if (__builtin_mul_overflow(n, d, &n) || n > (int64_t(1) << 40)) {
      return invalid_argument(t.name() + ": shape " + shape_string(t.shape()) + " is too large");
    }
  }
  *count = n;
  return Status();
}

// The size check every raw input passes: bytes = elements x element size.
Status check_raw_size(const Input& input, int64_t count, size_t element_bytes) {
  const InputTensorProto& t = *input.tensor;
  const uint64_t want = uint64_t(count) * element_bytes;
  if (input.raw->size() != want) {
    return invalid_argument(t.name() + ": raw contents are " + std::to_string(input.raw->size()) +
                            " bytes; shape " + shape_string(t.shape()) + " of " + t.datatype() +
                            " needs " + std::to_string(want));
  }
  return Status();
}

Status typed_count_mismatch(const InputTensorProto& t, const char* field, int64_t got,
                            int64_t count) {
  return invalid_argument(t.name() + ": contents." + field + " holds " + std::to_string(got) +
                          " values; shape " + shape_string(t.shape()) + " needs " +
                          std::to_string(count));
}

// The values of an INT64 or INT32 input.
Status read_integers(const Input& input, int64_t count, std::vector<int64_t>* out) {
  const InputTensorProto& t = *input.tensor;
  const bool wide = t.datatype() == "INT64";
  if (!wide && t.datatype() != "INT32") {
    return invalid_argument(t.name() + ": datatype " + t.datatype() + "; expected INT64 or INT32");
  }
  // The count comes from the shape, which the client wrote: the contents must hold it before
  // anything of that size is allocated.
  if (input.raw != nullptr) {
    if (Status s = check_raw_size(input, count, wide ? 8 : 4); !s.ok()) return s;
    out->resize(size_t(count));
    if (wide) {
      std::memcpy(out->data(), input.raw->data(), input.raw->size());
    } else {
      for (int64_t i = 0; i < count; ++i) {
        int32_t v;
        std::memcpy(&v, input.raw->data() + i * 4, 4);
        (*out)[size_t(i)] = v;
      }
    }
    return Status();
  }
  const inference::InferTensorContents& c = t.contents();
  if (wide) {
    if (c.int64_contents_size() != count)
      return typed_count_mismatch(t, "int64_contents", c.int64_contents_size(), count);
    out->resize(size_t(count));
    std::copy(c.int64_contents().begin(), c.int64_contents().end(), out->begin());
  } else {
    if (c.int_contents_size() != count)
      return typed_count_mismatch(t, "int_contents", c.int_contents_size(), count);
    out->resize(size_t(count));
    std::copy(c.int_contents().begin(), c.int_contents().end(), out->begin());
  }
  return Status();
}

// The values of an FP32 input.
Status read_floats(const Input& input, int64_t count, std::vector<float>* out) {
  const InputTensorProto& t = *input.tensor;
  if (t.datatype() != "FP32")
    return invalid_argument(t.name() + ": datatype " + t.datatype() + "; expected FP32");
  if (input.raw != nullptr) {  // sizes checked before the allocation, as in read_integers
    if (Status s = check_raw_size(input, count, 4); !s.ok()) return s;
    out->resize(size_t(count));
    std::memcpy(out->data(), input.raw->data(), input.raw->size());
    return Status();
  }
  const inference::InferTensorContents& c = t.contents();
  if (c.fp32_contents_size() != count)
    return typed_count_mismatch(t, "fp32_contents", c.fp32_contents_size(), count);
  out->resize(size_t(count));
  std::copy(c.fp32_contents().begin(), c.fp32_contents().end(), out->begin());
  return Status();
}

Status read_parameters(const inference::ModelInferRequest& proto, request::EncodeInput* input,
                       request::EmbeddingType* embedding_type,
                       std::optional<batching::Priority>* priority) {
  OutputOptions* options = &input->options;
  Truncate* truncate = &input->truncate;
  std::optional<int32_t>* macro_overlap = &input->macro_overlap_tokens;
  // Parameters we do not know are ignored, as the protocol asks (clients add their own).
  for (const auto& [key, value] : proto.parameters()) {
    if (key == "span_pooling") {
      const std::string& v = value.string_param();
      if (value.parameter_choice_case() != inference::InferParameter::kStringParam ||
          (v != "model" && v != "mean")) {
        return invalid_argument(
            "parameters: span_pooling must be the string \"model\" or \"mean\"");
      }
      options->span_pooling = v == "mean" ? SpanPooling::kMean : SpanPooling::kModel;
    } else if (key == "normalize") {
      if (value.parameter_choice_case() != inference::InferParameter::kBoolParam) {
        return invalid_argument("parameters: normalize must be a bool parameter");
      }
      options->normalize = value.bool_param();
    } else if (key == "truncation") {
      const std::string& v = value.string_param();
      if (value.parameter_choice_case() != inference::InferParameter::kStringParam ||
          (v != "none" && v != "right" && v != "left")) {
        return invalid_argument(
            "parameters: truncation must be the string \"none\", \"right\" or \"left\"");
      }
      *truncate = v == "right" ? Truncate::kRight : v == "left" ? Truncate::kLeft : Truncate::kNone;
    } else if (key == "macro_overlap_tokens") {
      if (value.parameter_choice_case() != inference::InferParameter::kInt64Param ||
          value.int64_param() < 0 || value.int64_param() > INT32_MAX) {
        return invalid_argument(
            "parameters: macro_overlap_tokens must be a non-negative int64 parameter");
      }
      *macro_overlap = int32_t(value.int64_param());
    } else if (key == "priority") {
      // Triton's: 1 is the highest level, 0 the model's default; here 1 is interactive and 2 or
      // more bulk (tritonclient's infer(priority=...), as int64 or uint64).
      const auto c = value.parameter_choice_case();
      const bool is_int = c == inference::InferParameter::kInt64Param;
      if ((!is_int && c != inference::InferParameter::kUint64Param) ||
          (is_int && value.int64_param() < 0)) {
        return invalid_argument(
            "parameters: priority must be a non-negative integer parameter (0 the model's "
            "default, 1 interactive, 2 or more bulk)");
      }
      const uint64_t level = is_int ? uint64_t(value.int64_param()) : value.uint64_param();
      if (level == 1) *priority = batching::Priority::kInteractive;
      if (level >= 2) *priority = batching::Priority::kBulk;
    } else if (key == "embedding_type") {
      const auto type = request::parse_embedding_type(value.string_param());
      if (value.parameter_choice_case() != inference::InferParameter::kStringParam || !type) {
        return invalid_argument(std::string("parameters: embedding_type must be the string ") +
                                request::embedding_type_names());
      }
      *embedding_type = *type;
    } else if (key == "prompt_name") {
      if (value.parameter_choice_case() != inference::InferParameter::kStringParam)
        return invalid_argument("parameters: prompt_name must be a string parameter");
      input->prompt_name = value.string_param();
    }
  }
  return Status();
}

Status read_outputs(const inference::ModelInferRequest& proto, const engine::Model& model,
                    const text::Tokenizer* tokenizer, bool spans, InferCall* call) {
  const std::vector<TensorSpec> outputs = model_outputs(model, tokenizer);
  std::string names;
  for (const TensorSpec& o : outputs) names += (names.empty() ? "" : ", ") + o.name;
  auto want = [&](const std::string& name) {
    if (name == "embedding") call->embedding = true;
    if (name == "token_embeddings") call->token_embeddings = true;
    if (name == "logits") call->logits = true;
    call->output_order.push_back(name);
  };
  if (proto.outputs_size() == 0) {  // every output, span_embeddings when spans are sent
    for (const TensorSpec& o : outputs)
      if (o.name != "span_embeddings" || spans) want(o.name);
    return Status();
  }
  for (int i = 0; i < proto.outputs_size(); ++i) {
    const std::string& name = proto.outputs(i).name();
    const bool known = std::any_of(outputs.begin(), outputs.end(),
                                   [&](const TensorSpec& o) { return o.name == name; });
    if (!known) {
      return invalid_argument("outputs[" + std::to_string(i) + "]: unknown output '" + name +
                              "' (this model has " + names + ")");
    }
    if (std::find(call->output_order.begin(), call->output_order.end(), name) !=
        call->output_order.end()) {
      return invalid_argument("outputs[" + std::to_string(i) + "]: output '" + name +
                              "' is asked for twice");
    }
    want(name);
  }
  return Status();
}

// Row r's real length from the attention mask (1 + the last 1), checking its values.
Status mask_length(const std::vector<int64_t>& mask, int64_t r, int64_t L, bool trailing_only,
                   int64_t* n) {
  int64_t last = -1;
  for (int64_t t = 0; t < L; ++t) {
    const int64_t m = mask[size_t(r * L + t)];
    if (m != 0 && m != 1) {
      return invalid_argument("attention_mask: row " + std::to_string(r) + ", token " +
                              std::to_string(t) + " is " + std::to_string(m) + "; expected 0 or 1");
    }
    if (m == 1) {
      if (trailing_only && last != t - 1) {
        return invalid_argument(
            "attention_mask: row " + std::to_string(r) + " has a 0 before token " +
            std::to_string(t) +
            ", which is 1: with input_embeddings only trailing padding is allowed");
      }
      last = t;
    }
  }
  if (last < 0)
    return invalid_argument("attention_mask: row " + std::to_string(r) +
                            " has no real token (every value is 0)");
  *n = last + 1;
  return Status();
}

// The elements of a BYTES input of shape [batch] or [batch, 1]: raw contents hold each one as
// a 4-byte little-endian length and its bytes (the protocol's serialization), typed ones
// bytes_contents.
Status read_texts(const Input& input, std::vector<std::string_view>* out) {
  const InputTensorProto& t = *input.tensor;
  if (t.datatype() != "BYTES")
    return invalid_argument(t.name() + ": datatype " + t.datatype() + "; expected BYTES");
  if (t.shape_size() < 1 || t.shape_size() > 2 || (t.shape_size() == 2 && t.shape(1) != 1) ||
      t.shape(0) <= 0) {
    return invalid_argument(t.name() + ": shape " + shape_string(t.shape()) +
                            "; expected [batch] or [batch, 1], batch >= 1");
  }
  const int64_t count = t.shape(0);
  out->clear();
  if (input.raw == nullptr) {
    const inference::InferTensorContents& c = t.contents();
    if (c.bytes_contents_size() != count)
      return typed_count_mismatch(t, "bytes_contents", c.bytes_contents_size(), count);
    for (const std::string& b : c.bytes_contents()) out->emplace_back(b);
    return Status();
  }
  const std::string& raw = *input.raw;
  size_t at = 0;
  for (int64_t i = 0; i < count; ++i) {
    uint32_t n = 0;
    if (raw.size() - at < 4) {
      return invalid_argument(t.name() + ": raw contents end at byte " +
                              std::to_string(raw.size()) + " before element " + std::to_string(i) +
                              "'s 4-byte length; shape " + shape_string(t.shape()) + " needs " +
                              std::to_string(count) + " elements");
    }
    std::memcpy(&n, raw.data() + at, 4);  // little-endian, as every host we build for
    at += 4;
    if (raw.size() - at < n) {
      return invalid_argument(t.name() + ": raw contents: element " + std::to_string(i) + " is " +
                              std::to_string(n) + " bytes, but only " +
                              std::to_string(raw.size() - at) + " remain");
    }
    out->emplace_back(raw.data() + at, n);
    at += n;
  }
  if (at != raw.size()) {
    return invalid_argument(t.name() + ": raw contents have " + std::to_string(raw.size() - at) +
                            " bytes after the " + std::to_string(count) + " elements of shape " +
                            shape_string(t.shape()));
  }
  return Status();
}

}  // namespace

std::vector<TensorSpec> model_inputs(const engine::Model& model, const text::Tokenizer* tokenizer) {
  const int64_t D = model.config().hidden_size;
  const bool text = tokenizer != nullptr;
  std::vector<TensorSpec> inputs;
  if (text) inputs.push_back({"text", "BYTES", inference::TYPE_STRING, {-1, 1}, true});
  if (model.has_word_embedding())
    inputs.push_back({"input_ids", "INT64", inference::TYPE_INT64, {-1, -1}, text});
  inputs.push_back({"attention_mask", "INT64", inference::TYPE_INT64, {-1, -1}, true});
  inputs.push_back(
      {"input_embeddings", "FP32", inference::TYPE_FP32, {-1, -1, D}, model.has_word_embedding()});
  inputs.push_back({"spans", "INT64", inference::TYPE_INT64, {-1, 3}, true});
  return inputs;
}

std::vector<TensorSpec> model_outputs(const engine::Model& model,
                                      const text::Tokenizer* tokenizer) {
  const int64_t D = model.config().hidden_size;
  std::vector<TensorSpec> outputs{
      {"embedding", "FP32", inference::TYPE_FP32, {-1, D}, false},
      {"token_embeddings", "FP32", inference::TYPE_FP32, {-1, -1, D}, false}};
  if (model.num_labels() > 0) {
    outputs.push_back(
        {"logits", "FP32", inference::TYPE_FP32, {-1, int64_t(model.num_labels())}, false});
  }
  if (tokenizer != nullptr)
    outputs.push_back({"num_tokens", "INT64", inference::TYPE_INT64, {-1}, false});
  outputs.push_back({"span_embeddings", "FP32", inference::TYPE_FP32, {-1, D}, false});
  return outputs;
}

namespace {

// A refusal of the request layer in the protocol's words: "input_ids: row 2, token 5 has id
// ...", "text: row 0: the text is empty", "input_ids: the request has ... tokens".
Status refuse(const request::Problem& p) {
  const char* tensor = p.field == request::Field::kTokenIds          ? "input_ids"
                       : p.field == request::Field::kInputEmbeddings ? "input_embeddings"
                       : p.field == request::Field::kSpans           ? "spans"
                       : p.field == request::Field::kMacroChunks     ? "macro_overlap_tokens"
                       : p.field == request::Field::kPrompt          ? "parameters: prompt_name"
                       : p.field == request::Field::kEmbeddingTypes  ? "parameters: embedding_type"
                       : p.field == request::Field::kDimensions      ? "parameters: dimensions"
                                                                     : "text";
  std::string where = tensor;
  if (p.row) {
    where += ": row " + std::to_string(*p.row);
    where += p.token ? ", token " + std::to_string(*p.token) + " " : ": ";
  } else {
    where += ": ";
  }
  return invalid_argument(where + p.message);
}

// A batch of B rows against the model's max_batch_size (0: no limit).
Status check_batch(const std::string& tensor, int64_t B, int64_t max_batch_size) {
  if (max_batch_size > 0 && B > max_batch_size) {
    return invalid_argument(tensor + ": batch size " + std::to_string(B) +
                            " exceeds max_batch_size " + std::to_string(max_batch_size));
  }
  return Status();
}

// The request's inputs by name: exactly one of input_ids, input_embeddings and text, and the
// optional attention_mask and spans.
struct Inputs {
  std::optional<Input> ids, mask, embeddings, text, spans;
};

Status find_inputs(const inference::ModelInferRequest& proto, const text::Tokenizer* tokenizer,
                   Inputs* in) {
  if (proto.raw_input_contents_size() > 0 &&
      proto.raw_input_contents_size() != proto.inputs_size()) {
    return invalid_argument(
        "raw_input_contents: " + std::to_string(proto.raw_input_contents_size()) + " entries for " +
        std::to_string(proto.inputs_size()) + " inputs; send one per input, or typed contents");
  }
  for (int i = 0; i < proto.inputs_size(); ++i) {
    const InputTensorProto& t = proto.inputs(i);
    std::optional<Input>* slot = t.name() == "input_ids"          ? &in->ids
                                 : t.name() == "attention_mask"   ? &in->mask
                                 : t.name() == "input_embeddings" ? &in->embeddings
                                 : t.name() == "text"             ? &in->text
                                 : t.name() == "spans"            ? &in->spans
                                                                  : nullptr;
    if (slot == nullptr) {
      return invalid_argument(
          "inputs[" + std::to_string(i) + "]: unknown input '" + t.name() +
          "' (expected input_ids, attention_mask, input_embeddings or text, and spans)");
    }
    if (slot->has_value())
      return invalid_argument("inputs[" + std::to_string(i) + "]: input '" + t.name() +
                              "' is sent twice");
    *slot = Input{&t, proto.raw_input_contents_size() > 0 ? &proto.raw_input_contents(i) : nullptr};
  }
  if (int(in->ids.has_value()) + int(in->embeddings.has_value()) + int(in->text.has_value()) != 1) {
    return invalid_argument(tokenizer != nullptr
                                ? "inputs: send exactly one of input_ids, input_embeddings and text"
                                : "inputs: send exactly one of input_ids and input_embeddings");
  }
  if (in->text && in->mask)
    return invalid_argument("attention_mask: not used with text (each text is one row)");
  return Status();
}

// Late chunking: the spans input [K, 3] of (row, begin, end), grouped by row into `row_spans`,
// each chunk's slot kept for the span_embeddings output.
Status read_spans(const Input& spans, const request::Limits& limits, InferCall* call,
                  std::vector<std::vector<TokenSpan>>* row_spans) {
  const auto& shape = spans.tensor->shape();
  if (shape.size() != 2 || shape[1] != 3) {
    return invalid_argument("spans: shape " + shape_string(shape) +
                            " must be [chunks, 3]: row, begin, end");
  }
  std::vector<int64_t> values;
  if (Status s = read_integers(spans, shape[0] * 3, &values); !s.ok()) return s;
  if (limits.max_request_spans > 0 && shape[0] > limits.max_request_spans) {
    return invalid_argument("spans: the request has " + std::to_string(shape[0]) +
                            " chunks, over max_request_spans " +
                            std::to_string(limits.max_request_spans));
  }
  for (int64_t k = 0; k < shape[0]; ++k) {
    const int64_t row = values[size_t(3 * k)], b = values[size_t(3 * k + 1)],
                  e = values[size_t(3 * k + 2)];
    constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
    if (row < 0 || row >= kMax || b < -kMax || b > kMax || e < -kMax || e > kMax) {
      return invalid_argument("spans: chunk " + std::to_string(k) + " (" + std::to_string(row) +
                              ", " + std::to_string(b) + ", " + std::to_string(e) +
                              ") is out of range");
    }
    if (size_t(row) >= row_spans->size()) row_spans->resize(size_t(row) + 1);
    call->span_slots.emplace_back(row, int64_t((*row_spans)[size_t(row)].size()));
    (*row_spans)[size_t(row)].push_back({int32_t(b), int32_t(e)});
  }
  return Status();
}

// The rows of the input_ids or input_embeddings tensor [batch, length(, hidden)], trimmed by
// the attention mask (masked ids become the pad token, which the engine skips), as rows of
// `input` viewing `ids` or `embeddings`; the request layer truncates and checks them.
Status read_tensor_rows(const Inputs& in, const engine::Model& model, int64_t max_batch_size,
                        InferCall* call, request::EncodeInput* input, std::vector<int64_t>* ids,
                        std::vector<float>* embeddings) {
  const engine::ModelConfig& c = model.config();
  const int64_t D = c.hidden_size;
  const Input& main = in.ids ? *in.ids : *in.embeddings;
  int64_t count = 0;
  if (Status s = element_count(main, in.ids ? 2 : 3, &count); !s.ok()) return s;
  const int64_t B = main.tensor->shape(0), L = main.tensor->shape(1);
  if (in.embeddings && main.tensor->shape(2) != D) {
    return invalid_argument("input_embeddings: shape " + shape_string(main.tensor->shape()) +
                            ": the last dimension must be hidden_size " + std::to_string(D));
  }
  if (Status s = check_batch(main.tensor->name(), B, max_batch_size); !s.ok()) return s;
  if (Status s = in.ids ? read_integers(*in.ids, count, ids)
                        : read_floats(*in.embeddings, count, embeddings);
      !s.ok())
    return s;
  std::vector<int64_t> mask;
  if (in.mask) {
    const auto& ms = in.mask->tensor->shape();
    if (ms.size() != 2 || ms[0] != B || ms[1] != L) {
      return invalid_argument("attention_mask: shape " + shape_string(ms) +
                              " must equal the rows of " + main.tensor->name() + ": [" +
                              std::to_string(B) + ", " + std::to_string(L) + "]");
    }
    if (Status s = read_integers(*in.mask, B * L, &mask); !s.ok()) return s;
  }
  call->rows = B;
  call->length =
      input->truncate == Truncate::kNone ? L : std::min<int64_t>(L, c.max_position_embeddings);
  input->rows.reserve(size_t(B));
  for (int64_t r = 0; r < B; ++r) {
    int64_t n = L;
    if (in.mask) {
      if (Status s = mask_length(mask, r, L, in.embeddings.has_value(), &n); !s.ok()) return s;
    }
    if (in.ids) {
      const std::span<int64_t> row(ids->data() + r * L, size_t(n));
      for (int64_t t = 0; t < n && in.mask; ++t) {
        if (mask[size_t(r * L + t)] == 0) row[size_t(t)] = c.pad_token_id;
      }
      input->rows.push_back(request::Row::wide_ids(row));
    } else {
      input->rows.push_back(request::Row::embeddings(
          std::span<const float>(embeddings->data() + r * L * D, size_t(n * D))));
    }
  }
  return Status();
}

}  // namespace

Status convert_infer_request(const inference::ModelInferRequest& proto, const engine::Model& model,
                             const text::Tokenizer* tokenizer, const request::Limits& limits,
                             int64_t max_batch_size, InferCall* call, request::Prepared* out) {
  const request::VersionFiles files{call->prompts.get(), call->quantization.get(),
                                    call->quantization_file};
  Inputs in;
  if (Status s = find_inputs(proto, tokenizer, &in); !s.ok()) return s;
  request::EncodeInput input;
  std::optional<batching::Priority> priority;
  if (Status s = read_parameters(proto, &input, &call->embedding_type, &priority); !s.ok())
    return s;
  if (priority) out->priority = priority;  // else the header's (HTTP), or the default
  // Checked against the model with the other output options (build_request).
  input.formats = {
      {request::embedding_type_name(call->embedding_type), call->embedding_type, false}};
  if (call->quantization)
    call->range = call->quantization->find(model.config().hidden_size, input.options.normalize);
  if (Status s = read_outputs(proto, model, tokenizer, in.spans.has_value(), call); !s.ok())
    return s;
  input.options.token_embeddings = call->token_embeddings;
  input.options.logits = call->logits;
  // What the rows view until build_request copies it: the spans by row, the texts or the
  // tensor's values.
  std::vector<std::vector<TokenSpan>> row_spans;
  if (in.spans) {
    if (Status s = read_spans(*in.spans, limits, call, &row_spans); !s.ok()) return s;
  }
  std::vector<std::string_view> texts;
  std::vector<int64_t> ids;
  std::vector<float> embeddings;
  if (in.text) {
    if (Status s = read_texts(*in.text, &texts); !s.ok()) return s;
    if (Status s = check_batch("text", int64_t(texts.size()), max_batch_size); !s.ok()) return s;
    for (const std::string_view t : texts) input.rows.push_back(request::Row::from_text(t));
    call->rows = int64_t(texts.size());
  } else if (Status s =
                 read_tensor_rows(in, model, max_batch_size, call, &input, &ids, &embeddings);
             !s.ok()) {
    return s;
  }
  // A span naming a row the request does not have is refused once the rows are known.
  if (row_spans.size() > input.rows.size()) {
    return invalid_argument("spans: a chunk names row " + std::to_string(row_spans.size() - 1) +
                            ", but the request has " + std::to_string(input.rows.size()) + " rows");
  }
  for (size_t r = 0; r < row_spans.size(); ++r)
    input.rows[r] = input.rows[r].with_spans(row_spans[r]);
  if (auto problem = request::build_request(input, model, tokenizer, limits, out, &files))
    return refuse(*problem);
  if (in.text) {  // the token_embeddings output's length: the longest text's tokens
    for (const SequenceInput& row : out->rows)
      call->length = std::max(call->length, int64_t(row.token_ids.size()));
  }
  return Status();
}

void fill_infer_response(const InferCall& call, const batching::Job& request,
                         const engine::Model& model, inference::ModelInferResponse* response) {
  const int64_t B = call.rows, D = model.config().hidden_size, labels = model.num_labels();
  for (const std::string& name : call.output_order) {
    inference::ModelInferResponse::InferOutputTensor* tensor = response->add_outputs();
    tensor->set_name(name);
    tensor->set_datatype("FP32");
    std::string* raw = response->add_raw_output_contents();
    auto put = [&](int64_t row, const std::vector<float>& values, int64_t row_floats) {
      std::memcpy(raw->data() + size_t(row * row_floats) * 4, values.data(),
                  std::min<size_t>(values.size(), size_t(row_floats)) * 4);
    };
    const bool quantized = call.embedding_type != request::EmbeddingType::kFloat &&
                           (name == "embedding" || name == "span_embeddings");
    if (quantized) {
      // [rows, bytes a row] of INT8 or UINT8: each embedding in the asked type.
      tensor->set_datatype(request::embedding_type_signed(call.embedding_type) ? "INT8" : "UINT8");
      std::vector<uint8_t> bytes;
      int64_t count = 0;
      auto add = [&](std::span<const float> e) {
        request::quantize_embedding(call.embedding_type, e, call.range, &bytes);
        ++count;
      };
      if (name == "embedding") {
        for (int64_t r = 0; r < B; ++r) add(request.results[size_t(r)].embedding);
      } else {
        for (const auto& [row, index] : call.span_slots) {
          const EncodedSequence& seq = request.results[size_t(row)];
          const size_t width = seq.embedding.size();
          add(std::span<const float>(seq.span_embeddings).subspan(size_t(index) * width, width));
        }
      }
      tensor->add_shape(count);
      tensor->add_shape(int64_t(request::embedding_type_bytes(call.embedding_type, size_t(D))));
      raw->assign(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    } else if (name == "embedding") {
      tensor->add_shape(B), tensor->add_shape(D);
      raw->assign(size_t(B * D) * 4, '\0');
      for (int64_t r = 0; r < B; ++r) put(r, request.results[size_t(r)].embedding, D);
    } else if (name == "token_embeddings") {
      tensor->add_shape(B), tensor->add_shape(call.length), tensor->add_shape(D);
      raw->assign(size_t(B * call.length * D) * 4, '\0');  // zero past each row's tokens
      for (int64_t r = 0; r < B; ++r)
        put(r, request.results[size_t(r)].token_embeddings, call.length * D);
    } else if (name == "logits") {
      tensor->add_shape(B), tensor->add_shape(labels);
      raw->assign(size_t(B * labels) * 4, '\0');
      for (int64_t r = 0; r < B; ++r) put(r, request.results[size_t(r)].logits, labels);
    } else if (name == "span_embeddings") {
      // [chunks, D] in the spans input's order; each row of the request holds its own.
      const int64_t K = int64_t(call.span_slots.size());
      tensor->add_shape(K), tensor->add_shape(D);
      raw->assign(size_t(K * D) * 4, '\0');
      for (int64_t k = 0; k < K; ++k) {
        const auto [row, index] = call.span_slots[size_t(k)];
        const std::vector<float>& from = request.results[size_t(row)].span_embeddings;
        const int64_t width = int64_t(request.results[size_t(row)].embedding.size());
        std::memcpy(raw->data() + size_t(k * D) * 4, from.data() + index * width,
                    size_t(std::min(width, D)) * 4);
      }
    } else if (name == "num_tokens") {
      tensor->set_datatype("INT64");
      tensor->add_shape(B);
      raw->assign(size_t(B) * 8, '\0');
      for (int64_t r = 0; r < B; ++r) {
        const int64_t n = request.results[size_t(r)].num_tokens;
        std::memcpy(raw->data() + size_t(r) * 8, &n, 8);
      }
    }
  }
}

std::string explain_infer_parse_failure(const std::string& bytes) {
  using google::protobuf::internal::WireFormatLite;
  google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(bytes.data()),
                                            int(bytes.size()));
  const std::string what = "the message is not an inference.ModelInferRequest: ";
  auto at = [](int byte) { return " at byte " + std::to_string(byte); };
  int inputs = 0, outputs = 0;
  for (;;) {
    const int start = in.CurrentPosition();
    const uint32_t tag = in.ReadTag();
    if (tag == 0) {
      return in.CurrentPosition() < int(bytes.size())
                 ? what + "a field tag that does not parse" + at(start)
                 : what + "its bytes do not parse as one (" + std::to_string(bytes.size()) +
                       " bytes)";
    }
    const int field = WireFormatLite::GetTagFieldNumber(tag);
    if (field == 0) return what + "a field numbered 0" + at(start);
    // The field numbers and names are the generated code's, never written out here.
    using Request = inference::ModelInferRequest;
    const google::protobuf::FieldDescriptor* descriptor =
        Request::descriptor()->FindFieldByNumber(field);
    const bool delimited =
        WireFormatLite::GetTagWireType(tag) == WireFormatLite::WIRETYPE_LENGTH_DELIMITED;
    if (!delimited || descriptor == nullptr) {
      if (!WireFormatLite::SkipField(&in, tag))
        return what + "field " + std::to_string(field) + " runs past the end" + at(start);
      continue;
    }
    std::string value;
    const int value_start = in.CurrentPosition();
    if (!WireFormatLite::ReadBytes(&in, &value)) {
      return what + "field " + std::to_string(field) + " runs past the end of the message" +
             at(start);
    }
    switch (field) {
      case Request::kModelNameFieldNumber:
      case Request::kModelVersionFieldNumber:
      case Request::kIdFieldNumber:  // proto3 strings must be UTF-8
        try {
          tokenizer::decode_utf8(value);
        } catch (const tokenizer::TokenizerError& e) {
          std::string why = e.what();  // "text is not valid UTF-8 (... at byte N)", N in the value
          if (why.starts_with("text ")) why = "the value " + why.substr(5);
          return descriptor->name() + " (bytes from " + std::to_string(value_start) + "): " + why;
        }
        break;
      case Request::kParametersFieldNumber: {
        Request one;  // a map entry parses as part of a message with only it
        if (!one.ParseFromString(
                bytes.substr(size_t(start), size_t(in.CurrentPosition() - start)))) {
          return "parameters: an entry that does not parse (a key that is not UTF-8?)" + at(start);
        }
        break;
      }
      case Request::kInputsFieldNumber: {
        Request::InferInputTensor tensor;
        if (!tensor.ParseFromString(value)) {
          return "inputs[" + std::to_string(inputs) +
                 "]: does not parse as an InferInputTensor (a name or datatype "
                 "that is not UTF-8, or a malformed field)" +
                 at(value_start);
        }
        ++inputs;
        break;
      }
      case Request::kOutputsFieldNumber: {
        Request::InferRequestedOutputTensor tensor;
        if (!tensor.ParseFromString(value)) {
          return "outputs[" + std::to_string(outputs) +
                 "]: does not parse as an InferRequestedOutputTensor (a name "
                 "that is not UTF-8, or a malformed field)" +
                 at(value_start);
        }
        ++outputs;
        break;
      }
      default:  // raw_input_contents: bytes, anything goes
        break;
    }
  }
}

}  // namespace fastformer::serving
