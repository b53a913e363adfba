// UTF-8 <-> code points and the character classes the Hugging Face `tokenizers` crate uses,
// answered by ICU (the crate's Rust std / unicode_categories / unicode-normalization calls are
// named beside each function). Where the crate's tables are older than ICU's, the predicate
// holds only for characters of that Unicode version (unicode_categories: 8.0,
// is_combining_mark: 9.0, normalization: 11.0), found by a sweep over every code point
// (tests/tokenizer/compare_hf.py).
#pragma once

#include <unicode/unistr.h>

#include <cstdint>
#include <string>
#include <string_view>

namespace fastformer::tokenizer {

// Strict UTF-8 decoding (no overlong forms, surrogates or code points above U+10FFFF);
// throws TokenizerError naming the byte offset of the first invalid sequence.
std::u32string decode_utf8(std::string_view utf8);
void append_utf8(std::string& out, char32_t c);
std::string encode_utf8(std::u32string_view text);
// Code points in UTF-8 bytes (those that are not continuation bytes), for valid UTF-8.
inline size_t code_point_count(std::string_view utf8) {
  size_t n = 0;
  for (const char b : utf8) n += (static_cast<unsigned char>(b) & 0xC0) != 0x80;
  return n;
}
// Code points <-> ICU's UTF-16 strings, for the ICU normalizers and regexes.
icu::UnicodeString to_icu(const std::u32string& text);
std::u32string from_icu(const icu::UnicodeString& text);

// Whether the code point was assigned by Unicode major.minor (ICU's u_charAge).
bool assigned_by(char32_t c, uint8_t major, uint8_t minor);
bool is_whitespace(char32_t c);       // Rust char::is_whitespace: the White_Space property
bool is_bert_whitespace(char32_t c);  // BertNormalizer: \t \n \r or White_Space
bool is_bert_control(char32_t c);     // BertNormalizer: general category C*, but not \t \n \r
bool is_mark(char32_t c);             // unicode-normalization is_combining_mark: M*
bool is_nonspacing_mark(char32_t c);  // unicode_categories is_mark_nonspacing: Mn
bool is_punctuation(char32_t c);      // is_ascii_punctuation || unicode_categories P*
bool is_chinese_char(char32_t c);     // BertNormalizer's CJK ideograph blocks
// Rust char::to_lowercase (full, context-free mapping) appended to `out`.
void append_lowercase(std::u32string& out, char32_t c);

}  // namespace fastformer::tokenizer
