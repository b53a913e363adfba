// The protocol-neutral request layer: every protocol (fastformer.v1, KServe v2, the offline
// encoder's JSON lines) maps its wire format into one EncodeInput, and build_request turns that
// into the rows the batch queue takes. The request rules live here once: text through the
// model's tokenizer, truncation, the vocabulary and position checks, the per-request token
// budget and the classifier-head check. A refusal is a Problem that says where (which row,
// which input, which token) and what, with the limit; each protocol words the "where" its own
// way (format_v1, or its own), so its clients' messages stay what they were.
//
// Adding a request option or limit: a field of EncodeInput or Limits, its rule here, one
// mapping line per protocol, the docs (docs/api.md) and a case in
// tests/unit/encode_input_test.cc.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "server/batching/job.h"
#include "server/engine/model.h"
#include "server/request/prepared.h"
#include "server/request/prompts.h"
#include "server/request/quantize.h"
#include "server/text/text.h"

namespace fastformer::request {

using text::Truncate;

// Which input of a row a rule speaks of.
// kMacroChunks: the request's macro_overlap_tokens (EncodeInput), or what it cannot serve;
// kPrompt: its prompt_name; kDimensions and kEmbeddingTypes: its output options.
enum class Field {
  kTokenIds,
  kInputEmbeddings,
  kText,
  kSpans,
  kMacroChunks,
  kPrompt,
  kDimensions,
  kEmbeddingTypes
};

// One row (sequence) of a request, as its protocol decoded it: exactly one input is set.
// Its views need only outlive build_request, which copies what the request keeps (Prepared).
struct Row {
  Field field = Field::kTokenIds;
  std::span<const int32_t> token_ids;       ///< kTokenIds, as sent (fastformer.v1, JSON lines)
  std::span<const int64_t> wide_token_ids;  ///< kTokenIds from a 64-bit tensor (KServe v2)
  std::span<const float> input_embeddings;  ///< kInputEmbeddings: rows of hidden_size
  std::string_view text;                    ///< kText: UTF-8, tokenized here
  /// Token ranges of the row (as tokenized: special tokens included) to pool one embedding
  /// each from its single pass (late chunking); checked against the row's final length.
  std::span<const TokenSpan> spans = {};
  /// Server-made chunks: windows of `window_tokens` tokens, each `window_tokens -
  /// overlap_tokens` after the last, over the row's tokens as tokenized (a text's special
  /// tokens excluded: they belong to no chunk); appended after `spans`. 0: none.
  int32_t window_tokens = 0;
  int32_t overlap_tokens = 0;
  /// Text rows: chunks given as character spans [begin, end) of the text (code points), and
  /// the text's sentences as chunks (text::sentence_spans); each becomes the tokens whose first
  /// character it holds. After `spans`, before the windows.
  std::span<const TokenSpan> char_spans = {};
  bool sentences = false;

  static Row ids(std::span<const int32_t> v) { return {Field::kTokenIds, v, {}, {}, {}, {}}; }
  static Row wide_ids(std::span<const int64_t> v) { return {Field::kTokenIds, {}, v, {}, {}, {}}; }
  static Row embeddings(std::span<const float> v) {
    return {Field::kInputEmbeddings, {}, {}, v, {}, {}};
  }
  static Row from_text(std::string_view v) { return {Field::kText, {}, {}, {}, v, {}}; }
  Row with_spans(std::span<const TokenSpan> s) const {
    Row r = *this;
    r.spans = s;
    return r;
  }
  Row with_windows(int32_t tokens, int32_t overlap) const {
    Row r = *this;
    r.window_tokens = tokens;
    r.overlap_tokens = overlap;
    return r;
  }
  Row with_char_chunks(std::span<const TokenSpan> chars, bool by_sentence) const {
    Row r = *this;
    r.char_spans = chars;
    r.sentences = by_sentence;
    return r;
  }
  // Chunks the request layer makes (character spans, sentences, windows), beside `spans`.
  bool server_chunked() const {
    return window_tokens != 0 || overlap_tokens != 0 || !char_spans.empty() || sentences;
  }
  bool chunked() const { return !spans.empty() || server_chunked(); }
};

// One request in neutral form.
struct EncodeInput {
  std::vector<Row> rows;
  Truncate truncate = Truncate::kNone;  ///< rows over max_position_embeddings: refuse or cut
  OutputOptions options;                ///< what to return for every row
  /// Late chunking in Jina's form: the rows are one document's consecutive chunks (texts
  /// joined with one space and tokenized once, or token ids concatenated as they are); the
  /// request is that one sequence, with one span per row (EncodedSequence::span_embeddings).
  bool late_chunking = false;
  /// Macro-chunks ("long late chunking"): a row (or late-chunked document) longer than
  /// max_position_embeddings P runs as passes of P tokens, each starting P - overlap after the
  /// last (the last one ending at the row's end), instead of being refused; each chunk is
  /// pooled from the pass that holds it with the most context on both sides, and the row's own
  /// embedding is the mean of its passes' (docs/api.md, "Macro-chunks"). Unset: refused.
  std::optional<int32_t> macro_overlap_tokens;
  /// The model's prompt (prompts.h) put before each text row: one the model lacks is refused.
  /// With token-id rows it is refused (a prompt is text). Spans, character spans and the
  /// answer's token and character positions stay the caller's text's; the prompt's tokens are
  /// in no chunk.
  std::optional<std::string> prompt_name;
  /// A prompt by another protocol's word (Cohere's input_type): used where the model has it,
  /// never refused. Neither set: the model's default_prompt_name, for text rows.
  std::optional<std::string> prompt_hint;
  /// The types every embedding is answered in (empty: float). Checked against the model's
  /// dimensions (options.dimensions, else hidden_size) and its quantization.json here, once for
  /// every protocol.
  std::vector<EmbeddingFormat> formats;
};

// What a model version's directory adds to its weights for the rules: its prompts
// (config_sentence_transformers.json) and its calibrated ranges (quantization.json, which
// int8 and uint8 need; `quantization_file` is where it is or would be).
struct VersionFiles {
  const Prompts* prompts = nullptr;
  const Quantization* quantization = nullptr;
  std::string_view quantization_file;
};

struct Limits {
  int64_t max_request_tokens = 0;  ///< tokens over all rows of one request
  int64_t max_request_inputs = 0;  ///< rows (sequences, texts) in one request; 0: no limit
  int64_t max_request_spans = 0;   ///< chunks (spans and windows) over all rows; 0: no limit
};

// Why a request is refused. `row` empty: the request as a whole (the token budget, no rows);
// `token`: the position in the row as sent. `message` says what is wrong and the limit.
struct Problem {
  std::optional<size_t> row;
  Field field = Field::kTokenIds;
  std::optional<int64_t> token;
  std::string message;
};

// The field's name in fastformer.v1 and the JSON lines: token_ids, input_embeddings, text,
// spans, macro_overlap_tokens, prompt_name, dimensions, embedding_types.
const char* field_name(Field field);

// The problem without its row: "token_ids: token 5 has id 1000, outside [0, vocab_size 1000)".
std::string describe(const Problem& problem);

// fastformer.v1's wording (engine::InputError's): "sequence 2: token_ids: token 5 has id ...",
// "sequences: the request has ...".
std::string format_v1(const Problem& problem);

// Fills `out`, a fresh Prepared: its sequences (views into its own storage: the ids tokenized,
// narrowed or copied here, the embeddings and spans copied), its rows, pass plan and options,
// and the tokenizer's time and count. Rows are checked in order; the first refusal is returned
// and `out` must not be queued. `tokenizer`: the model's (null when it takes no text); `files`:
// the version's (null: none).
std::optional<Problem> build_request(const EncodeInput& input, const engine::Model& model,
                                     const text::Tokenizer* tokenizer, const Limits& limits,
                                     Prepared* out, const VersionFiles* files = nullptr);

// The output options the model can answer: asking for logits of a model with no classifier
// head is refused (the message, without the option's name, which differs per protocol).
std::optional<std::string> check_options(const OutputOptions& options, const engine::Model& model);
// Why `dimensions` (OutputOptions::dimensions) cannot be served by `model`: "900 is over the
// model's hidden_size 768", or below 0; nothing when it can.
std::optional<std::string> check_dimensions(int64_t dimensions, const engine::Model& model);
// The options every protocol shares that act on a finished request's results: the first
// options.dimensions values of each embedding, re-normalised when options.normalize (the
// serving core applies it before any protocol formats its answer).
void apply_dimensions(const OutputOptions& options, std::vector<EncodedSequence>* results);
// Puts a job whose rows ran as several passes (prepared.passes) back into one result per row:
// each chunk's embedding from its pass, the row's embedding the mean of its passes'
// (re-normalised when options.normalize), token embeddings each from the pass that holds the
// token with the most context; the job's sequences become prepared.rows. Nothing to do when
// `passes` is empty. The serving core calls it before apply_dimensions and any protocol.
void merge_passes(const Prepared& prepared, batching::Job* job);
// A chunk's character range in its text row (code points): from its first token's start to its
// last token's end, the special tokens left out; nothing for a row that is not a chunked text
// (or a chunk of special tokens only).
std::optional<std::pair<uint32_t, uint32_t>> chunk_characters(const Prepared& request, size_t row,
                                                              TokenSpan chunk);
// A chunk of row `row` as its caller numbers tokens: without the prompt's (text::PromptTokens).
TokenSpan caller_tokens(const Prepared& request, size_t row, TokenSpan chunk);

}  // namespace fastformer::request
