#include "server/engine/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <tuple>
#include <utility>

#include "server/engine/error.h"

namespace fastformer::engine {
namespace {

using nlohmann::json;

// Largest header we accept: the format's own reference implementation caps it at 100 MB.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

bool parse_dtype(const std::string& s, DType* out) {
  if (s == "F32")
    *out = DType::kF32;
  else if (s == "F16")
    *out = DType::kF16;
  else if (s == "BF16")
    *out = DType::kBF16;
  else
    return false;
  return true;
}

}  // namespace

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
  }
  return "?";
}

size_t dtype_size(DType dtype) { return dtype == DType::kF32 ? 4 : 2; }

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

SafetensorsFile::SafetensorsFile(const std::filesystem::path& path) : path_(path) {
  const std::string file = path.string();
  auto fail = [&](const std::string& what) -> void { throw ModelError(file + ": " + what); };

  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail(std::string("cannot stat: ") + std::strerror(err));
  }
  file_size_ = static_cast<size_t>(st.st_size);
  if (file_size_ < 8) {
    ::close(fd);
    fail("file is " + std::to_string(file_size_) +
         " bytes, too short for the 8-byte header size of a safetensors file");
  }
  mapping_ = ::mmap(nullptr, file_size_, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_err = errno;
  ::close(fd);
  if (mapping_ == MAP_FAILED) {
    mapping_ = nullptr;
    fail(std::string("cannot mmap: ") + std::strerror(map_err));
  }

  try {
    const auto* base = static_cast<const std::byte*>(mapping_);
    uint64_t header_size = 0;
    for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | static_cast<uint8_t>(base[i]);
    if (header_size > file_size_ - 8) {
      fail("header size " + std::to_string(header_size) + " exceeds the " +
           std::to_string(file_size_ - 8) + " bytes that follow it in the file");
    }
    if (header_size > kMaxHeaderBytes) {
      fail("header size " + std::to_string(header_size) + " exceeds the limit of " +
           std::to_string(kMaxHeaderBytes) + " bytes");
    }
    const std::string_view header_text(reinterpret_cast<const char*>(base + 8), header_size);
    json header;
    try {
      header = json::parse(header_text);
    } catch (const json::exception& e) {  // parse_error, or out_of_range (number overflow)
      fail(std::string("header is not valid JSON: ") + e.what());
    }
    if (!header.is_object()) fail("header is not a JSON object");

    const std::byte* data = base + 8 + header_size;
    const size_t data_size = file_size_ - 8 - header_size;
    struct Range {
      size_t begin, end;
      std::string name;
      bool operator<(const Range& o) const {
        return std::tie(begin, end) < std::tie(o.begin, o.end);
      }
    };
    std::vector<Range> ranges;  // every non-empty tensor's bytes

    for (const auto& [name, entry] : header.items()) {
      if (name == "__metadata__") continue;
      const std::string where = "tensor \"" + name + "\": ";
      if (!entry.is_object()) fail(where + "entry is not a JSON object");
      if (!entry.contains("dtype") || !entry["dtype"].is_string())
        fail(where + "missing \"dtype\"");
      if (!entry.contains("shape") || !entry["shape"].is_array()) fail(where + "missing \"shape\"");
      if (!entry.contains("data_offsets") || !entry["data_offsets"].is_array() ||
          entry["data_offsets"].size() != 2) {
        fail(where + "missing \"data_offsets\" [begin, end]");
      }
      TensorInfo t;
      t.name = name;
      const std::string dtype = entry["dtype"].get<std::string>();
      if (!parse_dtype(dtype, &t.dtype)) {
        fail(where + "unsupported dtype \"" + dtype + "\" (expected F32, F16 or BF16)");
      }
      uint64_t numel = 1;
      for (const json& d : entry["shape"]) {
        if (!d.is_number_unsigned())
          fail(where + "shape entries must be non-negative integers, found " + d.dump());
        const uint64_t dim = d.get<uint64_t>();
        if (dim != 0 && numel > (uint64_t{1} << 40) / dim)
          fail(where + "shape " + entry["shape"].dump() + " is too large");
        numel *= dim;
        t.shape.push_back(static_cast<int64_t>(dim));
      }
      const json& off = entry["data_offsets"];
      if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
        fail(where + "data_offsets must be non-negative integers, found " + off.dump());
      }
      const uint64_t begin = off[0].get<uint64_t>();
      const uint64_t end = off[1].get<uint64_t>();
      if (begin > end || end > data_size) {
        fail(where + "data_offsets " + off.dump() + " lie outside the " +
             std::to_string(data_size) + " data bytes");
      }
      const uint64_t expected = numel * dtype_size(t.dtype);
      if (end - begin != expected) {
        fail(where + "data_offsets " + off.dump() + " span " + std::to_string(end - begin) +
             " bytes, but shape " + entry["shape"].dump() + " of " + dtype + " needs " +
             std::to_string(expected));
      }
      t.data = data + begin;
      t.nbytes = static_cast<size_t>(expected);
      if (expected > 0) ranges.push_back(Range{begin, end, name});
      tensors_.emplace(name, std::move(t));
    }
    std::sort(ranges.begin(), ranges.end());
    for (size_t i = 1; i < ranges.size(); ++i) {
      if (ranges[i].begin < ranges[i - 1].end) {
        fail("tensors \"" + ranges[i - 1].name + "\" and \"" + ranges[i].name +
             "\" overlap in the data section");
      }
    }
  } catch (...) {
    ::munmap(mapping_, file_size_);
    mapping_ = nullptr;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_ != nullptr) ::munmap(mapping_, file_size_);
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  const auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

void SafetensorsFile::release(const TensorInfo& tensor) const {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  auto begin = reinterpret_cast<uintptr_t>(tensor.data);
  auto end = begin + tensor.nbytes;
  begin = (begin + page - 1) / page * page;  // only whole pages inside the tensor
  end = end / page * page;
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

}  // namespace fastformer::engine
