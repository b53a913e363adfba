// JSON for the HTTP routes: simdjson (DOM) parses request bodies, and Writer prints responses
// with std::to_chars (the shortest text that reads back as the same float32), which is what
// keeps a JSON answer of 768 floats a row cheap (bench/json_bench.cc measures both against
// nlohmann::json; docs/benchmarks.md has the figures).
#pragma once

#include <simdjson.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace fastformer::http::json {

class Writer {
 public:
  Writer& raw(std::string_view text) {
    out_.append(text);
    return *this;
  }
  Writer& ch(char c) {
    out_.push_back(c);
    return *this;
  }
  Writer& string(std::string_view text);  // quoted, escaped; bytes that are not UTF-8: U+FFFD
  Writer& key(std::string_view name) {    // "name":
    string(name);
    return ch(':');
  }
  Writer& number(int64_t v);
  Writer& number(double v);                  // shortest round-trip; non-finite: null
  Writer& f32(float v);                      // shortest round-trip float32; non-finite: null
  Writer& floats(std::span<const float> v);  // [a,b,...]
  Writer& base64(std::string_view bytes);    // "<base64 of the bytes>" (OpenSSL's encoder)
  Writer& boolean(bool v) { return raw(v ? "true" : "false"); }
  Writer& null() { return raw("null"); }
  void reserve(size_t n) { out_.reserve(n); }
  std::string& str() { return out_; }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

// Parses `body` with `parser` (the element is valid until its next parse). Returns why it is
// not JSON, naming the byte where UTF-8 fails, or nothing.
std::optional<std::string> parse(simdjson::dom::parser& parser, std::string_view body,
                                 simdjson::dom::element* root);

// The offset of the first byte of `text` that is not valid UTF-8, or npos.
size_t invalid_utf8_at(std::string_view text);

// A JSON value's type in words, for messages: "a string", "an array", "a number", ...
const char* type_name(const simdjson::dom::element& value);

}  // namespace fastformer::http::json
