#include "server/request/quantize.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

namespace fastformer::request {

const char* embedding_type_name(EmbeddingType type) {
  switch (type) {
    case EmbeddingType::kFloat:
      return "float";
    case EmbeddingType::kInt8:
      return "int8";
    case EmbeddingType::kUint8:
      return "uint8";
    case EmbeddingType::kBinary:
      return "binary";
    case EmbeddingType::kUbinary:
      return "ubinary";
  }
  return "float";
}

std::optional<EmbeddingType> parse_embedding_type(std::string_view name) {
  for (EmbeddingType type : {EmbeddingType::kFloat, EmbeddingType::kInt8, EmbeddingType::kUint8,
                             EmbeddingType::kBinary, EmbeddingType::kUbinary}) {
    if (name == embedding_type_name(type)) return type;
  }
  return std::nullopt;
}

const char* embedding_type_names() {
  return "\"float\", \"int8\", \"uint8\", \"binary\" or \"ubinary\"";
}

std::optional<EmbeddingFormat> parse_embedding_format(std::string_view name) {
  if (name == "base64") return EmbeddingFormat{"base64", EmbeddingType::kFloat, true};
  const auto type = parse_embedding_type(name);
  if (!type) return std::nullopt;
  return EmbeddingFormat{std::string(name), *type, false};
}

const char* embedding_format_names() {
  return "\"float\", \"int8\", \"uint8\", \"binary\", \"ubinary\" or \"base64\"";
}

size_t embedding_type_bytes(EmbeddingType type, size_t dims) {
  switch (type) {
    case EmbeddingType::kFloat:
      return dims * sizeof(float);
    case EmbeddingType::kInt8:
    case EmbeddingType::kUint8:
      return dims;
    case EmbeddingType::kBinary:
    case EmbeddingType::kUbinary:
      return (dims + 7) / 8;
  }
  return 0;
}

const QuantizationRange* Quantization::find(int64_t dims, bool normalized) const {
  for (const QuantizationRange& r : ranges)
    if (r.dims == dims && r.normalized == normalized) return &r;
  return nullptr;
}

std::optional<std::string> check_embedding_type(EmbeddingType type, int64_t dims, bool normalized,
                                                const Quantization* quantization,
                                                const std::string& expected_file) {
  const std::string name = embedding_type_name(type);
  switch (type) {
    case EmbeddingType::kFloat:
      return std::nullopt;
    case EmbeddingType::kBinary:
    case EmbeddingType::kUbinary:
      if (dims % 8 != 0) {
        return "embedding type " + name +
               " packs 8 dimensions a byte and needs a dimension count that is a multiple of 8, "
               "got " +
               std::to_string(dims) + " (choose dimensions accordingly)";
      }
      return std::nullopt;
    case EmbeddingType::kInt8:
    case EmbeddingType::kUint8: {
      const std::string shape =
          std::to_string(dims) + " dimensions" + (normalized ? ", normalised" : ", not normalised");
      if (quantization == nullptr) {
        return "embedding type " + name + " needs calibrated ranges, and this model version has " +
               "none: no " + expected_file +
               " (write it with tools/calibrate_quantization.py); binary and ubinary need none";
      }
      if (quantization->find(dims, normalized) == nullptr) {
        std::string have;
        for (const QuantizationRange& r : quantization->ranges) {
          have += (have.empty() ? "" : ", ") + std::to_string(r.dims) +
                  (r.normalized ? "" : " (not normalised)");
        }
        return "embedding type " + name + " needs calibrated ranges for " + shape + ", and " +
               quantization->file +
               " has none for them (it has: " + (have.empty() ? std::string("none") : have) +
               "; calibrate them with tools/calibrate_quantization.py --dimensions " +
               std::to_string(dims) + ")";
      }
      return std::nullopt;
    }
  }
  return std::nullopt;
}

void quantize_embedding(EmbeddingType type, std::span<const float> embedding,
                        const QuantizationRange* range, std::vector<uint8_t>* out) {
  const size_t dims = embedding.size();
  switch (type) {
    case EmbeddingType::kFloat: {
      static_assert(std::endian::native == std::endian::little);
      const size_t at = out->size();
      out->resize(at + dims * sizeof(float));
      if (dims > 0) std::memcpy(out->data() + at, embedding.data(), dims * sizeof(float));
      return;
    }
    case EmbeddingType::kBinary:
    case EmbeddingType::kUbinary: {
      for (size_t j = 0; j < dims; j += 8) {
        unsigned byte = 0;
        for (size_t b = 0; b < 8; ++b) {
          byte <<= 1;
          if (j + b < dims && embedding[j + b] > 0.0f) byte |= 1u;
        }
        // binary: the byte - 128 as int8, whose two's-complement bits are the byte's with the
        // top bit flipped.
        out->push_back(static_cast<uint8_t>(type == EmbeddingType::kBinary ? byte ^ 0x80u : byte));
      }
      return;
    }
    case EmbeddingType::kInt8:
    case EmbeddingType::kUint8: {
      // float32 throughout, as numpy computes it on float32 arrays: the step (max - min) / 255
      // (1 where that is 0), q = floor((x - min) / step) clipped to [0, 255]; int8 is q - 128.
      for (size_t j = 0; j < dims; ++j) {
        const float lo = range->min[j], hi = range->max[j];
        float step = (hi - lo) / 255.0f;
        if (step == 0.0f) step = 1.0f;
        float q = std::floor((embedding[j] - lo) / step);
        if (!(q == q)) q = 0.0f;  // a NaN value (never a model's output): the range's start
        const int u = static_cast<int>(std::clamp(q, 0.0f, 255.0f));
        out->push_back(type == EmbeddingType::kUint8
                           ? static_cast<uint8_t>(u)
                           : static_cast<uint8_t>(static_cast<int8_t>(u - 128)));
      }
      return;
    }
  }
}

}  // namespace fastformer::request
