// The models of tokenizer.json: WordLevel and WordPiece (components.h).
#include <algorithm>
#include <string>
#include <utility>

#include "server/text/tokenizer/components.h"
#include "server/text/tokenizer/unicode.h"

namespace fastformer::tokenizer {

WordLevelModel::WordLevelModel(Vocab vocab, std::string unk_token)
    : vocab_(std::move(vocab)), unk_token_(std::move(unk_token)) {}

void WordLevelModel::tokenize(const std::string& word, Encoding& out,
                              std::vector<Offsets>* ranges) const {
  auto it = vocab_.find(word);
  if (it == vocab_.end()) {
    it = vocab_.find(unk_token_);
    if (it == vocab_.end()) {
      throw TokenizerError("WordLevel: word '" + word +
                           "' is not in the vocabulary and unk_token '" + unk_token_ +
                           "' is not in it either");
    }
  }
  out.ids.push_back(it->second);
  out.tokens.push_back(it->first);
  if (ranges) ranges->push_back({0, uint32_t(code_point_count(word))});
}

WordPieceModel::WordPieceModel(Vocab vocab, std::string unk_token,
                               std::string continuing_subword_prefix,
                               size_t max_input_chars_per_word)
    : vocab_(std::move(vocab)),
      unk_token_(std::move(unk_token)),
      prefix_(std::move(continuing_subword_prefix)),
      max_chars_(max_input_chars_per_word) {}

void WordPieceModel::push_unk(Encoding& out) const {
  const auto it = vocab_.find(unk_token_);
  if (it == vocab_.end())
    throw TokenizerError("WordPiece: unk_token '" + unk_token_ + "' is not in the vocabulary");
  out.ids.push_back(it->second);
  out.tokens.push_back(it->first);
}

void WordPieceModel::tokenize(const std::string& word, Encoding& out,
                              std::vector<Offsets>* ranges) const {
  const size_t chars = code_point_count(word);
  const size_t first = out.ids.size();
  const size_t first_range = ranges ? ranges->size() : 0;
  auto unknown = [&] {  // the whole word as one [UNK]
    out.ids.resize(first);
    out.tokens.resize(first);
    push_unk(out);
    if (ranges) {
      ranges->resize(first_range);
      ranges->push_back({0, uint32_t(chars)});
    }
  };
  if (chars > max_chars_) return unknown();
  size_t start_chars = 0;
  std::string candidate;
  size_t start = 0;
  while (start < word.size()) {
    size_t end = word.size();
    Vocab::const_iterator found = vocab_.end();
    while (start < end) {
      candidate.assign(start > 0 ? prefix_ : std::string());
      candidate.append(word, start, end - start);
      found = vocab_.find(candidate);
      if (found != vocab_.end()) break;
      do --end;  // back one UTF-8 character
      while (end > start && (static_cast<unsigned char>(word[end]) & 0xC0) == 0x80);
    }
    if (found == vocab_.end()) return unknown();  // no piece fits: the whole word is unknown
    out.ids.push_back(found->second);
    out.tokens.push_back(found->first);
    if (ranges) {
      const size_t end_chars =
          start_chars + code_point_count(std::string_view(word).substr(start, end - start));
      ranges->push_back({uint32_t(start_chars), uint32_t(end_chars)});
      start_chars = end_chars;
    }
    start = end;
  }
}

}  // namespace fastformer::tokenizer
