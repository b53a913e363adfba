// Device memory, streams and transfers for the CUDA engine: the CUDA runtime in CUDA
// builds, plain host memory and in-order execution under the host emulation
// (FF_EMULATION), so the same engine code runs in both.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/runtime.h"

// The same sources build for the CUDA runtime and for the host emulation; each build's
// symbols live in their own namespace so both can link into one test binary.
#if defined(FF_EMULATION)
#define FF_OPS_NAMESPACE emulated
#else
#define FF_OPS_NAMESPACE device
#endif

namespace fastformer::engine::cuda::FF_OPS_NAMESPACE {

struct DeviceInfo {
  bool usable = false;       ///< a device exists and a context could be made on it
  std::string name;          ///< e.g. "NVIDIA H200" or "host emulation"
  std::string why;           ///< why not usable (no driver, no device, ...)
  size_t total_bytes = 0;
  size_t free_bytes = 0;
};

// Asks the driver about device `ordinal` without failing when there is no GPU or driver.
DeviceInfo probe_device(int ordinal);

void set_device(int ordinal);
void* device_malloc(size_t bytes);  // throws EngineError when the device is out of memory
void device_free(void* p);
void* pinned_malloc(size_t bytes);  // page-locked host memory for overlapped copies
void pinned_free(void* p);
ff_stream_t create_stream();
void destroy_stream(ff_stream_t stream);
void copy_to_device_async(void* dst, const void* src, size_t bytes, ff_stream_t stream);
void copy_to_host_async(void* dst, const void* src, size_t bytes, ff_stream_t stream);
void copy_device_async(void* dst, const void* src, size_t bytes, ff_stream_t stream);
void synchronize(ff_stream_t stream);
// Raises EngineError for an error a kernel launch left behind.
void check_launch(const char* what);

}  // namespace fastformer::engine::cuda::FF_OPS_NAMESPACE
