// SafetensorsFile: parsing a valid file and rejecting every kind of malformed one with a
// message that names the file and the tensor.
#include "server/engine/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>

#include "common/half.h"
#include "server/engine/error.h"
#include "tests/support/test_models.h"

namespace fastformer::engine {
namespace {

using nlohmann::json;
using test::error_of;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

class SafetensorsTest : public ::testing::Test {
 protected:
  std::filesystem::path file(const std::string& name = "model.safetensors") { return dir_ / name; }

  // The error opening `path` raises (ModelError expected).
  static std::string open_error(const std::filesystem::path& path) {
    return error_of<ModelError>([&] { SafetensorsFile f(path); });
  }

  // A header {name: {dtype, shape, data_offsets}} with one tensor.
  static std::string one_tensor(const std::string& name, const std::string& dtype,
                                const json& shape, const json& offsets) {
    return json{{name, {{"dtype", dtype}, {"shape", shape}, {"data_offsets", offsets}}}}.dump();
  }

  test::TempDir dir_;
};

TEST_F(SafetensorsTest, ValidFileParsesNamesShapesDtypesAndData) {
  std::map<std::string, test::TensorSpec> tensors;
  tensors["a.weight"] = {{2, 3}, {1, 2, 3, 4, 5, 6}, DType::kF32};
  tensors["b.half"] = {{4}, {1.0f, -2.0f, 0.5f, 65504.0f}, DType::kF16};
  tensors["c.bf16"] = {{2, 1}, {1.0f, -0.375f}, DType::kBF16};
  tensors["d.scalar"] = {{}, {7.0f}, DType::kF32};
  tensors["e.empty"] = {{0, 4}, {}, DType::kF32};
  test::write_safetensors(file(), tensors);

  SafetensorsFile f(file());
  EXPECT_EQ(f.path(), file());
  ASSERT_EQ(f.tensors().size(), 5u);  // __metadata__ is not a tensor
  EXPECT_EQ(f.find("__metadata__"), nullptr);
  EXPECT_EQ(f.find("missing"), nullptr);

  const TensorInfo* a = f.find("a.weight");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->name, "a.weight");
  EXPECT_EQ(a->dtype, DType::kF32);
  EXPECT_THAT(a->shape, ElementsAre(2, 3));
  EXPECT_EQ(a->numel(), 6);
  EXPECT_EQ(a->nbytes, 24u);
  float values[6];
  std::memcpy(values, a->data, sizeof values);
  EXPECT_THAT(values, ElementsAre(1, 2, 3, 4, 5, 6));

  const TensorInfo* b = f.find("b.half");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->dtype, DType::kF16);
  EXPECT_THAT(b->shape, ElementsAre(4));
  EXPECT_EQ(b->nbytes, 8u);
  const auto* bytes = reinterpret_cast<const unsigned char*>(b->data);
  // Little-endian half bit patterns: 0x3C00, 0xC000, 0x3800, 0x7BFF.
  EXPECT_THAT(std::vector<unsigned char>(bytes, bytes + 8),
              ElementsAre(0x00, 0x3C, 0x00, 0xC0, 0x00, 0x38, 0xFF, 0x7B));

  const TensorInfo* c = f.find("c.bf16");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->dtype, DType::kBF16);
  EXPECT_THAT(c->shape, ElementsAre(2, 1));
  const auto* cb = reinterpret_cast<const unsigned char*>(c->data);
  // 1.0 = 0x3F80, -0.375 = 0xBEC0.
  EXPECT_THAT(std::vector<unsigned char>(cb, cb + 4), ElementsAre(0x80, 0x3F, 0xC0, 0xBE));

  const TensorInfo* d = f.find("d.scalar");
  ASSERT_NE(d, nullptr);
  EXPECT_TRUE(d->shape.empty());
  EXPECT_EQ(d->numel(), 1);
  EXPECT_EQ(d->nbytes, 4u);

  const TensorInfo* e = f.find("e.empty");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->numel(), 0);
  EXPECT_EQ(e->nbytes, 0u);

  // release() only drops pages; the data must still read back afterwards.
  f.release(*a);
  std::memcpy(values, a->data, sizeof values);
  EXPECT_THAT(values, ElementsAre(1, 2, 3, 4, 5, 6));
}

TEST_F(SafetensorsTest, DTypeNamesAndSizes) {
  EXPECT_STREQ(dtype_name(DType::kF32), "F32");
  EXPECT_STREQ(dtype_name(DType::kF16), "F16");
  EXPECT_STREQ(dtype_name(DType::kBF16), "BF16");
  EXPECT_EQ(dtype_size(DType::kF32), 4u);
  EXPECT_EQ(dtype_size(DType::kF16), 2u);
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
}

TEST_F(SafetensorsTest, EmptyHeaderObjectWithNoDataIsValid) {
  test::write_safetensors_raw(file(), "{}", "");
  SafetensorsFile f(file());
  EXPECT_TRUE(f.tensors().empty());
}

TEST_F(SafetensorsTest, MissingFile) {
  const std::string msg = open_error(file("does_not_exist.safetensors"));
  EXPECT_THAT(msg, HasSubstr(file("does_not_exist.safetensors").string()));
  EXPECT_THAT(msg, HasSubstr("cannot open"));
}

TEST_F(SafetensorsTest, FileShorterThanEightBytes) {
  for (size_t n : {0u, 1u, 7u}) {
    test::write_file(file(), std::string(n, '\x01'));
    const std::string msg = open_error(file());
    EXPECT_THAT(msg, HasSubstr(file().string()));
    EXPECT_THAT(msg, HasSubstr("file is " + std::to_string(n) + " bytes"));
    EXPECT_THAT(msg, HasSubstr("too short"));
  }
}

TEST_F(SafetensorsTest, HeaderSizeLargerThanFile) {
  const std::string header = "{}";
  test::write_safetensors_raw(file(), 1000, header, "");
  std::string msg = open_error(file());
  EXPECT_THAT(msg, HasSubstr(file().string()));
  EXPECT_THAT(msg, HasSubstr("header size 1000"));
  EXPECT_THAT(msg, HasSubstr("the 2 bytes that follow"));

  // A huge size (high bytes set) must not wrap around.
  test::write_safetensors_raw(file(), 0xFFFFFFFFFFFFFFF0ull, header, "");
  msg = open_error(file());
  EXPECT_THAT(msg, HasSubstr("header size 18446744073709551600"));

  // One byte too many.
  test::write_safetensors_raw(file(), 3, header, "");
  EXPECT_THAT(open_error(file()), HasSubstr("header size 3 exceeds"));
}

TEST_F(SafetensorsTest, HeaderNotJson) {
  test::write_safetensors_raw(file(), "{\"a\": ", "");
  std::string msg = open_error(file());
  EXPECT_THAT(msg, HasSubstr(file().string()));
  EXPECT_THAT(msg, HasSubstr("header is not valid JSON"));

  test::write_safetensors_raw(file(), "not json at all", "");
  EXPECT_THAT(open_error(file()), HasSubstr("header is not valid JSON"));
}

TEST_F(SafetensorsTest, HeaderNotAnObject) {
  for (const char* header : {"[1, 2, 3]", "42", "\"text\"", "null"}) {
    test::write_safetensors_raw(file(), header, "");
    const std::string msg = open_error(file());
    EXPECT_THAT(msg, HasSubstr(file().string())) << header;
    EXPECT_THAT(msg, HasSubstr("header is not a JSON object")) << header;
  }
}

TEST_F(SafetensorsTest, EntryNotAnObjectOrMissingFields) {
  test::write_safetensors_raw(file(), R"({"t": [1, 2]})", "");
  EXPECT_THAT(open_error(file()), HasSubstr("tensor \"t\": entry is not a JSON object"));

  test::write_safetensors_raw(file(), R"({"t": {"shape": [1], "data_offsets": [0, 4]}})",
                              std::string(4, '\0'));
  EXPECT_THAT(open_error(file()), HasSubstr("tensor \"t\": missing \"dtype\""));

  test::write_safetensors_raw(file(), R"({"t": {"dtype": "F32", "data_offsets": [0, 4]}})",
                              std::string(4, '\0'));
  EXPECT_THAT(open_error(file()), HasSubstr("tensor \"t\": missing \"shape\""));

  test::write_safetensors_raw(file(),
                              R"({"t": {"dtype": "F32", "shape": [1], "data_offsets": [0]}})",
                              std::string(4, '\0'));
  EXPECT_THAT(open_error(file()), HasSubstr("tensor \"t\": missing \"data_offsets\""));
}

TEST_F(SafetensorsTest, UnsupportedDtype) {
  for (const char* dtype : {"F64", "I32", "I64", "U8", "f32"}) {
    test::write_safetensors_raw(file(), one_tensor("layer.weight", dtype, {2}, {0, 16}),
                                std::string(16, '\0'));
    const std::string msg = open_error(file());
    EXPECT_THAT(msg, HasSubstr(file().string())) << dtype;
    EXPECT_THAT(msg, HasSubstr("tensor \"layer.weight\"")) << dtype;
    EXPECT_THAT(msg, HasSubstr(std::string("unsupported dtype \"") + dtype + "\"")) << dtype;
    EXPECT_THAT(msg, HasSubstr("F32, F16 or BF16")) << dtype;
  }
}

TEST_F(SafetensorsTest, ShapeByteCountMismatch) {
  // [2, 3] F32 needs 24 bytes; the offsets span 20.
  test::write_safetensors_raw(file(), one_tensor("w", "F32", {2, 3}, {0, 20}),
                              std::string(24, '\0'));
  std::string msg = open_error(file());
  EXPECT_THAT(msg, HasSubstr(file().string()));
  EXPECT_THAT(msg, HasSubstr("tensor \"w\""));
  EXPECT_THAT(msg, HasSubstr("span 20 bytes"));
  EXPECT_THAT(msg, HasSubstr("shape [2,3] of F32 needs 24"));

  // Same span as F16 would need 12.
  test::write_safetensors_raw(file(), one_tensor("w", "F16", {2, 3}, {0, 24}),
                              std::string(24, '\0'));
  msg = open_error(file());
  EXPECT_THAT(msg, HasSubstr("span 24 bytes"));
  EXPECT_THAT(msg, HasSubstr("of F16 needs 12"));
}

TEST_F(SafetensorsTest, NegativeOrNonIntegerShape) {
  test::write_safetensors_raw(file(), one_tensor("w", "F32", {-1, 4}, {0, 16}),
                              std::string(16, '\0'));
  std::string msg = open_error(file());
  EXPECT_THAT(msg, HasSubstr("tensor \"w\""));
  EXPECT_THAT(msg, HasSubstr("shape entries must be non-negative integers, found -1"));

  test::write_safetensors_raw(file(), one_tensor("w", "F32", {2.5}, {0, 8}), std::string(8, '\0'));
  EXPECT_THAT(open_error(file()), HasSubstr("shape entries must be non-negative integers"));
}

TEST_F(SafetensorsTest, HugeShapeIsRejectedWithoutOverflow) {
  // 2^32 * 2^32 elements would wrap a 64-bit product to 0.
  test::write_safetensors_raw(file(),
                              one_tensor("w", "F32", {4294967296ull, 4294967296ull}, {0, 0}), "");
  const std::string msg = open_error(file());
  EXPECT_THAT(msg, HasSubstr("tensor \"w\""));
  EXPECT_THAT(msg, HasSubstr("too large"));
}

TEST_F(SafetensorsTest, DataOffsetsBeyondTheData) {
  test::write_safetensors_raw(file(), one_tensor("big", "F32", {4}, {0, 16}),
                              std::string(12, '\0'));
  const std::string msg = open_error(file());
  EXPECT_THAT(msg, HasSubstr(file().string()));
  EXPECT_THAT(msg, HasSubstr("tensor \"big\""));
  EXPECT_THAT(msg, HasSubstr("data_offsets [0,16] lie outside the 12 data bytes"));
}

TEST_F(SafetensorsTest, DataOffsetsBeginAfterEnd) {
  test::write_safetensors_raw(file(), one_tensor("rev", "F32", {1}, {8, 4}), std::string(16, '\0'));
  const std::string msg = open_error(file());
  EXPECT_THAT(msg, HasSubstr("tensor \"rev\""));
  EXPECT_THAT(msg, HasSubstr("data_offsets [8,4]"));
}

TEST_F(SafetensorsTest, DataOffsetsNotNonNegativeIntegers) {
  test::write_safetensors_raw(file(), one_tensor("neg", "F32", {1}, {-4, 0}), std::string(4, '\0'));
  EXPECT_THAT(open_error(file()),
              HasSubstr("tensor \"neg\": data_offsets must be non-negative integers"));
}

TEST_F(SafetensorsTest, OverlappingTensorsNameBoth) {
  const json header = {
      {"first.weight", {{"dtype", "F32"}, {"shape", {4}}, {"data_offsets", {0, 16}}}},
      {"second.weight", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {8, 16}}}},
  };
  test::write_safetensors_raw(file(), header.dump(), std::string(16, '\0'));
  const std::string msg = open_error(file());
  EXPECT_THAT(msg, HasSubstr(file().string()));
  EXPECT_THAT(msg, HasSubstr("\"first.weight\""));
  EXPECT_THAT(msg, HasSubstr("\"second.weight\""));
  EXPECT_THAT(msg, HasSubstr("overlap"));
}

TEST_F(SafetensorsTest, IdenticalRangesOverlap) {
  const json header = {
      {"x", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {0, 8}}}},
      {"y", {{"dtype", "F16"}, {"shape", {4}}, {"data_offsets", {0, 8}}}},
  };
  test::write_safetensors_raw(file(), header.dump(), std::string(8, '\0'));
  const std::string msg = open_error(file());
  EXPECT_THAT(msg, HasSubstr(file().string()));
  EXPECT_THAT(msg, HasSubstr("overlap"));
}

// Disabled: safetensors.cc keys range_owner by (begin, end), so two tensors with the same
// range overwrite each other and the message reads 'tensors "y" and "y" overlap'.
TEST_F(SafetensorsTest, IdenticalRangesNameBothTensors) {
  const json header = {
      {"x", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {0, 8}}}},
      {"y", {{"dtype", "F16"}, {"shape", {4}}, {"data_offsets", {0, 8}}}},
  };
  test::write_safetensors_raw(file(), header.dump(), std::string(8, '\0'));
  const std::string msg = open_error(file());
  EXPECT_THAT(msg, HasSubstr("\"x\""));
  EXPECT_THAT(msg, HasSubstr("\"y\""));
}

TEST_F(SafetensorsTest, AdjacentAndEmptyTensorsDoNotOverlap) {
  const json header = {
      {"a", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {0, 8}}}},
      {"b", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {8, 16}}}},
      {"empty", {{"dtype", "F32"}, {"shape", {0}}, {"data_offsets", {4, 4}}}},
      {"__metadata__", {{"format", "pt"}}},
  };
  test::write_safetensors_raw(file(), header.dump(), std::string(16, '\0'));
  SafetensorsFile f(file());
  EXPECT_EQ(f.tensors().size(), 3u);
}

}  // namespace
}  // namespace fastformer::engine
