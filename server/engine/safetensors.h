// A memory-mapped, validated safetensors file.
//
// Layout: 8-byte little-endian header size N, N bytes of JSON
// ({"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}),
// then the data; offsets are relative to the end of the header. Opening validates the
// whole header: size within the file, valid JSON, known dtypes, byte counts that match
// the shapes, offsets inside the data and not overlapping. Every failure throws ModelError
// naming the file and the tensor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace fastformer::engine {

enum class DType { kF32, kF16, kBF16 };

const char* dtype_name(DType dtype);  // "F32", "F16", "BF16" as safetensors spells them
size_t dtype_size(DType dtype);

struct TensorInfo {
  std::string name;                 ///< the state_dict name
  DType dtype = DType::kF32;        ///< element type as stored
  std::vector<int64_t> shape;       ///< dimensions, outermost first
  const std::byte* data = nullptr;  ///< first byte, inside the mapping
  size_t nbytes = 0;                ///< element count times element size
  int64_t numel() const;
};

class SafetensorsFile {
 public:
  // Maps and validates `path`. Throws ModelError.
  explicit SafetensorsFile(const std::filesystem::path& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find(const std::string& name) const;

  // Tells the kernel a tensor's pages are no longer needed (after converting a copy), so
  // they leave the resident set. The mapping stays valid and re-reads from the file.
  void release(const TensorInfo& tensor) const;

 private:
  std::filesystem::path path_;
  void* mapping_ = nullptr;
  size_t file_size_ = 0;
  std::map<std::string, TensorInfo> tensors_;
};

}  // namespace fastformer::engine
