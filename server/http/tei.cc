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

namespace {

int64_t ms(uint64_t ns) { return int64_t(ns / 1000000); }

// TEI's timing headers (milliseconds, as TEI writes them) and x-compute-tokens.
void set_timing(Response& response, const batching::Request& r, Clock::time_point start,
                size_t characters) {
  const uint64_t queue = uint64_t(std::max<int64_t>(
      0,
      std::chrono::duration_cast<std::chrono::nanoseconds>(r.first_compute - r.arrival).count()));
  const uint64_t inference = uint64_t(r.compute_us) * 1000;
  response.set("x-total-time", std::to_string(ms(batching::ns_since(start))));
  response.set("x-tokenization-time", std::to_string(ms(r.tokenize_ns)));
  response.set("x-queue-time", std::to_string(ms(queue)));
  response.set("x-inference-time", std::to_string(ms(inference)));
  response.set("x-compute-time", std::to_string(ms(r.tokenize_ns + inference)));
  response.set("x-compute-tokens", std::to_string(r.tokens));
  response.set("x-compute-characters", std::to_string(characters));
}

// An optional boolean field: its value, `fallback` when absent or null, or an error.
std::optional<std::string> read_bool(const simdjson::dom::object& body, const char* name,
                                     bool* value) {
  simdjson::dom::element v;
  if (body[name].get(v) || v.is_null()) return std::nullopt;
  if (v.get_bool().get(*value)) {
    return std::string(name) + ": expected true or false, got " + json::type_name(v);
  }
  return std::nullopt;
}

// truncate (bool, default false) and truncation_direction ("right" or "left", any case).
std::optional<std::string> read_truncation(const simdjson::dom::object& body,
                                           request::Truncate* truncate) {
  bool cut = false;
  if (auto e = read_bool(body, "truncate", &cut)) return e;
  bool left = false;
  simdjson::dom::element v;
  if (!body["truncation_direction"].get(v) && !v.is_null()) {
    std::string_view d;
    if (v.get_string().get(d))
      return std::string("truncation_direction: expected \"right\" or \"left\"");
    std::string lower(d);
    std::transform(lower.begin(), lower.end(), lower.begin(), ::tolower);
    if (lower != "right" && lower != "left") {
      return "truncation_direction: expected \"right\" or \"left\", got \"" + std::string(d) + "\"";
    }
    left = lower == "left";
  }
  *truncate = !cut   ? request::Truncate::kNone
              : left ? request::Truncate::kLeft
                     : request::Truncate::kRight;
  return std::nullopt;
}

size_t characters(const Inputs& inputs) {
  size_t n = 0;
  for (const std::string& t : inputs.texts) n += t.size();
  return n;
}

}  // namespace

// POST /embed_chunks: late chunking of one document in TEI's style (ours; TEI has no such
// route): {"inputs": a text or token ids, "chunking": {"spans": [[begin, end], ...],
// "window_tokens": n, "overlap_tokens": m}, "pooling": "model" | "mean", "normalize": true,
// "truncate", "truncation_direction"} -> [{"embedding": [...], "tokens": [begin, end]}, ...],
// the spans first, then the windows (docs/api.md).
void HttpApi::tei_embed_chunks(const Request& http_request, Call call) {
  const auto served = find(call, "");
  if (!served) return;
  thread_local simdjson::dom::parser parser;
  simdjson::dom::object body;
  if (auto e = read_object(parser, http_request, &body)) return fail(call, invalid_argument(*e));
  struct Keep {
    Inputs inputs;
    request::EncodeInput input;
    std::vector<TokenSpan> spans, char_spans;
  };
  auto keep = std::make_shared<Keep>();
  simdjson::dom::element v;
  if (body["inputs"].get(v)) return fail(call, invalid_argument("inputs: is required"));
  if (auto e = read_inputs(v, "inputs", &keep->inputs)) return fail(call, invalid_argument(*e));
  if (keep->inputs.size() != 1) {
    return fail(call, invalid_argument("inputs: one document (a text or an array of token ids), "
                                       "got " +
                                       std::to_string(keep->inputs.size())));
  }
  keep->input = encode_input(keep->inputs);
  bool normalize = true;
  if (auto e = read_bool(body, "normalize", &normalize)) return fail(call, invalid_argument(*e));
  if (auto e = read_truncation(body, &keep->input.truncate))
    return fail(call, invalid_argument(*e));
  keep->input.options.normalize = normalize;
  if (auto e = read_macro_overlap(body, &keep->input.macro_overlap_tokens))
    return fail(call, invalid_argument(*e));
  if (!body["pooling"].get(v) && !v.is_null()) {
    std::string_view p;
    if (v.get_string().get(p) || (p != "model" && p != "mean"))
      return fail(call, invalid_argument("pooling: expected \"model\" or \"mean\""));
    keep->input.options.span_pooling = p == "mean" ? SpanPooling::kMean : SpanPooling::kModel;
  }
  simdjson::dom::object chunking;
  if (body["chunking"].get(v) || v.get_object().get(chunking)) {
    return fail(call, invalid_argument("chunking: is required, an object with spans and/or "
                                       "window_tokens (and overlap_tokens)"));
  }
  int64_t window = 0, overlap = 0;
  bool sentences = false;
  for (const auto [key, value] : chunking) {
    if (key == "spans" || key == "char_spans") {
      simdjson::dom::array spans;
      const std::string field = "chunking." + std::string(key);
      if (value.get_array().get(spans))
        return fail(call, invalid_argument(field + ": expected an array of [begin, end]"));
      size_t k = 0;
      for (const simdjson::dom::element s : spans) {
        simdjson::dom::array pair;
        int64_t b = 0, e = 0;
        if (s.get_array().get(pair) || pair.size() != 2 || pair.at(0).get_int64().get(b) ||
            pair.at(1).get_int64().get(e) || b < INT32_MIN || b > INT32_MAX || e < INT32_MIN ||
            e > INT32_MAX) {
          return fail(call, invalid_argument(field + "[" + std::to_string(k) +
                                             "]: expected [begin, end] (integers)"));
        }
        (key == "spans" ? keep->spans : keep->char_spans).push_back({int32_t(b), int32_t(e)});
        ++k;
      }
    } else if (key == "sentences") {
      if (value.get_bool().get(sentences))
        return fail(call, invalid_argument("chunking.sentences: expected true or false"));
    } else if (key == "window_tokens" || key == "overlap_tokens") {
      int64_t n = 0;
      if (value.get_int64().get(n) || n < 0 || n > INT32_MAX)
        return fail(call, invalid_argument("chunking." + std::string(key) +
                                           ": expected a non-negative integer"));
      (key == "window_tokens" ? window : overlap) = n;
    } else {
      return fail(call, invalid_argument("chunking: unknown field \"" + std::string(key) +
                                         "\" (spans, char_spans, sentences, window_tokens, "
                                         "overlap_tokens)"));
    }
  }
  if (keep->spans.empty() && keep->char_spans.empty() && !sentences && window == 0)
    return fail(call,
                invalid_argument("chunking: give spans, char_spans, sentences or window_tokens"));
  keep->input.rows[0] = keep->input.rows[0]
                            .with_spans(keep->spans)
                            .with_windows(int32_t(window), int32_t(overlap))
                            .with_char_chunks(keep->char_spans, sentences);
  const auto start = call.start;
  submit(
      call, served, keep,
      [this, keep, served](batching::Request* out) {
        return build(*served, keep->input, "inputs", true, out);
      },
      [keep, start](const batching::Request& r) {
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
          w.raw(",\"tokens\":[").number(int64_t(spans[k].begin)).ch(',');
          w.number(int64_t(spans[k].end)).ch(']');
          if (const auto chars = request::chunk_characters(r, 0, spans[k])) {
            w.raw(",\"text\":[").number(int64_t(chars->first)).ch(',');
            w.number(int64_t(chars->second)).ch(']');
          }
          w.ch('}');
        }
        w.ch(']');
        Response response = json_response(bhttp::status::ok, w.take());
        set_timing(response, r, start, characters(keep->inputs));
        return response;
      });
}

void HttpApi::tei_embed(const Request& http_request, Call call, bool all_tokens) {
  const auto served = find(call, "");  // TEI serves one model: the default one
  if (!served) return;
  thread_local simdjson::dom::parser parser;
  simdjson::dom::object body;
  if (auto e = read_object(parser, http_request, &body)) return fail(call, invalid_argument(*e));
  struct Keep {
    Inputs inputs;
    request::EncodeInput input;
  };
  auto keep = std::make_shared<Keep>();
  simdjson::dom::element v;
  if (body["inputs"].get(v)) return fail(call, invalid_argument("inputs: is required"));
  if (auto e = read_inputs(v, "inputs", &keep->inputs)) return fail(call, invalid_argument(*e));
  keep->input = encode_input(keep->inputs);
  bool normalize = true;
  if (auto e = read_bool(body, "normalize", &normalize)) return fail(call, invalid_argument(*e));
  if (auto e = read_truncation(body, &keep->input.truncate))
    return fail(call, invalid_argument(*e));
  if (!body["prompt_name"].get(v) && !v.is_null()) {
    return fail(call, invalid_argument(
                          "prompt_name: this model has no prompts (config_sentence_transformers"
                          ".json); leave it out"));
  }
  keep->input.options.normalize = normalize && !all_tokens;
  keep->input.options.token_embeddings = all_tokens;
  const int64_t D = served->model->config().hidden_size;
  const bool single = keep->inputs.single;
  const auto start = call.start;
  submit(
      call, served, keep,
      [this, keep, single, served](batching::Request* out) {
        return build(*served, keep->input, "inputs", single, out);
      },
      [keep, all_tokens, D, start](const batching::Request& r) {
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
        Response response = json_response(bhttp::status::ok, w.take());
        set_timing(response, r, start, characters(keep->inputs));
        return response;
      });
}

void HttpApi::tei_predict(const Request& http_request, Call call) {
  const auto served = find(call, "");
  if (!served) return;
  const engine::Model& model = *served->model;
  if (model.num_labels() == 0) {
    return fail(call, invalid_argument(
                          "this model has no classifier head: /predict needs one (use /embed)"));
  }
  thread_local simdjson::dom::parser parser;
  simdjson::dom::object body;
  if (auto e = read_object(parser, http_request, &body)) return fail(call, invalid_argument(*e));
  struct Keep {
    Inputs inputs;
    request::EncodeInput input;
  };
  auto keep = std::make_shared<Keep>();
  simdjson::dom::element v;
  if (body["inputs"].get(v)) return fail(call, invalid_argument("inputs: is required"));
  // TEI's shapes: "text" (one), [["a"], ["b"]] or ["a", "b", "c"] (a batch); a two-text array
  // is a pair, which this encoder (one text a row) cannot classify.
  const std::string pair_error =
      ": is a pair of texts; this model classifies one text a row (send [[\"a\"], [\"b\"]] for "
      "a batch)";
  std::string_view text;
  simdjson::dom::array array;
  if (!v.get_string().get(text)) {
    keep->inputs.texts.emplace_back(text);
    keep->inputs.single = true;
  } else if (!v.get_array().get(array)) {
    if (array.size() == 0)
      return fail(call, invalid_argument("inputs: is empty; send at least one text"));
    bool all_strings = true;
    for (const simdjson::dom::element item : array) all_strings &= item.is_string();
    if (all_strings && array.size() == 2)
      return fail(call, invalid_argument("inputs" + pair_error));
    size_t i = 0;
    for (const simdjson::dom::element item : array) {
      const std::string where = "inputs[" + std::to_string(i++) + "]";
      simdjson::dom::array inner;
      if (!item.get_string().get(text)) {
        keep->inputs.texts.emplace_back(text);
      } else if (!item.get_array().get(inner) && inner.size() == 1 &&
                 !inner.at(0).get_string().get(text)) {
        keep->inputs.texts.emplace_back(text);
      } else if (!item.get_array().get(inner) && inner.size() == 2) {
        return fail(call, invalid_argument(where + pair_error));
      } else {
        return fail(call, invalid_argument(where + ": expected a text or [text], got " +
                                           std::string(json::type_name(item))));
      }
    }
  } else {
    return fail(call,
                invalid_argument(std::string("inputs: expected a text or a list of texts, got ") +
                                 json::type_name(v)));
  }
  bool raw_scores = false;
  if (auto e = read_bool(body, "raw_scores", &raw_scores)) return fail(call, invalid_argument(*e));
  keep->input = encode_input(keep->inputs);
  if (auto e = read_truncation(body, &keep->input.truncate))
    return fail(call, invalid_argument(*e));
  keep->input.options.logits = true;
  const bool single = keep->inputs.single;
  const auto start = call.start;
  submit(
      call, served, keep,
      [this, keep, single, served](batching::Request* out) {
        return build(*served, keep->input, "inputs", single, out);
      },
      [keep, single, raw_scores, start](const batching::Request& r) {
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
        Response response = json_response(bhttp::status::ok, w.take());
        set_timing(response, r, start, characters(keep->inputs));
        return response;
      });
}

void HttpApi::tei_tokenize(const Request& http_request, Call call) {
  const auto served = find(call, "");
  if (!served) return;
  const text::Tokenizer* tokenizer = served->tokenizer();
  if (tokenizer == nullptr) {
    return fail(call,
                invalid_argument("this model has no tokenizer.json: it takes token ids, not text"));
  }
  thread_local simdjson::dom::parser parser;
  simdjson::dom::object body;
  if (auto e = read_object(parser, http_request, &body)) return fail(call, invalid_argument(*e));
  simdjson::dom::element v;
  Inputs inputs;
  if (body["inputs"].get(v)) return fail(call, invalid_argument("inputs: is required"));
  if (auto e = read_inputs(v, "inputs", &inputs)) return fail(call, invalid_argument(*e));
  if (!inputs.ids.empty())
    return fail(call, invalid_argument("inputs: expected text, got token ids"));
  const int64_t max_inputs = served->config.limits.max_request_inputs;
  if (max_inputs > 0 && int64_t(inputs.size()) > max_inputs) {
    return fail(call,
                invalid_argument("inputs: the request has " + std::to_string(inputs.size()) +
                                 " texts, over max_request_inputs " + std::to_string(max_inputs)));
  }
  bool special = true;
  if (auto e = read_bool(body, "add_special_tokens", &special))
    return fail(call, invalid_argument(*e));
  json::Writer w;
  w.ch('[');
  for (size_t i = 0; i < inputs.texts.size(); ++i) {
    tokenizer::Encoding encoding;
    try {
      encoding = tokenizer->encode(inputs.texts[i], tokenizer->truncation(), special,
                                   /*offsets=*/true);
    } catch (const std::exception& e) {
      return fail(call, invalid_argument((inputs.single ? std::string("inputs")
                                                        : "inputs[" + std::to_string(i) + "]") +
                                         ": " + e.what()));
    }
    // "special" as Hugging Face's special-tokens mask has it: the tokens the post-processor
    // added ([CLS], [SEP]), found as what lies around the text's own encoding; an [UNK] the
    // model made from an unknown word is not special.
    size_t first = 0, last = encoding.ids.size();
    if (special) {
      const tokenizer::Encoding bare = tokenizer->encode(inputs.texts[i], false);
      for (size_t o = 0; o + bare.ids.size() <= encoding.ids.size(); ++o) {
        if (std::equal(bare.ids.begin(), bare.ids.end(), encoding.ids.begin() + ptrdiff_t(o))) {
          first = o;
          last = o + bare.ids.size();
          break;
        }
      }
    }
    if (i > 0) w.ch(',');
    w.ch('[');
    // TEI's answer: a special token's own text and null offsets; any other token the text's
    // characters [start, stop), counted in Unicode code points as TEI counts them (its
    // `input.chars().skip(start).take(stop - start)`).
    const std::u32string chars = tokenizer::decode_utf8(inputs.texts[i]);
    for (size_t k = 0; k < encoding.ids.size(); ++k) {
      if (k > 0) w.ch(',');
      const bool is_special = (k < first || k >= last) && tokenizer->is_special(encoding.ids[k]);
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
  w.raw(",\"accepts_text\":").boolean(served->tokenizer() != nullptr);
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
