// The embedding types (server/request/quantize.h) on hand-computed cases: sentence-transformers'
// quantize_embeddings rules worked out by hand here (numpy.packbits' bit order, the float32
// steps and the floor), the clipping outside the calibrated range, and every
// refusal's wording. The server's answers are checked against sentence-transformers' own formula
// on the demo model's embeddings in tests/http/test_embedding_types.py.
#include "server/request/quantize.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace fastformer::request {
namespace {

std::vector<uint8_t> quantize(EmbeddingType type, const std::vector<float>& e,
                              const QuantizationRange* range = nullptr) {
  std::vector<uint8_t> out;
  quantize_embedding(type, e, range, &out);
  return out;
}

TEST(EmbeddingTypes, NamesRoundTrip) {
  for (EmbeddingType t : {EmbeddingType::kFloat, EmbeddingType::kInt8, EmbeddingType::kUint8,
                          EmbeddingType::kBinary, EmbeddingType::kUbinary}) {
    EXPECT_EQ(parse_embedding_type(embedding_type_name(t)), t);
  }
  EXPECT_FALSE(parse_embedding_type("int4"));
  EXPECT_FALSE(parse_embedding_type("Float"));
  EXPECT_EQ(embedding_type_bytes(EmbeddingType::kFloat, 768), 3072u);
  EXPECT_EQ(embedding_type_bytes(EmbeddingType::kInt8, 768), 768u);
  EXPECT_EQ(embedding_type_bytes(EmbeddingType::kUbinary, 768), 96u);
}

// numpy.packbits([x > 0]): the first dimension is the most significant bit.
TEST(EmbeddingTypes, BinaryPacksTheSignsMostSignificantBitFirst) {
  const std::vector<float> e = {
      0.5f,  -1.0f, 0.0f,  2.0f,  1e-30f, -0.0f, -3.0f, 7.0f,   // 1001 1001
      -1.0f, -1.0f, -1.0f, -1.0f, -1.0f,  -1.0f, -1.0f, 0.1f};  // 0000 0001
  EXPECT_EQ(quantize(EmbeddingType::kUbinary, e), (std::vector<uint8_t>{0x99, 0x01}));
  // binary: the byte - 128 as int8: 153 - 128 = 25, 1 - 128 = -127.
  const std::vector<uint8_t> b = quantize(EmbeddingType::kBinary, e);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(static_cast<int8_t>(b[0]), 25);
  EXPECT_EQ(static_cast<int8_t>(b[1]), -127);
  // All positive: 255 - 128 = 127; none: 0 - 128 = -128.
  EXPECT_EQ(static_cast<int8_t>(quantize(EmbeddingType::kBinary, std::vector<float>(8, 1.0f))[0]),
            127);
  EXPECT_EQ(static_cast<int8_t>(quantize(EmbeddingType::kBinary, std::vector<float>(8, -1.0f))[0]),
            -128);
}

// Range [-1, 1]: step = float32(2 / 255); q = floor((x + 1) / step), as numpy computes it in
// float32 (the values sentence-transformers 6.3.0's quantize_embeddings gives for these ranges).
TEST(EmbeddingTypes, Uint8AndInt8AreTheFlooredSteps) {
  const QuantizationRange range{4, true, {-1.0f, -1.0f, -1.0f, 0.0f}, {1.0f, 1.0f, 1.0f, 0.5f}};
  const std::vector<float> e = {-1.0f, 0.0f, 1.0f, 0.25f};
  // 0 / step = 0; 1 / step = 127.49999 -> 127; 2 / step = 254.99998 -> 254 (the range's top is
  // 254, not 255: float32(2 / 255) rounds up); 0.25 / float32(0.5 / 255) = 127.49999 -> 127.
  EXPECT_EQ(quantize(EmbeddingType::kUint8, e, &range), (std::vector<uint8_t>{0, 127, 254, 127}));
  // int8: q - 128.
  const std::vector<uint8_t> i = quantize(EmbeddingType::kInt8, e, &range);
  ASSERT_EQ(i.size(), 4u);
  EXPECT_EQ(static_cast<int8_t>(i[0]), -128);
  EXPECT_EQ(static_cast<int8_t>(i[1]), -1);
  EXPECT_EQ(static_cast<int8_t>(i[2]), 126);
  EXPECT_EQ(static_cast<int8_t>(i[3]), -1);
}

// Outside the calibrated range q is clipped to [0, 255] (as sentence-transformers 6 does; older
// releases wrapped such values around); a range of one value steps by 1.
TEST(EmbeddingTypes, ValuesOutsideTheRangeAreClipped) {
  const QuantizationRange range{2, true, {0.0f, 0.0f}, {1.0f, 1.0f}};
  EXPECT_EQ(quantize(EmbeddingType::kUint8, {-5.0f, 9.0f}, &range), (std::vector<uint8_t>{0, 255}));
  const std::vector<uint8_t> i = quantize(EmbeddingType::kInt8, {-5.0f, 9.0f}, &range);
  EXPECT_EQ(static_cast<int8_t>(i[0]), -128);
  EXPECT_EQ(static_cast<int8_t>(i[1]), 127);
  const QuantizationRange flat{2, true, {0.5f, 0.5f}, {0.5f, 0.5f}};
  EXPECT_EQ(quantize(EmbeddingType::kUint8, {0.5f, 2.7f}, &flat), (std::vector<uint8_t>{0, 2}));
}

TEST(EmbeddingTypes, FloatIsTheLittleEndianFloat32Bytes) {
  EXPECT_EQ(quantize(EmbeddingType::kFloat, {1.0f, -2.0f}),
            (std::vector<uint8_t>{0, 0, 0x80, 0x3f, 0, 0, 0, 0xc0}));
}

TEST(EmbeddingTypes, RefusalsNameTheLimitAndTheFile) {
  Quantization q;
  q.file = "/models/m/1/quantization.json";
  q.ranges.push_back({768, true, std::vector<float>(768, -1.0f), std::vector<float>(768, 1.0f)});
  EXPECT_FALSE(check_embedding_type(EmbeddingType::kFloat, 100, true, nullptr, "x"));
  EXPECT_FALSE(check_embedding_type(EmbeddingType::kUbinary, 96, true, nullptr, "x"));
  const auto binary = check_embedding_type(EmbeddingType::kBinary, 100, true, nullptr, "x");
  ASSERT_TRUE(binary);
  EXPECT_NE(binary->find("multiple of 8, got 100"), std::string::npos) << *binary;
  const auto none = check_embedding_type(EmbeddingType::kInt8, 768, true, nullptr,
                                         "/models/m/2/quantization.json");
  ASSERT_TRUE(none);
  EXPECT_NE(none->find("no /models/m/2/quantization.json"), std::string::npos) << *none;
  EXPECT_FALSE(check_embedding_type(EmbeddingType::kInt8, 768, true, &q, q.file));
  const auto other = check_embedding_type(EmbeddingType::kUint8, 256, true, &q, q.file);
  ASSERT_TRUE(other);
  EXPECT_NE(other->find("256 dimensions"), std::string::npos) << *other;
  EXPECT_NE(other->find(q.file), std::string::npos) << *other;
  EXPECT_NE(other->find("it has: 768"), std::string::npos) << *other;
  const auto raw = check_embedding_type(EmbeddingType::kUint8, 768, false, &q, q.file);
  ASSERT_TRUE(raw);
  EXPECT_NE(raw->find("not normalised"), std::string::npos) << *raw;
}

}  // namespace
}  // namespace fastformer::request
