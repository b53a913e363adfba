#include "server/request/encode_input.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>

#include "server/engine/error.h"
#include "server/engine/ragged_batch.h"
#include "server/text/tokenizer/unicode.h"

namespace fastformer::request {
namespace {

Field field_of(const std::string& engine_field) {
  return engine_field == "input_embeddings" ? Field::kInputEmbeddings
         : engine_field == "spans"          ? Field::kSpans
                                            : Field::kTokenIds;
}

// The token ids of `row` kept under `truncate` (the first or last max_len of a longer row),
// each inside the vocabulary; `first` is the position of the first kept one in the row as sent.
// 64-bit ids are narrowed into `storage`.
template <class Id>
std::optional<Problem> keep_ids(std::span<const Id> ids, size_t row, const engine::Model& model,
                                Truncate truncate, std::vector<std::vector<int32_t>>* storage,
                                std::span<const int32_t>* kept) {
  const engine::ModelConfig& c = model.config();
  const size_t max_len = size_t(c.max_position_embeddings);
  size_t first = 0, n = ids.size();
  if (truncate != Truncate::kNone && n > max_len) {
    if (truncate == Truncate::kLeft) first = n - max_len;
    n = max_len;
  }
  const std::span<const Id> keep = ids.subspan(first, n);
  if (model.has_word_embedding()) {  // else validate_sequence says there is no word table
    for (size_t t = 0; t < keep.size(); ++t) {
      if (keep[t] < 0 || keep[t] >= c.vocab_size) {
        return Problem{row, Field::kTokenIds, int64_t(first + t),
                       engine::id_outside_vocabulary(int64_t(keep[t]), c.vocab_size)};
      }
    }
  }
  if constexpr (std::is_same_v<Id, int32_t>) {
    *kept = keep;
  } else {
    std::vector<int32_t>& narrow = storage->emplace_back(keep.begin(), keep.end());
    *kept = narrow;
  }
  return std::nullopt;
}

// The row's chunks in `storage` (which `in->spans` then views): its token spans, then its
// character spans and sentences (a text's, through `offsets`), then its windows over the tokens
// as tokenized (a text's special tokens, tokenizer.json's, belonging to no window).
// `prompt`: the row's prompt tokens, in no chunk; `in->spans` already holds the row's token spans.
std::optional<Problem> add_chunks(const Row& row, size_t i, const text::Tokenizer* tokenizer,
                                  int64_t tokens, const std::vector<tokenizer::Offsets>& offsets,
                                  text::PromptTokens prompt, SequenceInput* in,
                                  std::vector<TokenSpan>* storage) {
  storage->assign(in->spans.begin(), in->spans.end());
  const bool text = row.field == Field::kText && tokenizer != nullptr;
  if (!row.char_spans.empty() || row.sentences) {
    if (!text) {
      return Problem{i,
                     Field::kSpans,
                     {},
                     "character spans and sentences need a text (this row is token ids or "
                     "embeddings: give token spans)"};
    }
    const std::u32string chars = tokenizer::decode_utf8(row.text);
    const std::vector<int32_t> ids(in->token_ids.begin(), in->token_ids.end());
    auto content = text::content_tokens(*tokenizer, ids);
    content.first = std::max(content.first, size_t(prompt.at + prompt.count));
    size_t which = 0;
    if (auto why = text::token_spans_of_chars(row.char_spans, chars.size(), offsets, content,
                                              storage, &which))
      return Problem{i, Field::kSpans, {}, std::move(*why)};
    if (row.sentences) {
      const std::vector<TokenSpan> sentences = text::sentence_spans(chars);
      if (auto why = text::token_spans_of_chars(sentences, chars.size(), offsets, content, storage,
                                                &which))
        return Problem{
            i, Field::kSpans, {}, "sentence " + std::to_string(which) + " holds no token: " + *why};
    }
  }
  const int32_t w = row.window_tokens, overlap = row.overlap_tokens;
  if (w != 0 || overlap != 0) {
    if (w <= 0)
      return Problem{i,
                     Field::kSpans,
                     {},
                     "window_tokens " + std::to_string(w) + " must be at least 1 (0: no windows)"};
    if (overlap < 0 || overlap >= w)
      return Problem{i,
                     Field::kSpans,
                     {},
                     "overlap_tokens " + std::to_string(overlap) +
                         " must be in [0, window_tokens " + std::to_string(w) + ")"};
    std::vector<int32_t> content;  // the positions windows cover
    for (int64_t t = 0; t < tokens; ++t) {
      if (text && tokenizer->is_special(in->token_ids[size_t(t)])) continue;
      if (t >= prompt.at && t < prompt.at + prompt.count) continue;
      content.push_back(int32_t(t));
    }
    const int64_t stride = w - overlap;
    for (int64_t s = 0; s < int64_t(content.size()); s += stride) {
      const int64_t e = std::min<int64_t>(s + w, int64_t(content.size()));
      storage->push_back({content[size_t(s)], content[size_t(e - 1)] + 1});
      if (e == int64_t(content.size())) break;
    }
  }
  in->spans = *storage;
  return std::nullopt;
}

}  // namespace

const char* field_name(Field field) {
  switch (field) {
    case Field::kTokenIds:
      return "token_ids";
    case Field::kInputEmbeddings:
      return "input_embeddings";
    case Field::kText:
      return "text";
    case Field::kSpans:
      return "spans";
    case Field::kMacroChunks:
      return "macro_overlap_tokens";
    case Field::kPrompt:
      return "prompt_name";
    case Field::kDimensions:
      return "dimensions";
    case Field::kEmbeddingTypes:
      return "embedding_types";
  }
  return "?";
}

namespace {
std::string what(const Problem& p) {
  return (p.token ? "token " + std::to_string(*p.token) + " " : "") + p.message;
}
}  // namespace

std::string describe(const Problem& p) { return std::string(field_name(p.field)) + ": " + what(p); }

std::string format_v1(const Problem& p) {
  if (!p.row) {
    return (p.field == Field::kMacroChunks ? "macro_overlap_tokens: "
            : p.field == Field::kPrompt || p.field == Field::kDimensions ||
                    p.field == Field::kEmbeddingTypes
                ? std::string(field_name(p.field)) + ": "
                : "sequences: ") +
           what(p);
  }
  return engine::InputError{*p.row, field_name(p.field), what(p)}.to_string();
}

std::optional<std::string> check_options(const OutputOptions& options, const engine::Model& model) {
  if (options.logits && model.num_labels() == 0) {
    return "this model has no classifier head (dense_linear)";
  }
  return std::nullopt;
}

std::optional<std::string> check_dimensions(int64_t dimensions, const engine::Model& model) {
  const int64_t hidden = model.config().hidden_size;
  if (dimensions < 0) return "expected a positive integer, got " + std::to_string(dimensions);
  if (dimensions > hidden) {
    return std::to_string(dimensions) + " is over the model's hidden_size " +
           std::to_string(hidden);
  }
  return std::nullopt;
}

void apply_dimensions(const OutputOptions& options, std::vector<EncodedSequence>* results) {
  if (options.dimensions <= 0) return;
  const size_t dims = size_t(options.dimensions);
  // Matryoshka-style: the first `dimensions` values of a row, re-normalised.
  auto cut = [&](const float* row, float* to) {
    std::memmove(to, row, dims * sizeof(float));  // `to` at or before `row`
    if (!options.normalize) return;
    double norm = 0;
    for (size_t j = 0; j < dims; ++j) norm += double(to[j]) * to[j];
    norm = std::sqrt(norm);
    if (norm > 0) {
      for (size_t j = 0; j < dims; ++j) to[j] = float(to[j] / norm);
    }
  };
  for (EncodedSequence& seq : *results) {
    std::vector<float>& e = seq.embedding;
    const size_t width = e.size();
    if (dims >= width) continue;
    cut(e.data(), e.data());
    e.resize(dims);
    // Each span's embedding the same way, packed to `dims` a row.
    std::vector<float>& spans = seq.span_embeddings;
    const size_t count = spans.size() / width;
    for (size_t i = 0; i < count; ++i) cut(spans.data() + i * width, spans.data() + i * dims);
    spans.resize(count * dims);
  }
}

namespace {

// The model's config without its position limit: a row run as macro-chunks may be longer.
engine::ModelConfig unbounded(const engine::ModelConfig& c) {
  engine::ModelConfig u = c;
  u.max_position_embeddings = std::numeric_limits<int32_t>::max();
  return u;
}

// The output options every protocol shares: logits need a head, `dimensions` at most
// hidden_size, each embedding type its dimension count and calibrated ranges.
std::optional<Problem> check_output(const EncodeInput& input, const engine::Model& model,
                                    const VersionFiles* files) {
  const OutputOptions& o = input.options;
  if (auto why = check_dimensions(o.dimensions, model))
    return Problem{std::nullopt, Field::kDimensions, {}, std::move(*why)};
  const int64_t dims = o.dimensions > 0 ? o.dimensions : model.config().hidden_size;
  for (const EmbeddingFormat& f : input.formats) {
    const std::string file(files ? files->quantization_file : "quantization.json");
    if (auto why = check_embedding_type(f.type, dims, o.normalize,
                                        files ? files->quantization : nullptr, file))
      return Problem{std::nullopt, Field::kEmbeddingTypes, {}, std::move(*why)};
  }
  return std::nullopt;
}

std::optional<Problem> check_macro(const EncodeInput& input, const engine::ModelConfig& c) {
  if (!input.macro_overlap_tokens) return std::nullopt;
  const int64_t overlap = *input.macro_overlap_tokens, P = c.max_position_embeddings;
  if (overlap < 0 || overlap >= P)
    return Problem{std::nullopt,
                   Field::kMacroChunks,
                   {},
                   std::to_string(overlap) + " must be in [0, max_position_embeddings " +
                       std::to_string(P) + ")"};
  if (input.truncate != Truncate::kNone)
    return Problem{std::nullopt,
                   Field::kMacroChunks,
                   {},
                   "macro-chunks keep the whole row, truncation cuts it: ask for one of them"};
  return std::nullopt;
}

// Where the passes of an n-token row (n > P) start: every P - overlap tokens, the last one
// ending at the row's end.
std::vector<int32_t> pass_starts(int64_t n, int64_t P, int64_t overlap) {
  std::vector<int32_t> starts;
  for (int64_t s = 0; s + P < n; s += P - overlap) starts.push_back(int32_t(s));
  starts.push_back(int32_t(n - P));
  return starts;
}

// The tokens the passes of an n-token row compute (n when it fits one pass): what the token
// budget counts.
int64_t macro_tokens(int64_t n, int64_t P, int64_t overlap) {
  return n <= P ? n : int64_t(pass_starts(n, P, overlap).size()) * P;
}

Problem macro_logits(std::optional<size_t> row, const engine::ModelConfig& c) {
  return Problem{row,
                 Field::kMacroChunks,
                 {},
                 "logits are not served for a row over max_position_embeddings " +
                     std::to_string(c.max_position_embeddings) +
                     " run as macro-chunks (a classification is one pass)"};
}

// The pass of `starts` (each P tokens) that holds `span` whole with the most context on both
// sides (the earlier on a tie); -1 if none holds it.
int32_t pass_for(TokenSpan span, const std::vector<int32_t>& starts, int32_t P) {
  int32_t best = -1;
  int64_t most = -1;
  for (size_t w = 0; w < starts.size(); ++w) {
    const int32_t a = starts[w], b = a + P;
    if (span.begin < a || span.end > b) continue;
    const int64_t context = std::min(span.begin - a, b - span.end);
    if (context > most) {
      most = context;
      best = int32_t(w);
    }
  }
  return best;
}

// Cuts row `in` (longer than P = max_position_embeddings) into passes of P tokens, each
// P - overlap after the last and the last ending at the row's end, appended to out->sequences;
// each span goes to the pass that holds it with the most context (pass_for).
std::optional<Problem> add_passes(const SequenceInput& in, std::optional<size_t> row, Field field,
                                  const engine::Model& model, int32_t overlap,
                                  batching::Request* out, batching::Request::RowPasses* plan) {
  const engine::ModelConfig& c = model.config();
  const int64_t D = c.hidden_size;
  const int32_t P = c.max_position_embeddings, n = int32_t(engine::sequence_length(in, D));
  plan->first = int32_t(out->sequences.size());
  plan->starts = pass_starts(n, P, overlap);
  const size_t passes = plan->starts.size();
  plan->count = int32_t(passes);
  std::vector<std::vector<TokenSpan>> local(passes);
  plan->span_pass.assign(in.spans.size(), 0);
  plan->span_index.assign(in.spans.size(), 0);
  for (size_t k = 0; k < in.spans.size(); ++k) {
    const TokenSpan span = in.spans[k];
    const int32_t w = pass_for(span, plan->starts, P);
    if (w < 0) {
      return Problem{row,
                     Field::kSpans,
                     {},
                     "span " + std::to_string(k) + " [" + std::to_string(span.begin) + ", " +
                         std::to_string(span.end) + ") lies in no single macro-chunk: passes of " +
                         "max_position_embeddings " + std::to_string(P) + " tokens start every " +
                         std::to_string(P - overlap) + " tokens (macro_overlap_tokens " +
                         std::to_string(overlap) + "), so a chunk of at most " +
                         std::to_string(overlap + 1) +
                         " tokens always fits one; raise macro_overlap_tokens or cut the chunk"};
    }
    const int32_t start = plan->starts[size_t(w)];
    plan->span_pass[k] = w;
    plan->span_index[k] = int32_t(local[size_t(w)].size());
    local[size_t(w)].push_back({span.begin - start, span.end - start});
  }
  for (size_t w = 0; w < passes; ++w) {
    const int32_t start = plan->starts[w];
    SequenceInput pass;
    if (!in.token_ids.empty())
      pass.token_ids = in.token_ids.subspan(size_t(start), size_t(P));
    else
      pass.input_embeddings = in.input_embeddings.subspan(size_t(start * D), size_t(P * D));
    out->spans.push_back(std::move(local[w]));  // its buffer, which the view keeps, moves along
    pass.spans = out->spans.back();
    if (auto error = engine::validate_sequence(c, model.has_word_embedding(), pass, 0)) {
      return Problem{row,
                     field,
                     {},
                     "macro-chunk " + std::to_string(w) + " (tokens [" + std::to_string(start) +
                         ", " + std::to_string(start + P) + ")): " + error->message};
    }
    out->sequences.push_back(pass);
  }
  return std::nullopt;
}

// build_request for input.late_chunking: the rows joined into one document, one span each.
std::optional<Problem> build_late_chunked(const EncodeInput& input, const engine::Model& model,
                                          const text::Tokenizer* tokenizer, const Limits& limits,
                                          std::string_view prompt, batching::Request* out) {
  const engine::ModelConfig& c = model.config();
  const size_t rows = input.rows.size();
  const Field kind = input.rows[0].field;
  for (size_t i = 0; i < rows; ++i) {
    const Field f = input.rows[i].field;
    if (f == Field::kInputEmbeddings)
      return Problem{i, f, {}, "late chunking takes texts or token ids, not input embeddings"};
    if (f != kind)
      return Problem{i, f, {}, "late chunking joins the inputs into one document: send one kind"};
  }
  if (limits.max_request_spans > 0 && int64_t(rows) > limits.max_request_spans) {
    return Problem{std::nullopt,
                   Field::kSpans,
                   {},
                   "the request has " + std::to_string(rows) + " chunks, over max_request_spans " +
                       std::to_string(limits.max_request_spans)};
  }
  out->text_ids.clear();
  out->spans.clear();
  std::vector<int32_t>& ids = out->text_ids.emplace_back();
  std::vector<TokenSpan>& spans = out->spans.emplace_back();
  if (kind == Field::kText) {
    std::vector<std::string_view> texts;
    for (const Row& r : input.rows) texts.push_back(r.text);
    size_t which = rows;
    const auto start = batching::Clock::now();
    std::optional<std::string> refused =
        text::chunk_texts(tokenizer, input.macro_overlap_tokens ? unbounded(c) : c, texts, &ids,
                          &spans, &which, prompt);
    out->tokenize_ns += batching::ns_since(start);
    out->texts = int64_t(rows);
    if (refused) {
      return Problem{which < rows ? std::optional<size_t>(which) : std::nullopt,
                     Field::kText,
                     {},
                     std::move(*refused)};
    }
  } else {
    for (size_t i = 0; i < rows; ++i) {
      const Row& r = input.rows[i];
      const size_t n = r.wide_token_ids.empty() ? r.token_ids.size() : r.wide_token_ids.size();
      if (n == 0)
        return Problem{i, Field::kTokenIds, {}, "empty: a chunk needs at least one token"};
      for (size_t t = 0; t < n; ++t) {
        const int64_t id = r.wide_token_ids.empty() ? r.token_ids[t] : r.wide_token_ids[t];
        if (id < 0 || id >= c.vocab_size)
          return Problem{i, Field::kTokenIds, int64_t(t),
                         engine::id_outside_vocabulary(id, c.vocab_size)};
        ids.push_back(int32_t(id));
      }
      spans.push_back({int32_t(ids.size() - n), int32_t(ids.size())});
    }
  }
  const int64_t n = int64_t(ids.size());
  const bool split = n > c.max_position_embeddings;
  if (split && !input.macro_overlap_tokens) {
    return Problem{std::nullopt,
                   kind,
                   {},
                   "late chunking: the document is " + std::to_string(n) +
                       " tokens, over max_position_embeddings " +
                       std::to_string(c.max_position_embeddings) +
                       " (one pass holds the whole document; ask for macro-chunks with "
                       "macro_overlap_tokens, or cut it into documents that fit)"};
  }
  if (split && input.options.logits) return macro_logits(std::nullopt, c);
  const int64_t cost = input.macro_overlap_tokens
                           ? macro_tokens(n, c.max_position_embeddings, *input.macro_overlap_tokens)
                           : n;
  if (cost > limits.max_request_tokens) {
    return Problem{std::nullopt,
                   kind,
                   {},
                   "the request has " + std::to_string(cost) + " tokens, over max_request_tokens " +
                       std::to_string(limits.max_request_tokens)};
  }
  SequenceInput in;
  in.token_ids = ids;
  in.spans = spans;
  out->options = input.options;
  out->sequences.clear();
  if (split) {
    out->rows.assign(1, in);
    out->passes.assign(1, {});
    return add_passes(in, std::nullopt, kind, model, *input.macro_overlap_tokens, out,
                      &out->passes[0]);
  }
  if (auto error = engine::validate_sequence(c, model.has_word_embedding(), in, 0))
    return Problem{std::nullopt, field_of(error->field), {}, std::move(error->message)};
  out->sequences.assign(1, in);
  return std::nullopt;
}

}  // namespace

void merge_passes(batching::Request* request) {
  batching::Request& r = *request;
  if (r.passes.empty()) return;
  std::vector<EncodedSequence> merged(r.passes.size());
  for (size_t i = 0; i < r.passes.size(); ++i) {
    const batching::Request::RowPasses& plan = r.passes[i];
    EncodedSequence& row = merged[i];
    if (plan.count == 1) {
      row = std::move(r.results[size_t(plan.first)]);
      continue;
    }
    const EncodedSequence* pass = r.results.data() + plan.first;
    const size_t width = pass[0].embedding.size();
    const int64_t P = pass[0].num_tokens;
    // The row's embedding: the mean of its passes' (each normalised by the engine if asked).
    std::vector<double> sum(width, 0.0);
    for (int32_t w = 0; w < plan.count; ++w)
      for (size_t j = 0; j < width; ++j) sum[j] += pass[w].embedding[j];
    double norm = 0.0;
    for (size_t j = 0; j < width; ++j) {
      sum[j] /= plan.count;
      norm += sum[j] * sum[j];
    }
    norm = std::sqrt(norm);
    row.embedding.resize(width);
    for (size_t j = 0; j < width; ++j)
      row.embedding[j] = float(r.options.normalize && norm > 0 ? sum[j] / norm : sum[j]);
    // Each chunk from the pass that holds it with the most context.
    row.span_embeddings.resize(plan.span_pass.size() * width);
    for (size_t k = 0; k < plan.span_pass.size(); ++k) {
      const std::vector<float>& from = pass[plan.span_pass[k]].span_embeddings;
      std::copy_n(from.begin() + int64_t(size_t(plan.span_index[k]) * width), width,
                  row.span_embeddings.begin() + int64_t(k * width));
    }
    const int64_t n = int64_t(plan.starts.back()) + P;
    row.num_tokens = n;
    if (!pass[0].token_embeddings.empty()) {
      // Token t from the pass that holds it with the most context on both sides.
      const size_t D = pass[0].token_embeddings.size() / size_t(P);
      row.token_embeddings.resize(size_t(n) * D);
      for (int64_t t = 0; t < n; ++t) {
        const TokenSpan token{int32_t(t), int32_t(t + 1)};
        const int32_t w = pass_for(token, plan.starts, int32_t(P));
        std::copy_n(pass[w].token_embeddings.begin() + (t - plan.starts[size_t(w)]) * int64_t(D), D,
                    row.token_embeddings.begin() + t * int64_t(D));
      }
    }
  }
  r.results = std::move(merged);
  r.sequences = std::move(r.rows);
  r.rows.clear();
  r.passes.clear();
}

std::optional<std::pair<uint32_t, uint32_t>> chunk_characters(const batching::Request& request,
                                                              size_t row, TokenSpan chunk) {
  if (row >= request.text_offsets.size()) return std::nullopt;
  const auto& offsets = request.text_offsets[row];
  std::optional<std::pair<uint32_t, uint32_t>> range;
  for (int32_t t = std::max(chunk.begin, 0); t < chunk.end && size_t(t) < offsets.size(); ++t) {
    const auto [s, e] = offsets[size_t(t)];
    if (e <= s) continue;  // a special token, (0, 0)
    if (!range) range = std::pair<uint32_t, uint32_t>{s, e};
    range->first = std::min(range->first, s);
    range->second = std::max(range->second, e);
  }
  return range;
}

TokenSpan caller_tokens(const batching::Request& request, size_t row, TokenSpan chunk) {
  if (row >= request.prompt_tokens.size()) return chunk;
  const text::PromptTokens p{request.prompt_tokens[row].first, request.prompt_tokens[row].second};
  return {p.to_caller(chunk.begin), p.to_caller(chunk.end)};
}

std::optional<Problem> build_request(const EncodeInput& input, const engine::Model& model,
                                     const text::Tokenizer* tokenizer, const Limits& limits,
                                     batching::Request* out, const VersionFiles* files) {
  const engine::ModelConfig& c = model.config();
  const int64_t D = c.hidden_size, max_len = c.max_position_embeddings;
  const size_t rows = input.rows.size();
  if (rows == 0) return Problem{std::nullopt, Field::kTokenIds, {}, "the request has no sequences"};
  if (limits.max_request_inputs > 0 && int64_t(rows) > limits.max_request_inputs) {
    return Problem{std::nullopt,
                   input.rows[0].field,
                   {},
                   "the request has " + std::to_string(rows) +
                       " sequences, over max_request_inputs " +
                       std::to_string(limits.max_request_inputs)};
  }
  if (auto p = check_macro(input, c)) return p;
  if (auto p = check_output(input, model, files)) return p;
  std::string prompt, prompt_name;
  if (auto why = choose_prompt(files ? files->prompts : nullptr, input.prompt_name,
                               input.prompt_hint, &prompt, &prompt_name))
    return Problem{std::nullopt, Field::kPrompt, {}, std::move(*why)};
  if (!prompt.empty() && input.prompt_name) {
    // A prompt named by the request is text: token ids or embeddings cannot take it.
    for (size_t i = 0; i < rows; ++i) {
      if (input.rows[i].field == Field::kText) continue;
      return Problem{i,
                     Field::kPrompt,
                     {},
                     "the prompt '" + prompt_name + "' is put before text, and this row is " +
                         (input.rows[i].field == Field::kTokenIds ? "token ids" : "embeddings") +
                         " (send the text, or tokenize the prompt and the text yourself)"};
    }
  }
  out->passes.clear();
  out->rows.clear();
  out->prompt_tokens.clear();
  if (input.late_chunking) return build_late_chunked(input, model, tokenizer, limits, prompt, out);
  const bool macro = input.macro_overlap_tokens.has_value();
  const engine::ModelConfig any_length = unbounded(c);
  const engine::ModelConfig& row_config = macro ? any_length : c;  // what a row may hold
  bool split_any = false;
  out->sequences.clear();
  out->sequences.reserve(rows);
  // Views into text_ids must not move: one slot per row that may need one, reserved up front.
  out->text_ids.clear();
  out->text_ids.reserve(rows);
  out->spans.clear();
  out->spans.reserve(2 * rows);  // a row's spans in its prompted positions, then its chunks
  out->text_offsets.clear();
  int64_t total = 0, spans = 0;
  for (size_t i = 0; i < rows; ++i) {
    const Row& row = input.rows[i];
    SequenceInput in;
    in.spans = row.spans;
    text::PromptTokens prompted;
    switch (row.field) {
      case Field::kText: {
        std::vector<int32_t>& ids = out->text_ids.emplace_back();
        const auto start = batching::Clock::now();
        // A chunked text keeps its tokens' character offsets (character spans, sentences, and
        // each chunk's character range in the answer).
        if (row.chunked()) out->text_offsets.resize(rows);
        std::optional<std::string> refused =
            text::tokenize_prompted(tokenizer, row_config, prompt, row.text, input.truncate, &ids,
                                    row.chunked() ? &out->text_offsets[i] : nullptr, &prompted);
        out->tokenize_ns += batching::ns_since(start);
        ++out->texts;
        if (refused) return Problem{i, Field::kText, {}, std::move(*refused)};
        in.token_ids = ids;
        if (prompted.count > 0) {
          out->prompt_tokens.resize(rows);
          out->prompt_tokens[i] = {prompted.at, prompted.count};
          if (!row.spans.empty()) {  // the caller's positions, past the prompt's tokens
            std::vector<TokenSpan>& moved = out->spans.emplace_back();
            for (const TokenSpan s : row.spans)
              moved.push_back({prompted.to_row(s.begin), prompted.to_row(s.end)});
            in.spans = moved;
          }
        }
        break;
      }
      case Field::kTokenIds: {
        std::optional<Problem> p =
            row.wide_token_ids.empty()
                ? keep_ids(row.token_ids, i, model, input.truncate, &out->text_ids, &in.token_ids)
                : keep_ids(row.wide_token_ids, i, model, input.truncate, &out->text_ids,
                           &in.token_ids);
        if (p) return p;
        break;
      }
      case Field::kInputEmbeddings: {
        in.input_embeddings = row.input_embeddings;
        // Only whole rows are cut; anything else is left for validate_sequence's message.
        const size_t keep = size_t(max_len * D);
        if (input.truncate != Truncate::kNone && in.input_embeddings.size() % size_t(D) == 0 &&
            in.input_embeddings.size() > keep) {
          in.input_embeddings = input.truncate == Truncate::kLeft ? in.input_embeddings.last(keep)
                                                                  : in.input_embeddings.first(keep);
        }
        break;
      }
      case Field::kSpans:  // name refusals only; a row's input is one of the three above
      case Field::kMacroChunks:
      case Field::kPrompt:
      case Field::kDimensions:
      case Field::kEmbeddingTypes:
        return Problem{i, Field::kSpans, {}, "a row needs token_ids, input_embeddings or text"};
    }
    if (row.field != Field::kText) {
      if (auto error = engine::validate_sequence(row_config, model.has_word_embedding(), in, i)) {
        return Problem{i, field_of(error->field), {}, std::move(error->message)};
      }
    } else if (auto error = engine::validate_spans(c, in, i)) {
      return Problem{i, Field::kSpans, {}, std::move(error->message)};
    }
    if (row.server_chunked()) {
      static const std::vector<tokenizer::Offsets> kNone;
      const std::vector<tokenizer::Offsets>& offsets =
          i < out->text_offsets.size() ? out->text_offsets[i] : kNone;
      if (auto p = add_chunks(row, i, tokenizer, engine::sequence_length(in, D), offsets, prompted,
                              &in, &out->spans.emplace_back()))
        return p;
      // A window of pad tokens only has nothing to pool: refused as a caller's span would be.
      if (auto error = engine::validate_spans(c, in, i))
        return Problem{i, Field::kSpans, {}, std::move(error->message)};
    }
    spans += int64_t(in.spans.size());
    if (limits.max_request_spans > 0 && spans > limits.max_request_spans) {
      return Problem{i,
                     Field::kSpans,
                     {},
                     "the request has " + std::string(i + 1 < rows ? "at least " : "") +
                         std::to_string(spans) + " chunks, over max_request_spans " +
                         std::to_string(limits.max_request_spans)};
    }
    const int64_t length = engine::sequence_length(in, D);
    total += macro ? macro_tokens(length, max_len, *input.macro_overlap_tokens) : length;
    if (total > limits.max_request_tokens) {
      return Problem{std::nullopt,
                     row.field,
                     {},
                     "the request has " + std::string(i + 1 < rows ? "at least " : "") +
                         std::to_string(total) + " tokens, over max_request_tokens " +
                         std::to_string(limits.max_request_tokens)};
    }
    if (macro) {
      out->rows.push_back(in);
      batching::Request::RowPasses& plan = out->passes.emplace_back();
      plan.first = int32_t(out->sequences.size());
      if (length > max_len) {
        if (input.options.logits) return macro_logits(i, c);
        if (auto p = add_passes(in, i, row.field, model, *input.macro_overlap_tokens, out, &plan))
          return p;
        split_any = true;
        continue;
      }
    }
    out->sequences.push_back(in);
  }
  if (!split_any) {
    out->passes.clear();
    out->rows.clear();
  }
  out->options = input.options;
  return std::nullopt;
}

}  // namespace fastformer::request
