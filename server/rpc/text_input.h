// Text sequences, for both APIs: a sequence's UTF-8 text becomes token ids with the model's
// tokenizer.json, on the request thread that converts the call (never in the batch loop).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/batching/request.h"
#include "server/engine/model.h"

namespace fastformer::rpc {

// A request's rule for sequences longer than max_position_embeddings: an error, or keep the
// first (right) or last (left) positions.
enum class Truncate { kNone, kRight, kLeft };

// Tokenizes `text` into `ids` (special tokens included) under the request's rule. tokenizer.json's
// own truncation applies first, as it did in training. With kNone, a text longer than the
// model's positions is an error; with kRight/kLeft the tokenizer truncates it, keeping room for
// its special tokens. Returns why the text is refused (without the field name), or nothing.
// Adds the time taken and the text to request->tokenize_ns and request->texts.
std::optional<std::string> tokenize_text(const engine::Model& model, std::string_view text, Truncate truncate,
                                         std::vector<int32_t>* ids, batching::Request* request);

}  // namespace fastformer::rpc
