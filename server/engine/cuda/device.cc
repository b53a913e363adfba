#include "server/engine/cuda/device.h"

#include <stdexcept>
#include <string>

#include "server/engine/error.h"

#if !defined(FF_EMULATION)
#include <cuda_runtime.h>
#endif

namespace fastformer::engine::cuda::FF_OPS_NAMESPACE {

// Memory, streams and copies go through kernels/runtime.h's ff_* wrappers: the CUDA runtime,
// or the emulator's exact-size, NaN-filled, range-checked host allocations.

#if defined(FF_EMULATION)
DeviceInfo probe_device(int) { return DeviceInfo{true, "host emulation", "", 0, 0}; }
void set_device(int) {}
#else
DeviceInfo probe_device(int ordinal) {
  DeviceInfo info;
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    info.why = std::string("no usable CUDA driver or device (") + cudaGetErrorString(err) + ")";
    cudaGetLastError();  // clear the sticky error
    return info;
  }
  if (ordinal >= count) {
    info.why = "device " + std::to_string(ordinal) + " requested, " + std::to_string(count) + " present";
    return info;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, ordinal) != cudaSuccess || cudaSetDevice(ordinal) != cudaSuccess ||
      cudaMemGetInfo(&info.free_bytes, &info.total_bytes) != cudaSuccess) {
    info.why = "device " + std::to_string(ordinal) + " present but no context could be created";
    cudaGetLastError();
    return info;
  }
  info.usable = true;
  info.name = prop.name;
  return info;
}
void set_device(int ordinal) { ff_check(cudaSetDevice(ordinal), "cudaSetDevice"); }
#endif

void* device_malloc(size_t bytes) {
  try {
    return ff_malloc(bytes);
  } catch (const std::runtime_error& e) {
    throw EngineError("device allocation of " + std::to_string(bytes) + " bytes failed: " + e.what());
  }
}
void device_free(void* p) { ff_free(p); }
void* pinned_malloc(size_t bytes) { return ff_malloc_host(bytes); }
void pinned_free(void* p) { ff_free_host(p); }
ff_stream_t create_stream() { return ff_stream_create(); }
void destroy_stream(ff_stream_t stream) { ff_stream_destroy(stream); }
void copy_to_device_async(void* dst, const void* src, size_t bytes, ff_stream_t stream) {
  ff_memcpy_async(dst, src, bytes, ff_host_to_device, stream);
}
void copy_to_host_async(void* dst, const void* src, size_t bytes, ff_stream_t stream) {
  ff_memcpy_async(dst, src, bytes, ff_device_to_host, stream);
}
void copy_device_async(void* dst, const void* src, size_t bytes, ff_stream_t stream) {
  ff_memcpy_async(dst, src, bytes, ff_device_to_device, stream);
}
void synchronize(ff_stream_t stream) { ff_stream_synchronize(stream); }
void check_launch(const char* what) {
  try {
    ff_check_launch(what);
  } catch (const std::runtime_error& e) {
    throw EngineError(e.what());
  }
}

}  // namespace fastformer::engine::cuda::FF_OPS_NAMESPACE
