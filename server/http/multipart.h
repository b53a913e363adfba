// A streaming multipart/form-data parser (RFC 7578 over RFC 2046) for OpenAI's Files API
// (`POST /v1/files`, issue 50): the body is fed in chunks of any size, and each part's content
// is handed on in pieces as it arrives, so a 200 MB upload is never held whole. What the parser
// keeps between chunks is bounded: a few bytes more than the delimiter (a chunk may end inside
// one) and one part's header block (Limits::max_header_bytes).
//
// The body: an optional preamble, then `--boundary` at the start of a line; each part is its
// header lines (CRLF, or a bare LF, ends each), a blank line and its content, which ends at
// `\r\n--boundary`; `--boundary--` closes the body and whatever follows it (the epilogue) is
// ignored. A body whose first boundary line ends in a bare LF is read with bare LFs throughout
// (its contents end at `\n--boundary`), as Go's mime/multipart reads one. A boundary line may carry
// spaces or tabs after the boundary (RFC 2046's transport padding). `\r\n--boundary` followed by
// anything but `--`, a space, a tab, CR or LF is content, as Go's mime/multipart reads it: such a
// look-alike passes through intact.
//
// Each part needs `Content-Disposition: form-data; name="..."` (a quoted string with backslash
// escapes, or a token); `filename="..."` is kept, `filename*=` and other parameters are
// ignored, and `Content-Type` is kept as sent. Other headers are ignored.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fastformer::http::multipart {

// The boundary of a Content-Type value "multipart/form-data; boundary=XYZ" (quoted or not, any
// parameter order, the type and the parameter names in any case), or nothing and `why`: not
// multipart/form-data, no boundary, or a boundary RFC 2046 refuses (1 to 70 printable ASCII
// characters, the last not a space).
std::optional<std::string> boundary_of(std::string_view content_type, std::string* why);

// One part's headers, as the parser hands them on before its content.
struct PartHeaders {
  std::string name;                     ///< Content-Disposition's name, never empty
  std::optional<std::string> filename;  ///< Content-Disposition's filename, if sent (may be "")
  std::string content_type;             ///< the Content-Type header, trimmed; "" if not sent
};

struct Limits {
  size_t max_header_bytes = 16 * 1024;  ///< one part's header block, line ends and blank line in
  size_t max_parts = 64;                ///< parts in the body
};

class Parser {
 public:
  // Each callback may refuse with a message, which stops the parse: feed() then returns that
  // message as it is. A callback left empty accepts everything.
  struct Callbacks {
    std::function<std::optional<std::string>(const PartHeaders&)> on_part;
    // A piece of the current part's content (never empty); pieces follow one another in order.
    std::function<std::optional<std::string>(std::string_view)> on_data;
    std::function<std::optional<std::string>()> on_part_end;
  };

  Parser(std::string boundary, Callbacks callbacks, Limits limits = {});

  // The next bytes of the body. The first error ("multipart: part 2: ..."), or a callback's
  // refusal; after one, every call (finish() too) returns it again.
  std::optional<std::string> feed(std::string_view bytes);

  // The body ended: an error unless the closing boundary came.
  std::optional<std::string> finish();

  // Whether the closing boundary came (what follows it is ignored).
  bool closed() const { return state_ == State::kEpilogue || state_ == State::kFinished; }

  // The bytes held between calls: the tail of the last chunk that may begin a delimiter, and
  // the header block being read. At most held_limit().
  size_t held_bytes() const;
  size_t held_limit() const;

 private:
  enum class State { kPreamble, kAfterBoundary, kHeaders, kContent, kEpilogue, kFinished };

  // Consumes what it can of `in` in the current state and those that follow; what is left
  // needs more bytes to be decided (at most the delimiter's length and two bytes).
  size_t run(std::string_view in);
  size_t preamble(std::string_view in);
  size_t after_boundary(std::string_view in);
  size_t headers(std::string_view in);
  size_t content(std::string_view in);

  // Whether `in`, which starts with `prefix_size` bytes of delimiter, is a boundary line:
  // +1 yes, -1 no (content or preamble), 0 not known until more bytes come.
  static int is_boundary(std::string_view in, size_t prefix_size);

  void start_part();
  void end_headers();
  void fail(std::string message);
  // "multipart: part N: " for the part being read.
  std::string part_prefix() const;

  std::string delimiter_;  // "\r\n--" + boundary ("\n--" + boundary in a body of bare LFs)
  Callbacks callbacks_;
  const Limits limits_;

  State state_ = State::kPreamble;
  std::optional<std::string> error_;
  std::string pending_;        // bytes of earlier chunks that are not decided yet
  bool at_line_start_ = true;  // preamble: the next byte begins a line
  bool padded_ = false;        // after a boundary: transport padding came (no "--" after it)
  size_t parts_ = 0;           // parts begun so far; the current one's number
  size_t header_bytes_ = 0;    // of the current part's header block so far
  std::string line_;           // the header line being read, without its line end
  std::vector<std::pair<std::string, std::string>> header_lines_;  // name, value
};

}  // namespace fastformer::http::multipart
