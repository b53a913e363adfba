// Quantized embeddings (docs/api.md, "Embedding types"): the types vector stores keep, as
// sentence-transformers' quantize_embeddings defines them, made once here for every protocol
// from the finished float embedding (after `dimensions` and the normalisation).
//
// - float: the float32 values (what every API answered before).
// - binary / ubinary: one bit per dimension, set where the value is > 0, packed eight to a byte
//   with the first dimension in the byte's most significant bit (numpy.packbits); ubinary is
//   the byte, binary the byte - 128 as int8. The dimension count must be a multiple of 8.
// - uint8 / int8: per-dimension ranges [min, max] calibrated on the model's own output (the
//   version's quantization.json, written by tools/calibrate_quantization.py), in 255 steps:
//   q = floor((x - min) / step), step = (max - min) / 255 (1 where max = min), in float32 and
//   clipped to [0, 255]; uint8 is q, int8 is q - 128. That is sentence-transformers 6.x's rule
//   (util/quantization.py), values outside the range included; older releases cast
//   without the floor and the clip (int8 truncated q - 128 toward zero, and a value outside
//   the range wrapped around).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace fastformer::request {

enum class EmbeddingType { kFloat, kInt8, kUint8, kBinary, kUbinary };

// "float", "int8", "uint8", "binary", "ubinary".
const char* embedding_type_name(EmbeddingType type);
// The type a name denotes (the names above), or nothing.
std::optional<EmbeddingType> parse_embedding_type(std::string_view name);
// "\"float\", \"int8\", \"uint8\", \"binary\" or \"ubinary\"": for the refusals.
const char* embedding_type_names();

// An embedding type as the JSON APIs name it (OpenAI's and Jina's embedding_type, Cohere's
// embedding_types): one of the names above, or "base64", the float32 values' bytes in base64.
// `base64` also stands for OpenAI's encoding_format "base64" (any type's bytes in base64).
struct EmbeddingFormat {
  std::string name;
  EmbeddingType type = EmbeddingType::kFloat;
  bool base64 = false;
};
// The format a name denotes, or nothing.
std::optional<EmbeddingFormat> parse_embedding_format(std::string_view name);
// embedding_type_names() and "base64": for the refusals.
const char* embedding_format_names();
// Bytes a `dims`-dimensional embedding takes in the type (float: 4 per dimension).
size_t embedding_type_bytes(EmbeddingType type, size_t dims);
// Whether the type's values are signed (int8, binary).
inline bool embedding_type_signed(EmbeddingType type) {
  return type == EmbeddingType::kInt8 || type == EmbeddingType::kBinary;
}

// One output's calibrated ranges: `dims` dimensions, for embeddings normalised or not.
struct QuantizationRange {
  int64_t dims = 0;
  bool normalized = true;
  std::vector<float> min, max;  ///< dims values each, min <= max
};

// The ranges of one model version (its quantization.json), one per output shape.
struct Quantization {
  std::string file;  ///< where they were read from, for the refusals
  std::vector<QuantizationRange> ranges;
  const QuantizationRange* find(int64_t dims, bool normalized) const;
};

// Why `type` cannot be answered for embeddings of `dims` dimensions (normalised or not) with
// `quantization` (null: the version has no quantization.json, whose expected path is
// `expected_file`): "embedding type binary needs a dimension count that is a multiple of 8, got
// 100"; nothing when it can.
std::optional<std::string> check_embedding_type(EmbeddingType type, int64_t dims, bool normalized,
                                                const Quantization* quantization,
                                                const std::string& expected_file);

// Appends `embedding` in `type` to `out` (float: its float32 bytes, little-endian). `range`:
// the calibrated range for int8 and uint8 (check_embedding_type found it); unused otherwise.
void quantize_embedding(EmbeddingType type, std::span<const float> embedding,
                        const QuantizationRange* range, std::vector<uint8_t>* out);

}  // namespace fastformer::request
