// Text for a model: the model directory's tokenizer.json, loaded beside the weights and checked
// against them, and a sequence given as UTF-8 text turned into token ids under a request's
// truncation rule, refused with a reason when it cannot be encoded. The server's request
// threads (through server/request/encode_input.h, which times it) and fastformer-encode both call
// this, so text means the same everywhere. The engine below knows token ids only: this layer
// (and ICU, through the tokenizer) stays out of the engine core, the CUDA plugin and the
// benchmark.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/sequence.h"
#include "server/engine/model.h"
#include "server/text/tokenizer/tokenizer.h"

namespace fastformer::text {

using tokenizer::Tokenizer;

// `dir`/tokenizer.json when present, else null (the model takes no text). Every id it can
// produce must be a row of the model's word embedding. Throws engine::ModelError naming the file.
std::shared_ptr<const Tokenizer> load_tokenizer(const std::filesystem::path& dir,
                                                const engine::Model& model);

// What to do with a sequence longer than max_position_embeddings: refuse it, or keep the first
// (right) or last (left) positions.
enum class Truncate { kNone, kRight, kLeft };

// Tokenizes `text` into `ids` (special tokens included) with `tokenizer` (null: the model takes
// no text) for a model of `config`. tokenizer.json's own truncation applies first, as it did in
// training. With kNone a text still longer than the model's positions is refused; with
// kRight/kLeft the tokenizer truncates it, keeping room for its special tokens.
// Returns why the text is refused (without a field name), or nothing.
// With `offsets`: also each token's character range in `text` (code points; the special tokens
// the post-processor adds: (0, 0)), exact to `tokenizers`' Encoding.offsets.
std::optional<std::string> tokenize_text(const Tokenizer* tokenizer,
                                         const engine::ModelConfig& config, std::string_view text,
                                         Truncate truncate, std::vector<int32_t>* ids,
                                         std::vector<tokenizer::Offsets>* offsets = nullptr);

// Where a prompt's tokens lie in a row tokenized with one (tokenize_prompted): `count` tokens
// from `at` (after the special tokens the post-processor put first). A row without a prompt
// has count 0.
struct PromptTokens {
  int32_t at = 0;
  int32_t count = 0;
  // The row's position of the caller's token `t` (numbered as if the text had no prompt), and
  // back: the prompt's tokens are in no span the caller gives or gets.
  int32_t to_row(int32_t t) const { return t >= at ? t + count : t; }
  int32_t to_caller(int32_t t) const { return t >= at + count ? t - count : std::min(t, at); }
};

// tokenize_text for `prompt` + `text`, tokenized as one string (as sentence-transformers and TEI
// do). The prompt counts toward the position limit and tokenizer.json's truncation, but a cut
// (the request's or tokenizer.json's, in its direction) takes the text's tokens, never the
// prompt's; a prompt that leaves the text no token is refused. `offsets` (when asked) are the
// text's characters as sent (the prompt's tokens: (0, 0), as special tokens). An empty prompt:
// tokenize_text.
std::optional<std::string> tokenize_prompted(const Tokenizer* tokenizer,
                                             const engine::ModelConfig& config,
                                             std::string_view prompt, std::string_view text,
                                             Truncate truncate, std::vector<int32_t>* ids,
                                             std::vector<tokenizer::Offsets>* offsets,
                                             PromptTokens* where);

// The tokens of `ids` between the special tokens the post-processor put around the text:
// [begin, end).
std::pair<size_t, size_t> content_tokens(const Tokenizer& tokenizer,
                                         const std::vector<int32_t>& ids);

// Character spans [start, end) (code points) of a text -> token ranges, by the rule that a
// token belongs to the span that holds its first character; the special tokens belong to none.
// Returns why a span is refused (out of the text, reversed, or holding no token's start), with
// *which set to it, or nothing.
std::optional<std::string> token_spans_of_chars(std::span<const TokenSpan> chars, size_t text_chars,
                                                const std::vector<tokenizer::Offsets>& offsets,
                                                std::pair<size_t, size_t> content,
                                                std::vector<TokenSpan>* out, size_t* which);

// Byte spans [begin, end) of a UTF-8 text (the C++ API's unit) -> character spans (code points,
// the unit of the protocols). Refuses a span outside the text, reversed, or cutting a UTF-8
// character: "byte span 0 [1, 3) cuts a character (byte 1 is inside the one at byte 0)".
std::optional<std::string> char_spans_of_bytes(std::string_view utf8,
                                               std::span<const TokenSpan> bytes,
                                               std::vector<TokenSpan>* chars);

// The sentences of a text as character spans: a sentence ends after a run of . ! ? (and
// their fullwidth and ideographic forms, and …), with any closing quotes or brackets after it,
// where whitespace or the end of the text follows; the whitespace between sentences belongs to
// none. Text without such an end is one sentence.
std::vector<TokenSpan> sentence_spans(std::u32string_view text);

// Late chunking in Jina's form: `texts` are one document's consecutive chunks, joined with one
// space and tokenized once into `ids` (special tokens included, no truncation: a document over
// the model's positions is refused), after `prompt` when one is given (its tokens in no span);
// `spans` gets each text's token range in it: the tokens
// whose first character is one of the text's (the tokenizer's character offsets). Returns why
// (and sets *which to the text at fault, or to texts.size() for the document), or nothing.
std::optional<std::string> chunk_texts(const Tokenizer* tokenizer,
                                       const engine::ModelConfig& config,
                                       std::span<const std::string_view> texts,
                                       std::vector<int32_t>* ids, std::vector<TokenSpan>* spans,
                                       size_t* which, std::string_view prompt = {});

}  // namespace fastformer::text
