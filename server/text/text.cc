#include "server/text/text.h"

#include <algorithm>

#include "server/engine/error.h"

namespace fastformer::text {

std::shared_ptr<const Tokenizer> load_tokenizer(const std::filesystem::path& dir,
                                                const engine::Model& model) {
  const std::filesystem::path path = dir / "tokenizer.json";
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::symlink_status(path, ec))) return nullptr;
  engine::check_model_file(path);
  std::shared_ptr<const Tokenizer> t;
  try {
    t = std::make_shared<const Tokenizer>(Tokenizer::from_file(path.string()));
  } catch (const tokenizer::TokenizerError& e) {
    throw engine::ModelError(e.what());
  }
  if (!model.has_word_embedding()) {
    throw engine::ModelError(
        path.string() +
        ": the model has no word embedding (word_embedding.weight), so it takes no text");
  }
  const int64_t vocab = model.config().vocab_size;
  if (t->max_token_id() >= vocab) {
    throw engine::ModelError(path.string() + ": the tokenizer produces token id " +
                             std::to_string(t->max_token_id()) + ", over the model's vocab_size " +
                             std::to_string(vocab) + " (ids must be below it)");
  }
  return t;
}

std::optional<std::string> tokenize_text(const Tokenizer* tok, const engine::ModelConfig& c,
                                         std::string_view text, Truncate truncate,
                                         std::vector<int32_t>* ids) {
  if (tok == nullptr) {
    return "this model takes no text: its model directory has no tokenizer.json (send token_ids)";
  }
  if (text.empty()) return "the text is empty";
  const size_t max_len = size_t(c.max_position_embeddings);
  const tokenizer::Truncation* rule = tok->truncation();
  tokenizer::Truncation by_request;
  if (truncate != Truncate::kNone && (rule == nullptr || rule->max_length > max_len)) {
    by_request.max_length = max_len;
    by_request.direction = truncate == Truncate::kLeft ? tokenizer::TruncationDirection::kLeft
                                                       : tokenizer::TruncationDirection::kRight;
    rule = &by_request;
  }
  try {
    *ids = tok->encode(text, rule).ids;
  } catch (const tokenizer::TokenizerError& e) {
    return std::string(e.what());
  }
  // Special tokens alone ([CLS] [SEP]) are no text: whitespace, or only characters the tokenizer
  // drops.
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

std::optional<std::string> chunk_texts(const Tokenizer* tok, const engine::ModelConfig& c,
                                       std::span<const std::string_view> texts,
                                       std::vector<int32_t>* ids, std::vector<TokenSpan>* spans,
                                       size_t* which) {
  *which = texts.size();
  std::string document;
  for (size_t i = 0; i < texts.size(); ++i) {
    if (i > 0) document += ' ';
    document += texts[i];
  }
  if (auto refused = tokenize_text(tok, c, document, Truncate::kNone, ids)) return refused;
  // The document's own tokens: between the special tokens the post-processor put around them.
  size_t begin = 0, end = ids->size();
  while (begin < end && tok->is_special((*ids)[begin])) ++begin;
  while (end > begin && tok->is_special((*ids)[end - 1])) --end;
  spans->clear();
  size_t at = begin;
  for (size_t i = 0; i < texts.size(); ++i) {
    std::vector<int32_t> piece;
    try {
      piece = tok->encode(texts[i], nullptr, /*add_special_tokens=*/false).ids;
    } catch (const tokenizer::TokenizerError& e) {
      *which = i;
      return std::string(e.what());
    }
    if (piece.empty()) {
      *which = i;
      return "the text tokenizes to no tokens, and a chunk needs at least one";
    }
    if (at + piece.size() > end || !std::equal(piece.begin(), piece.end(), ids->begin() + at)) {
      *which = i;
      return "late chunking: this tokenizer joins the text's tokens with its neighbour's across "
             "the joining space, so the chunk's tokens are not its own (character offsets are "
             "not supported yet); send token ids instead";
    }
    spans->push_back({int32_t(at), int32_t(at + piece.size())});
    at += piece.size();
  }
  if (at != end) {
    return "late chunking: the document has tokens that belong to no text (" +
           std::to_string(end - at) + " after the last)";
  }
  return std::nullopt;
}

}  // namespace fastformer::text
