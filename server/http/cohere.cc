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

namespace {

// POST /v1/embed and /v2/embed's body, each field setting the request layer's option.
struct Embed {
  std::string model;  // empty: the default model
  Inputs texts;
  request::EncodeInput encode;
  std::optional<std::string> input_type;
  bool typed = false;                                  // embedding_types given: answered by type
  std::shared_ptr<const serving::ServedModel> served;  // holds the range below
  const request::QuantizationRange* range = nullptr;
};

const std::vector<reader::Field<Embed>>& embed_fields() {
  using E = Embed;
  static const std::vector<reader::Field<E>> fields = {
      reader::string_field<E>("model", [](E& e, std::string v) { e.model = std::move(v); }),
      reader::refused_field<E>("images", "not served here (a text encoder): send texts"),
      reader::refused_field<E>("inputs", "not served here (a text encoder): send texts"),
      {"texts",
       [](const simdjson::dom::element& v, E& e) -> reader::Why {
         if (auto why = reader::read_strings(v, &e.texts.texts)) return why;
         if (e.texts.texts.empty()) return "is empty";
         return std::nullopt;
       },
       true},
      // The prompt of that name where the model has one (search_query: query, search_document:
      // document), and the priority class.
      reader::choice_field<E>("input_type",
                              {"search_document", "search_query", "classification", "clustering"},
                              [](E& e, const std::string& v) {
                                e.input_type = v;
                                e.encode.prompt_hint = v == "search_query"      ? "query"
                                                       : v == "search_document" ? "document"
                                                                                : v;
                              }),
      reader::choice_field<E>("truncate", {"NONE", "START", "END"},
                              [](E& e, const std::string& v) {
                                // START drops a long text's start (keeps its end), END its end.
                                e.encode.truncate = v == "NONE"    ? request::Truncate::kNone
                                                    : v == "START" ? request::Truncate::kLeft
                                                                   : request::Truncate::kRight;
                              }),
      reader::int_field<E>("output_dimension", 1, INT32_MAX,
                           [](E& e, int64_t v) { e.encode.options.dimensions = v; }),
      reader::refused_field<E>("max_tokens",
                               "not served here; truncate cuts a text at the model's "
                               "max_position_embeddings (GET /info: max_input_length)"),
      {"embedding_types",
       [](const simdjson::dom::element& v, E& e) -> reader::Why {
         simdjson::dom::array array;
         if (v.get_array().get(array)) return reader::expected("an array of strings", v);
         for (const simdjson::dom::element t : array) {
           request::EmbeddingFormat f;
           if (auto why = reader::read_format(t, &f))
             return reader::at_index(e.encode.formats.size()) + *why;
           bool seen = false;
           for (const request::EmbeddingFormat& k : e.encode.formats) seen |= k.name == f.name;
           if (!seen) e.encode.formats.push_back(std::move(f));
         }
         if (e.encode.formats.empty()) return "is empty";
         e.typed = true;
         return std::nullopt;
       }},
  };
  return fields;
}

Response embed_answer(const Embed& e, const batching::Job& r, int32_t pad, bool v2) {
  json::Writer w;
  const size_t dims = r.results.empty() ? 0 : r.results[0].embedding.size();
  const std::vector<request::EmbeddingFormat>& types = e.encode.formats;
  w.reserve(128 + r.results.size() * (32 + dims * 12 * std::max<size_t>(1, types.size())));
  w.raw("{\"id\":").string(response_id()).raw(",\"embeddings\":");
  auto each = [&](const request::EmbeddingFormat& type) {
    w.ch('[');
    for (size_t i = 0; i < r.results.size(); ++i) {
      if (i > 0) w.ch(',');
      write_embedding(w, type.type, r.results[i].embedding, e.range, type.base64);
    }
    w.ch(']');
  };
  if (!e.typed) {
    each(request::EmbeddingFormat{"float"});
  } else {
    w.ch('{');
    for (size_t k = 0; k < types.size(); ++k) {
      if (k > 0) w.ch(',');
      w.key(types[k].name);
      each(types[k]);
    }
    w.ch('}');
  }
  w.raw(",\"texts\":[");
  for (size_t i = 0; i < e.texts.texts.size(); ++i) {
    if (i > 0) w.ch(',');
    w.string(e.texts.texts[i]);
  }
  w.raw("],\"meta\":{\"api_version\":{\"version\":").string(v2 ? "2" : "1");
  w.raw("},\"billed_units\":{\"input_tokens\":").number(real_tokens(r, pad)).raw("}}");
  w.raw(",\"response_type\":").string(e.typed ? "embeddings_by_type" : "embeddings_floats");
  w.ch('}');
  return json_response(bhttp::status::ok, w.take());
}

}  // namespace

void HttpApi::cohere_embed(const Request& http_request, Call call, bool v2) {
  if (Status s = intake_.availability(); !s.ok()) return fail(call, s);
  auto keep = std::make_shared<Embed>();
  keep->encode.truncate = request::Truncate::kRight;  // Cohere's default: END
  if (auto refused = reader::read_body(http_request, embed_fields(), keep.get()))
    return refuse_body(call, *refused);
  keep->served = find(call, keep->model, "", "model");
  if (!keep->served) return;
  const auto served = keep->served;
  // The priority class, unless an x-priority header chose: queries ahead of documents.
  if (!call.priority && keep->input_type == "search_query")
    call.priority = batching::Priority::kInteractive;
  if (!call.priority && keep->input_type == "search_document")
    call.priority = batching::Priority::kBulk;
  if (v2 && !keep->typed) keep->encode.formats = {request::EmbeddingFormat{"float"}};
  add_rows(keep->texts, &keep->encode);
  keep->encode.options.normalize = true;  // Cohere's embeddings have length 1
  const int64_t dims = keep->encode.options.dimensions;
  keep->range =
      served->quantization_range(dims > 0 ? dims : served->model->config().hidden_size, true);
  keep->typed |= v2;
  const int32_t pad = served->model->config().pad_token_id;
  submit(
      call, served,
      [this, keep](request::Prepared* out) {
        return build(*keep->served, keep->encode,
                     {"texts", "output_dimension", "embedding_types", "input_type"}, false, out);
      },
      [keep, pad, v2](const batching::Job& r) { return embed_answer(*keep, r, pad, v2); }, "texts");
}

}  // namespace fastformer::http
