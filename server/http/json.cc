#include "server/http/json.h"

#include <openssl/evp.h>

#include <charconv>
#include <cmath>
#include <cstring>

namespace fastformer::http::json {

namespace {

// The length of the UTF-8 character at s[i] (i < n), or 0 when the bytes there are not one
// (a stray continuation byte, a sequence cut short, an overlong form, a surrogate, past
// U+10FFFF).
size_t utf8_length_at(const unsigned char* s, size_t n, size_t i) {
  const unsigned char c = s[i];
  if (c < 0x80) return 1;
  size_t len = 0;
  uint32_t cp = 0;
  if ((c & 0xE0) == 0xC0) {
    len = 2;
    cp = c & 0x1F;
  } else if ((c & 0xF0) == 0xE0) {
    len = 3;
    cp = c & 0x0F;
  } else if ((c & 0xF8) == 0xF0) {
    len = 4;
    cp = c & 0x07;
  } else {
    return 0;
  }
  if (i + len > n) return 0;
  for (size_t k = 1; k < len; ++k) {
    if ((s[i + k] & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (s[i + k] & 0x3F);
  }
  if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
      (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) {
    return 0;
  }
  return len;
}

}  // namespace

Writer& Writer::string(std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
  out_.push_back('"');
  size_t run = 0;  // start of the bytes not yet copied
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = bytes[i];
    if (c >= 0x80) {
      // A message may quote what a client sent (a model name from the path): bytes that are
      // not UTF-8 become U+FFFD, so the answer stays valid JSON.
      const size_t len = utf8_length_at(bytes, text.size(), i);
      if (len > 0) {
        i += len - 1;
        continue;
      }
      out_.append(text.substr(run, i - run));
      out_.append("\\ufffd");
      run = i + 1;
      continue;
    }
    if (c >= 0x20 && c != '"' && c != '\\') continue;
    out_.append(text.substr(run, i - run));
    run = i + 1;
    switch (c) {
      case '"':
        out_.append("\\\"");
        break;
      case '\\':
        out_.append("\\\\");
        break;
      case '\n':
        out_.append("\\n");
        break;
      case '\r':
        out_.append("\\r");
        break;
      case '\t':
        out_.append("\\t");
        break;
      default:
        out_.append("\\u00");
        out_.push_back(kHex[c >> 4]);
        out_.push_back(kHex[c & 15]);
    }
  }
  out_.append(text.substr(run));
  out_.push_back('"');
  return *this;
}

Writer& Writer::number(int64_t v) {
  char buf[24];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  out_.append(buf, r.ptr);
  return *this;
}

Writer& Writer::number(double v) {
  if (!std::isfinite(v)) return null();
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  out_.append(buf, r.ptr);
  return *this;
}

Writer& Writer::f32(float v) {
  if (!std::isfinite(v)) return null();
  char buf[24];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  out_.append(buf, r.ptr);
  return *this;
}

Writer& Writer::floats(std::span<const float> v) {
  // At most 16 characters a float32 ("-1.2345678e-38" and a comma): grow once.
  const size_t at = out_.size();
  out_.resize(at + 2 + v.size() * 17);
  char* p = out_.data() + at;
  char* const end = out_.data() + out_.size();
  *p++ = '[';
  for (size_t i = 0; i < v.size(); ++i) {
    if (i > 0) *p++ = ',';
    if (std::isfinite(v[i])) {
      p = std::to_chars(p, end, v[i]).ptr;
    } else {
      std::memcpy(p, "null", 4);
      p += 4;
    }
  }
  *p++ = ']';
  out_.resize(size_t(p - out_.data()));
  return *this;
}

Writer& Writer::base64(std::string_view bytes) {
  const size_t at = out_.size();
  out_.resize(at + 2 + 4 * ((bytes.size() + 2) / 3) + 1);  // quotes, text, EVP's NUL
  out_[at] = '"';
  const int n =
      EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out_.data() + at + 1),
                      reinterpret_cast<const unsigned char*>(bytes.data()), int(bytes.size()));
  out_[at + 1 + size_t(n)] = '"';
  out_.resize(at + 2 + size_t(n));
  return *this;
}

size_t invalid_utf8_at(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  for (size_t i = 0; i < text.size();) {
    const size_t len = utf8_length_at(s, text.size(), i);
    if (len == 0) return i;
    i += len;
  }
  return std::string_view::npos;
}

std::optional<std::string> parse(simdjson::dom::parser& parser, std::string_view body,
                                 simdjson::dom::element* root) {
  const simdjson::error_code error = parser.parse(body.data(), body.size()).get(*root);
  if (!error) return std::nullopt;
  if (error == simdjson::UTF8_ERROR) {
    return "the request body is not UTF-8 (byte " + std::to_string(invalid_utf8_at(body)) +
           " is not part of a UTF-8 character); JSON text must be UTF-8";
  }
  if (error == simdjson::EMPTY) return std::string("the request body is empty; expected JSON");
  return std::string("the request body is not valid JSON: ") + simdjson::error_message(error);
}

const char* type_name(const simdjson::dom::element& value) {
  switch (value.type()) {
    case simdjson::dom::element_type::ARRAY:
      return "an array";
    case simdjson::dom::element_type::OBJECT:
      return "an object";
    case simdjson::dom::element_type::INT64:
    case simdjson::dom::element_type::UINT64:
      return "an integer";
    case simdjson::dom::element_type::DOUBLE:
      return "a number";
    case simdjson::dom::element_type::STRING:
      return "a string";
    case simdjson::dom::element_type::BOOL:
      return "a boolean";
    case simdjson::dom::element_type::NULL_VALUE:
      return "null";
  }
  return "a value";
}

}  // namespace fastformer::http::json
