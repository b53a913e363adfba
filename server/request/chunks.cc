// A row's chunks (encode_parts.h): token spans, character spans, sentences and windows, and
// each chunk as its caller numbers it in the answer.
#include <algorithm>

#include "server/request/encode_parts.h"
#include "server/text/tokenizer/unicode.h"

namespace fastformer::request {

std::optional<Problem> detail::add_chunks(const Row& row, size_t i,
                                          const text::Tokenizer* tokenizer, int64_t tokens,
                                          const std::vector<tokenizer::Offsets>& offsets,
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

std::optional<std::pair<uint32_t, uint32_t>> chunk_characters(const Prepared& request, size_t row,
                                                              TokenSpan chunk) {
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

TokenSpan caller_tokens(const Prepared& request, size_t row, TokenSpan chunk) {
  if (row >= request.prompt_tokens.size()) return chunk;
  const text::PromptTokens p{request.prompt_tokens[row].first, request.prompt_tokens[row].second};
  return {p.to_caller(chunk.begin), p.to_caller(chunk.end)};
}

}  // namespace fastformer::request
