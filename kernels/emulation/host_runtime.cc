// Emulated device memory, copies and streams (see host_runtime.h).
#include "kernels/emulation/host_runtime.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>

namespace {

constexpr std::size_t kDeviceAlignment = 256;  // what cudaMalloc guarantees

// Device allocations by start address, so a copy can check its device side.
struct DeviceAllocations {
  std::mutex mutex;
  std::map<std::uintptr_t, std::size_t> bytes_at;
};
DeviceAllocations& device_allocations() {
  static DeviceAllocations allocations;
  return allocations;
}

void* allocate_poisoned(std::size_t bytes) {
  void* p = ::operator new (bytes, std::align_val_t{kDeviceAlignment});
  std::memset(p, 0xff, bytes);  // undefined until written; a float NaN
  return p;
}

// Whether [p, p + bytes) lies inside one device allocation.
bool is_device_range(const void* p, std::size_t bytes) {
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  DeviceAllocations& allocations = device_allocations();
  const std::lock_guard lock(allocations.mutex);
  auto it = allocations.bytes_at.upper_bound(address);
  if (it == allocations.bytes_at.begin()) return false;
  --it;
  return address - it->first <= it->second && bytes <= it->second - (address - it->first);
}

// Whether p points at a byte of a device allocation. (Not is_device_range(p, 0): that holds
// one past the end too, where an allocator without gaps between blocks, such as
// ThreadSanitizer's, may place the next, host, allocation.)
bool is_device_pointer(const void* p) { return is_device_range(p, 1); }

void check_side(const char* side, const void* p, std::size_t bytes, bool device) {
  if (device && !is_device_range(p, bytes)) {
    throw std::runtime_error(std::string("ff_memcpy_async: the ") + side + " (" +
                             std::to_string(bytes) +
                             " bytes) is not inside one ff_malloc allocation");
  }
  if (!device && bytes > 0 && is_device_pointer(p)) {
    throw std::runtime_error(std::string("ff_memcpy_async: the ") + side +
                             " is device memory but the copy kind says host");
  }
}

void count_operation(ff_stream_t stream) {
  if (stream != nullptr) ++stream->operations;
}

}  // namespace

void ff_check(ff_error_t err, const char* what) {
  if (err != ff_success)
    throw std::runtime_error(std::string(what) + ": error " + std::to_string(err));
}

void* ff_malloc(std::size_t bytes) {
  void* p = allocate_poisoned(bytes);
  DeviceAllocations& allocations = device_allocations();
  const std::lock_guard lock(allocations.mutex);
  allocations.bytes_at[reinterpret_cast<std::uintptr_t>(p)] = bytes;
  return p;
}

void ff_free(void* device_pointer) noexcept {
  if (device_pointer == nullptr) return;
  {
    DeviceAllocations& allocations = device_allocations();
    const std::lock_guard lock(allocations.mutex);
    if (allocations.bytes_at.erase(reinterpret_cast<std::uintptr_t>(device_pointer)) == 0) {
      std::fprintf(stderr, "ff_free: %p is not an ff_malloc allocation\n", device_pointer);
      std::abort();
    }
  }
  ::operator delete (device_pointer, std::align_val_t{kDeviceAlignment});
}

void* ff_malloc_host(std::size_t bytes) { return allocate_poisoned(bytes); }

void ff_free_host(void* host_pointer) noexcept {
  if (host_pointer != nullptr) ::operator delete (host_pointer, std::align_val_t{kDeviceAlignment});
}

void ff_memcpy_async(void* dst, const void* src, std::size_t bytes, ff_memcpy_kind kind,
                     ff_stream_t stream) {
  if (kind != ff_copy_default) {
    const bool device_src = kind == ff_device_to_host || kind == ff_device_to_device;
    const bool device_dst = kind == ff_host_to_device || kind == ff_device_to_device;
    check_side("source", src, bytes, device_src);
    check_side("destination", dst, bytes, device_dst);
  }
  if (bytes > 0) std::memcpy(dst, src, bytes);
  count_operation(stream);
}

void ff_memset_async(void* device_dst, int value, std::size_t bytes, ff_stream_t stream) {
  if (!is_device_range(device_dst, bytes)) {
    throw std::runtime_error("ff_memset_async: " + std::to_string(bytes) +
                             " bytes are not inside one ff_malloc allocation");
  }
  std::memset(device_dst, value, bytes);
  count_operation(stream);
}

ff_stream_t ff_stream_create() { return new ff_emu::Stream(); }
void ff_stream_destroy(ff_stream_t stream) noexcept { delete stream; }
void ff_stream_synchronize(ff_stream_t /*stream*/) {}  // every operation has already run
