// Fuzz target: a batch's input file (server/jobs/batch_input.h) checked line by line, as the
// batches' runner validates it. Byte 0 picks the limits (bits 0-1: max_lines 1, 2, 8, 50000;
// bits 2-3: max_errors 1, 2, 8, 100); the rest is the file. Invariants: every error names a line
// of the file (or none: the file as a whole), in order; a file with no error has at least one
// request and at most max_lines, and every one of its lines that is not blank parses alone
// (parse_batch_line) into a non-empty custom_id, unique in the file, and a body that is a JSON
// object; the errors object is valid JSON with one entry per error.
#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "server/jobs/batch_input.h"
#include "tests/fuzz/fuzz_input.h"

using namespace fastformer;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::FuzzInput in(data, size);
  const uint8_t choice = in.byte();
  jobs::InputValidator::Limits limits;
  limits.max_lines = std::array<int64_t, 4>{1, 2, 8, 50000}[choice & 3];
  limits.max_errors = std::array<size_t, 4>{1, 2, 8, 100}[(choice >> 2) & 3];
  const std::string_view file = in.rest();
  std::vector<std::string_view> lines;
  for (size_t at = 0; at <= file.size();) {
    const size_t end = std::min(file.find('\n', at), file.size());
    if (end == file.size() && at == end) break;  // the newline ended the last line
    lines.push_back(file.substr(at, end - at));
    at = end + 1;
  }
  jobs::InputValidator validator("/v1/embeddings", limits);
  for (const std::string_view line : lines) validator.add_line(line);
  const std::vector<jobs::LineError> errors = validator.finish();

  FUZZ_CHECK(errors.size() <= std::max<size_t>(limits.max_errors, 1));
  int64_t last = 0;
  for (const jobs::LineError& e : errors) {
    FUZZ_CHECK(!e.code.empty() && !e.message.empty());
    FUZZ_CHECK(e.line >= 0 && e.line <= int64_t(lines.size()));
    FUZZ_CHECK(e.line == 0 || e.line >= last);
    last = std::max(last, e.line);
  }
  const nlohmann::json listed = nlohmann::json::parse(jobs::errors_json(errors));
  FUZZ_CHECK(listed["object"] == "list" && listed["data"].size() == errors.size());
  if (!errors.empty()) return 0;

  FUZZ_CHECK(validator.requests() >= 1 && validator.requests() <= limits.max_lines);
  std::set<std::string> ids;
  for (std::string_view line : lines) {
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find_first_not_of(" \t\r\n") == std::string_view::npos) continue;
    jobs::LineError error;
    const auto parsed = jobs::parse_batch_line(line, "/v1/embeddings", &error);
    FUZZ_CHECK(parsed.has_value());
    FUZZ_CHECK(!parsed->custom_id.empty());
    FUZZ_CHECK(ids.insert(parsed->custom_id).second);
    FUZZ_CHECK(nlohmann::json::parse(parsed->body).is_object());
  }
  return 0;
}
