// The pre-tokenizers of tokenizer.json: BertPreTokenizer, Whitespace, WhitespaceSplit,
// Punctuation, Split (on ICU's regex) and Sequence (components.h).
#include <unicode/regex.h>
#include <unicode/unistr.h>

#include <algorithm>
#include <string>
#include <utility>

#include "server/text/tokenizer/components.h"
#include "server/text/tokenizer/unicode.h"

namespace fastformer::tokenizer {

void split_spans(const std::u32string& word, size_t word_start, const std::vector<Span>& spans,
                 SplitBehavior behavior, std::vector<std::u32string>& out,
                 std::vector<size_t>& starts) {
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
    if (!p.remove && p.end > p.begin) {
      out.push_back(word.substr(p.begin, p.end - p.begin));
      starts.push_back(word_start + p.begin);
    }
  }
}

CharSplitPreTokenizer::CharSplitPreTokenizer(Kind kind, SplitBehavior punctuation_behavior)
    : kind_(kind), behavior_(punctuation_behavior) {}

namespace {
// tokenizers' Pattern for Fn(char) -> bool: each matching char is a delimiter of its own.
template <typename Pred>
void split_on_chars(const std::u32string& word, size_t word_start, Pred pred,
                    SplitBehavior behavior, std::vector<Span>& spans,
                    std::vector<std::u32string>& out, std::vector<size_t>& starts) {
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
  split_spans(word, word_start, spans, behavior, out, starts);
}
}  // namespace

void CharSplitPreTokenizer::pre_tokenize(std::vector<std::u32string>& words,
                                         std::vector<size_t>& starts) const {
  std::vector<std::u32string> out;
  std::vector<size_t> out_starts;
  std::vector<Span> spans;
  for (size_t w = 0; w < words.size(); ++w) {
    const std::u32string& word = words[w];
    const size_t start = starts[w];
    switch (kind_) {
      case Kind::kWhitespaceSplit:
        split_on_chars(word, start, is_whitespace, SplitBehavior::kRemoved, spans, out, out_starts);
        break;
      case Kind::kPunctuation:
        split_on_chars(word, start, is_punctuation, behavior_, spans, out, out_starts);
        break;
      case Kind::kBert: {
        std::vector<std::u32string> parts;
        std::vector<size_t> part_starts;
        split_on_chars(word, start, is_whitespace, SplitBehavior::kRemoved, spans, parts,
                       part_starts);
        for (size_t k = 0; k < parts.size(); ++k)
          split_on_chars(parts[k], part_starts[k], is_punctuation, SplitBehavior::kIsolated, spans,
                         out, out_starts);
        break;
      }
    }
  }
  words = std::move(out);
  starts = std::move(out_starts);
}

std::string CharSplitPreTokenizer::name() const {
  switch (kind_) {
    case Kind::kWhitespaceSplit:
      return "WhitespaceSplit";
    case Kind::kPunctuation:
      return "Punctuation";
    case Kind::kBert:
      return "BertPreTokenizer";
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
      case 'w':
        out += "[" + w + "]";
        break;
      case 'W':
        out += "[^" + w + "]";
        break;
      case 's':
        out += "\\p{White_Space}";
        break;
      case 'S':
        out += "\\P{White_Space}";
        break;
      case 'd':
        out += "\\p{Nd}";
        break;
      case 'D':
        out += "\\P{Nd}";
        break;
      default:
        out += '\\', out += next;
    }
  }
  return out;
}

}  // namespace

RegexSplitPreTokenizer::RegexSplitPreTokenizer(const std::string& pattern, bool is_regex,
                                               SplitBehavior behavior, bool invert, Flavor flavor,
                                               std::string name)
    : behavior_(behavior), invert_(invert), name_(std::move(name)) {
  UErrorCode status = U_ZERO_ERROR;
  UParseError parse_error{};
  const std::string icu_pattern = is_regex ? translate_classes(pattern, flavor) : pattern;
  regex_.reset(icu::RegexPattern::compile(icu::UnicodeString::fromUTF8(icu_pattern),
                                          is_regex ? 0 : UREGEX_LITERAL, parse_error, status));
  if (U_FAILURE(status)) {
    throw TokenizerError("invalid regular expression '" + pattern + "' (" + u_errorName(status) +
                         " at offset " + std::to_string(parse_error.offset) + ")");
  }
}

void RegexSplitPreTokenizer::pre_tokenize(std::vector<std::u32string>& words,
                                          std::vector<size_t>& starts) const {
  std::vector<std::u32string> out;
  std::vector<size_t> out_starts;
  std::vector<Span> spans;
  UErrorCode status = U_ZERO_ERROR;
  std::unique_ptr<icu::RegexMatcher> matcher(regex_->matcher(status));
  if (U_FAILURE(status))
    throw TokenizerError(std::string("ICU regex matcher: ") + u_errorName(status));
  for (size_t w = 0; w < words.size(); ++w) {
    const std::u32string& word = words[w];
    if (word.empty()) continue;
    const icu::UnicodeString text = to_icu(word);
    const bool bmp_only = static_cast<size_t>(text.length()) == word.size();
    auto to_cp = [&](int32_t utf16_index) {
      return bmp_only ? static_cast<size_t>(utf16_index)
                      : static_cast<size_t>(text.countChar32(0, utf16_index));
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
    if (U_FAILURE(status))
      throw TokenizerError(std::string("ICU regex search: ") + u_errorName(status));
    if (prev != word.size()) spans.push_back({prev, word.size(), invert_});
    split_spans(word, starts[w], spans, behavior_, out, out_starts);
  }
  words = std::move(out);
  starts = std::move(out_starts);
}

std::unique_ptr<PreTokenizer> make_whitespace_pre_tokenizer() {
  return std::make_unique<RegexSplitPreTokenizer>("\\w+|[^\\w\\s]+", true, SplitBehavior::kRemoved,
                                                  true, RegexSplitPreTokenizer::Flavor::kRustRegex,
                                                  "Whitespace");
}

void SequencePreTokenizer::pre_tokenize(std::vector<std::u32string>& words,
                                        std::vector<size_t>& starts) const {
  for (const auto& part : parts_) part->pre_tokenize(words, starts);
}

std::string SequencePreTokenizer::name() const { return join_names("Sequence", parts_); }

}  // namespace fastformer::tokenizer
