// The protocol-neutral request layer (encode_input.h): rows in, the batch queue's sequences out;
// build_request's row rules here, its chunks, macro-chunks and output options in their own files
// (encode_parts.h).
#include "server/request/encode_input.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>

#include "server/engine/error.h"
#include "server/engine/ragged_batch.h"
#include "server/request/encode_parts.h"
#include "server/text/tokenizer/unicode.h"

namespace fastformer::request {

using detail::add_chunks;
using detail::add_passes;
using detail::check_macro;
using detail::check_output;
using detail::macro_logits;
using detail::macro_tokens;
using detail::unbounded;

namespace {

Field field_of(const std::string& engine_field) {
  return engine_field == "input_embeddings" ? Field::kInputEmbeddings
         : engine_field == "spans"          ? Field::kSpans
                                            : Field::kTokenIds;
}

// The token ids of `row` kept under `truncate` (the first or last max_len of a longer row),
// each inside the vocabulary; `first` is the position of the first kept one in the row as sent.
// They are copied (64-bit ids narrowed) into `storage`, which `kept` then views.
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
  std::vector<int32_t>& copy = storage->emplace_back(keep.begin(), keep.end());
  *kept = copy;
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

namespace {

// build_request for input.late_chunking: the rows joined into one document, one span each.
std::optional<Problem> build_late_chunked(const EncodeInput& input, const engine::Model& model,
                                          const text::Tokenizer* tokenizer, const Limits& limits,
                                          std::string_view prompt, Prepared* out) {
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
  std::vector<int32_t>& ids = out->ids.emplace_back();
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
  out->rows.assign(1, in);
  if (split) {
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

std::optional<Problem> build_request(const EncodeInput& input, const engine::Model& model,
                                     const text::Tokenizer* tokenizer, const Limits& limits,
                                     Prepared* out, const VersionFiles* files) {
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
  if (input.late_chunking) return build_late_chunked(input, model, tokenizer, limits, prompt, out);
  const bool macro = input.macro_overlap_tokens.has_value();
  const engine::ModelConfig any_length = unbounded(c);
  const engine::ModelConfig& row_config = macro ? any_length : c;  // what a row may hold
  bool split_any = false;
  out->sequences.reserve(rows);
  out->rows.reserve(rows);
  out->ids.reserve(rows);
  out->spans.reserve(2 * rows);  // a row's spans as sent (or prompted), then its chunks
  int64_t total = 0, spans = 0;
  for (size_t i = 0; i < rows; ++i) {
    const Row& row = input.rows[i];
    SequenceInput in;
    if (!row.spans.empty()) in.spans = out->spans.emplace_back(row.spans.begin(), row.spans.end());
    text::PromptTokens prompted;
    switch (row.field) {
      case Field::kText: {
        std::vector<int32_t>& ids = out->ids.emplace_back();
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
            std::vector<TokenSpan>& moved = out->spans.back();
            for (TokenSpan& s : moved) s = {prompted.to_row(s.begin), prompted.to_row(s.end)};
          }
        }
        break;
      }
      case Field::kTokenIds: {
        std::optional<Problem> p =
            row.wide_token_ids.empty()
                ? keep_ids(row.token_ids, i, model, input.truncate, &out->ids, &in.token_ids)
                : keep_ids(row.wide_token_ids, i, model, input.truncate, &out->ids, &in.token_ids);
        if (p) return p;
        break;
      }
      case Field::kInputEmbeddings: {
        std::span<const float> kept = row.input_embeddings;
        // Only whole rows are cut; anything else is left for validate_sequence's message.
        const size_t keep = size_t(max_len * D);
        if (input.truncate != Truncate::kNone && kept.size() % size_t(D) == 0 &&
            kept.size() > keep) {
          kept = input.truncate == Truncate::kLeft ? kept.last(keep) : kept.first(keep);
        }
        in.input_embeddings = out->embeddings.emplace_back(kept.begin(), kept.end());
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
    out->rows.push_back(in);
    if (macro) {
      RowPasses& plan = out->passes.emplace_back();
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
  if (!split_any) out->passes.clear();
  out->options = input.options;
  return std::nullopt;
}

}  // namespace fastformer::request
