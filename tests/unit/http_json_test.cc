// The HTTP layer's JSON (server/http/json.h) and the input and error shapes every route
// shares (server/http/api.h), against hand-written expectations.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "server/http/api.h"
#include "server/http/json.h"

namespace fastformer::http {
namespace {

TEST(HttpJson, FloatsPrintShortestAndReadBackExactly) {
  json::Writer w;
  const std::vector<float> v{0.1f, -2.5f, 1e-38f, 3.4028235e38f, 0.0f, 16777216.0f};
  w.floats(v);
  EXPECT_EQ(w.str(), "[0.1,-2.5,1e-38,3.4028235e+38,0,16777216]");
  // Random floats: simdjson reads every printed value back as the same float32.
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0, 3);
  std::vector<float> many(4096);
  for (float& x : many) x = normal(rng) * std::pow(10.0f, float(int(rng() % 20) - 10));
  json::Writer big;
  big.floats(many);
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  ASSERT_FALSE(json::parse(parser, big.str(), &root).has_value());
  size_t i = 0;
  for (double x : root.get_array()) EXPECT_EQ(float(x), many[i++]) << i;
  EXPECT_EQ(i, many.size());
}

TEST(HttpJson, Base64IsQuotedAndPadded) {
  json::Writer w;
  w.base64("").ch(',').base64("f").ch(',').base64("foob");
  EXPECT_EQ(w.str(), "\"\",\"Zg==\",\"Zm9vYg==\"");  // RFC 4648's test vectors
}

TEST(HttpJson, NonFiniteIsNull) {
  json::Writer w;
  w.floats(std::vector<float>{std::numeric_limits<float>::quiet_NaN(), 1.0f,
                              std::numeric_limits<float>::infinity()});
  EXPECT_EQ(w.str(), "[null,1,null]");
}

TEST(HttpJson, StringsAreEscaped) {
  json::Writer w;
  w.string("a\"b\\c\nd\te\x01 é");
  EXPECT_EQ(w.str(), "\"a\\\"b\\\\c\\nd\\te\\u0001 é\"");
}

TEST(HttpJson, BytesThatAreNotUtf8BecomeReplacementCharacters) {
  json::Writer w;
  w.string("id\x8d\xa9head \xc3\xa9 \xe2\x82");
  EXPECT_EQ(w.str(), "\"id\\ufffd\\ufffdhead \xc3\xa9 \\ufffd\\ufffd\"");
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  ASSERT_FALSE(json::parse(parser, w.str(), &root).has_value());
  EXPECT_EQ(std::string_view(root.get_string().value()), "id\ufffd\ufffdhead \u00e9 \ufffd\ufffd");
}

TEST(HttpJson, InvalidUtf8IsLocated) {
  EXPECT_EQ(json::invalid_utf8_at("plain"), std::string_view::npos);
  EXPECT_EQ(json::invalid_utf8_at("h\xc3\xa9llo"), std::string_view::npos);
  EXPECT_EQ(json::invalid_utf8_at("ab\xff"), 2u);
  EXPECT_EQ(json::invalid_utf8_at("a\xc0\xaf"), 1u);      // overlong '/'
  EXPECT_EQ(json::invalid_utf8_at("x\xed\xa0\x80"), 1u);  // a surrogate
  EXPECT_EQ(json::invalid_utf8_at("\xe2\x82"), 0u);       // cut short
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  const std::optional<std::string> e = json::parse(parser, "{\"input\":\"ab\xff\"}", &root);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(*e,
            "the request body is not UTF-8 (byte 12 is not part of a UTF-8 character); JSON "
            "text must be UTF-8");
}

Inputs read(const char* text, std::optional<std::string>* error) {
  static simdjson::dom::parser parser;
  simdjson::dom::element root;
  EXPECT_FALSE(json::parse(parser, text, &root).has_value()) << text;
  Inputs inputs;
  *error = reader::read_inputs(root, &inputs);
  if (*error) *error = reader::where("input", **error);
  return inputs;
}

TEST(HttpInputs, EveryShapeOpenAITakes) {
  std::optional<std::string> e;
  Inputs one = read("\"a text\"", &e);
  EXPECT_FALSE(e);
  EXPECT_TRUE(one.single);
  EXPECT_EQ(one.texts, std::vector<std::string>{"a text"});
  Inputs texts = read("[\"a\", \"b\"]", &e);
  EXPECT_FALSE(e);
  EXPECT_FALSE(texts.single);
  EXPECT_EQ(texts.size(), 2u);
  Inputs ids = read("[1, 2, 3]", &e);
  EXPECT_FALSE(e);
  EXPECT_TRUE(ids.single);
  EXPECT_EQ(ids.ids, (std::vector<std::vector<int64_t>>{{1, 2, 3}}));
  Inputs rows = read("[[1], [2, 5000000000]]", &e);
  EXPECT_FALSE(e);
  EXPECT_EQ(rows.ids, (std::vector<std::vector<int64_t>>{{1}, {2, 5000000000}}));
}

TEST(HttpInputs, RefusalsNameTheField) {
  std::optional<std::string> e;
  read("5", &e);
  EXPECT_EQ(*e,
            "input: expected a string, an array of strings, an array of token ids or an array "
            "of arrays of token ids, got an integer");
  read("[]", &e);
  EXPECT_EQ(*e, "input: is empty; send at least one input");
  read("[\"a\", [1]]", &e);
  EXPECT_EQ(*e, "input[1]: mixes token ids with text; send one kind");
  read("[[1, 2.5]]", &e);
  EXPECT_EQ(*e, "input[0]: expected token ids (integers), got a number");
  read("[\"a\", {}]", &e);
  EXPECT_EQ(*e, "input[1]: expected a string or an array of token ids, got an object");
}

// The one reader (reader.h): a table of fields over a struct, every refusal in one wording.
struct Body {
  std::string name = "default";
  int64_t count = 0;
  bool flag = false;
  std::string side;
  std::vector<std::string> words;
  request::EmbeddingFormat format;
};

const std::vector<reader::Field<Body>>& body_fields() {
  static const std::vector<reader::Field<Body>> fields = {
      reader::string_field<Body>(
          "name", [](Body& b, std::string v) { b.name = std::move(v); },
          /*required=*/true),
      reader::int_field<Body>("count", 1, INT32_MAX, [](Body& b, int64_t v) { b.count = v; }),
      reader::bool_field<Body>("flag", [](Body& b, bool v) { b.flag = v; }),
      reader::choice_field<Body>(
          "side", {"right", "left"}, [](Body& b, const std::string& v) { b.side = v; }, true),
      {"words",
       [](const simdjson::dom::element& v, Body& b) { return reader::read_strings(v, &b.words); }},
      reader::format_field<Body>("type", [](Body& b, request::EmbeddingFormat f) { b.format = f; }),
      reader::refused_field<Body>("images", "not served here"),
  };
  return fields;
}

std::optional<reader::Refusal> read_body(const char* text, Body* body) {
  static simdjson::dom::parser parser;
  simdjson::dom::element root;
  EXPECT_FALSE(json::parse(parser, text, &root).has_value()) << text;
  simdjson::dom::object object;
  EXPECT_FALSE(root.get_object().get(object)) << text;
  return reader::read(object, body_fields(), body);
}

TEST(HttpReader, FillsTheStructAndIgnoresUnknownFieldsAndNulls) {
  Body b;
  ASSERT_FALSE(read_body(R"({"name": "x", "count": 3, "flag": true, "side": "LEFT",
                             "words": ["a", "b"], "type": "base64", "other": [1], "images": null})",
                         &b));
  EXPECT_EQ(b.name, "x");
  EXPECT_EQ(b.count, 3);
  EXPECT_TRUE(b.flag);
  EXPECT_EQ(b.side, "left");  // any case
  EXPECT_EQ(b.words, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(b.format.type, request::EmbeddingType::kFloat);
  EXPECT_TRUE(b.format.base64);
  Body d;
  ASSERT_FALSE(read_body(R"({"name": "y", "count": null})", &d));
  EXPECT_EQ(d.count, 0);  // null: the default
}

TEST(HttpReader, EveryRefusalNamesTheFieldInOneWording) {
  const std::vector<std::pair<const char*, std::string>> cases = {
      {R"({})", "name: is required"},
      {R"({"name": null})", "name: is required"},
      {R"({"name": 5})", "name: expected a string, got an integer"},
      {R"({"name": "x", "count": 0})", "count: expected a positive integer, got 0"},
      {R"({"name": "x", "count": "8"})", "count: expected a positive integer, got \"8\""},
      {R"({"name": "x", "flag": 1})", "flag: expected true or false, got an integer"},
      {R"({"name": "x", "side": "up"})", "side: expected \"right\" or \"left\", got \"up\""},
      {R"({"name": "x", "words": ["a", 2]})", "words[1]: expected a string, got an integer"},
      {R"({"name": "x", "words": "a"})", "words: expected an array of strings, got \"a\""},
      {R"({"name": "x", "type": "int4"})",
       "type: expected \"float\", \"int8\", \"uint8\", \"binary\", \"ubinary\" or \"base64\", "
       "got \"int4\""},
      {R"({"name": "x", "images": []})", "images: not served here"},
  };
  for (const auto& [text, message] : cases) {
    Body b;
    const auto refused = read_body(text, &b);
    ASSERT_TRUE(refused) << text;
    EXPECT_EQ(refused->message, message) << text;
    EXPECT_EQ(refused->message.substr(0, refused->field.size()), refused->field) << text;
  }
}

TEST(HttpErrors, EachApiItsShapeAndStatus) {
  EXPECT_EQ(
      error_response(Api::kOpenAI, bhttp::status::not_found, "no \"x\"", "model").body(),
      "{\"error\":{\"message\":\"no \\\"x\\\"\",\"type\":\"not_found_error\",\"param\":\"model\","
      "\"code\":\"model_not_found\"}}");
  EXPECT_EQ(error_response(Api::kTei, bhttp::status::unprocessable_entity, "bad").body(),
            "{\"error\":\"bad\",\"error_type\":\"Validation\"}");
  EXPECT_EQ(error_response(Api::kKServe, bhttp::status::bad_request, "bad").body(),
            "{\"error\":\"bad\"}");
  const Response busy = error_response(Api::kOpenAI, bhttp::status::too_many_requests, "full");
  EXPECT_EQ(busy[bhttp::field::retry_after], "1");
  const Response denied = error_response(Api::kTei, bhttp::status::unauthorized, "token");
  EXPECT_EQ(denied[bhttp::field::www_authenticate], "Bearer");
  const Status invalid{StatusCode::kInvalidArgument, "x"};
  EXPECT_EQ(http_status(Api::kOpenAI, invalid), bhttp::status::bad_request);
  EXPECT_EQ(http_status(Api::kTei, invalid), bhttp::status::unprocessable_entity);
  EXPECT_EQ(http_status(Api::kKServe, invalid), bhttp::status::bad_request);
  EXPECT_EQ(http_status(Api::kTei, {StatusCode::kResourceExhausted, ""}),
            bhttp::status::too_many_requests);
  EXPECT_EQ(http_status(Api::kOpenAI, {StatusCode::kUnavailable, ""}),
            bhttp::status::service_unavailable);
  EXPECT_EQ(http_status(Api::kKServe, {StatusCode::kDeadlineExceeded, ""}),
            bhttp::status::gateway_timeout);
  EXPECT_EQ(http_status(Api::kKServe, {StatusCode::kNotFound, ""}), bhttp::status::not_found);
}

TEST(HttpRoutes, ThePathParserMatchesSegmentsAndCaptures) {
  PathParams p;
  EXPECT_TRUE(match_path("/v2/models/{model}/ready", "/v2/models/m/ready", &p));
  EXPECT_EQ(p.model, "m");
  EXPECT_TRUE(match_path("/v2/models/{model}/versions/{version}/infer",
                         "/v2/models/text/versions/12/infer", &p));
  EXPECT_EQ(p.model, "text");
  EXPECT_EQ(p.version, "12");
  EXPECT_FALSE(match_path("/v2/models/{model}/ready", "/v2/models//ready", &p));  // empty name
  EXPECT_FALSE(match_path("/v2/models/{model}", "/v2/models/m/extra", &p));
  EXPECT_FALSE(match_path("/v2/models/{model}/ready", "/v2/models/m", &p));
  EXPECT_FALSE(match_path("/embed", "/embed_all", &p));
  EXPECT_TRUE(match_path("/", "/", &p));
  EXPECT_FALSE(match_path("/", "/x", &p));
  EXPECT_TRUE(match_path("/v1/models/{model...}", "/v1/models/BAAI/bge-small", &p));
  EXPECT_EQ(p.model, "BAAI/bge-small");  // OpenAI's ids may hold slashes
  EXPECT_FALSE(match_path("/v1/models/{model...}", "/v1/models/", &p));
  EXPECT_FALSE(match_path("/v1/models/{model...}", "/v1/models", &p));
}

// Every route in the table is the one a request for its own path reaches: no route shadows
// another, and each (method, pattern) appears once.
TEST(HttpRoutes, EveryRouteIsReachable) {
  const auto& routes = HttpApi::routes();
  ASSERT_GE(routes.size(), 25u);
  for (const HttpApi::Route& route : routes) {
    std::string path(route.pattern);
    for (const auto& [from, to] : {std::pair<std::string, std::string>{"{model...}", "org/name"},
                                   {"{model}", "some-model"},
                                   {"{version}", "3"}}) {
      for (size_t at; (at = path.find(from)) != std::string::npos;)
        path.replace(at, from.size(), to);
    }
    const HttpApi::Route* first = nullptr;
    PathParams params;
    for (const HttpApi::Route& other : routes) {
      if (other.verb == route.verb && match_path(other.pattern, path, &params)) {
        first = &other;
        break;
      }
    }
    EXPECT_EQ(first, &route) << route.pattern << " (" << path << ") is reached by "
                             << (first ? first->pattern : "nothing");
  }
}

}  // namespace
}  // namespace fastformer::http
