// The components of a tokenizer.json pipeline that we support, each a small class that
// reproduces the `tokenizers` crate (v0.2x) rule named in its comment. Built by tokenizer.cc
// from the JSON, and directly by the unit tests.
#pragma once

#include <unicode/normalizer2.h>
#include <unicode/regex.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "server/text/tokenizer/tokenizer.h"

namespace fastformer::tokenizer {

// "Sequence[Lowercase, NFC]": a Sequence component's name from its parts'.
std::string join_names(const char* kind, const auto& parts) {
  std::string out = std::string(kind) + "[";
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? ", " : "") + parts[i]->name();
  return out + "]";
}

// ---- normalizers: text (code points) -> text ----------------------------------------------
// A text being normalized, each of its code points with the range of the original text it
// comes from (tokenizers' NormalizedString alignments, in code points).
struct Aligned {
  std::u32string text;
  std::vector<Offsets> align;

  // `text` aligned to itself from `start`: character i to [start + i, start + i + 1).
  static Aligned identity(std::u32string text, uint32_t start = 0);
};
// A replacement of the whole text, as tokenizers' NormalizedString::transform applies it: each
// new character with its change (1: inserted, aligned as the previous original character; 0:
// replaces the next original character, taking its alignment; -n: replaces it and removes the
// n after it); `initial_removed` original characters are dropped from the front first.
void transform(Aligned& text, const std::vector<std::pair<char32_t, int>>& changes,
               size_t initial_removed = 0);
// tokenizers' NormalizedString::filter: keeps the characters `keep` holds for.
template <typename Keep>
void filter(Aligned& text, Keep keep) {
  std::vector<std::pair<char32_t, int>> changes;
  changes.reserve(text.text.size());
  int removed = 0;
  size_t removed_start = 0;
  bool have_last = false;
  char32_t last = 0;
  for (const char32_t c : text.text) {
    if (keep(c)) {
      if (have_last)
        changes.emplace_back(last, -removed);
      else
        removed_start = size_t(removed);
      last = c;
      have_last = true;
      removed = 0;
    } else {
      ++removed;
    }
  }
  if (have_last) changes.emplace_back(last, -removed);
  transform(text, changes, removed_start);
}

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(std::u32string& text) const = 0;
  // The same text, with its alignments kept (Tokenizer::encode's offsets).
  virtual void normalize(Aligned& text) const = 0;
  virtual std::string name() const = 0;
};

class LowercaseNormalizer : public Normalizer {  // char::to_lowercase of each char
 public:
  void normalize(std::u32string& text) const override;
  void normalize(Aligned& text) const override;
  std::string name() const override { return "Lowercase"; }
};

enum class NormalForm { kNFC, kNFD, kNFKC, kNFKD };
class UnicodeNormalizer : public Normalizer {  // ICU Normalizer2
 public:
  explicit UnicodeNormalizer(NormalForm form);
  void normalize(std::u32string& text) const override;
  // unicode-normalization-alignments' iterators, which the crate's NormalizedString applies:
  // each character decomposed (its first piece replacing it, the rest inserted), marks
  // reordered by combining class, then (NFC, NFKC) recomposed, a composite taking its parts'
  // changes (their sum, less one).
  void normalize(Aligned& text) const override;
  std::string name() const override;

 private:
  NormalForm form_;
  const icu::Normalizer2* normalizer_;
  std::unique_ptr<icu::FilteredNormalizer2> filtered_;
  // The decomposition (canonical, or compatibility for NFKC/NFKD), for the aligned path.
  const icu::Normalizer2* decomposer_ = nullptr;
  std::unique_ptr<icu::FilteredNormalizer2> filtered_decomposer_;
};

class StripAccentsNormalizer : public Normalizer {  // drops every combining mark (M*); no NFD
 public:
  void normalize(std::u32string& text) const override;
  void normalize(Aligned& text) const override;
  std::string name() const override { return "StripAccents"; }
};

class BertNormalizer : public Normalizer {
 public:
  // strip_accents: tokenizer.json's null means "same as lowercase".
  BertNormalizer(bool clean_text, bool handle_chinese_chars, bool strip_accents, bool lowercase);
  void normalize(std::u32string& text) const override;
  void normalize(Aligned& text) const override;
  std::string name() const override { return "BertNormalizer"; }

 private:
  bool clean_text_, handle_chinese_chars_, strip_accents_, lowercase_;
};

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts)
      : parts_(std::move(parts)) {}
  void normalize(std::u32string& text) const override;
  void normalize(Aligned& text) const override;
  std::string name() const override;

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

// ---- pre-tokenizers: text -> words --------------------------------------------------------
// How a split treats the delimiters it finds (tokenizers' SplitDelimiterBehavior).
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// A stretch of a word [begin, end) in its code points, and whether it is a delimiter match.
struct Span {
  size_t begin, end;
  bool is_match;
};
// Applies a behavior to the spans covering a word (tokenizers' NormalizedString::split) and
// appends the non-empty pieces to `out`, and each piece's start (`word_start` + its offset in
// the word) to `starts`.
void split_spans(const std::u32string& word, size_t word_start, const std::vector<Span>& spans,
                 SplitBehavior behavior, std::vector<std::u32string>& out,
                 std::vector<size_t>& starts);

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Splits each word of `words` further (the words of the previous pre-tokenizer); `starts`
  // holds each word's first character in the normalized text, and is kept in step. (The
  // supported pre-tokenizers only split: a word is a stretch of the normalized text.)
  virtual void pre_tokenize(std::vector<std::u32string>& words,
                            std::vector<size_t>& starts) const = 0;
  void pre_tokenize(std::vector<std::u32string>& words) const {
    std::vector<size_t> starts(words.size(), 0);
    pre_tokenize(words, starts);
  }
  virtual std::string name() const = 0;
};

// Splits where a char predicate holds, each matching char its own delimiter.
class CharSplitPreTokenizer : public PreTokenizer {
 public:
  enum class Kind { kWhitespaceSplit, kPunctuation, kBert };
  CharSplitPreTokenizer(Kind kind, SplitBehavior punctuation_behavior = SplitBehavior::kIsolated);
  using PreTokenizer::pre_tokenize;
  void pre_tokenize(std::vector<std::u32string>& words, std::vector<size_t>& starts) const override;
  std::string name() const override;

 private:
  Kind kind_;
  SplitBehavior behavior_;
};

// A regular expression split (ICU regex). `pattern` is tokenizers' Split pattern: a regex in
// Oniguruma's syntax (is_regex) or a literal string.
class RegexSplitPreTokenizer : public PreTokenizer {
 public:
  enum class Flavor { kOniguruma, kRustRegex };  // \w \s \d as Split (onig) or Whitespace (regex)
  RegexSplitPreTokenizer(const std::string& pattern, bool is_regex, SplitBehavior behavior,
                         bool invert, Flavor flavor = Flavor::kOniguruma,
                         std::string name = "Split");
  using PreTokenizer::pre_tokenize;
  void pre_tokenize(std::vector<std::u32string>& words, std::vector<size_t>& starts) const override;
  std::string name() const override { return name_; }

 private:
  std::unique_ptr<icu::RegexPattern> regex_;
  SplitBehavior behavior_;
  bool invert_;
  std::string name_;
};
// The Whitespace pre-tokenizer: the words matched by \w+|[^\w\s]+ (Rust regex classes).
std::unique_ptr<PreTokenizer> make_whitespace_pre_tokenizer();

class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> parts)
      : parts_(std::move(parts)) {}
  using PreTokenizer::pre_tokenize;
  void pre_tokenize(std::vector<std::u32string>& words, std::vector<size_t>& starts) const override;
  std::string name() const override;

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

// ---- models: word -> ids ------------------------------------------------------------------
using Vocab = std::unordered_map<std::string, int32_t>;

class Model {
 public:
  virtual ~Model() = default;
  // Appends the word's tokens to `out`, and with `ranges` each token's [start, end) in the word,
  // in code points (an unknown word's one token covers it all).
  virtual void tokenize(const std::string& word, Encoding& out,
                        std::vector<Offsets>* ranges = nullptr) const = 0;
  virtual const Vocab& vocab() const = 0;
  virtual std::string name() const = 0;
};

class WordLevelModel : public Model {  // the whole word, or unk_token
 public:
  WordLevelModel(Vocab vocab, std::string unk_token);
  void tokenize(const std::string& word, Encoding& out,
                std::vector<Offsets>* ranges = nullptr) const override;
  const Vocab& vocab() const override { return vocab_; }
  std::string name() const override { return "WordLevel"; }

 private:
  Vocab vocab_;
  std::string unk_token_;
};

class WordPieceModel : public Model {  // greedy longest match from the left
 public:
  WordPieceModel(Vocab vocab, std::string unk_token, std::string continuing_subword_prefix,
                 size_t max_input_chars_per_word);
  void tokenize(const std::string& word, Encoding& out,
                std::vector<Offsets>* ranges = nullptr) const override;
  const Vocab& vocab() const override { return vocab_; }
  std::string name() const override { return "WordPiece"; }

 private:
  void push_unk(Encoding& out) const;
  Vocab vocab_;
  std::string unk_token_, prefix_;
  size_t max_chars_;
};

// ---- post-processors: the single sequence's ids -> with special tokens --------------------
struct SpecialPiece {  // a special token's ids (TemplateProcessing's may have several) and tokens
  std::vector<int32_t> ids;
  std::vector<std::string> tokens;
  int32_t type_id = 0;
};

class PostProcessor {
 public:
  // `before` go in front of the sequence, `after` behind it; the sequence's type id.
  PostProcessor(std::string name, std::vector<SpecialPiece> before, std::vector<SpecialPiece> after,
                int32_t sequence_type_id)
      : name_(std::move(name)),
        before_(std::move(before)),
        after_(std::move(after)),
        sequence_type_id_(sequence_type_id) {}
  // Adds the special tokens; with `offsets`, each at (0, 0), as `tokenizers` gives them.
  void process(Encoding& enc, bool offsets = false) const;
  size_t added_tokens() const;
  int32_t max_id() const;  // the largest id it adds (-1: none)
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  std::vector<SpecialPiece> before_, after_;
  int32_t sequence_type_id_;
};

}  // namespace fastformer::tokenizer
