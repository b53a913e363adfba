// KServe v2 REST's infer body and answer (server/http/kserve_rest.h), apart from the route:
// JSON and binary inputs into the ModelInferRequest the gRPC service converts, each refusal
// naming its field, and a response back into JSON data or binary outputs, against values
// written out by hand here.
#include "server/http/kserve_rest.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>

namespace fastformer::http {
namespace {

std::string bytes_of(const std::vector<int64_t>& v) {
  std::string s(v.size() * 8, '\0');
  std::memcpy(s.data(), v.data(), s.size());
  return s;
}

TEST(KServeRestParse, JsonDataBecomesRawContents) {
  RestInferRequest r;
  const Status s = parse_rest_infer(R"({"id":"q1","parameters":{"timeout":2500,"truncation":"left"},
      "inputs":[{"name":"input_ids","datatype":"INT64","shape":[1,3],"data":[[5,6,7]]}],
      "outputs":[{"name":"embedding"},{"name":"logits","parameters":{"binary_data":true}}]})",
                                    std::nullopt, &r);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(r.proto.id(), "q1");
  EXPECT_EQ(r.timeout_us, 2500);
  EXPECT_EQ(r.proto.parameters().at("truncation").string_param(), "left");
  ASSERT_EQ(r.proto.inputs_size(), 1);
  EXPECT_EQ(r.proto.inputs(0).name(), "input_ids");
  EXPECT_EQ(r.proto.inputs(0).datatype(), "INT64");
  EXPECT_EQ(r.proto.inputs(0).shape(1), 3);
  ASSERT_EQ(r.proto.raw_input_contents_size(), 1);
  EXPECT_EQ(r.proto.raw_input_contents(0), bytes_of({5, 6, 7}));
  ASSERT_EQ(r.proto.outputs_size(), 2);
  EXPECT_EQ(r.binary_output, (std::vector<bool>{false, true}));
}

TEST(KServeRestParse, BinaryTensorBytesFollowTheJson) {
  const std::string json =
      R"({"inputs":[{"name":"input_ids","datatype":"INT64","shape":[1,2],)"
      R"("parameters":{"binary_data_size":16}}],"parameters":{"binary_data_output":true}})";
  const std::string body = json + bytes_of({9, 11});
  const std::string length = std::to_string(json.size());
  RestInferRequest r;
  const Status s = parse_rest_infer(body, length, &r);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(r.proto.raw_input_contents(0), bytes_of({9, 11}));
  EXPECT_TRUE(r.binary_default);
  EXPECT_TRUE(r.binary_output.empty());
}

TEST(KServeRestParse, EachRefusalNamesItsField) {
  auto why = [](const std::string& body, std::optional<std::string_view> length = std::nullopt) {
    RestInferRequest r;
    const Status s = parse_rest_infer(body, length, &r);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << body;
    return s.message();
  };
  EXPECT_EQ(why("[1]"), "the request body must be a JSON object, got an array");
  EXPECT_EQ(why("{}"), "inputs: is required");
  EXPECT_EQ(why(R"({"inputs":[{"datatype":"INT64"}]})"), "inputs[0].name: is required (a string)");
  EXPECT_EQ(why(R"({"inputs":[{"name":"input_ids","datatype":"INT64","shape":[1,"x"]}]})"),
            "inputs[0] (input_ids).shape: expected integers");
  EXPECT_EQ(why(R"({"inputs":[{"name":"a","datatype":"INT64","shape":[1]}]})"),
            "inputs[0] (a).data: is required (or parameters.binary_data_size)");
  EXPECT_EQ(why(R"({"parameters":{"timeout":0},"inputs":[]})"),
            "parameters.timeout: expected a positive number of microseconds");
  EXPECT_EQ(why(R"({"inputs":[],"outputs":[{"name":"logits","parameters":{"classification":2}}]})"),
            "outputs[0].parameters.classification: the classification extension is not "
            "supported; ask for logits");
  EXPECT_EQ(why("{}", "99"),
            "Inference-Header-Content-Length: '99' is not a length within the body's 2 bytes");
  EXPECT_EQ(why(R"({"inputs":[]})"
                "xyz",
                "13"),
            "the body has 3 binary bytes after the JSON that no input's binary_data_size claims");
}

inference::ModelInferResponse two_outputs() {
  inference::ModelInferResponse response;
  auto* e = response.add_outputs();
  e->set_name("embedding");
  e->set_datatype("FP32");
  e->add_shape(1);
  e->add_shape(2);
  const float values[] = {0.5f, -2.0f};
  response.add_raw_output_contents(std::string(reinterpret_cast<const char*>(values), 8));
  auto* n = response.add_outputs();
  n->set_name("num_tokens");
  n->set_datatype("INT64");
  n->add_shape(1);
  response.add_raw_output_contents(bytes_of({4}));
  return response;
}

TEST(KServeRestWrite, JsonDataInTheRequestedOrder) {
  RestInferRequest r;
  r.proto.set_id("q1");
  const Response http = write_rest_infer(r, two_outputs(), "m", "3");
  EXPECT_EQ(http.result(), bhttp::status::ok);
  EXPECT_EQ(http[bhttp::field::content_type], "application/json");
  EXPECT_EQ(http.body(), R"({"model_name":"m","model_version":"3","id":"q1","outputs":[)"
                         R"({"name":"embedding","datatype":"FP32","shape":[1,2],"data":[0.5,-2]},)"
                         R"({"name":"num_tokens","datatype":"INT64","shape":[1],"data":[4]}]})");
}

TEST(KServeRestWrite, BinaryOutputsFollowTheJson) {
  RestInferRequest r;
  r.binary_output = {false, true};  // embedding as JSON, num_tokens as bytes
  const Response http = write_rest_infer(r, two_outputs(), "m", "1");
  EXPECT_EQ(http[bhttp::field::content_type], "application/octet-stream");
  const std::string json =
      R"({"model_name":"m","model_version":"1","outputs":[)"
      R"({"name":"embedding","datatype":"FP32","shape":[1,2],"data":[0.5,-2]},)"
      R"({"name":"num_tokens","datatype":"INT64","shape":[1],"parameters":{"binary_data_size":8}}]})";
  EXPECT_EQ(http[kHeaderLength], std::to_string(json.size()));
  EXPECT_EQ(http.body(), json + bytes_of({4}));
}

}  // namespace
}  // namespace fastformer::http
