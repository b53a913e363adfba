// A sequence given as text, for the model: its UTF-8 text through the model directory's
// tokenizer.json into token ids, under a request's truncation rule, refused with a reason when
// it cannot be encoded. The server's request threads (server/rpc/text_input.h, which adds the
// metrics) and fastformer-encode both call this, so text means the same everywhere.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/engine/model.h"

namespace fastformer::engine {

// What to do with a sequence longer than max_position_embeddings: refuse it, or keep the first
// (right) or last (left) positions.
enum class Truncate { kNone, kRight, kLeft };

// Tokenizes `text` into `ids` (special tokens included). tokenizer.json's own truncation applies
// first, as it did in training. With kNone a text still longer than the model's positions is
// refused; with kRight/kLeft the tokenizer truncates it, keeping room for its special tokens.
// Returns why the text is refused (without a field name), or nothing.
std::optional<std::string> tokenize_text(const Model& model, std::string_view text, Truncate truncate,
                                         std::vector<int32_t>* ids);

}  // namespace fastformer::engine
