#include "server/engine/tokenizer/components.h"

#include <unicode/normalizer2.h>
#include <unicode/uniset.h>
#include <unicode/unistr.h>

#include <algorithm>
#include <string>
#include <utility>

#include "server/engine/tokenizer/unicode.h"

namespace fastformer::tokenizer {
namespace {

icu::UnicodeString to_icu(const std::u32string& text) {
  return icu::UnicodeString::fromUTF32(reinterpret_cast<const UChar32*>(text.data()),
                                       static_cast<int32_t>(text.size()));
}

std::u32string from_icu(const icu::UnicodeString& text) {
  std::u32string out(static_cast<size_t>(text.countChar32()), U'\0');
  UErrorCode status = U_ZERO_ERROR;
  text.toUTF32(reinterpret_cast<UChar32*>(out.data()), static_cast<int32_t>(out.size()), status);
  return out;
}

std::string join_names(const char* kind, const auto& parts) {
  std::string out = std::string(kind) + "[";
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? ", " : "") + parts[i]->name();
  return out + "]";
}

}  // namespace

// ---- normalizers ---------------------------------------------------------------------------
void LowercaseNormalizer::normalize(std::u32string& text) const {
  std::u32string out;
  out.reserve(text.size());
  for (char32_t c : text) append_lowercase(out, c);
  text = std::move(out);
}

UnicodeNormalizer::UnicodeNormalizer(NormalForm form) : form_(form) {
  UErrorCode status = U_ZERO_ERROR;
  switch (form) {
    case NormalForm::kNFC: normalizer_ = icu::Normalizer2::getNFCInstance(status); break;
    case NormalForm::kNFD: normalizer_ = icu::Normalizer2::getNFDInstance(status); break;
    case NormalForm::kNFKC: normalizer_ = icu::Normalizer2::getNFKCInstance(status); break;
    case NormalForm::kNFKD: normalizer_ = icu::Normalizer2::getNFKDInstance(status); break;
  }
  if (U_FAILURE(status)) throw TokenizerError(std::string("ICU normalizer unavailable: ") + u_errorName(status));
  // The crate's normalization tables are Unicode 11.0: later characters are left as they are.
  static const icu::UnicodeSet* const unicode_11 = [] {
    UErrorCode s = U_ZERO_ERROR;
    auto* set = new icu::UnicodeSet(icu::UnicodeString(u"[:age=11.0:]"), s);
    set->freeze();
    return set;
  }();
  filtered_ = std::make_unique<icu::FilteredNormalizer2>(*normalizer_, *unicode_11);
  normalizer_ = filtered_.get();
}

void UnicodeNormalizer::normalize(std::u32string& text) const {
  bool ascii = true;
  for (char32_t c : text) ascii = ascii && c < 0x80;
  if (ascii) return;  // ASCII is invariant under every normal form
  UErrorCode status = U_ZERO_ERROR;
  const icu::UnicodeString out = normalizer_->normalize(to_icu(text), status);
  if (U_FAILURE(status)) throw TokenizerError(std::string("ICU normalization failed: ") + u_errorName(status));
  text = from_icu(out);
}

std::string UnicodeNormalizer::name() const {
  switch (form_) {
    case NormalForm::kNFC: return "NFC";
    case NormalForm::kNFD: return "NFD";
    case NormalForm::kNFKC: return "NFKC";
    case NormalForm::kNFKD: return "NFKD";
  }
  return "?";
}

void StripAccentsNormalizer::normalize(std::u32string& text) const {
  std::erase_if(text, is_mark);
}

BertNormalizer::BertNormalizer(bool clean_text, bool handle_chinese_chars, bool strip_accents, bool lowercase)
    : clean_text_(clean_text), handle_chinese_chars_(handle_chinese_chars), strip_accents_(strip_accents),
      lowercase_(lowercase) {}

void BertNormalizer::normalize(std::u32string& text) const {
  if (clean_text_) {
    std::u32string out;
    out.reserve(text.size());
    for (char32_t c : text) {
      if (c == 0 || c == 0xFFFD || is_bert_control(c)) continue;
      out.push_back(is_bert_whitespace(c) ? U' ' : c);
    }
    text = std::move(out);
  }
  if (handle_chinese_chars_) {
    std::u32string out;
    out.reserve(text.size());
    for (char32_t c : text) {
      if (is_chinese_char(c)) {
        out += U' ';
        out += c;
        out += U' ';
      } else {
        out.push_back(c);
      }
    }
    text = std::move(out);
  }
  if (strip_accents_) {
    // NFD, then drop the nonspacing marks (Mn) only: the crate's BertNormalizer keeps the
    // spacing marks (Mc) that its StripAccents normalizer drops (Indic vowel signs).
    UnicodeNormalizer(NormalForm::kNFD).normalize(text);
    std::erase_if(text, is_nonspacing_mark);
  }
  if (lowercase_) LowercaseNormalizer().normalize(text);
}

void SequenceNormalizer::normalize(std::u32string& text) const {
  for (const auto& part : parts_) part->normalize(text);
}

std::string SequenceNormalizer::name() const { return join_names("Sequence", parts_); }

// ---- pre-tokenizers ------------------------------------------------------------------------
void split_spans(const std::u32string& word, const std::vector<Span>& spans, SplitBehavior behavior,
                 std::vector<std::u32string>& out) {
  // (begin, end, remove) as tokenizers' NormalizedString::split builds them.
  struct Piece {
    size_t begin, end;
    bool remove;
  };
  std::vector<Piece> pieces;
  pieces.reserve(spans.size());
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const Span& s : spans) pieces.push_back({s.begin, s.end, false});
      break;
    case SplitBehavior::kRemoved:
      for (const Span& s : spans) pieces.push_back({s.begin, s.end, s.is_match});
      break;
    case SplitBehavior::kContiguous:
      for (const Span& s : spans) {
        if (s.is_match == previous_match && !pieces.empty()) {
          pieces.back().end = s.end;
        } else {
          pieces.push_back({s.begin, s.end, false});
        }
        previous_match = s.is_match;
      }
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const Span& s : spans) {
        if (s.is_match && !previous_match && !pieces.empty()) {
          pieces.back().end = s.end;
        } else {
          pieces.push_back({s.begin, s.end, false});
        }
        previous_match = s.is_match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->is_match && !previous_match && !pieces.empty()) {
          pieces.back().begin = it->begin;
        } else {
          pieces.push_back({it->begin, it->end, false});
        }
        previous_match = it->is_match;
      }
      std::reverse(pieces.begin(), pieces.end());
      break;
  }
  for (const Piece& p : pieces) {
    if (!p.remove && p.end > p.begin) out.push_back(word.substr(p.begin, p.end - p.begin));
  }
}

CharSplitPreTokenizer::CharSplitPreTokenizer(Kind kind, SplitBehavior punctuation_behavior)
    : kind_(kind), behavior_(punctuation_behavior) {}

namespace {
// tokenizers' Pattern for Fn(char) -> bool: each matching char is a delimiter of its own.
template <typename Pred>
void split_on_chars(const std::u32string& word, Pred pred, SplitBehavior behavior, std::vector<Span>& spans,
                    std::vector<std::u32string>& out) {
  spans.clear();
  size_t last = 0;
  for (size_t i = 0; i < word.size(); ++i) {
    if (pred(word[i])) {
      if (last < i) spans.push_back({last, i, false});
      spans.push_back({i, i + 1, true});
      last = i + 1;
    }
  }
  if (last < word.size()) spans.push_back({last, word.size(), false});
  split_spans(word, spans, behavior, out);
}
}  // namespace

void CharSplitPreTokenizer::pre_tokenize(std::vector<std::u32string>& words) const {
  std::vector<std::u32string> out;
  std::vector<Span> spans;
  for (const auto& word : words) {
    switch (kind_) {
      case Kind::kWhitespaceSplit:
        split_on_chars(word, is_whitespace, SplitBehavior::kRemoved, spans, out);
        break;
      case Kind::kPunctuation:
        split_on_chars(word, is_punctuation, behavior_, spans, out);
        break;
      case Kind::kBert: {
        std::vector<std::u32string> parts;
        split_on_chars(word, is_whitespace, SplitBehavior::kRemoved, spans, parts);
        for (const auto& part : parts) split_on_chars(part, is_punctuation, SplitBehavior::kIsolated, spans, out);
        break;
      }
    }
  }
  words = std::move(out);
}

std::string CharSplitPreTokenizer::name() const {
  switch (kind_) {
    case Kind::kWhitespaceSplit: return "WhitespaceSplit";
    case Kind::kPunctuation: return "Punctuation";
    case Kind::kBert: return "BertPreTokenizer";
  }
  return "?";
}

namespace {
// Rewrites the Perl classes \w \W \s \S \d \D of a pattern into explicit Unicode property sets,
// so that ICU matches what Oniguruma (tokenizers' Split) or Rust's regex (its Whitespace
// pre-tokenizer) match: ICU's own \s is [\t\n\f\r\p{Z}], missing \v and U+0085.
// Oniguruma's \w is Alphabetic, Mark, Nd and Pc (not Join_Control), and outside a bracket
// class also the Latin-1 digits and fractions ¹ ² ³ ¼ ½ ¾ (its Latin-1 ctype table), so that
// [^\w\s] matches ¹ while \w matches it too. Rust's \w is UTS#18's.
std::string translate_classes(const std::string& pattern, RegexSplitPreTokenizer::Flavor flavor) {
  const bool onig = flavor == RegexSplitPreTokenizer::Flavor::kOniguruma;
  const std::string word = onig ? "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}"
                                : "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}";
  const std::string latin1_word = onig ? "\\u00B2\\u00B3\\u00B9\\u00BC-\\u00BE" : "";
  std::string out;
  int class_depth = 0;  // inside [...]
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c != '\\' || i + 1 == pattern.size()) {
      if (c == '[') ++class_depth;
      if (c == ']' && class_depth > 0) --class_depth;
      out += c;
      continue;
    }
    const char next = pattern[++i];
    const std::string w = class_depth > 0 ? word : word + latin1_word;
    switch (next) {
      case 'w': out += "[" + w + "]"; break;
      case 'W': out += "[^" + w + "]"; break;
      case 's': out += "\\p{White_Space}"; break;
      case 'S': out += "\\P{White_Space}"; break;
      case 'd': out += "\\p{Nd}"; break;
      case 'D': out += "\\P{Nd}"; break;
      default: out += '\\', out += next;
    }
  }
  return out;
}

}  // namespace

RegexSplitPreTokenizer::RegexSplitPreTokenizer(const std::string& pattern, bool is_regex, SplitBehavior behavior,
                                               bool invert, Flavor flavor, std::string name)
    : behavior_(behavior), invert_(invert), name_(std::move(name)) {
  UErrorCode status = U_ZERO_ERROR;
  UParseError parse_error{};
  const std::string icu_pattern = is_regex ? translate_classes(pattern, flavor) : pattern;
  regex_.reset(icu::RegexPattern::compile(icu::UnicodeString::fromUTF8(icu_pattern), is_regex ? 0 : UREGEX_LITERAL,
                                          parse_error, status));
  if (U_FAILURE(status)) {
    throw TokenizerError("invalid regular expression '" + pattern + "' (" + u_errorName(status) + " at offset " +
                         std::to_string(parse_error.offset) + ")");
  }
}

void RegexSplitPreTokenizer::pre_tokenize(std::vector<std::u32string>& words) const {
  std::vector<std::u32string> out;
  std::vector<Span> spans;
  UErrorCode status = U_ZERO_ERROR;
  std::unique_ptr<icu::RegexMatcher> matcher(regex_->matcher(status));
  if (U_FAILURE(status)) throw TokenizerError(std::string("ICU regex matcher: ") + u_errorName(status));
  for (const auto& word : words) {
    if (word.empty()) continue;
    const icu::UnicodeString text = to_icu(word);
    const bool bmp_only = static_cast<size_t>(text.length()) == word.size();
    auto to_cp = [&](int32_t utf16_index) {
      return bmp_only ? static_cast<size_t>(utf16_index) : static_cast<size_t>(text.countChar32(0, utf16_index));
    };
    matcher->reset(text);
    spans.clear();
    size_t prev = 0;
    while (matcher->find(status)) {
      const size_t start = to_cp(matcher->start(status));
      const size_t end = to_cp(matcher->end(status));
      if (prev != start) spans.push_back({prev, start, invert_});
      spans.push_back({start, end, !invert_});
      prev = end;
    }
    if (U_FAILURE(status)) throw TokenizerError(std::string("ICU regex search: ") + u_errorName(status));
    if (prev != word.size()) spans.push_back({prev, word.size(), invert_});
    split_spans(word, spans, behavior_, out);
  }
  words = std::move(out);
}

std::unique_ptr<PreTokenizer> make_whitespace_pre_tokenizer() {
  return std::make_unique<RegexSplitPreTokenizer>("\\w+|[^\\w\\s]+", true, SplitBehavior::kRemoved, true,
                                                  RegexSplitPreTokenizer::Flavor::kRustRegex, "Whitespace");
}

void SequencePreTokenizer::pre_tokenize(std::vector<std::u32string>& words) const {
  for (const auto& part : parts_) part->pre_tokenize(words);
}

std::string SequencePreTokenizer::name() const { return join_names("Sequence", parts_); }

// ---- models --------------------------------------------------------------------------------
WordLevelModel::WordLevelModel(Vocab vocab, std::string unk_token)
    : vocab_(std::move(vocab)), unk_token_(std::move(unk_token)) {}

void WordLevelModel::tokenize(const std::string& word, Encoding& out) const {
  auto it = vocab_.find(word);
  if (it == vocab_.end()) {
    it = vocab_.find(unk_token_);
    if (it == vocab_.end()) {
      throw TokenizerError("WordLevel: word '" + word + "' is not in the vocabulary and unk_token '" + unk_token_ +
                           "' is not in it either");
    }
  }
  out.ids.push_back(it->second);
  out.tokens.push_back(it->first);
}

WordPieceModel::WordPieceModel(Vocab vocab, std::string unk_token, std::string continuing_subword_prefix,
                               size_t max_input_chars_per_word)
    : vocab_(std::move(vocab)), unk_token_(std::move(unk_token)), prefix_(std::move(continuing_subword_prefix)),
      max_chars_(max_input_chars_per_word) {}

void WordPieceModel::push_unk(Encoding& out) const {
  const auto it = vocab_.find(unk_token_);
  if (it == vocab_.end()) throw TokenizerError("WordPiece: unk_token '" + unk_token_ + "' is not in the vocabulary");
  out.ids.push_back(it->second);
  out.tokens.push_back(it->first);
}

void WordPieceModel::tokenize(const std::string& word, Encoding& out) const {
  size_t chars = 0;
  for (char b : word) chars += (static_cast<unsigned char>(b) & 0xC0) != 0x80;
  if (chars > max_chars_) return push_unk(out);
  const size_t first = out.ids.size();
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
    if (found == vocab_.end()) {  // no piece fits: the whole word is unknown
      out.ids.resize(first);
      out.tokens.resize(first);
      return push_unk(out);
    }
    out.ids.push_back(found->second);
    out.tokens.push_back(found->first);
    start = end;
  }
}

// ---- post-processor ------------------------------------------------------------------------
void PostProcessor::process(Encoding& enc) const {
  Encoding result;
  auto add = [&](const SpecialPiece& p) {
    result.ids.insert(result.ids.end(), p.ids.begin(), p.ids.end());
    result.tokens.insert(result.tokens.end(), p.tokens.begin(), p.tokens.end());
    result.type_ids.insert(result.type_ids.end(), p.ids.size(), p.type_id);
  };
  for (const auto& p : before_) add(p);
  result.ids.insert(result.ids.end(), enc.ids.begin(), enc.ids.end());
  result.tokens.insert(result.tokens.end(), enc.tokens.begin(), enc.tokens.end());
  result.type_ids.insert(result.type_ids.end(), enc.ids.size(), sequence_type_id_);
  for (const auto& p : after_) add(p);
  enc = std::move(result);
}

int32_t PostProcessor::max_id() const {
  int32_t m = -1;
  for (const auto* list : {&before_, &after_}) {
    for (const auto& p : *list) {
      for (int32_t id : p.ids) m = std::max(m, id);
    }
  }
  return m;
}

size_t PostProcessor::added_tokens() const {
  size_t n = 0;
  for (const auto& p : before_) n += p.ids.size();
  for (const auto& p : after_) n += p.ids.size();
  return n;
}

}  // namespace fastformer::tokenizer
