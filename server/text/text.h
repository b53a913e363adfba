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
std::optional<std::string> tokenize_text(const Tokenizer* tokenizer,
                                         const engine::ModelConfig& config, std::string_view text,
                                         Truncate truncate, std::vector<int32_t>* ids);

// Late chunking in Jina's form: `texts` are one document's consecutive chunks, joined with one
// space and tokenized once into `ids` (special tokens included, no truncation: a document over
// the model's positions is refused); `spans` gets each text's token range in it. A token
// belongs to the text its characters come from: each text alone must tokenize (without special
// tokens) to exactly its stretch of the document's tokens, which holds for tokenizers that
// split at whitespace; where a token would straddle two texts the call is refused (character
// offsets would be needed). Returns why (and sets *which to the text at fault, or to
// texts.size() for the document), or nothing.
std::optional<std::string> chunk_texts(const Tokenizer* tokenizer,
                                       const engine::ModelConfig& config,
                                       std::span<const std::string_view> texts,
                                       std::vector<int32_t>* ids, std::vector<TokenSpan>* spans,
                                       size_t* which);

}  // namespace fastformer::text
