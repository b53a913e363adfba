// Fuzz target: a multipart/form-data body through the streaming parser of
// server/http/multipart.h, fed whole, a byte at a time and in chunks whose sizes come from the
// input. The three give the same parts (name, filename, Content-Type, every content byte, the
// end of each) and the same error; between chunks the parser holds no more than held_limit();
// no content piece is empty or comes outside a part; no part's content holds a delimiter that
// is a boundary line ("\r\n--B" then "--", a space, a tab, CR or LF); a parse that finishes
// without an error saw the closing boundary.
//
// Input: byte 0 picks the boundary (bits 0-1: "B", "b0und4ry", a browser's, the openai SDK's
// 32 hex digits), max_header_bytes (bits 2-3: 16, 64, 256, 16384) and max_parts (bits 4-5: 1,
// 2, 4, 64); byte 1 the number of chunk sizes (1 to 8), then that many bytes, each a chunk
// size from 1 to 256, used in turn; the rest is the body.
#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/http/multipart.h"
#include "tests/fuzz/fuzz_input.h"

using namespace fastformer;
namespace mp = fastformer::http::multipart;

namespace {

struct Part {
  std::string name;
  std::optional<std::string> filename;
  std::string content_type;
  std::string data;
  bool ended = false;
  bool operator==(const Part&) const = default;
};

struct Outcome {
  std::vector<Part> parts;
  std::optional<std::string> error;
  bool closed = false;
  bool operator==(const Outcome&) const = default;
};

// Feeds `body` cut into the chunk sizes `sizes` (in turn; empty: whole) and records the parts.
Outcome parse(std::string_view body, const std::string& boundary, mp::Limits limits,
              const std::vector<size_t>& sizes) {
  Outcome out;
  mp::Parser::Callbacks callbacks{
      [&](const mp::PartHeaders& h) -> std::optional<std::string> {
        FUZZ_CHECK(out.parts.empty() || out.parts.back().ended);
        FUZZ_CHECK(!h.name.empty());
        out.parts.push_back({h.name, h.filename, h.content_type, "", false});
        return std::nullopt;
      },
      [&](std::string_view piece) -> std::optional<std::string> {
        FUZZ_CHECK(!piece.empty());
        FUZZ_CHECK(!out.parts.empty() && !out.parts.back().ended);
        out.parts.back().data.append(piece);
        return std::nullopt;
      },
      [&]() -> std::optional<std::string> {
        FUZZ_CHECK(!out.parts.empty() && !out.parts.back().ended);
        out.parts.back().ended = true;
        return std::nullopt;
      }};
  mp::Parser parser(boundary, callbacks, limits);
  size_t at = 0, turn = 0;
  while (at < body.size() && !out.error) {
    const size_t n =
        sizes.empty() ? body.size() : std::min(sizes[turn++ % sizes.size()], body.size() - at);
    out.error = parser.feed(body.substr(at, n));
    at += n;
    FUZZ_CHECK(parser.held_bytes() <= parser.held_limit());
  }
  if (!out.error) out.error = parser.finish();
  out.closed = parser.closed();
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::FuzzInput in(data, size);
  static const std::array<std::string, 4> kBoundaries = {
      "B", "b0und4ry", "----WebKitFormBoundary7MA4YWxkTrZu0gW", "6f0b9e3c1d2a4b5c8e7f6a5b4c3d2e1f"};
  const uint8_t choice = in.byte();
  const std::string& boundary = kBoundaries[choice & 3];
  mp::Limits limits;
  limits.max_header_bytes = std::array<size_t, 4>{16, 64, 256, 16384}[(choice >> 2) & 3];
  limits.max_parts = std::array<size_t, 4>{1, 2, 4, 64}[(choice >> 4) & 3];
  std::vector<size_t> sizes(size_t(in.range(1, 8)));
  for (size_t& s : sizes) s = size_t(in.byte()) + 1;
  const std::string_view body = in.rest();

  const Outcome whole = parse(body, boundary, limits, {});
  FUZZ_CHECK(parse(body, boundary, limits, {1}) == whole);
  FUZZ_CHECK(parse(body, boundary, limits, sizes) == whole);

  FUZZ_CHECK(!whole.error || whole.error->starts_with("multipart: "));
  FUZZ_CHECK(whole.closed == !whole.error);
  FUZZ_CHECK(whole.parts.size() <= limits.max_parts);
  const std::string delimiter = "\r\n--" + boundary;
  for (const Part& p : whole.parts) {
    for (size_t at = p.data.find(delimiter); at != std::string::npos;
         at = p.data.find(delimiter, at + 1)) {
      const std::string_view after = std::string_view(p.data).substr(at + delimiter.size());
      FUZZ_CHECK(!after.empty());  // the byte that decided it is content is content too
      const char c = after[0];
      FUZZ_CHECK(!(c == ' ' || c == '\t' || c == '\r' || c == '\n'));
      FUZZ_CHECK(!after.starts_with("--"));
    }
  }
  if (!whole.error) {
    for (const Part& p : whole.parts) FUZZ_CHECK(p.ended);
  }
  return 0;
}
