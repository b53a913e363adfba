// The normalizers of tokenizer.json: Lowercase, NFC/NFD/NFKC/NFKD, StripAccents, BertNormalizer,
// Sequence (components.h).
#include <unicode/normalizer2.h>
#include <unicode/uniset.h>
#include <unicode/unistr.h>

#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "server/text/tokenizer/components.h"
#include "server/text/tokenizer/unicode.h"

namespace fastformer::tokenizer {

Aligned Aligned::identity(std::u32string text, uint32_t start) {
  Aligned a;
  a.align.resize(text.size());
  for (size_t i = 0; i < text.size(); ++i)
    a.align[i] = {start + uint32_t(i), start + uint32_t(i) + 1};
  a.text = std::move(text);
  return a;
}

void transform(Aligned& t, const std::vector<std::pair<char32_t, int>>& changes,
               size_t initial_removed) {
  std::u32string text;
  std::vector<Offsets> align;
  text.reserve(changes.size());
  align.reserve(changes.size());
  size_t idx = initial_removed;  // the next original character
  const size_t n = t.align.size();
  for (const auto& [c, change] : changes) {
    Offsets a{0, 0};
    if (change > 0) {
      if (idx >= 1 && idx - 1 < n) a = t.align[idx - 1];  // shares the previous alignment
    } else {
      if (idx < n) a = t.align[idx];
      idx += 1 + size_t(-change);
    }
    text.push_back(c);
    align.push_back(a);
  }
  t.text = std::move(text);
  t.align = std::move(align);
}

void LowercaseNormalizer::normalize(Aligned& t) const {
  std::vector<std::pair<char32_t, int>> changes;
  changes.reserve(t.text.size());
  std::u32string lower;
  for (const char32_t c : t.text) {
    lower.clear();
    append_lowercase(lower, c);
    for (size_t k = 0; k < lower.size(); ++k) changes.emplace_back(lower[k], k > 0 ? 1 : 0);
  }
  transform(t, changes);
}

void LowercaseNormalizer::normalize(std::u32string& text) const {
  std::u32string out;
  out.reserve(text.size());
  for (char32_t c : text) append_lowercase(out, c);
  text = std::move(out);
}

UnicodeNormalizer::UnicodeNormalizer(NormalForm form) : form_(form) {
  UErrorCode status = U_ZERO_ERROR;
  switch (form) {
    case NormalForm::kNFC:
      normalizer_ = icu::Normalizer2::getNFCInstance(status);
      break;
    case NormalForm::kNFD:
      normalizer_ = icu::Normalizer2::getNFDInstance(status);
      break;
    case NormalForm::kNFKC:
      normalizer_ = icu::Normalizer2::getNFKCInstance(status);
      break;
    case NormalForm::kNFKD:
      normalizer_ = icu::Normalizer2::getNFKDInstance(status);
      break;
  }
  if (U_FAILURE(status))
    throw TokenizerError(std::string("ICU normalizer unavailable: ") + u_errorName(status));
  // The crate's normalization tables are Unicode 11.0: later characters are left as they are.
  static const icu::UnicodeSet* const unicode_11 = [] {
    UErrorCode s = U_ZERO_ERROR;
    auto* set = new icu::UnicodeSet(icu::UnicodeString(u"[:age=11.0:]"), s);
    set->freeze();
    return set;
  }();
  filtered_ = std::make_unique<icu::FilteredNormalizer2>(*normalizer_, *unicode_11);
  normalizer_ = filtered_.get();
  const bool compatibility = form == NormalForm::kNFKC || form == NormalForm::kNFKD;
  const icu::Normalizer2* decomposer = compatibility ? icu::Normalizer2::getNFKDInstance(status)
                                                     : icu::Normalizer2::getNFDInstance(status);
  if (U_FAILURE(status))
    throw TokenizerError(std::string("ICU normalizer unavailable: ") + u_errorName(status));
  filtered_decomposer_ = std::make_unique<icu::FilteredNormalizer2>(*decomposer, *unicode_11);
  decomposer_ = filtered_decomposer_.get();
}

void UnicodeNormalizer::normalize(Aligned& t) const {
  bool ascii = true;
  for (char32_t c : t.text) ascii = ascii && c < 0x80;
  if (ascii) return;
  // 1. Decompose: each character's pieces (the first replaces it, the rest are inserted), the
  // non-starters between two starters sorted by combining class (stably).
  struct Piece {
    char32_t c;
    int change;
    uint8_t ccc;
  };
  std::vector<Piece> decomposed, pending;
  decomposed.reserve(t.text.size());
  auto flush = [&] {
    std::stable_sort(pending.begin(), pending.end(),
                     [](const Piece& a, const Piece& b) { return a.ccc < b.ccc; });
    decomposed.insert(decomposed.end(), pending.begin(), pending.end());
    pending.clear();
  };
  icu::UnicodeString mapping;
  for (const char32_t c : t.text) {
    std::u32string pieces;
    if (decomposer_->getDecomposition(UChar32(c), mapping))
      pieces = from_icu(mapping);
    else
      pieces.assign(1, c);
    for (size_t k = 0; k < pieces.size(); ++k) {
      const Piece p{pieces[k], k > 0 ? 1 : 0, decomposer_->getCombiningClass(UChar32(pieces[k]))};
      if (p.ccc == 0) {
        flush();
        decomposed.push_back(p);
      } else {
        pending.push_back(p);
      }
    }
  }
  flush();
  std::vector<std::pair<char32_t, int>> changes;
  changes.reserve(decomposed.size());
  if (form_ == NormalForm::kNFD || form_ == NormalForm::kNFKD) {
    for (const Piece& p : decomposed) changes.emplace_back(p.c, p.change);
    transform(t, changes);
    return;
  }
  // 2. Recompose (the canonical composition algorithm): a composite keeps its parts' changes,
  // summed less one; the composee goes out before the marks it could not absorb.
  std::optional<Piece> composee;
  std::vector<Piece> buffer;
  int last_ccc = -1;  // -1: none since the composee
  auto emit = [&](const Piece& p) { changes.emplace_back(p.c, p.change); };
  auto purge = [&] {
    if (composee) emit(*composee);
    for (const Piece& p : buffer) emit(p);
    buffer.clear();
  };
  for (const Piece& p : decomposed) {
    if (!composee) {
      if (p.ccc != 0) {
        emit(p);
        continue;
      }
      composee = p;
      last_ccc = -1;
      continue;
    }
    const bool blocked = last_ccc >= 0 && last_ccc >= int(p.ccc);
    if (!blocked) {
      const UChar32 composite = normalizer_->composePair(UChar32(composee->c), UChar32(p.c));
      if (composite >= 0) {
        composee = Piece{char32_t(composite), composee->change + p.change - 1, 0};
        continue;
      }
    }
    if (p.ccc == 0) {
      purge();
      composee = p;
      last_ccc = -1;
      continue;
    }
    buffer.push_back(p);
    last_ccc = p.ccc;
  }
  purge();
  transform(t, changes);
}

void UnicodeNormalizer::normalize(std::u32string& text) const {
  bool ascii = true;
  for (char32_t c : text) ascii = ascii && c < 0x80;
  if (ascii) return;  // ASCII is invariant under every normal form
  UErrorCode status = U_ZERO_ERROR;
  const icu::UnicodeString out = normalizer_->normalize(to_icu(text), status);
  if (U_FAILURE(status))
    throw TokenizerError(std::string("ICU normalization failed: ") + u_errorName(status));
  text = from_icu(out);
}

std::string UnicodeNormalizer::name() const {
  switch (form_) {
    case NormalForm::kNFC:
      return "NFC";
    case NormalForm::kNFD:
      return "NFD";
    case NormalForm::kNFKC:
      return "NFKC";
    case NormalForm::kNFKD:
      return "NFKD";
  }
  return "?";
}

void StripAccentsNormalizer::normalize(std::u32string& text) const { std::erase_if(text, is_mark); }

void StripAccentsNormalizer::normalize(Aligned& text) const {
  filter(text, [](char32_t c) { return !is_mark(c); });
}

BertNormalizer::BertNormalizer(bool clean_text, bool handle_chinese_chars, bool strip_accents,
                               bool lowercase)
    : clean_text_(clean_text),
      handle_chinese_chars_(handle_chinese_chars),
      strip_accents_(strip_accents),
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

void SequenceNormalizer::normalize(Aligned& text) const {
  for (const auto& part : parts_) part->normalize(text);
}

void BertNormalizer::normalize(Aligned& t) const {
  std::vector<std::pair<char32_t, int>> changes;
  if (clean_text_) {
    filter(t, [](char32_t c) { return !(c == 0 || c == 0xFFFD || is_bert_control(c)); });
    changes.clear();
    for (const char32_t c : t.text) changes.emplace_back(is_bert_whitespace(c) ? U' ' : c, 0);
    transform(t, changes);
  }
  if (handle_chinese_chars_) {
    changes.clear();
    for (const char32_t c : t.text) {
      if (is_chinese_char(c)) {
        changes.emplace_back(U' ', 0);
        changes.emplace_back(c, 1);
        changes.emplace_back(U' ', 1);
      } else {
        changes.emplace_back(c, 0);
      }
    }
    transform(t, changes);
  }
  if (strip_accents_) {
    UnicodeNormalizer(NormalForm::kNFD).normalize(t);
    filter(t, [](char32_t c) { return !is_nonspacing_mark(c); });
  }
  if (lowercase_) LowercaseNormalizer().normalize(t);
}

std::string SequenceNormalizer::name() const { return join_names("Sequence", parts_); }

}  // namespace fastformer::tokenizer
