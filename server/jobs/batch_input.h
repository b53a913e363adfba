// A batch's input file (issue 50, OpenAI's Batch API): one request a line,
//   {"custom_id": "request-1", "method": "POST", "url": "/v1/embeddings", "body": {...}}
// checked once before the batch runs (status "validating"), line by line so that a file of
// hundreds of megabytes is never held whole. A file that fails fails the batch with OpenAI's
// `errors` list: a line that is not a JSON object, a missing or mistyped field, a method other
// than POST, a url other than the batch's endpoint, a duplicate custom_id, more lines than the
// limit, or no line at all. What a body asks for is not checked here: the front door reads it
// when the line runs (its typed reader), and a body it refuses goes to the error file while the
// batch goes on.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

namespace fastformer::jobs {

// One entry of a batch's errors (OpenAI's Batch.errors.data[]). `line`: 1-based; 0: the file.
struct LineError {
  std::string code;
  std::string message;
  std::optional<std::string> param;
  int64_t line = 0;
};

// One line as the runner takes it: its custom_id and its body's JSON text.
struct BatchLine {
  std::string custom_id;
  std::string body;
};

// The line's fields, or nothing and `error` (its code, message and param; line left 0).
std::optional<BatchLine> parse_batch_line(std::string_view line, std::string_view endpoint,
                                          LineError* error);

class InputValidator {
 public:
  struct Limits {
    int64_t max_lines = 50000;  ///< OpenAI's limit of requests in one batch
    size_t max_errors = 100;    ///< errors listed; the rest are counted in the last one's message
  };
  explicit InputValidator(std::string endpoint) : InputValidator(std::move(endpoint), Limits{}) {}
  InputValidator(std::string endpoint, Limits limits)
      : endpoint_(std::move(endpoint)), limits_(limits) {}

  // The next line of the file, without its line end ("\n" or "\r\n"). A line of only
  // whitespace is skipped, as a trailing newline makes one.
  void add_line(std::string_view line);
  // The file ended: the errors (empty when every line is sound), in line order.
  std::vector<LineError> finish();
  // Requests seen (lines not blank).
  int64_t requests() const { return requests_; }

 private:
  void fail(LineError error);

  std::string endpoint_;
  Limits limits_;
  int64_t line_ = 0, requests_ = 0, unlisted_ = 0;
  std::unordered_set<std::string> custom_ids_;
  std::vector<LineError> errors_;
};

// OpenAI's Batch.errors object for `errors`: {"object": "list", "data": [...]}.
std::string errors_json(const std::vector<LineError>& errors);

}  // namespace fastformer::jobs
