// The streaming multipart/form-data parser (server/http/multipart.h): bodies as the openai
// Python SDK (httpx) and urllib3's encode_multipart_formdata write them, fed whole, a byte at a
// time and split at every point, against parts and bytes written out by hand here; every
// refusal's message; the limits; what is held between chunks; boundary_of's cases.
#include "server/http/multipart.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace fastformer::http::multipart {
namespace {

using namespace std::string_literals;  // bodies with NUL bytes

struct Part {
  std::string name;
  std::optional<std::string> filename;
  std::string content_type;
  std::string data;
  bool ended = false;
  bool operator==(const Part&) const = default;
};

std::ostream& operator<<(std::ostream& os, const Part& p) {
  return os << "{" << p.name << ", " << p.filename.value_or("(none)") << ", " << p.content_type
            << ", " << p.data.size() << " bytes, " << (p.ended ? "ended" : "open") << "}";
}

struct Outcome {
  std::vector<Part> parts;
  std::optional<std::string> error;  // the first error of feed() or finish()
  size_t largest_held = 0;           // Parser::held_bytes() after any feed()
  size_t held_limit = 0;
  size_t largest_piece = 0;  // the largest on_data piece
};

// A parser whose callbacks record every part, checking that they come in order.
struct Recorder {
  Outcome out;
  Parser parser;
  Recorder(const std::string& boundary, Limits limits) : parser(boundary, callbacks(), limits) {
    out.held_limit = parser.held_limit();
  }
  Parser::Callbacks callbacks() {
    return {[this](const PartHeaders& h) -> std::optional<std::string> {
              EXPECT_TRUE(out.parts.empty() || out.parts.back().ended) << "a part began in a part";
              out.parts.push_back({h.name, h.filename, h.content_type, "", false});
              return std::nullopt;
            },
            [this](std::string_view piece) -> std::optional<std::string> {
              EXPECT_FALSE(piece.empty());
              EXPECT_TRUE(!out.parts.empty() && !out.parts.back().ended) << "data out of a part";
              if (!out.parts.empty()) out.parts.back().data.append(piece);
              out.largest_piece = std::max(out.largest_piece, piece.size());
              return std::nullopt;
            },
            [this]() -> std::optional<std::string> {
              EXPECT_TRUE(!out.parts.empty() && !out.parts.back().ended) << "an end out of a part";
              if (!out.parts.empty()) out.parts.back().ended = true;
              return std::nullopt;
            }};
  }
  void feed(std::string_view bytes) {
    auto e = parser.feed(bytes);
    if (e && !out.error) out.error = e;
    out.largest_held = std::max(out.largest_held, parser.held_bytes());
  }
  Outcome finish() {
    auto e = parser.finish();
    if (e && !out.error) out.error = e;
    return out;
  }
};

// `body` fed in pieces cut at `cuts` (ascending offsets).
Outcome parse_cut(std::string_view body, const std::string& boundary,
                  const std::vector<size_t>& cuts, Limits limits = {}) {
  Recorder r(boundary, limits);
  size_t from = 0;
  for (size_t cut : cuts) {
    r.feed(body.substr(from, cut - from));
    from = cut;
  }
  r.feed(body.substr(from));
  return r.finish();
}

// `body` fed in chunks of `chunk` bytes (0: whole).
Outcome parse(std::string_view body, const std::string& boundary, size_t chunk = 0,
              Limits limits = {}) {
  std::vector<size_t> cuts;
  for (size_t at = chunk; chunk > 0 && at < body.size(); at += chunk) cuts.push_back(at);
  return parse_cut(body, boundary, cuts, limits);
}

// Fed whole, a byte at a time, in 3- and 7-byte chunks and cut at every point, the body gives
// `expected` parts; and, cut at every pair of points when the body is small, the same.
void expect_parts(std::string_view body, const std::string& boundary,
                  const std::vector<Part>& expected) {
  for (size_t chunk : {0, 1, 3, 7}) {
    const Outcome o = parse(body, boundary, chunk);
    ASSERT_FALSE(o.error) << "chunk " << chunk << ": " << *o.error;
    ASSERT_EQ(o.parts, expected) << "chunk " << chunk;
    EXPECT_LE(o.largest_held, o.held_limit);
  }
  for (size_t cut = 0; cut <= body.size(); ++cut) {
    const Outcome o = parse_cut(body, boundary, {cut});
    ASSERT_FALSE(o.error) << "cut at " << cut << ": " << *o.error;
    ASSERT_EQ(o.parts, expected) << "cut at " << cut;
  }
  if (body.size() > 400) return;
  for (size_t a = 0; a <= body.size(); ++a) {
    for (size_t b = a; b <= body.size(); ++b) {
      const Outcome o = parse_cut(body, boundary, {a, b});
      ASSERT_EQ(o.error, std::nullopt) << "cut at " << a << " and " << b;
      ASSERT_EQ(o.parts, expected) << "cut at " << a << " and " << b;
    }
  }
}

// The error of `body` (CRLFs as written), fed whole and a byte at a time: the same both ways.
std::string error_of(std::string_view body, const std::string& boundary = "B", Limits limits = {}) {
  const Outcome whole = parse(body, boundary, 0, limits);
  const Outcome bytes = parse(body, boundary, 1, limits);
  EXPECT_EQ(whole.error, bytes.error);
  EXPECT_EQ(whole.parts, bytes.parts);
  return whole.error.value_or("(no error)");
}

// As httpx (the openai SDK's transport) writes client.files.create(file=open("x.jsonl", "rb"),
// purpose="batch", expires_after={"anchor": "created_at", "seconds": 3600}): the data fields
// first, then the file, a 32-hex-digit boundary (os.urandom(16).hex()), Content-Type guessed
// from the file name (mimetypes has none for .jsonl: application/octet-stream).
const std::string kSdkBoundary = "6f0b9e3c1d2a4b5c8e7f6a5b4c3d2e1f";
const std::string kSdkJsonl =
    "{\"custom_id\": \"r1\", \"method\": \"POST\", \"url\": \"/v1/embeddings\", \"body\": "
    "{\"model\": \"m\", \"input\": \"hello\"}}\n"
    "{\"custom_id\": \"r2\", \"method\": \"POST\", \"url\": \"/v1/embeddings\", \"body\": "
    "{\"model\": \"m\", \"input\": \"world\"}}\n";
const std::string kSdkBody =
    "--6f0b9e3c1d2a4b5c8e7f6a5b4c3d2e1f\r\n"
    "Content-Disposition: form-data; name=\"purpose\"\r\n"
    "\r\n"
    "batch\r\n"
    "--6f0b9e3c1d2a4b5c8e7f6a5b4c3d2e1f\r\n"
    "Content-Disposition: form-data; name=\"expires_after[anchor]\"\r\n"
    "\r\n"
    "created_at\r\n"
    "--6f0b9e3c1d2a4b5c8e7f6a5b4c3d2e1f\r\n"
    "Content-Disposition: form-data; name=\"expires_after[seconds]\"\r\n"
    "\r\n"
    "3600\r\n"
    "--6f0b9e3c1d2a4b5c8e7f6a5b4c3d2e1f\r\n"
    "Content-Disposition: form-data; name=\"file\"; filename=\"x.jsonl\"\r\n"
    "Content-Type: application/octet-stream\r\n"
    "\r\n" +
    kSdkJsonl +
    "\r\n"
    "--6f0b9e3c1d2a4b5c8e7f6a5b4c3d2e1f--\r\n";

TEST(MultipartParser, TheOpenAiSdkUploadGivesItsFieldsAndFile) {
  expect_parts(kSdkBody, kSdkBoundary,
               {{"purpose", std::nullopt, "", "batch", true},
                {"expires_after[anchor]", std::nullopt, "", "created_at", true},
                {"expires_after[seconds]", std::nullopt, "", "3600", true},
                {"file", "x.jsonl", "application/octet-stream", kSdkJsonl, true}});
}

// Written by urllib3 1.26's encode_multipart_formdata (a real third-party encoder):
//   fields = [RequestField(name="purpose", data="batch"),
//             RequestField(name="file", data=CONTENT, filename='we"ird\\name.jsonl')]
//   fields[0].make_multipart(); fields[1].make_multipart(content_type="application/jsonl")
//   encode_multipart_formdata(fields, boundary="b0und4ry")
// CONTENT is binary with look-alikes of the delimiter that are not one: "\r\n--b0und4ryX",
// "\r\n--b0und4r", a bare-LF "\n--b0und4ry\r\n", "\r\n--B0UND4RY--" in another case,
// "\r\n--b0und4ry-x", NUL and 0xff bytes, and a CR just before the real delimiter. urllib3
// escapes the file name's '"' as %22 and its '\' as "\\" (HTML5's rule).
const std::string kUrllib3Content =
    "{\"custom_id\":\"r1\"}\r\n--b0und4ryX\r\n--b0und4r\n--b0und4ry\r\n\r\n--B0UND4RY--\x00\xff"
    "\r\n--b0und4ry-x\r\n-\r"s;
const std::string kUrllib3Body =
    "--b0und4ry\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--b0und4ry\r\n"
    "Content-Disposition: form-data; name=\"file\"; filename=\"we%22ird\\\\name.jsonl\"\r\n"
    "Content-Type: application/jsonl\r\n\r\n{\"custom_id\":\"r1\"}\r\n--b0und4ryX\r\n--b0und4r\n"
    "--b0und4ry\r\n\r\n--B0UND4RY--\x00\xff\r\n--b0und4ry-x\r\n-\r\r\n--b0und4ry--\r\n"s;

TEST(MultipartParser, Urllib3sBodyWithBinaryLookAlikesPassesThroughIntact) {
  ASSERT_EQ(kUrllib3Content.size(), 89u);  // the NUL byte is in
  expect_parts(kUrllib3Body, "b0und4ry",
               {{"purpose", std::nullopt, "", "batch", true},
                {"file", "we%22ird\\name.jsonl", "application/jsonl", kUrllib3Content, true}});
}

TEST(MultipartParser, PreambleEpilogueEmptyPartsAndHeaderForms) {
  const std::string body =
      "This is the preamble.\r\n--B-x is not a boundary line\r\n--BB\r\n"
      "--B  \t\r\n"  // transport padding
      "content-disposition: FORM-DATA; NAME=plain; filename*=UTF-8''x.txt\r\n"
      "X-Other: ignored\r\n"
      "\r\n"
      "\r\n--B\r\n"  // an empty content
      "Content-Disposition: form-data;\r\n name=\"q\\\"uo\\\\te\"; filename=\"\";\r\n"  // folded
      "CONTENT-TYPE:  text/plain; charset=utf-8 \r\n"
      "\r\n"
      "x\r\n--B-\r\n--Bz\r\n"  // look-alikes of the delimiter
      "\r\n--B--ignored\r\nthe epilogue\r\n--B\r\nnot a part\r\n";
  expect_parts(body, "B",
               {{"plain", std::nullopt, "", "", true},
                {"q\"uo\\te", "", "text/plain; charset=utf-8", "x\r\n--B-\r\n--Bz\r\n", true}});
}

TEST(MultipartParser, ABodyOfBareLineFeedsIsReadAsOne) {
  // curl --data-binary @body from a file written with LF line ends.
  const std::string body =
      "--B\nContent-Disposition: form-data; name=\"a\"\n\none\r\ntwo\n--B\n"
      "Content-Disposition: form-data; name=\"b\"; filename=\"b.txt\"\n\n\n--B--\n";
  expect_parts(body, "B",
               {{"a", std::nullopt, "", "one\r\ntwo", true}, {"b", "b.txt", "", "", true}});
  // In a CRLF body a bare-LF look-alike is content.
  expect_parts("--B\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\nx\n--B\n\r\n--B--", "B",
               {{"a", std::nullopt, "", "x\n--B\n", true}});
}

TEST(MultipartParser, NoPartsAtAllIsAnEmptyForm) {
  expect_parts("--B--\r\n", "B", {});
  expect_parts("preamble\r\n--B--", "B", {});
}

TEST(MultipartParser, ALargeFileStreamsWithoutBeingHeld) {
  // 1 MiB of content with a CR every 1000 bytes, fed in 64 KiB chunks: handed on in pieces no
  // larger than a chunk, holding no more than a delimiter's worth between chunks.
  std::string content(1 << 20, 'a');
  for (size_t i = 0; i < content.size(); i += 1000) content[i] = '\r';
  content.back() = '\r';
  const std::string body = "--" + kSdkBoundary +
                           "\r\nContent-Disposition: form-data; name=\"file\"; "
                           "filename=\"big.jsonl\"\r\n\r\n" +
                           content + "\r\n--" + kSdkBoundary + "--\r\n";
  for (size_t chunk : {size_t(65536), size_t(65537), size_t(1000), size_t(0)}) {
    const Outcome o = parse(body, kSdkBoundary, chunk);
    ASSERT_FALSE(o.error) << *o.error;
    ASSERT_EQ(o.parts.size(), 1u);
    EXPECT_TRUE(o.parts[0].data == content) << "chunk " << chunk;
    EXPECT_LE(o.largest_piece, chunk == 0 ? body.size() : chunk);
    EXPECT_LE(o.largest_held, kSdkBoundary.size() + 5) << "chunk " << chunk;
  }
}

TEST(MultipartParser, EveryRefusalNamesThePartAndWhatIsWrong) {
  const std::string ok = "--B\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\nx\r\n";
  EXPECT_EQ(error_of(ok + "--B\r\nContent-Type: text/plain\r\n\r\ny\r\n--B--"),
            "multipart: part 2: no Content-Disposition form-data header");
  EXPECT_EQ(error_of(ok + "--B\r\nContent-Disposition: attachment; name=\"b\"\r\n\r\n\r\n--B--"),
            "multipart: part 2: Content-Disposition is \"attachment\", not form-data");
  EXPECT_EQ(error_of("--B\r\nContent-Disposition: form-data; filename=\"f\"\r\n\r\n\r\n--B--"),
            "multipart: part 1: a part with no name");
  EXPECT_EQ(error_of("--B\r\nContent-Disposition: form-data; name=\"\"\r\n\r\n\r\n--B--"),
            "multipart: part 1: a part with no name");
  EXPECT_EQ(error_of(ok + "--B\r\nContent-Disposition: form-data; name=\"b\r\n\r\n\r\n--B--"),
            "multipart: part 2: Content-Disposition: parameter \"name\": an unterminated quoted "
            "string");
  EXPECT_EQ(error_of("--B\r\nContent-Disposition: form-data; name=a; NAME=b\r\n\r\n\r\n--B--"),
            "multipart: part 1: Content-Disposition: parameter \"name\" given twice");
  EXPECT_EQ(error_of("--B\r\nContent-Disposition: form-data; name\r\n\r\n\r\n--B--"),
            "multipart: part 1: Content-Disposition: a parameter without '='");
  EXPECT_EQ(error_of("--B\r\nContent-Disposition: form-data; name=a\r\n"
                     "Content-Disposition: form-data; name=b\r\n\r\n\r\n--B--"),
            "multipart: part 1: two Content-Disposition headers");
  EXPECT_EQ(error_of(ok + "--B\r\nno colon here\r\n\r\n\r\n--B--"),
            "multipart: part 2: a header line without a colon");
  EXPECT_EQ(error_of(ok + "--B\r\n continued\r\n\r\n\r\n--B--"),
            "multipart: part 2: a folded header line with no header before it");
  EXPECT_EQ(error_of(ok + "--B  x\r\n"), "multipart: part 2: text after the boundary on its line");
  EXPECT_EQ(error_of(ok + "--B \t--\r\n"),
            "multipart: part 2: text after the boundary on its line");
  EXPECT_EQ(error_of(ok + "--B"), "multipart: the body ended before the closing boundary");
  EXPECT_EQ(error_of(""), "multipart: the body ended before the closing boundary");
  EXPECT_EQ(error_of("no boundary at all\r\n--Bx--\r\n"),
            "multipart: the body ended before the closing boundary");
}

TEST(MultipartParser, EveryProperPrefixOfABodyIsUnfinished) {
  // Up to "--<boundary>-" the body is cut short; from "--<boundary>--" on it is whole.
  const size_t closed_at = kSdkBody.rfind("--\r\n") + 2;
  for (size_t n = 0; n <= kSdkBody.size(); ++n) {
    const Outcome o = parse(std::string_view(kSdkBody).substr(0, n), kSdkBoundary, 5);
    if (n < closed_at) {
      EXPECT_EQ(o.error, "multipart: the body ended before the closing boundary") << n;
    } else {
      EXPECT_EQ(o.error, std::nullopt) << n;
      EXPECT_EQ(o.parts.size(), 4u);
    }
  }
}

TEST(MultipartParser, HeaderBlockLimitCountsItsLineEndsAndBlankLine) {
  const std::string start = "--B\r\nContent-Disposition: form-data; name=\"a\"\r\nX-Pad: ";
  // The block: from "Content-Disposition" to the blank line's CRLF.
  const size_t fixed = start.size() - 5 + 4;  // less "--B\r\n", plus "\r\n\r\n"
  const std::string at_limit = start + std::string(16384 - fixed, 'p') + "\r\n\r\nx\r\n--B--";
  EXPECT_EQ(error_of(at_limit), "(no error)");
  const std::string over = start + std::string(16385 - fixed, 'p') + "\r\n\r\nx\r\n--B--";
  EXPECT_EQ(error_of(over), "multipart: part 1: headers over 16384 bytes");
  // A header line that never ends stops at the limit, whatever the chunks.
  EXPECT_EQ(error_of(start + std::string(1 << 20, 'p')),
            "multipart: part 1: headers over 16384 bytes");
  EXPECT_EQ(error_of("--B\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\n", "B",
                     {.max_header_bytes = 40}),
            "multipart: part 1: headers over 40 bytes");
  Recorder r("B", {.max_header_bytes = 100});
  r.feed("--B\r\nContent-Disposition: form-data; name=\"abcdefghijklmnopqrstuvwxyz\"\r\nX: 1\r\n");
  EXPECT_LE(r.parser.held_bytes(), 100u);
  EXPECT_LE(r.parser.held_bytes(), r.parser.held_limit());
}

std::string parts_body(size_t n) {
  std::string body;
  for (size_t i = 0; i < n; ++i) {
    body += "--B\r\nContent-Disposition: form-data; name=\"f" + std::to_string(i) + "\"\r\n\r\n" +
            std::to_string(i) + "\r\n";
  }
  return body + "--B--\r\n";
}

TEST(MultipartParser, PartLimit) {
  const Outcome at_limit = parse(parts_body(64), "B");
  EXPECT_EQ(at_limit.error, std::nullopt);
  ASSERT_EQ(at_limit.parts.size(), 64u);
  EXPECT_EQ(at_limit.parts[63].name, "f63");
  EXPECT_EQ(at_limit.parts[63].data, "63");
  EXPECT_EQ(error_of(parts_body(65)), "multipart: more than 64 parts");
  EXPECT_EQ(error_of(parts_body(3), "B", {.max_parts = 2}), "multipart: more than 2 parts");
}

TEST(MultipartParser, ACallbackRefusalStopsTheParseAndStays) {
  int parts = 0, pieces = 0;
  Parser parser("B", {[&](const PartHeaders& h) -> std::optional<std::string> {
                        ++parts;
                        if (h.name == "no") return "files: refused part \"no\"";
                        return std::nullopt;
                      },
                      [&](std::string_view) -> std::optional<std::string> {
                        ++pieces;
                        return std::nullopt;
                      },
                      nullptr});
  EXPECT_EQ(parser.feed("--B\r\nContent-Disposition: form-data; name=yes\r\n\r\nok\r\n"
                        "--B\r\nContent-Disposition: form-data; name=no\r\n\r\nnot this"),
            "files: refused part \"no\"");
  EXPECT_EQ(parts, 2);
  EXPECT_EQ(pieces, 1);
  EXPECT_EQ(parser.feed("\r\n--B--\r\n"), "files: refused part \"no\"");
  EXPECT_EQ(parser.finish(), "files: refused part \"no\"");
  EXPECT_EQ(pieces, 1);

  Parser too_big("B", {nullptr,
                       [](std::string_view piece) -> std::optional<std::string> {
                         if (piece.find('!') != std::string_view::npos) return "too big";
                         return std::nullopt;
                       },
                       nullptr});
  EXPECT_EQ(too_big.feed("--B\r\nContent-Disposition: form-data; name=f\r\n\r\nab"), std::nullopt);
  EXPECT_EQ(too_big.feed("c!"), "too big");
  EXPECT_EQ(too_big.finish(), "too big");

  Parser ended("B", {nullptr, nullptr, []() -> std::optional<std::string> { return "short"; }});
  EXPECT_EQ(ended.feed("--B\r\nContent-Disposition: form-data; name=f\r\n\r\n\r\n--B--"), "short");
}

TEST(MultipartParser, FinishedOnceAndNothingAfter) {
  Parser parser("B", {});
  EXPECT_EQ(parser.feed("--B--"), std::nullopt);
  EXPECT_TRUE(parser.closed());
  EXPECT_EQ(parser.finish(), std::nullopt);
  EXPECT_EQ(parser.feed("x"), "multipart: bytes fed after the body ended");
}

TEST(MultipartBoundary, FromContentType) {
  std::string why;
  EXPECT_EQ(boundary_of("multipart/form-data; boundary=abc", &why), "abc");
  EXPECT_EQ(boundary_of("multipart/form-data; boundary=" + kSdkBoundary, &why), kSdkBoundary);
  EXPECT_EQ(boundary_of("Multipart/Form-Data;charset=utf-8; BOUNDARY=\"a b:c\"", &why), "a b:c");
  EXPECT_EQ(boundary_of("multipart/form-data; boundary=\"q\\\"q\" ; x=y", &why), "q\"q");
  EXPECT_EQ(
      boundary_of(" multipart/form-data ; boundary=----WebKitFormBoundary7MA4YWxkTrZu0gW;", &why),
      "----WebKitFormBoundary7MA4YWxkTrZu0gW");
  EXPECT_EQ(boundary_of("multipart/form-data; boundary=" + std::string(70, 'x'), &why),
            std::string(70, 'x'));
}

TEST(MultipartBoundary, Refusals) {
  const auto why_of = [](std::string_view content_type) {
    std::string why;
    EXPECT_EQ(boundary_of(content_type, &why), std::nullopt) << content_type;
    return why;
  };
  EXPECT_EQ(why_of("application/json"),
            "expected Content-Type multipart/form-data, got \"application/json\"");
  EXPECT_EQ(why_of("multipart/mixed; boundary=abc"),
            "expected Content-Type multipart/form-data, got \"multipart/mixed; boundary=abc\"");
  EXPECT_EQ(why_of(""), "expected Content-Type multipart/form-data, got \"\"");
  EXPECT_EQ(why_of("multipart/form-data"), "Content-Type multipart/form-data without a boundary");
  EXPECT_EQ(why_of("multipart/form-data; charset=utf-8"),
            "Content-Type multipart/form-data without a boundary");
  const std::string bad_boundary =
      "Content-Type: the boundary must be 1 to 70 printable ASCII characters, the last not a "
      "space";
  EXPECT_EQ(why_of("multipart/form-data; boundary=\"\""), bad_boundary);
  EXPECT_EQ(why_of("multipart/form-data; boundary=" + std::string(71, 'x')), bad_boundary);
  EXPECT_EQ(why_of("multipart/form-data; boundary=\"abc \""), bad_boundary);
  EXPECT_EQ(why_of("multipart/form-data; boundary=\"a\x01\""), bad_boundary);
  EXPECT_EQ(why_of("multipart/form-data; boundary=\"abc"),
            "Content-Type: parameter \"boundary\": an unterminated quoted string");
  EXPECT_EQ(why_of("multipart/form-data; boundary=a; boundary=b"),
            "Content-Type: parameter \"boundary\" given twice");
}

}  // namespace
}  // namespace fastformer::http::multipart
