// Test helpers: temporary directories, safetensors writers (well-formed and arbitrary, for
// the malformed cases) and random tiny Fastformer model directories (docs/model-format.md,
// "Tensor names").
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/engine/safetensors.h"

namespace fastformer::test {

// A fresh directory under the system temp dir, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

// Writes `bytes` to `path` as they are.
void write_file(const std::filesystem::path& path, const std::string& bytes);

// Writes a safetensors file from its parts: the 8-byte little-endian `header_size` (as
// given, so it may lie), the header text and the data bytes.
void write_safetensors_raw(const std::filesystem::path& path, uint64_t header_size,
                           const std::string& header, const std::string& data);
// The same with the true header size.
void write_safetensors_raw(const std::filesystem::path& path, const std::string& header,
                           const std::string& data);

// One tensor as it goes into a file: values are encoded in `dtype`.
struct TensorSpec {
  std::vector<int64_t> shape;
  std::vector<float> values;  ///< row-major, numel(shape) values
  engine::DType dtype = engine::DType::kF32;
};

// The little-endian bytes of `values` in `dtype` (F16/BF16 round to nearest even).
std::string encode_values(const std::vector<float>& values, engine::DType dtype);

// Writes a well-formed safetensors file: tensors packed in name order, header padded with
// spaces to a multiple of 8 (as the safetensors library does) unless `align` is false,
// "__metadata__" {"format": "pt"}.
void write_safetensors(const std::filesystem::path& path,
                       const std::map<std::string, TensorSpec>& tensors, bool align = true);

struct TinyModelSpec {
  int64_t hidden = 32;  ///< D
  int64_t heads = 4;    ///< H
  int64_t layers = 2;
  int64_t intermediate = 48;  ///< I
  int64_t max_positions = 64;
  int64_t vocab = 100;
  std::string activation = "gelu";
  int32_t pad_token_id = 0;
  double layer_norm_eps = 1e-12;
  int64_t num_labels = 0;      ///< > 0: a dense_linear head with this many outputs
  bool word_embedding = true;  ///< write word_embedding.weight
  bool shared_layers = false;  ///< share_layer_parameters: only layer 0 stored
  bool bare = false;           ///< names without the "fastformer_model." prefix
  engine::DType dtype = engine::DType::kF32;
  uint64_t seed = 1;
};

// Two layers of base-long's shape (hidden 768, 12 heads, intermediate 3,072), 1,024 positions,
// 512 ids and a 4-label head: the real model's launch configurations and vector widths at a
// test's cost (the emulated and the GPU base-long parity tests).
TinyModelSpec base_long_two_layers();

// A model's config.json and its tensors. Values are already rounded to the storage dtype,
// so the loaded float32 weights equal them exactly.
struct TinyModel {
  nlohmann::json config;
  std::map<std::string, TensorSpec> tensors;
};

// Random weights for every tensor name of docs/model-format.md ("Tensor names") that `spec` calls
// for.
TinyModel make_tiny_model(const TinyModelSpec& spec);

// Writes dir/config.json and dir/model.safetensors (creating dir).
void write_model(const std::filesystem::path& dir, const TinyModel& model);

// make_tiny_model + write_model into a new directory `name` under `root`; returns it.
std::filesystem::path write_tiny_model(const std::filesystem::path& root, const std::string& name,
                                       const TinyModelSpec& spec);

// Rounds `value` through the storage dtype (identity for F32).
float round_to_dtype(float value, engine::DType dtype);

// Runs `fn` and returns the what() of the `Error` it throws, or "<no exception>".
template <class Error, class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no exception>";
}

}  // namespace fastformer::test
