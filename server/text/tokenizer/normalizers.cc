// The normalizers of tokenizer.json: Lowercase, NFC/NFD/NFKC/NFKD, StripAccents, BertNormalizer,
// Sequence (components.h).
#include <unicode/normalizer2.h>
#include <unicode/uniset.h>
#include <unicode/unistr.h>

#include <algorithm>
#include <string>
#include <utility>

#include "server/text/tokenizer/components.h"
#include "server/text/tokenizer/unicode.h"

namespace fastformer::tokenizer {

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

std::string SequenceNormalizer::name() const { return join_names("Sequence", parts_); }

}  // namespace fastformer::tokenizer
