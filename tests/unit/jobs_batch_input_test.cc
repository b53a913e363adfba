// A batch's input file checked before it runs (server/jobs/batch_input.h, issue 50): each
// refusal's code, line and message, written out here, and OpenAI's errors object.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "server/jobs/batch_input.h"

namespace fastformer::jobs {
namespace {

std::string request(const std::string& id, const std::string& body = R"({"input": "a text"})") {
  return R"({"custom_id": ")" + id + R"(", "method": "POST", "url": "/v1/embeddings", "body": )" +
         body + "}";
}

std::vector<LineError> check(const std::vector<std::string>& lines,
                             InputValidator::Limits limits = {}) {
  InputValidator v("/v1/embeddings", limits);
  for (const std::string& line : lines) v.add_line(line);
  return v.finish();
}

TEST(BatchInput, SoundLinesPassAndTheBodyIsKeptAsJson) {
  EXPECT_TRUE(check({request("a"), request("b") + "\r", "", "  "}).empty());
  LineError error;
  const auto line = parse_batch_line(request("doc-1", R"({ "input": ["x", "y"], "model": "m" })"),
                                     "/v1/embeddings", &error);
  ASSERT_TRUE(line) << error.message;
  EXPECT_EQ(line->custom_id, "doc-1");
  EXPECT_EQ(nlohmann::json::parse(line->body),
            nlohmann::json::parse(R"({"input": ["x", "y"], "model": "m"})"));
}

TEST(BatchInput, EachRefusalNamesItsLineAndCode) {
  const auto errors = check({
      request("a"),                                                                     // 1: sound
      "{not json",                                                                      // 2
      "[1, 2]",                                                                         // 3
      R"({"method": "POST", "url": "/v1/embeddings", "body": {}})",                     // 4
      R"({"custom_id": 7, "method": "POST", "url": "/v1/embeddings", "body": {}})",     // 5
      R"({"custom_id": "g", "method": "GET", "url": "/v1/embeddings", "body": {}})",    // 6
      R"({"custom_id": "h", "method": "POST", "url": "/v2/embed", "body": {}})",        // 7
      R"({"custom_id": "i", "method": "POST", "url": "/v1/embeddings", "body": "x"})",  // 8
      request("a"),  // 9: duplicate
  });
  ASSERT_EQ(errors.size(), 8u);
  const std::vector<std::pair<std::string, int64_t>> want = {
      {"invalid_json_line", 2}, {"invalid_json_line", 3},  {"missing_required_parameter", 4},
      {"invalid_request", 5},   {"invalid_request", 6},    {"invalid_url", 7},
      {"invalid_request", 8},   {"duplicate_custom_id", 9}};
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(errors[i].code, want[i].first) << i;
    EXPECT_EQ(errors[i].line, want[i].second) << i;
  }
  EXPECT_EQ(errors[1].message,
            "This line is an array, not a request object {\"custom_id\", \"method\", \"url\", "
            "\"body\"}.");
  EXPECT_EQ(errors[2].message,
            "The request has no custom_id (a string naming the request, unique in the batch).");
  EXPECT_EQ(errors[2].param, "custom_id");
  EXPECT_EQ(errors[3].message, "custom_id: expected a string, got a number.");
  EXPECT_EQ(errors[4].message, "method: \"GET\"; only POST is served.");
  EXPECT_EQ(errors[5].message,
            "url: \"/v2/embed\" is not the batch's endpoint \"/v1/embeddings\"; every request of "
            "a batch goes to its endpoint.");
  EXPECT_EQ(errors[6].message, "body: expected an object, got a string.");
  EXPECT_NE(errors[7].message.find("(\"a\") is a duplicate"), std::string::npos);
}

TEST(BatchInput, LimitsAndAnEmptyFile) {
  auto errors = check({request("a"), request("b"), request("c")}, {2, 100});
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].code, "too_many_requests");
  EXPECT_EQ(errors[0].line, 3);
  EXPECT_NE(errors[0].message.find("more than 2 requests"), std::string::npos);
  errors = check({"", " "});
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].code, "empty_file");
  EXPECT_EQ(errors[0].line, 0);
  // Past max_errors the rest are counted, not listed.
  errors = check({"x", "y", "z", "w"}, {50000, 2});
  ASSERT_EQ(errors.size(), 2u);
  EXPECT_NE(errors[1].message.find("(and 2 more errors not listed)"), std::string::npos);
}

TEST(BatchInput, ErrorsInOpenAIsShape) {
  const auto json = nlohmann::json::parse(
      errors_json({{"invalid_json_line", "bad", std::nullopt, 2}, {"empty_file", "none", "x", 0}}));
  EXPECT_EQ(json["object"], "list");
  ASSERT_EQ(json["data"].size(), 2u);
  EXPECT_EQ(json["data"][0]["line"], 2);
  EXPECT_TRUE(json["data"][0]["param"].is_null());
  EXPECT_TRUE(json["data"][1]["line"].is_null());
  EXPECT_EQ(json["data"][1]["param"], "x");
}

}  // namespace
}  // namespace fastformer::jobs
