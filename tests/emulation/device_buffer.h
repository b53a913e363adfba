// A typed ff_malloc allocation for the tests, with synchronous upload and download.
#pragma once

#include <cstddef>
#include <vector>

#include "kernels/runtime.h"

namespace fastformer::emulation_test {

template <class T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t count)
      : count_(count), data_(static_cast<T*>(ff_malloc(count * sizeof(T)))) {}
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  ~DeviceBuffer() { ff_free(data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return data_; }
  std::size_t size() const { return count_; }
  std::size_t bytes() const { return count_ * sizeof(T); }

  void upload(const std::vector<T>& host) {
    ff_memcpy_async(data_, host.data(), bytes(), ff_host_to_device, nullptr);
    ff_stream_synchronize(nullptr);
  }
  void fill_zero() {
    ff_memset_async(data_, 0, bytes(), nullptr);
    ff_stream_synchronize(nullptr);
  }
  std::vector<T> download() const {
    std::vector<T> host(count_);
    ff_memcpy_async(host.data(), data_, bytes(), ff_device_to_host, nullptr);
    ff_stream_synchronize(nullptr);
    return host;
  }

 private:
  std::size_t count_;
  T* data_;
};

}  // namespace fastformer::emulation_test
