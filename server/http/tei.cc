// text-embeddings-inference's routes: POST /embed, /embed_all, /predict, /tokenize and /, GET
// /info and /health, with TEI's fields, defaults, error shape and timing headers.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "server/http/api.h"
#include "server/text/tokenizer/tokenizer.h"
#include "server/text/tokenizer/unicode.h"

namespace fastformer::http {

using batching::Clock;

// A TEI body: the fields of /embed, /embed_all, /embed_chunks, /predict and /tokenize, each
// route reading those its table names.
struct TeiBody {
  Inputs inputs;
  request::EncodeInput encode;
  bool normalize = true;
  bool truncate = false, left = false;       // truncate, truncation_direction
  bool raw_scores = false;                   // /predict
  bool special = true;                       // /tokenize's add_special_tokens
  std::vector<TokenSpan> spans, char_spans;  // /embed_chunks' chunking
  int64_t window = 0, overlap = 0;
  bool sentences = false, chunking = false;
  // The truncation the fields ask for: none, or right or left.
  request::Truncate truncation() const {
    return !truncate ? request::Truncate::kNone
           : left    ? request::Truncate::kLeft
                     : request::Truncate::kRight;
  }
};

namespace {

int64_t ms(uint64_t ns) { return int64_t(ns / 1000000); }

// TEI's timing headers (milliseconds, as TEI writes them) and x-compute-tokens.
void set_timing(Response& response, const batching::Job& r, Clock::time_point start,
                size_t characters) {
  const uint64_t queue = uint64_t(std::max<int64_t>(
      0,
      std::chrono::duration_cast<std::chrono::nanoseconds>(r.first_compute - r.arrival).count()));
  const uint64_t inference = uint64_t(r.compute_us) * 1000;
  const uint64_t tokenize_ns = serving::Intake::admitted(r).tokenize_ns;
  response.set("x-total-time", std::to_string(ms(batching::ns_since(start))));
  response.set("x-tokenization-time", std::to_string(ms(tokenize_ns)));
  response.set("x-queue-time", std::to_string(ms(queue)));
  response.set("x-inference-time", std::to_string(ms(inference)));
  response.set("x-compute-time", std::to_string(ms(tokenize_ns + inference)));
  response.set("x-compute-tokens", std::to_string(r.tokens));
  response.set("x-compute-characters", std::to_string(characters));
}

using Body = TeiBody;
using Fields = std::vector<reader::Field<Body>>;

reader::Field<Body> inputs_field() {
  return {
      "inputs",
      [](const simdjson::dom::element& v, Body& b) { return reader::read_inputs(v, &b.inputs); },
      true};
}
// TEI's truncation: truncate (bool, default false) and truncation_direction ("right" or "left",
// any case); the normalisation (default true) and the prompt.
void add_common(Fields* f) {
  f->push_back(reader::bool_field<Body>("normalize", [](Body& b, bool v) { b.normalize = v; }));
  f->push_back(reader::bool_field<Body>("truncate", [](Body& b, bool v) { b.truncate = v; }));
  f->push_back(reader::choice_field<Body>(
      "truncation_direction", {"right", "left"},
      [](Body& b, const std::string& v) { b.left = v == "left"; }, /*any_case=*/true));
  f->push_back(reader::string_field<Body>(
      "prompt_name", [](Body& b, std::string v) { b.encode.prompt_name = std::move(v); }));
}

// /embed_chunks' `chunking`: {"spans": [[begin, end], ...], "char_spans": [...], "sentences":
// bool, "window_tokens": n, "overlap_tokens": m}.
reader::Why read_chunking(const simdjson::dom::element& v, Body& b) {
  simdjson::dom::object chunking;
  if (v.get_object().get(chunking)) return reader::expected("an object", v);
  b.chunking = true;
  for (const auto [key, value] : chunking) {
    const std::string at = "." + std::string(key);
    if (key == "spans" || key == "char_spans") {
      simdjson::dom::array spans;
      if (value.get_array().get(spans))
        return at + ": " + reader::expected("an array of [begin, end]", value);
      size_t k = 0;
      for (const simdjson::dom::element s : spans) {
        simdjson::dom::array pair;
        int64_t x = 0, y = 0;
        if (s.get_array().get(pair) || pair.size() != 2 || pair.at(0).get_int64().get(x) ||
            pair.at(1).get_int64().get(y) || x < INT32_MIN || x > INT32_MAX || y < INT32_MIN ||
            y > INT32_MAX) {
          return at + reader::at_index(k) + reader::expected("[begin, end] (integers)", s);
        }
        (key == "spans" ? b.spans : b.char_spans).push_back({int32_t(x), int32_t(y)});
        ++k;
      }
    } else if (key == "sentences") {
      if (auto e = reader::read_bool(value, &b.sentences)) return at + ": " + *e;
    } else if (key == "window_tokens" || key == "overlap_tokens") {
      if (auto e = reader::read_int(value, 0, INT32_MAX,
                                    key == "window_tokens" ? &b.window : &b.overlap))
        return at + ": " + *e;
    } else {
      return "unknown field \"" + std::string(key) +
             "\" (spans, char_spans, sentences, window_tokens, overlap_tokens)";
    }
  }
  if (b.spans.empty() && b.char_spans.empty() && !b.sentences && b.window == 0)
    return "give spans, char_spans, sentences or window_tokens";
  return std::nullopt;
}

// /predict's `inputs`: "text" (one), [["a"], ["b"]] or ["a", "b", "c"] (a batch); a two-text
// array is a pair, which this encoder (one text a row) cannot classify.
reader::Why read_predict_inputs(const simdjson::dom::element& v, Body& b) {
  const std::string pair =
      "is a pair of texts; this model classifies one text a row (send [[\"a\"], [\"b\"]] for a "
      "batch)";
  std::string_view text;
  simdjson::dom::array array;
  if (!v.get_string().get(text)) {
    b.inputs.texts.emplace_back(text);
    b.inputs.single = true;
    return std::nullopt;
  }
  if (v.get_array().get(array)) return reader::expected("a text or a list of texts", v);
  if (array.size() == 0) return "is empty; send at least one text";
  bool all_strings = true;
  for (const simdjson::dom::element item : array) all_strings &= item.is_string();
  if (all_strings && array.size() == 2) return pair;
  size_t i = 0;
  for (const simdjson::dom::element item : array) {
    const std::string at = reader::at_index(i++);
    simdjson::dom::array inner;
    if (!item.get_string().get(text)) {
      b.inputs.texts.emplace_back(text);
    } else if (!item.get_array().get(inner) && inner.size() == 1 &&
               !inner.at(0).get_string().get(text)) {
      b.inputs.texts.emplace_back(text);
    } else if (!item.get_array().get(inner) && inner.size() == 2) {
      return at + pair;
    } else {
      return at + reader::expected("a text or [text]", item);
    }
  }
  return std::nullopt;
}

const Fields& embed_fields() {
  static const Fields fields = [] {
    Fields f{inputs_field()};
    add_common(&f);
    return f;
  }();
  return fields;
}

const Fields& chunks_fields() {
  static const Fields fields = [] {
    Fields f{inputs_field()};
    add_common(&f);
    f.push_back(reader::int_field<Body>(
        "macro_overlap_tokens", 0, INT32_MAX,
        [](Body& b, int64_t v) { b.encode.macro_overlap_tokens = int32_t(v); }));
    f.push_back(
        reader::choice_field<Body>("pooling", {"model", "mean"}, [](Body& b, const std::string& v) {
          b.encode.options.span_pooling = v == "mean" ? SpanPooling::kMean : SpanPooling::kModel;
        }));
    f.push_back({"chunking", read_chunking, true});
    return f;
  }();
  return fields;
}

const Fields& predict_fields() {
  static const Fields fields = [] {
    Fields f{{"inputs", read_predict_inputs, true}};
    add_common(&f);
    f.push_back(reader::bool_field<Body>("raw_scores", [](Body& b, bool v) { b.raw_scores = v; }));
    return f;
  }();
  return fields;
}

const Fields& tokenize_fields() {
  static const Fields fields = {
      inputs_field(),
      reader::bool_field<Body>("add_special_tokens", [](Body& b, bool v) { b.special = v; }),
  };
  return fields;
}

size_t characters(const Inputs& inputs) {
  size_t n = 0;
  for (const std::string& t : inputs.texts) n += t.size();
  return n;
}

// /embed_chunks' answer: each chunk's embedding, its tokens as the caller numbers them (a
// prompt's left out) and its characters.
Response chunks_answer(const batching::Job& r) {
  const request::Prepared& prepared = serving::Intake::admitted(r);
  const EncodedSequence& seq = r.results[0];
  const std::span<const TokenSpan> spans = r.sequences[0].spans;
  const size_t width = seq.embedding.size();
  json::Writer w;
  w.reserve(16 + spans.size() * (32 + width * 12));
  w.ch('[');
  for (size_t k = 0; k < spans.size(); ++k) {
    if (k > 0) w.ch(',');
    w.raw("{\"embedding\":");
    w.floats(std::span<const float>(seq.span_embeddings).subspan(k * width, width));
    const TokenSpan tokens = request::caller_tokens(prepared, 0, spans[k]);
    w.raw(",\"tokens\":[").number(int64_t(tokens.begin)).ch(',');
    w.number(int64_t(tokens.end)).ch(']');
    if (const auto chars = request::chunk_characters(prepared, 0, spans[k])) {
      w.raw(",\"text\":[").number(int64_t(chars->first)).ch(',');
      w.number(int64_t(chars->second)).ch(']');
    }
    w.ch('}');
  }
  w.ch(']');
  return json_response(bhttp::status::ok, w.take());
}

// /embed's and /embed_all's answer: an embedding a row, or every token's.
Response embed_answer(const batching::Job& r, bool all_tokens, int64_t D) {
  json::Writer w;
  w.reserve(16 + r.results.size() * size_t(D) * 12);
  w.ch('[');
  for (size_t i = 0; i < r.results.size(); ++i) {
    if (i > 0) w.ch(',');
    if (!all_tokens) {
      w.floats(r.results[i].embedding);
      continue;
    }
    const std::vector<float>& t = r.results[i].token_embeddings;
    w.ch('[');
    for (size_t row = 0; row * size_t(D) < t.size(); ++row) {
      if (row > 0) w.ch(',');
      w.floats(std::span<const float>(t).subspan(row * size_t(D), size_t(D)));
    }
    w.ch(']');
  }
  w.ch(']');
  return json_response(bhttp::status::ok, w.take());
}

// /predict's answer: each row's labels by score (softmax unless raw_scores).
Response predict_answer(const batching::Job& r, bool single, bool raw_scores) {
  json::Writer w;
  if (!single) w.ch('[');
  for (size_t i = 0; i < r.results.size(); ++i) {
    if (i > 0) w.ch(',');
    std::vector<float> scores = r.results[i].logits;
    if (!raw_scores && !scores.empty()) {
      const float top = *std::max_element(scores.begin(), scores.end());
      double sum = 0;
      for (float& s : scores) sum += (s = std::exp(s - top));
      for (float& s : scores) s = float(s / sum);
    }
    std::vector<size_t> order(scores.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return scores[a] > scores[b]; });
    w.ch('[');
    for (size_t k = 0; k < order.size(); ++k) {
      if (k > 0) w.ch(',');
      w.raw("{\"score\":")
          .f32(scores[order[k]])
          .raw(",\"label\":")
          .string(serving::Intake::served(r).label(order[k]));
      w.ch('}');
    }
    w.ch(']');
  }
  if (!single) w.ch(']');
  return json_response(bhttp::status::ok, w.take());
}

}  // namespace

void HttpApi::tei_submit(Call call, std::shared_ptr<const serving::ServedModel> served,
                         std::shared_ptr<Body> body,
                         std::function<Response(const batching::Job&)> answer) {
  body->encode.truncate = body->truncation();
  if (body->encode.rows.empty()) add_rows(body->inputs, &body->encode);
  const bool single = body->inputs.single;
  const auto start = call.start;
  submit(
      call, served,
      [this, body, single, served](request::Prepared* out) {
        return build(*served, body->encode, {"inputs"}, single, out);
      },
      [body, start, answer](const batching::Job& r) {
        Response response = answer(r);
        set_timing(response, r, start, characters(body->inputs));
        return response;
      });
}

// POST /embed_chunks: late chunking of one document in TEI's style (ours; TEI has no such
// route): {"inputs": a text or token ids, "chunking": {"spans": [[begin, end], ...],
// "window_tokens": n, "overlap_tokens": m}, "pooling": "model" | "mean", "normalize": true,
// "truncate", "truncation_direction", "prompt_name"} -> [{"embedding": [...], "tokens": [begin,
// end]}, ...], the spans first, then the windows (docs/api.md).
void HttpApi::tei_embed_chunks(const Request& http_request, Call call) {
  const auto served = find(call, "");
  if (!served) return;
  auto body = std::make_shared<Body>();
  if (auto refused = reader::read_body(http_request, chunks_fields(), body.get()))
    return refuse_body(call, *refused);
  if (body->inputs.size() != 1) {
    return fail(call, invalid_argument("inputs: one document (a text or an array of token ids), "
                                       "got " +
                                       std::to_string(body->inputs.size())));
  }
  body->encode.options.normalize = body->normalize;
  add_rows(body->inputs, &body->encode);
  request::Row& row = body->encode.rows[0];  // its chunks view the body's spans
  row = row.with_spans(body->spans)
            .with_windows(int32_t(body->window), int32_t(body->overlap))
            .with_char_chunks(body->char_spans, body->sentences);
  tei_submit(call, served, body, chunks_answer);
}

void HttpApi::tei_embed(const Request& http_request, Call call, bool all_tokens) {
  const auto served = find(call, "");  // TEI serves one model: the default one
  if (!served) return;
  auto body = std::make_shared<Body>();
  if (auto refused = reader::read_body(http_request, embed_fields(), body.get()))
    return refuse_body(call, *refused);
  body->encode.options.normalize = body->normalize && !all_tokens;
  body->encode.options.token_embeddings = all_tokens;
  const int64_t D = served->model->config().hidden_size;
  tei_submit(call, served, body,
             [all_tokens, D](const batching::Job& r) { return embed_answer(r, all_tokens, D); });
}

void HttpApi::tei_predict(const Request& http_request, Call call) {
  const auto served = find(call, "");
  if (!served) return;
  if (served->model->num_labels() == 0) {
    return fail(call, invalid_argument(
                          "this model has no classifier head: /predict needs one (use /embed)"));
  }
  auto body = std::make_shared<Body>();
  if (auto refused = reader::read_body(http_request, predict_fields(), body.get()))
    return refuse_body(call, *refused);
  body->encode.options.logits = true;
  const bool single = body->inputs.single, raw = body->raw_scores;
  tei_submit(call, served, body,
             [single, raw](const batching::Job& r) { return predict_answer(r, single, raw); });
}

namespace {

// One text's tokens as TEI's /tokenize answers them; why not, when the tokenizer refuses it.
std::optional<std::string> write_tokens(json::Writer& w, const text::Tokenizer& tokenizer,
                                        const std::string& text, bool special) {
  tokenizer::Encoding encoding;
  try {
    encoding = tokenizer.encode(text, tokenizer.truncation(), special, /*offsets=*/true);
  } catch (const std::exception& e) {
    return std::string(e.what());
  }
  // "special" as Hugging Face's special-tokens mask has it: the tokens the post-processor
  // added ([CLS], [SEP]), found as what lies around the text's own encoding; an [UNK] the
  // model made from an unknown word is not special.
  size_t first = 0, last = encoding.ids.size();
  if (special) {
    const tokenizer::Encoding bare = tokenizer.encode(text, false);
    for (size_t o = 0; o + bare.ids.size() <= encoding.ids.size(); ++o) {
      if (std::equal(bare.ids.begin(), bare.ids.end(), encoding.ids.begin() + ptrdiff_t(o))) {
        first = o;
        last = o + bare.ids.size();
        break;
      }
    }
  }
  w.ch('[');
  // TEI's answer: a special token's own text and null offsets; any other token the text's
  // characters [start, stop), counted in Unicode code points as TEI counts them (its
  // `input.chars().skip(start).take(stop - start)`).
  const std::u32string chars = tokenizer::decode_utf8(text);
  for (size_t k = 0; k < encoding.ids.size(); ++k) {
    if (k > 0) w.ch(',');
    const bool is_special = (k < first || k >= last) && tokenizer.is_special(encoding.ids[k]);
    w.raw("{\"id\":").number(int64_t(encoding.ids[k])).raw(",\"text\":");
    if (is_special) {
      w.string(encoding.tokens[k]);
      w.raw(",\"special\":true,\"start\":null,\"stop\":null}");
      continue;
    }
    const auto [start, stop] = encoding.offsets[k];
    w.string(tokenizer::encode_utf8(std::u32string_view(chars).substr(start, stop - start)));
    w.raw(",\"special\":false,\"start\":").number(int64_t(start));
    w.raw(",\"stop\":").number(int64_t(stop)).ch('}');
  }
  w.ch(']');
  return std::nullopt;
}

}  // namespace

void HttpApi::tei_tokenize(const Request& http_request, Call call) {
  const auto served = find(call, "");
  if (!served) return;
  const text::Tokenizer* tokenizer = served->tokenizer();
  if (tokenizer == nullptr) {
    return fail(call,
                invalid_argument("this model has no tokenizer.json: it takes token ids, not text"));
  }
  Body body;
  if (auto refused = reader::read_body(http_request, tokenize_fields(), &body))
    return refuse_body(call, *refused);
  const Inputs& inputs = body.inputs;
  if (!inputs.ids.empty())
    return fail(call, invalid_argument("inputs: expected text, got token ids"));
  const int64_t max_inputs = served->config.limits.max_request_inputs;
  if (max_inputs > 0 && int64_t(inputs.size()) > max_inputs) {
    return fail(call,
                invalid_argument("inputs: the request has " + std::to_string(inputs.size()) +
                                 " texts, over max_request_inputs " + std::to_string(max_inputs)));
  }
  json::Writer w;
  w.ch('[');
  for (size_t i = 0; i < inputs.texts.size(); ++i) {
    if (i > 0) w.ch(',');
    if (auto why = write_tokens(w, *tokenizer, inputs.texts[i], body.special)) {
      return fail(call, invalid_argument((inputs.single ? std::string("inputs")
                                                        : "inputs[" + std::to_string(i) + "]") +
                                         ": " + *why));
    }
  }
  w.ch(']');
  answer(call, json_response(bhttp::status::ok, w.take()), Status());
}

void HttpApi::tei_info(Call call) {
  const auto served = find(call, "");
  if (!served) return;
  const engine::Engine& engine = *served->engine;
  const engine::Model& model = *served->model;
  const serving::ServiceConfig& config = served->config;
  json::Writer w;
  w.raw("{\"model_id\":").string(served->name).raw(",\"model_sha\":null");
  w.raw(",\"model_dtype\":")
      .string(engine::dtype_name(engine.dtype().dtype))  // as served: never "auto"
      .raw(",\"model_type\":");
  if (model.num_labels() > 0) {
    w.raw("{\"classifier\":{\"id2label\":{");
    for (int64_t i = 0; i < model.num_labels(); ++i) {
      if (i > 0) w.ch(',');
      w.key(std::to_string(i)).string(served->label(size_t(i)));
    }
    w.raw("},\"label2id\":{");
    for (int64_t i = 0; i < model.num_labels(); ++i) {
      if (i > 0) w.ch(',');
      w.key(served->label(size_t(i))).number(i);
    }
    w.raw("}}}");
  } else {
    w.raw("{\"embedding\":{\"pooling\":\"attention\"}}");
  }
  w.raw(",\"max_concurrent_requests\":").number(int64_t(0));
  w.raw(",\"max_input_length\":").number(model.config().max_position_embeddings);
  w.raw(",\"max_batch_tokens\":").number(served->settings.max_batch_tokens);
  w.raw(",\"max_batch_requests\":").number(served->settings.max_batch_sequences);
  w.raw(",\"max_client_batch_size\":").number(config.limits.max_request_inputs);
  w.raw(",\"auto_truncate\":false,\"tokenization_workers\":").number(int64_t(0));
  w.raw(",\"backend\":").string(engine.backend_name());
  w.raw(",\"device\":").string(engine.device_name());
  w.raw(",\"gemm_kernels\":[");  // ours: which kernel runs each GEMM site (docs/api.md)
  size_t site = 0;
  for (const std::string& line : engine.gemm_report()) (site++ ? w.ch(',') : w).string(line);
  w.ch(']');
  w.raw(",\"accepts_text\":").boolean(served->tokenizer() != nullptr);
  // The prompts for prompt_name, as sentence-transformers names them (ours: TEI has none here).
  w.raw(",\"prompts\":{");
  const request::Prompts* prompts = served->config.prompts.get();
  if (prompts != nullptr) {
    size_t k = 0;
    for (const auto& [name, text] : prompts->by_name) (k++ ? w.ch(',') : w).key(name).string(text);
  }
  w.raw("},\"default_prompt_name\":");
  if (prompts != nullptr && prompts->default_name) {
    w.string(*prompts->default_name);
  } else {
    w.null();
  }
  w.raw(",\"model_version\":").string(served->version);
  w.raw(",\"version\":").string(config.version).raw(",\"sha\":null,\"docker_label\":null}");
  answer(call, json_response(bhttp::status::ok, w.take()), Status());
}

void HttpApi::tei_health(Call call) {
  if (Status s = intake_.availability(); !s.ok()) return fail(call, s);
  if (!intake_.repository().ready()) {
    return fail(call, {StatusCode::kUnavailable,
                       "not ready: a model this server serves has no READY version"});
  }
  Response response{bhttp::status::ok, 11};
  answer(call, std::move(response), Status());
}

}  // namespace fastformer::http
