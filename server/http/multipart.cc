// A streaming multipart/form-data parser (server/http/multipart.h): a state machine over the
// body's bytes, which keeps between chunks only what it cannot decide yet.
#include "server/http/multipart.h"

#include <algorithm>
#include <cctype>

namespace fastformer::http::multipart {
namespace {

constexpr size_t kMaxBoundary = 70;  // RFC 2046, section 5.1.1

bool is_space(char c) { return c == ' ' || c == '\t'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = char(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool equals_lower(std::string_view s, std::string_view lower_case) {
  return s.size() == lower_case.size() &&
         std::equal(s.begin(), s.end(), lower_case.begin(), [](char a, char b) {
           return std::tolower(static_cast<unsigned char>(a)) == b;
         });
}

// A header value's parameters after its first ';' (`; name=value; name="quoted \" value"`): the
// names in lower case, the values unquoted, or why they cannot be read. A name given twice is
// refused, so that two readers of the same header cannot disagree on which one counts.
using Parameters = std::vector<std::pair<std::string, std::string>>;
std::optional<std::string> parse_parameters(std::string_view s, Parameters* out) {
  while (true) {
    s = trim(s);
    if (s.empty()) return std::nullopt;
    if (s.front() != ';') return "expected ';' before \"" + std::string(s.substr(0, 20)) + "\"";
    s = trim(s.substr(1));
    if (s.empty()) return std::nullopt;  // a trailing ';', as some clients send
    const size_t eq = s.find('=');
    if (eq == std::string_view::npos) return "a parameter without '='";
    const std::string name = lower(trim(s.substr(0, eq)));
    if (name.empty()) return "a parameter with no name";
    s = trim(s.substr(eq + 1));
    std::string value;
    if (!s.empty() && s.front() == '"') {
      size_t i = 1;
      for (; i < s.size() && s[i] != '"'; ++i) {
        if (s[i] == '\\' && i + 1 < s.size()) ++i;  // quoted-pair: the next byte as it is
        value.push_back(s[i]);
      }
      if (i >= s.size()) return "parameter \"" + name + "\": an unterminated quoted string";
      s.remove_prefix(i + 1);
    } else {
      const size_t end = std::min(s.find(';'), s.size());
      value = std::string(trim(s.substr(0, end)));
      s.remove_prefix(end);
    }
    for (const auto& [seen, v] : *out) {
      if (seen == name) return "parameter \"" + name + "\" given twice";
    }
    out->emplace_back(name, std::move(value));
  }
}

const std::string* find_parameter(const Parameters& params, std::string_view name) {
  for (const auto& [n, v] : params) {
    if (n == name) return &v;
  }
  return nullptr;
}

// Splits "type; parameters" into the type (trimmed) and the rest, which starts at the ';'.
std::pair<std::string_view, std::string_view> split_type(std::string_view value) {
  const size_t semi = std::min(value.find(';'), value.size());
  return {trim(value.substr(0, semi)), value.substr(semi)};
}

}  // namespace

std::optional<std::string> boundary_of(std::string_view content_type, std::string* why) {
  const auto [type, rest] = split_type(content_type);
  if (!equals_lower(type, "multipart/form-data")) {
    *why = "expected Content-Type multipart/form-data, got \"" +
           std::string(content_type.substr(0, 100)) + "\"";
    return std::nullopt;
  }
  Parameters params;
  if (auto e = parse_parameters(rest, &params)) {
    *why = "Content-Type: " + *e;
    return std::nullopt;
  }
  const std::string* boundary = find_parameter(params, "boundary");
  if (!boundary) {
    *why = "Content-Type multipart/form-data without a boundary";
    return std::nullopt;
  }
  const bool printable = std::all_of(boundary->begin(), boundary->end(),
                                     [](char c) { return c >= 0x20 && c <= 0x7e; });
  if (boundary->empty() || boundary->size() > kMaxBoundary || !printable ||
      boundary->back() == ' ') {
    *why = "Content-Type: the boundary must be 1 to " + std::to_string(kMaxBoundary) +
           " printable ASCII characters, the last not a space";
    return std::nullopt;
  }
  return *boundary;
}

Parser::Parser(std::string boundary, Callbacks callbacks, Limits limits)
    : delimiter_("\r\n--" + boundary), callbacks_(std::move(callbacks)), limits_(limits) {}

std::optional<std::string> Parser::feed(std::string_view bytes) {
  if (error_) return error_;
  if (state_ == State::kFinished) {
    fail("multipart: bytes fed after the body ended");
    return error_;
  }
  // Undecided bytes of the last chunk come first: they are topped up a few bytes at a time,
  // enough to decide them, so that a large chunk is not copied; once they are gone the chunk
  // is read where it lies, and only its undecided tail is kept.
  const size_t window = delimiter_.size() + 2;
  while (!bytes.empty() && !error_) {
    if (pending_.empty()) {
      bytes.remove_prefix(run(bytes));
      if (!error_) pending_.assign(bytes);
      break;
    }
    const size_t take = std::min(window, bytes.size());
    pending_.append(bytes.substr(0, take));
    bytes.remove_prefix(take);
    pending_.erase(0, run(pending_));
  }
  return error_;
}

std::optional<std::string> Parser::finish() {
  if (error_) return error_;
  if (state_ == State::kFinished) return std::nullopt;
  if (state_ != State::kEpilogue) {
    fail("multipart: the body ended before the closing boundary");
    return error_;
  }
  state_ = State::kFinished;
  pending_.clear();
  return std::nullopt;
}

size_t Parser::held_bytes() const {
  size_t held = pending_.size() + line_.size();
  for (const auto& [name, value] : header_lines_) held += name.size() + value.size();
  return held;
}

size_t Parser::held_limit() const { return limits_.max_header_bytes + delimiter_.size() + 1; }

size_t Parser::run(std::string_view in) {
  size_t used = 0;
  while (!error_ && used < in.size()) {
    const std::string_view rest = in.substr(used);
    size_t n = 0;
    switch (state_) {
      case State::kPreamble:
        n = preamble(rest);
        break;
      case State::kAfterBoundary:
        n = after_boundary(rest);
        break;
      case State::kHeaders:
        n = headers(rest);
        break;
      case State::kContent:
        n = content(rest);
        break;
      case State::kEpilogue:
        n = rest.size();
        break;  // ignored, as RFC 2046 says
      case State::kFinished:
        n = 0;
        break;
    }
    if (n == 0) break;  // the rest needs more bytes (or an error stopped the parse)
    used += n;
  }
  return used;
}

int Parser::is_boundary(std::string_view in, size_t prefix_size) {
  if (in.size() <= prefix_size) return 0;
  const char c = in[prefix_size];
  if (is_space(c) || c == '\r' || c == '\n') return 1;
  if (c != '-') return -1;
  if (in.size() <= prefix_size + 1) return 0;
  return in[prefix_size + 1] == '-' ? 1 : -1;
}

size_t Parser::preamble(std::string_view in) {
  if (at_line_start_) {
    // The first boundary has no CRLF before it when the body starts with it.
    const std::string_view dash_boundary = std::string_view(delimiter_).substr(2);
    const size_t n = std::min(in.size(), dash_boundary.size());
    if (in.substr(0, n) == dash_boundary.substr(0, n)) {
      if (n < dash_boundary.size()) return 0;
      const int boundary = is_boundary(in, dash_boundary.size());
      if (boundary == 0) return 0;
      if (boundary > 0) {
        state_ = State::kAfterBoundary;
        return dash_boundary.size();
      }
    }
    at_line_start_ = false;
  }
  const size_t newline = in.find('\n');
  if (newline == std::string_view::npos) return in.size();
  at_line_start_ = true;
  return newline + 1;
}

size_t Parser::after_boundary(std::string_view in) {
  if (in[0] == '-' && !padded_) {
    if (in.size() < 2) return 0;
    if (in[1] == '-') {
      state_ = State::kEpilogue;
      return 2;
    }
  }
  if (is_space(in[0])) {
    padded_ = true;
    size_t n = 1;
    while (n < in.size() && is_space(in[n])) ++n;
    return n;
  }
  if (in[0] == '\r' && in.size() < 2) return 0;
  const size_t line_end = in[0] == '\n' ? 1 : in[0] == '\r' && in[1] == '\n' ? 2 : 0;
  if (line_end == 0) {
    fail("multipart: part " + std::to_string(parts_ + 1) + ": text after the boundary on its line");
    return 0;
  }
  // A body whose first boundary line ends in a bare LF ends every line so (as Go's
  // mime/multipart reads it): its parts' content ends at "\n--boundary".
  if (parts_ == 0 && line_end == 1) delimiter_.erase(0, 1);
  start_part();
  return line_end;
}

void Parser::start_part() {
  padded_ = false;
  if (++parts_ > limits_.max_parts) {
    fail("multipart: more than " + std::to_string(limits_.max_parts) + " parts");
    return;
  }
  header_bytes_ = 0;
  line_.clear();
  header_lines_.clear();
  state_ = State::kHeaders;
}

size_t Parser::headers(std::string_view in) {
  const size_t newline = in.find('\n');
  const size_t take = newline == std::string_view::npos ? in.size() : newline + 1;
  if (header_bytes_ + take > limits_.max_header_bytes) {
    fail(part_prefix() + "headers over " + std::to_string(limits_.max_header_bytes) + " bytes");
    return 0;
  }
  header_bytes_ += take;
  if (newline == std::string_view::npos) {
    line_.append(in);
    return take;
  }
  line_.append(in.substr(0, newline));
  if (!line_.empty() && line_.back() == '\r') line_.pop_back();
  if (line_.empty()) {
    end_headers();
    return take;
  }
  if (is_space(line_.front())) {
    // A folded line (obsolete, RFC 5322) continues the header before it.
    if (header_lines_.empty()) {
      fail(part_prefix() + "a folded header line with no header before it");
      return 0;
    }
    std::string& value = header_lines_.back().second;
    value.push_back(' ');
    value.append(trim(line_));
  } else {
    const size_t colon = line_.find(':');
    if (colon == std::string::npos) {
      fail(part_prefix() + "a header line without a colon");
      return 0;
    }
    const std::string_view line = line_;
    header_lines_.emplace_back(lower(trim(line.substr(0, colon))),
                               std::string(trim(line.substr(colon + 1))));
  }
  line_.clear();
  return take;
}

void Parser::end_headers() {
  const std::string* disposition = nullptr;
  PartHeaders part;
  bool content_type_seen = false;
  for (const auto& [name, value] : header_lines_) {
    if (name == "content-disposition") {
      if (disposition) return fail(part_prefix() + "two Content-Disposition headers");
      disposition = &value;
    } else if (name == "content-type") {
      if (content_type_seen) return fail(part_prefix() + "two Content-Type headers");
      content_type_seen = true;
      part.content_type = value;
    }
  }
  if (!disposition) return fail(part_prefix() + "no Content-Disposition form-data header");
  const auto [type, rest] = split_type(*disposition);
  if (!equals_lower(type, "form-data")) {
    return fail(part_prefix() + "Content-Disposition is \"" + std::string(type.substr(0, 40)) +
                "\", not form-data");
  }
  Parameters params;
  if (auto e = parse_parameters(rest, &params)) {
    return fail(part_prefix() + "Content-Disposition: " + *e);
  }
  const std::string* name = find_parameter(params, "name");
  if (!name || name->empty()) return fail(part_prefix() + "a part with no name");
  part.name = *name;
  if (const std::string* filename = find_parameter(params, "filename")) part.filename = *filename;
  header_lines_.clear();
  line_.clear();
  state_ = State::kContent;
  if (callbacks_.on_part) {
    if (auto refused = callbacks_.on_part(part)) fail(std::move(*refused));
  }
}

size_t Parser::content(std::string_view in) {
  // The content ends at the first delimiter that is a boundary line; everything before it,
  // and before the earliest byte that may still begin one, is handed on now.
  size_t end = in.size();  // what is handed on
  size_t from = 0;
  bool delimiter = false;
  while (true) {
    const size_t at = in.find(delimiter_, from);
    if (at == std::string_view::npos) {
      const size_t tail_from =
          std::max(from, in.size() - std::min(in.size(), delimiter_.size() - 1));
      for (size_t i = tail_from; i < in.size(); ++i) {
        if (in[i] == delimiter_[0] && std::string_view(delimiter_).starts_with(in.substr(i))) {
          end = i;
          break;
        }
      }
      break;
    }
    const int boundary = is_boundary(in.substr(at), delimiter_.size());
    if (boundary < 0) {
      from = at + 1;  // a look-alike: content
      continue;
    }
    end = at;
    delimiter = boundary > 0;
    break;
  }
  if (end > 0 && callbacks_.on_data) {
    if (auto refused = callbacks_.on_data(in.substr(0, end))) {
      fail(std::move(*refused));
      return 0;
    }
  }
  if (!delimiter) return end;
  state_ = State::kAfterBoundary;
  if (callbacks_.on_part_end) {
    if (auto refused = callbacks_.on_part_end()) {
      fail(std::move(*refused));
      return 0;
    }
  }
  return end + delimiter_.size();
}

void Parser::fail(std::string message) {
  if (!error_) error_ = std::move(message);
}

std::string Parser::part_prefix() const {
  return "multipart: part " + std::to_string(parts_) + ": ";
}

}  // namespace fastformer::http::multipart
