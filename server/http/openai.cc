// POST /v1/embeddings and GET /v1/models, as the openai SDK calls them (docs/api.md, "HTTP").
#include <bit>

#include "server/http/api.h"

namespace fastformer::http {

using batching::Clock;

int64_t real_tokens(const batching::Job& r, int32_t pad) {
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

void add_rows(const Inputs& inputs, request::EncodeInput* input) {
  input->rows.reserve(input->rows.size() + inputs.size());
  for (const std::string& text : inputs.texts) input->rows.push_back(request::Row::from_text(text));
  for (const std::vector<int64_t>& ids : inputs.ids)
    input->rows.push_back(request::Row::wide_ids(ids));
}

namespace {

// POST /v1/embeddings' body: OpenAI's fields, Jina's extensions (embedding_type, late_chunking)
// and ours (macro_overlap_tokens, prompt_name), each setting the request layer's option.
struct Embeddings {
  std::string model;  // empty: the default model
  Inputs input;
  request::EncodeInput encode;
  request::EmbeddingFormat format{"float"};
  bool base64 = false;  // encoding_format: the chosen type's bytes in base64
  std::shared_ptr<const serving::ServedModel> served;  // holds the range below
  const request::QuantizationRange* range = nullptr;
};

const std::vector<reader::Field<Embeddings>>& embeddings_fields() {
  using E = Embeddings;
  static const std::vector<reader::Field<E>> fields = {
      reader::string_field<E>("model", [](E& e, std::string v) { e.model = std::move(v); }),
      {"input",
       [](const simdjson::dom::element& v, E& e) { return reader::read_inputs(v, &e.input); },
       true},
      reader::choice_field<E>("encoding_format", {"float", "base64"},
                              [](E& e, const std::string& v) { e.base64 = v == "base64"; }),
      reader::int_field<E>("dimensions", 1, INT32_MAX,
                           [](E& e, int64_t v) { e.encode.options.dimensions = v; }),
      reader::format_field<E>("embedding_type",
                              [](E& e, request::EmbeddingFormat f) { e.format = std::move(f); }),
      reader::bool_field<E>("late_chunking", [](E& e, bool v) { e.encode.late_chunking = v; }),
      reader::int_field<E>("macro_overlap_tokens", 0, INT32_MAX,
                           [](E& e, int64_t v) { e.encode.macro_overlap_tokens = int32_t(v); }),
      reader::string_field<E>("user", [](E&, std::string) {}),
      reader::string_field<E>("prompt_name",
                              [](E& e, std::string v) { e.encode.prompt_name = std::move(v); }),
  };
  return fields;
}

// The answer: one embedding per input (each sequence's, or with late chunking each chunk's, the
// one document's span embeddings in input order) and the usage.
Response embeddings_answer(const Embeddings& e, const batching::Job& r, int32_t pad) {
  json::Writer w;
  const size_t dims = r.results.empty() ? 0 : r.results[0].embedding.size();
  const bool late = e.encode.late_chunking && dims > 0;
  const size_t count = late ? r.results[0].span_embeddings.size() / dims : r.results.size();
  w.reserve(64 + count * (48 + dims * (e.format.base64 ? 6 : 12)));
  w.raw("{\"object\":\"list\",\"data\":[");
  for (size_t i = 0; i < count; ++i) {
    const std::span<const float> embedding =
        late ? std::span<const float>(r.results[0].span_embeddings).subspan(i * dims, dims)
             : std::span<const float>(r.results[i].embedding);
    if (i > 0) w.ch(',');
    w.raw("{\"object\":\"embedding\",\"index\":").number(int64_t(i)).raw(",\"embedding\":");
    write_embedding(w, e.format.type, embedding, e.range, e.format.base64);
    w.ch('}');
  }
  const int64_t tokens = real_tokens(r, pad);
  w.raw("],\"model\":").string(e.model).raw(",\"usage\":{\"prompt_tokens\":");
  w.number(tokens).raw(",\"total_tokens\":").number(tokens).raw("}}");
  return json_response(bhttp::status::ok, w.take());
}

}  // namespace

// A model that is not served, in OpenAI's words: the names it serves.
Status HttpApi::openai_not_found(const Status& found, const std::string& name) const {
  if (found.code() != StatusCode::kNotFound) return found;
  std::string names;
  for (const std::string& n : intake_.repository().served_names())
    names += (names.empty() ? "'" : ", '") + n + "'";
  return {StatusCode::kNotFound, "model: '" + name + "' is not served here; this server serves " +
                                     (names.empty() ? std::string("no model yet") : names) +
                                     " (GET /v1/models)"};
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
  auto keep = std::make_shared<Embeddings>();
  if (auto refused = reader::read_body(http_request, embeddings_fields(), keep.get()))
    return refuse_body(call, *refused);
  Status found;
  keep->served = intake_.find(keep->model, "", &found);
  if (!keep->served) return fail(call, openai_not_found(found, keep->model), "model");
  const auto served = keep->served;
  if (keep->model.empty()) keep->model = served->name;
  request::EncodeInput& input = keep->encode;
  add_rows(keep->input, &input);
  keep->format.base64 |= keep->base64;
  input.formats = {keep->format};
  input.options.normalize = true;  // OpenAI's embeddings have length 1
  const int64_t dims = input.options.dimensions;
  keep->range =
      served->quantization_range(dims > 0 ? dims : served->model->config().hidden_size, true);
  const bool single = keep->input.single;
  const int32_t pad = served->model->config().pad_token_id;
  submit(
      call, served,
      [this, keep, single](request::Prepared* out) {
        return build(*keep->served, keep->encode, {"input"}, single, out);
      },
      [keep, pad](const batching::Job& r) { return embeddings_answer(*keep, r, pad); }, "input");
}

}  // namespace fastformer::http
