#include "server/jobs/batch_input.h"

#include <simdjson.h>

#include <algorithm>
#include <nlohmann/json.hpp>

namespace fastformer::jobs {
namespace {

bool blank(std::string_view line) {
  return std::all_of(line.begin(), line.end(),
                     [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; });
}

// A JSON value's kind in a message: "a number", "an array", ...
const char* kind_of(simdjson::dom::element_type type) {
  switch (type) {
    case simdjson::dom::element_type::ARRAY:
      return "an array";
    case simdjson::dom::element_type::OBJECT:
      return "an object";
    case simdjson::dom::element_type::INT64:
    case simdjson::dom::element_type::UINT64:
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

}  // namespace

std::optional<BatchLine> parse_batch_line(std::string_view line, std::string_view endpoint,
                                          LineError* error) {
  thread_local simdjson::dom::parser parser;
  const simdjson::padded_string padded(line);
  simdjson::dom::element root;
  if (parser.parse(padded).get(root) != simdjson::SUCCESS) {
    *error = {"invalid_json_line", "This line is not parseable as valid JSON.", std::nullopt};
    return std::nullopt;
  }
  simdjson::dom::object request;
  if (root.get_object().get(request) != simdjson::SUCCESS) {
    *error = {"invalid_json_line",
              std::string("This line is ") + kind_of(root.type()) +
                  ", not a request object {\"custom_id\", \"method\", \"url\", \"body\"}.",
              std::nullopt};
    return std::nullopt;
  }
  auto missing = [&](const char* field, const char* what) {
    *error = {"missing_required_parameter",
              std::string("The request has no ") + field + " (" + what + ").", field};
    return std::nullopt;
  };
  auto wrong = [&](const char* field, const char* what, simdjson::dom::element value) {
    *error = {"invalid_request",
              std::string(field) + ": expected " + what + ", got " + kind_of(value.type()) + ".",
              field};
    return std::nullopt;
  };
  BatchLine out;
  simdjson::dom::element value;
  std::string_view text;
  if (request["custom_id"].get(value) != simdjson::SUCCESS)
    return missing("custom_id", "a string naming the request, unique in the batch");
  if (value.get_string().get(text) != simdjson::SUCCESS)
    return wrong("custom_id", "a string", value);
  if (text.empty()) {
    *error = {"invalid_request", "custom_id: is empty.", std::string("custom_id")};
    return std::nullopt;
  }
  out.custom_id = std::string(text);
  if (request["method"].get(value) != simdjson::SUCCESS) return missing("method", "\"POST\"");
  if (value.get_string().get(text) != simdjson::SUCCESS) return wrong("method", "\"POST\"", value);
  if (text != "POST") {
    *error = {"invalid_request", "method: \"" + std::string(text) + "\"; only POST is served.",
              std::string("method")};
    return std::nullopt;
  }
  if (request["url"].get(value) != simdjson::SUCCESS)
    return missing("url", ("the batch's endpoint, " + std::string(endpoint)).c_str());
  if (value.get_string().get(text) != simdjson::SUCCESS) return wrong("url", "a string", value);
  if (text != endpoint) {
    *error = {"invalid_url",
              "url: \"" + std::string(text) + "\" is not the batch's endpoint \"" +
                  std::string(endpoint) + "\"; every request of a batch goes to its endpoint.",
              std::string("url")};
    return std::nullopt;
  }
  if (request["body"].get(value) != simdjson::SUCCESS) return missing("body", "the request's body");
  if (value.type() != simdjson::dom::element_type::OBJECT) return wrong("body", "an object", value);
  out.body = simdjson::minify(value);
  return out;
}

void InputValidator::fail(LineError error) {
  error.line = line_;
  if (errors_.size() < limits_.max_errors) {
    errors_.push_back(std::move(error));
  } else {
    ++unlisted_;
  }
}

void InputValidator::add_line(std::string_view line) {
  ++line_;
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  if (blank(line)) return;
  ++requests_;
  if (requests_ == limits_.max_lines + 1) {
    fail({"too_many_requests",
          "The input file has more than " + std::to_string(limits_.max_lines) +
              " requests, the most one batch takes; split it into several batches.",
          std::nullopt});
  }
  if (requests_ > limits_.max_lines) return;
  LineError error;
  const std::optional<BatchLine> parsed = parse_batch_line(line, endpoint_, &error);
  if (!parsed) return fail(std::move(error));
  if (!custom_ids_.insert(parsed->custom_id).second) {
    fail({"duplicate_custom_id",
          "The custom_id for this request (\"" + parsed->custom_id +
              "\") is a duplicate of another request's. The custom_id parameter must be unique "
              "for each request in a batch.",
          std::string("custom_id")});
  }
}

std::vector<LineError> InputValidator::finish() {
  if (requests_ == 0 && errors_.empty()) {
    errors_.push_back({"empty_file", "The input file has no requests.", std::nullopt, 0});
  }
  if (unlisted_ > 0) {
    errors_.back().message += " (and " + std::to_string(unlisted_) + " more errors not listed)";
  }
  return errors_;
}

std::string errors_json(const std::vector<LineError>& errors) {
  nlohmann::json data = nlohmann::json::array();
  for (const LineError& e : errors) {
    data.push_back({{"code", e.code},
                    {"message", e.message},
                    {"param", e.param ? nlohmann::json(*e.param) : nlohmann::json(nullptr)},
                    {"line", e.line > 0 ? nlohmann::json(e.line) : nlohmann::json(nullptr)}});
  }
  return nlohmann::json{{"object", "list"}, {"data", data}}.dump(
      -1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace fastformer::jobs
