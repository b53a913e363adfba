#include "server/text/text.h"

#include <algorithm>

#include "server/engine/error.h"
#include "server/text/tokenizer/unicode.h"

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
                                         std::vector<int32_t>* ids,
                                         std::vector<tokenizer::Offsets>* offsets) {
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
    tokenizer::Encoding enc = tok->encode(text, rule, true, offsets != nullptr);
    *ids = std::move(enc.ids);
    if (offsets) *offsets = std::move(enc.offsets);
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

std::optional<std::string> tokenize_prompted(const Tokenizer* tok, const engine::ModelConfig& c,
                                             std::string_view prompt, std::string_view text,
                                             Truncate truncate, std::vector<int32_t>* ids,
                                             std::vector<tokenizer::Offsets>* offsets,
                                             PromptTokens* where) {
  *where = {};
  // No prompt, or no tokenizer (tokenize_text's refusal): the plain rule.
  if (prompt.empty() || tok == nullptr) return tokenize_text(tok, c, text, truncate, ids, offsets);
  if (text.empty()) return "the text is empty";
  std::string joined;
  joined.reserve(prompt.size() + text.size());
  joined.append(prompt).append(text);
  tokenizer::Encoding enc;
  try {
    enc = tok->encode(joined, nullptr, true, true);
  } catch (const tokenizer::TokenizerError& e) {
    return std::string(e.what());
  }
  const auto [begin, end] = content_tokens(*tok, enc.ids);
  const uint32_t prompt_chars = uint32_t(tokenizer::code_point_count(prompt));
  size_t count = 0;  // the prompt's tokens: those that start in it
  while (begin + count < end && enc.offsets[begin + count].first < prompt_chars) ++count;
  const size_t text_tokens = end - begin - count;
  // The cut: tokenizer.json's own rule first (as in training), then the request's.
  size_t cap = SIZE_MAX;
  bool left = false;
  if (const tokenizer::Truncation* rule = tok->truncation()) {
    cap = rule->max_length;
    left = rule->direction == tokenizer::TruncationDirection::kLeft;
  }
  const size_t max_len = size_t(c.max_position_embeddings);
  if (truncate != Truncate::kNone && max_len < cap) {
    cap = max_len;
    left = truncate == Truncate::kLeft;
  }
  const std::string limit = cap == max_len ? "max_position_embeddings " + std::to_string(max_len)
                                           : "tokenizer.json's max_length " + std::to_string(cap);
  if (enc.ids.size() > cap) {
    const size_t over = enc.ids.size() - cap;
    if (over >= text_tokens) {
      return "the prompt's " + std::to_string(count) + " tokens and the special tokens leave " +
             "the text no token under " + limit;
    }
    const size_t from = left ? begin + count : end - over;
    enc.ids.erase(enc.ids.begin() + ptrdiff_t(from), enc.ids.begin() + ptrdiff_t(from + over));
    enc.offsets.erase(enc.offsets.begin() + ptrdiff_t(from),
                      enc.offsets.begin() + ptrdiff_t(from + over));
  }
  if (text_tokens == 0) {
    return "the text tokenizes to no tokens (its " + std::to_string(text.size()) +
           " bytes are whitespace or characters the tokenizer drops)";
  }
  if (enc.ids.size() > max_len) {
    return "the prompt and the text are " + std::to_string(enc.ids.size()) +
           " tokens, over max_position_embeddings " + std::to_string(max_len) +
           " (truncation right or left cuts the text, never the prompt)";
  }
  for (size_t t = 0; t < enc.offsets.size(); ++t) {
    auto& [s, e] = enc.offsets[t];
    if (t >= begin && t < begin + count) {
      s = e = 0;  // the prompt's: no character of the text
    } else if (e > s) {
      s = s >= prompt_chars ? s - prompt_chars : 0;
      e = e >= prompt_chars ? e - prompt_chars : 0;
    }
  }
  *ids = std::move(enc.ids);
  if (offsets) *offsets = std::move(enc.offsets);
  *where = {int32_t(begin), int32_t(count)};
  return std::nullopt;
}

std::pair<size_t, size_t> content_tokens(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  size_t begin = 0, end = ids.size();
  while (begin < end && tok.is_special(ids[begin])) ++begin;
  while (end > begin && tok.is_special(ids[end - 1])) --end;
  return {begin, end};
}

std::optional<std::string> token_spans_of_chars(std::span<const TokenSpan> chars, size_t text_chars,
                                                const std::vector<tokenizer::Offsets>& offsets,
                                                std::pair<size_t, size_t> content,
                                                std::vector<TokenSpan>* out, size_t* which) {
  for (size_t i = 0; i < chars.size(); ++i) {
    *which = i;
    const TokenSpan s = chars[i];
    const std::string what = "character span " + std::to_string(i) + " [" +
                             std::to_string(s.begin) + ", " + std::to_string(s.end) + ")";
    if (s.begin < 0 || size_t(s.end) > text_chars || s.end < 0)
      return what + " is outside the text's " + std::to_string(text_chars) + " characters";
    if (s.end < s.begin) return what + " is reversed (end before begin)";
    // The tokens whose first character lies in the span (their starts never decrease).
    size_t first = content.second, last = content.first;
    for (size_t t = content.first; t < content.second; ++t) {
      const uint32_t start = offsets[t].first;
      if (start >= uint32_t(s.begin) && start < uint32_t(s.end)) {
        first = std::min(first, t);
        last = t + 1;
      }
    }
    if (first >= last) return what + " holds no token's first character: an empty chunk";
    out->push_back({int32_t(first), int32_t(last)});
  }
  return std::nullopt;
}

std::optional<std::string> char_spans_of_bytes(std::string_view utf8,
                                               std::span<const TokenSpan> bytes,
                                               std::vector<TokenSpan>* chars) {
  auto continuation = [&](size_t b) {
    return b < utf8.size() && (static_cast<unsigned char>(utf8[b]) & 0xC0) == 0x80;
  };
  // The code point each byte boundary starts (for boundaries that are not inside a character).
  std::vector<int32_t> index(utf8.size() + 1, -1);
  int32_t cp = 0;
  for (size_t b = 0; b <= utf8.size(); ++b) {
    if (!continuation(b)) index[b] = cp++;
  }
  for (size_t i = 0; i < bytes.size(); ++i) {
    const TokenSpan s = bytes[i];
    const std::string what = "byte span " + std::to_string(i) + " [" + std::to_string(s.begin) +
                             ", " + std::to_string(s.end) + ")";
    if (s.begin < 0 || s.end < 0 || size_t(s.end) > utf8.size())
      return what + " is outside the text's " + std::to_string(utf8.size()) + " bytes";
    if (s.end < s.begin) return what + " is reversed (end before begin)";
    for (const int32_t b : {s.begin, s.end}) {
      if (index[size_t(b)] < 0) {
        size_t lead = size_t(b);
        while (lead > 0 && continuation(lead)) --lead;
        return what + " cuts a character (byte " + std::to_string(b) +
               " is inside the one at byte " + std::to_string(lead) + ")";
      }
    }
    chars->push_back({index[size_t(s.begin)], index[size_t(s.end)]});
  }
  return std::nullopt;
}

std::vector<TokenSpan> sentence_spans(std::u32string_view text) {
  auto terminator = [](char32_t c) {
    return c == U'.' || c == U'!' || c == U'?' || c == U'\u3002' || c == U'\uFF01' ||
           c == U'\uFF1F' || c == U'\uFF0E' || c == U'\u2026';
  };
  auto closer = [](char32_t c) {
    return c == U'"' || c == U'\'' || c == U')' || c == U']' || c == U'}' || c == U'\u201D' ||
           c == U'\u2019' || c == U'\u00BB' || c == U'\u300D' || c == U'\u300F' || c == U'\uFF09';
  };
  auto space = [](char32_t c) { return tokenizer::is_whitespace(c); };
  std::vector<TokenSpan> out;
  size_t i = 0;
  const size_t n = text.size();
  while (i < n && space(text[i])) ++i;
  size_t start = i;
  while (i < n) {
    if (!terminator(text[i])) {
      ++i;
      continue;
    }
    size_t end = i;
    while (end < n && terminator(text[end])) ++end;
    while (end < n && closer(text[end])) ++end;
    if (end == n || space(text[end])) {
      out.push_back({int32_t(start), int32_t(end)});
      i = end;
      while (i < n && space(text[i])) ++i;
      start = i;
    } else {
      i = end;
    }
  }
  if (start < n) {
    size_t end = n;
    while (end > start && space(text[end - 1])) --end;
    out.push_back({int32_t(start), int32_t(end)});
  }
  return out;
}

std::optional<std::string> chunk_texts(const Tokenizer* tok, const engine::ModelConfig& c,
                                       std::span<const std::string_view> texts,
                                       std::vector<int32_t>* ids, std::vector<TokenSpan>* spans,
                                       size_t* which, std::string_view prompt) {
  *which = texts.size();
  std::string document(prompt);
  std::vector<TokenSpan> chars;  // each text's characters in the document
  size_t at = tokenizer::code_point_count(prompt);
  for (size_t i = 0; i < texts.size(); ++i) {
    if (i > 0) {
      document += ' ';
      ++at;
    }
    document += texts[i];
    const size_t n = tokenizer::code_point_count(texts[i]);
    chars.push_back({int32_t(at), int32_t(at + n)});
    at += n;
  }
  std::vector<tokenizer::Offsets> offsets;
  if (auto refused = tokenize_text(tok, c, document, Truncate::kNone, ids, &offsets))
    return refused;
  spans->clear();
  size_t span = 0;
  if (auto refused =
          token_spans_of_chars(chars, at, offsets, content_tokens(*tok, *ids), spans, &span)) {
    *which = span;
    return "the text holds no token's first character, and a chunk needs at least one token";
  }
  return std::nullopt;
}

}  // namespace fastformer::text
