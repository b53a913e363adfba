// POST /v1/embeddings and GET /v1/models, as the openai SDK calls them (docs/api.md, "HTTP").
#include <bit>

#include "server/http/api.h"

namespace fastformer::http {

using batching::Clock;

int64_t real_tokens(const batching::Request& r, int32_t pad) {
  int64_t n = 0;
  for (size_t i = 0; i < r.sequences.size(); ++i) {
    const SequenceInput& s = r.sequences[i];
    if (s.token_ids.empty()) {
      n += r.results[i].num_tokens;
      continue;
    }
    for (const int32_t id : s.token_ids) n += id != pad;
  }
  return n;
}

std::optional<std::string> read_macro_overlap(const simdjson::dom::object& body,
                                              std::optional<int32_t>* overlap) {
  simdjson::dom::element v;
  if (body["macro_overlap_tokens"].get(v) || v.is_null()) return std::nullopt;
  int64_t n = 0;
  if (v.get_int64().get(n) || n < 0 || n > INT32_MAX) {
    return std::string("macro_overlap_tokens: expected a non-negative integer, got ") +
           (v.is_int64() ? std::to_string(n) : std::string(json::type_name(v)));
  }
  *overlap = int32_t(n);
  return std::nullopt;
}

std::optional<std::string> read_inputs(const simdjson::dom::element& value, const char* field,
                                       Inputs* out) {
  const std::string f = field;
  auto read_ids = [&](const simdjson::dom::array& array, const std::string& where,
                      std::vector<int64_t>* ids) -> std::optional<std::string> {
    for (const simdjson::dom::element id : array) {
      int64_t v = 0;
      if (id.get_int64().get(v)) {
        return where + ": expected token ids (integers), got " + json::type_name(id);
      }
      ids->push_back(v);
    }
    return std::nullopt;
  };
  std::string_view text;
  if (!value.get_string().get(text)) {
    out->texts.emplace_back(text);
    out->single = true;
    return std::nullopt;
  }
  simdjson::dom::array array;
  if (value.get_array().get(array)) {
    return f +
           ": expected a string, an array of strings, an array of token ids or an array of "
           "arrays of token ids, got " +
           json::type_name(value);
  }
  if (array.size() == 0) return f + ": is empty; send at least one input";
  const simdjson::dom::element first = array.at(0).value_unsafe();
  if (first.is_int64() || first.is_uint64()) {
    out->single = true;
    return read_ids(array, f, &out->ids.emplace_back());
  }
  size_t i = 0;
  for (const simdjson::dom::element item : array) {
    const std::string where = f + "[" + std::to_string(i++) + "]";
    if (!item.get_string().get(text)) {
      if (!out->ids.empty()) return where + ": mixes text with token ids; send one kind";
      out->texts.emplace_back(text);
      continue;
    }
    simdjson::dom::array ids;
    if (!item.get_array().get(ids)) {
      if (!out->texts.empty()) return where + ": mixes token ids with text; send one kind";
      if (auto e = read_ids(ids, where, &out->ids.emplace_back())) return e;
      continue;
    }
    return where + ": expected a string or an array of token ids, got " + json::type_name(item);
  }
  return std::nullopt;
}

request::EncodeInput encode_input(const Inputs& inputs) {
  request::EncodeInput input;
  input.rows.reserve(inputs.size());
  for (const std::string& text : inputs.texts) input.rows.push_back(request::Row::from_text(text));
  for (const std::vector<int64_t>& ids : inputs.ids)
    input.rows.push_back(request::Row::wide_ids(ids));
  return input;
}

void HttpApi::openai_models(Call call) {
  if (Status s = intake_.availability(); !s.ok()) return fail(call, s);
  json::Writer w;
  w.raw("{\"object\":\"list\",\"data\":[");
  // Every model with a READY version, then the default model's other names.
  const std::vector<std::string> names = intake_.repository().served_names();
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) w.ch(',');
    w.raw("{\"id\":").string(names[i]).raw(",\"object\":\"model\",\"created\":").number(created_);
    w.raw(",\"owned_by\":\"fastformer\"}");
  }
  w.raw("]}");
  answer(call, json_response(bhttp::status::ok, w.take()), Status());
}

void HttpApi::openai_embeddings(const Request& http_request, Call call) {
  if (Status s = intake_.availability(); !s.ok()) return fail(call, s);
  thread_local simdjson::dom::parser parser;
  simdjson::dom::object body;
  if (auto e = read_object(parser, http_request, &body)) return fail(call, invalid_argument(*e));
  struct Keep {
    Inputs inputs;
    request::EncodeInput input;
    std::string model;
    bool base64 = false;
    int64_t dimensions = 0;
    bool late_chunking = false;
    request::EmbeddingType type = request::EmbeddingType::kFloat;
    const request::QuantizationRange* range = nullptr;          // int8 / uint8: the version's, in
    std::shared_ptr<const request::Quantization> quantization;  // (held here)
  };
  auto keep = std::make_shared<Keep>();
  simdjson::dom::element v;
  std::string_view name;  // empty: the default model
  if (!body["model"].get(v) && !v.is_null()) {
    if (v.get_string().get(name)) {
      return fail(
          call,
          invalid_argument(std::string("model: expected a string, got ") + json::type_name(v)),
          "model");
    }
  }
  Status found;
  const auto served = intake_.find(std::string(name), "", &found);
  if (!served) {
    if (found.code() == StatusCode::kNotFound) {
      std::string names;
      for (const std::string& n : intake_.repository().served_names())
        names += (names.empty() ? "'" : ", '") + n + "'";
      found = {StatusCode::kNotFound,
               "model: '" + std::string(name) + "' is not served here; this server serves " +
                   (names.empty() ? std::string("no model yet") : names) + " (GET /v1/models)"};
    }
    return fail(call, found, "model");
  }
  const engine::Model& model = *served->model;
  keep->model = name.empty() ? served->name : std::string(name);
  if (body["input"].get(v)) return fail(call, invalid_argument("input: is required"), "input");
  if (auto e = read_inputs(v, "input", &keep->inputs))
    return fail(call, invalid_argument(*e), "input");
  if (!body["encoding_format"].get(v) && !v.is_null()) {
    std::string_view format;
    if (v.get_string().get(format) || (format != "float" && format != "base64")) {
      return fail(call, invalid_argument("encoding_format: expected \"float\" or \"base64\""),
                  "encoding_format");
    }
    keep->base64 = format == "base64";
  }
  if (!body["dimensions"].get(v) && !v.is_null()) {
    int64_t d = 0;
    if (v.get_int64().get(d) || d < 1) {
      return fail(call, invalid_argument("dimensions: expected a positive integer"), "dimensions");
    }
    if (auto refused = request::check_dimensions(d, model))
      return fail(call, invalid_argument(*refused), "dimensions");
    keep->dimensions = d;
  }
  // Jina's `embedding_type` (the openai SDK sends it in extra_body): float, base64 (float as
  // base64), binary, ubinary, and ours int8 and uint8; encoding_format base64 encodes the
  // chosen type's bytes.
  if (!body["embedding_type"].get(v) && !v.is_null()) {
    std::string_view type_name;
    std::optional<request::EmbeddingType> type;
    if (!v.get_string().get(type_name)) {
      type = type_name == "base64" ? request::EmbeddingType::kFloat
                                   : request::parse_embedding_type(type_name);
      if (type_name == "base64") keep->base64 = true;
    }
    if (!type) {
      return fail(call,
                  invalid_argument(std::string("embedding_type: expected ") +
                                   request::embedding_type_names() + " (or \"base64\": float as " +
                                   "base64), got " +
                                   (v.is_string() ? "\"" + std::string(type_name) + "\""
                                                  : std::string(json::type_name(v)))),
                  "embedding_type");
    }
    keep->type = *type;
  }
  {
    const int64_t dims = keep->dimensions > 0 ? keep->dimensions : model.config().hidden_size;
    if (auto refused = served->check_embedding_type(keep->type, dims, true))
      return fail(call, invalid_argument("embedding_type: " + *refused), "embedding_type");
    keep->quantization = served->config.quantization;
    keep->range = served->quantization_range(dims, true);
  }
  // Jina's extension (the openai SDK sends it in extra_body): the inputs are one document's
  // consecutive chunks, one embedding each from one pass.
  if (!body["late_chunking"].get(v) && !v.is_null()) {
    if (v.get_bool().get(keep->late_chunking)) {
      return fail(call,
                  invalid_argument(std::string("late_chunking: expected a boolean, got ") +
                                   json::type_name(v)),
                  "late_chunking");
    }
  }
  std::optional<int32_t> macro;
  if (auto e = read_macro_overlap(body, &macro))
    return fail(call, invalid_argument(*e), "macro_overlap_tokens");
  if (!body["user"].get(v) && !v.is_null() && !v.is_string()) {
    return fail(call,
                invalid_argument(std::string("user: expected a string, got ") + json::type_name(v)),
                "user");
  }
  keep->input = encode_input(keep->inputs);
  keep->input.options.normalize = true;               // OpenAI's embeddings have length 1
  keep->input.options.dimensions = keep->dimensions;  // cut and re-normalised by the request layer
  keep->input.late_chunking = keep->late_chunking;
  keep->input.macro_overlap_tokens = macro;
  const bool single = keep->inputs.single;
  const int32_t pad = model.config().pad_token_id;
  submit(
      call, served, keep,
      [this, keep, single, served](batching::Request* out) {
        return build(*served, keep->input, "input", single, out);
      },
      [keep, pad](const batching::Request& r) {
        json::Writer w;
        const size_t dims = r.results.empty() ? 0 : r.results[0].embedding.size();
        // One embedding per input: each sequence's, or with late chunking each chunk's (the
        // one document's span embeddings, in input order).
        const size_t count = keep->late_chunking && dims > 0
                                 ? r.results[0].span_embeddings.size() / dims
                                 : r.results.size();
        auto embedding = [&](size_t i) -> std::span<const float> {
          if (!keep->late_chunking) return r.results[i].embedding;
          return std::span<const float>(r.results[0].span_embeddings).subspan(i * dims, dims);
        };
        w.reserve(64 + count * (48 + dims * (keep->base64 ? 6 : 12)));
        w.raw("{\"object\":\"list\",\"data\":[");
        for (size_t i = 0; i < count; ++i) {
          const std::span<const float> e = embedding(i);
          if (i > 0) w.ch(',');
          w.raw("{\"object\":\"embedding\",\"index\":").number(int64_t(i)).raw(",\"embedding\":");
          write_embedding(w, keep->type, e, keep->range, keep->base64);
          w.ch('}');
        }
        const int64_t tokens = real_tokens(r, pad);
        w.raw("],\"model\":").string(keep->model).raw(",\"usage\":{\"prompt_tokens\":");
        w.number(tokens).raw(",\"total_tokens\":").number(tokens).raw("}}");
        return json_response(bhttp::status::ok, w.take());
      },
      "input");
}

}  // namespace fastformer::http
