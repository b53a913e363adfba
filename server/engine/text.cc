#include "server/engine/text.h"

#include <algorithm>

namespace fastformer::engine {

std::optional<std::string> tokenize_text(const Model& model, std::string_view text, Truncate truncate,
                                         std::vector<int32_t>* ids) {
  const tokenizer::Tokenizer* tok = model.tokenizer();
  if (tok == nullptr) {
    return "this model takes no text: its model directory has no tokenizer.json (send token_ids)";
  }
  if (text.empty()) return "the text is empty";
  const ModelConfig& c = model.config();
  const size_t max_len = size_t(c.max_position_embeddings);
  const tokenizer::Truncation* rule = tok->truncation();
  tokenizer::Truncation by_request;
  if (truncate != Truncate::kNone && (rule == nullptr || rule->max_length > max_len)) {
    by_request.max_length = max_len;
    by_request.direction =
        truncate == Truncate::kLeft ? tokenizer::TruncationDirection::kLeft : tokenizer::TruncationDirection::kRight;
    rule = &by_request;
  }
  try {
    *ids = tok->encode(text, rule).ids;
  } catch (const tokenizer::TokenizerError& e) {
    return std::string(e.what());
  }
  // Special tokens alone ([CLS] [SEP]) are no text: whitespace, or only characters the tokenizer drops.
  if (ids->size() <= tok->num_special_tokens_added()) {
    return "the text tokenizes to no tokens (its " + std::to_string(text.size()) +
           " bytes are whitespace or characters the tokenizer drops)";
  }
  if (std::all_of(ids->begin(), ids->end(), [&](int32_t id) { return id == c.pad_token_id; })) {
    return "the text's tokens are all the pad token (id " + std::to_string(c.pad_token_id) +
           "), which the model skips";
  }
  if (ids->size() > max_len) {
    return "the text is " + std::to_string(ids->size()) + " tokens, over max_position_embeddings " +
           std::to_string(max_len) + " (truncation right or left keeps the first or last " +
           std::to_string(max_len) + ")";
  }
  return std::nullopt;
}

}  // namespace fastformer::engine
