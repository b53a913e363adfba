// Cohere's embed API, POST /v2/embed and /v1/embed, as the cohere SDK calls them with its
// base_url (docs/api.md, "Cohere"): texts in, their normalised embeddings out in every type
// asked for (embedding_types, request/quantize.h), and billed_units counting the real tokens.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>

#include "server/http/api.h"

namespace fastformer::http {

namespace {

// One embedding type of Cohere's `embedding_types`: ours, or "base64" (the float32 values' bytes
// in base64).
struct CohereType {
  std::string name;
  request::EmbeddingType type = request::EmbeddingType::kFloat;
  bool base64 = false;
};

// A response id: the server's start and a count, in hex (Cohere's ids are opaque strings).
std::string response_id() {
  static const auto epoch = std::chrono::duration_cast<std::chrono::microseconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count();
  static std::atomic<uint64_t> next{0};
  char buffer[48];
  std::snprintf(buffer, sizeof buffer, "%012llx-%08llx", static_cast<unsigned long long>(epoch),
                static_cast<unsigned long long>(next.fetch_add(1)));
  return buffer;
}

}  // namespace

void HttpApi::cohere_embed(const Request& http_request, Call call, bool v2) {
  if (Status s = intake_.availability(); !s.ok()) return fail(call, s);
  thread_local simdjson::dom::parser parser;
  simdjson::dom::object body;
  if (auto e = read_object(parser, http_request, &body)) return fail(call, invalid_argument(*e));
  struct Keep {
    Inputs inputs;
    request::EncodeInput input;
    std::vector<CohereType> types;  // empty: /v1/embed's float list (embeddings_floats)
    const request::QuantizationRange* range = nullptr;
    std::shared_ptr<const request::Quantization> quantization;  // holds `range`
  };
  auto keep = std::make_shared<Keep>();
  simdjson::dom::element v;
  std::string_view name;  // empty: the default model
  if (!body["model"].get(v) && !v.is_null() && v.get_string().get(name)) {
    return fail(
        call, invalid_argument(std::string("model: expected a string, got ") + json::type_name(v)));
  }
  const auto served = find(call, name, "", "model");
  if (!served) return;
  const engine::Model& model = *served->model;
  for (const char* other : {"images", "inputs"}) {
    if (!body[other].get(v) && !v.is_null()) {
      return fail(call, invalid_argument(std::string(other) +
                                         ": not served here (a text encoder): send texts"));
    }
  }
  if (body["texts"].get(v)) return fail(call, invalid_argument("texts: is required"));
  if (!v.is_array()) {
    return fail(call, invalid_argument(std::string("texts: expected an array of strings, got ") +
                                       json::type_name(v)));
  }
  for (simdjson::dom::element t : v.get_array()) {
    std::string_view text;
    if (t.get_string().get(text)) {
      return fail(call, invalid_argument("texts[" + std::to_string(keep->inputs.texts.size()) +
                                         "]: expected a string, got " + json::type_name(t)));
    }
    keep->inputs.texts.emplace_back(text);
  }
  if (keep->inputs.texts.empty()) return fail(call, invalid_argument("texts: is empty"));
  if (!body["input_type"].get(v) && !v.is_null()) {
    std::string_view type;
    if (v.get_string().get(type) || (type != "search_document" && type != "search_query" &&
                                     type != "classification" && type != "clustering")) {
      return fail(call,
                  invalid_argument("input_type: expected \"search_document\", \"search_query\", "
                                   "\"classification\" or \"clustering\""));
    }
    // The priority class, unless an x-priority header chose: queries ahead of documents.
    if (!call.priority && type == "search_query") call.priority = batching::Priority::kInteractive;
    if (!call.priority && type == "search_document") call.priority = batching::Priority::kBulk;
  }
  request::Truncate truncate = request::Truncate::kRight;  // Cohere's default: END
  if (!body["truncate"].get(v) && !v.is_null()) {
    std::string_view how;
    if (v.get_string().get(how) || (how != "NONE" && how != "START" && how != "END")) {
      return fail(call, invalid_argument("truncate: expected \"NONE\", \"START\" or \"END\""));
    }
    // START drops the start of a text over the positions (keeps its end); END its end.
    truncate = how == "NONE"    ? request::Truncate::kNone
               : how == "START" ? request::Truncate::kLeft
                                : request::Truncate::kRight;
  }
  int64_t dims = model.config().hidden_size, dimensions = 0;  // 0: the hidden size
  if (!body["output_dimension"].get(v) && !v.is_null()) {
    int64_t d = 0;
    if (v.get_int64().get(d) || d < 1)
      return fail(call, invalid_argument("output_dimension: expected a positive integer"));
    if (auto refused = request::check_dimensions(d, model))
      return fail(call, invalid_argument("output_dimension: " + *refused));
    dims = d;
    dimensions = d;
  }
  if (!body["max_tokens"].get(v) && !v.is_null()) {
    return fail(call, invalid_argument("max_tokens: not served here; truncate cuts a text at the "
                                       "model's max_position_embeddings " +
                                       std::to_string(model.config().max_position_embeddings)));
  }
  if (!body["embedding_types"].get(v) && !v.is_null()) {
    if (!v.is_array())
      return fail(call, invalid_argument("embedding_types: expected an array of strings"));
    for (simdjson::dom::element t : v.get_array()) {
      std::string_view type_name;
      std::optional<request::EmbeddingType> type;
      if (!t.get_string().get(type_name)) {
        type = type_name == "base64" ? request::EmbeddingType::kFloat
                                     : request::parse_embedding_type(type_name);
      }
      if (!type) {
        return fail(call,
                    invalid_argument(std::string("embedding_types: expected ") +
                                     request::embedding_type_names() + " or \"base64\", got " +
                                     (t.is_string() ? "\"" + std::string(type_name) + "\""
                                                    : std::string(json::type_name(t)))));
      }
      bool seen = false;
      for (const CohereType& k : keep->types) seen |= k.name == type_name;
      if (seen) continue;
      if (auto refused = served->check_embedding_type(*type, dims, true))
        return fail(call, invalid_argument("embedding_types: " + *refused));
      keep->types.push_back({std::string(type_name), *type, type_name == "base64"});
    }
    if (keep->types.empty()) return fail(call, invalid_argument("embedding_types: is empty"));
  } else if (v2) {
    keep->types.push_back({"float", request::EmbeddingType::kFloat, false});
  }
  keep->quantization = served->config.quantization;
  keep->range = served->quantization_range(dims, true);
  keep->input = encode_input(keep->inputs);
  keep->input.truncate = truncate;
  keep->input.options.dimensions = dimensions;  // cut and re-normalised by the request layer
  keep->input.options.normalize = true;         // Cohere's embeddings have length 1
  const int32_t pad = model.config().pad_token_id;
  submit(
      call, served, keep,
      [this, keep, served](batching::Request* out) {
        return build(*served, keep->input, "texts", false, out);
      },
      [keep, pad, v2](const batching::Request& r) {
        json::Writer w;
        const size_t dims = r.results.empty() ? 0 : r.results[0].embedding.size();
        w.reserve(128 +
                  r.results.size() * (32 + dims * 12 * std::max<size_t>(1, keep->types.size())));
        w.raw("{\"id\":").string(response_id()).raw(",\"embeddings\":");
        auto each = [&](const CohereType* type) {
          w.ch('[');
          for (size_t i = 0; i < r.results.size(); ++i) {
            if (i > 0) w.ch(',');
            if (type == nullptr) {
              w.floats(r.results[i].embedding);
            } else {
              write_embedding(w, type->type, r.results[i].embedding, keep->range, type->base64);
            }
          }
          w.ch(']');
        };
        if (keep->types.empty()) {
          each(nullptr);
        } else {
          w.ch('{');
          for (size_t k = 0; k < keep->types.size(); ++k) {
            if (k > 0) w.ch(',');
            w.key(keep->types[k].name);
            each(&keep->types[k]);
          }
          w.ch('}');
        }
        w.raw(",\"texts\":[");
        for (size_t i = 0; i < keep->inputs.texts.size(); ++i) {
          if (i > 0) w.ch(',');
          w.string(keep->inputs.texts[i]);
        }
        w.raw("],\"meta\":{\"api_version\":{\"version\":").string(v2 ? "2" : "1");
        w.raw("},\"billed_units\":{\"input_tokens\":").number(real_tokens(r, pad)).raw("}}");
        w.raw(",\"response_type\":")
            .string(keep->types.empty() ? "embeddings_floats" : "embeddings_by_type")
            .ch('}');
        return json_response(bhttp::status::ok, w.take());
      },
      "texts");
}

}  // namespace fastformer::http
