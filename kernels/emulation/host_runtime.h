// The host side of kernels/runtime.h in emulation builds: device memory, copies and streams,
// with the same names and meaning as the CUDA wrappers there.
//
// "Device" memory is host memory that ff_malloc hands out: 256-byte aligned, filled with 0xff
// bytes (a float NaN) so a read of memory nobody wrote shows. Copies and memsets run at once,
// in issue order; a copy whose device side is not inside one ff_malloc allocation, or whose
// kind does not match its pointers, throws.
#pragma once

#include <cstddef>

#include "kernels/emulation/emulator.h"

using ff_stream_t = ::ff_emu::Stream*;

enum ff_error_t : int { ff_success = 0 };

// Same values as cudaMemcpyKind.
enum ff_memcpy_kind : int {
  ff_host_to_host = 0,
  ff_host_to_device = 1,
  ff_device_to_host = 2,
  ff_device_to_device = 3,
  ff_copy_default = 4,
};

void ff_check(ff_error_t err, const char* what = "CUDA call");
inline void ff_check_launch(const char* /*kernel_name*/) {}  // emulated launches throw

void* ff_malloc(std::size_t bytes);
void ff_free(void* device_pointer) noexcept;
void* ff_malloc_host(std::size_t bytes);  // pinned staging memory on a GPU
void ff_free_host(void* host_pointer) noexcept;

void ff_memcpy_async(void* dst, const void* src, std::size_t bytes, ff_memcpy_kind kind,
                     ff_stream_t stream);
void ff_memset_async(void* device_dst, int value, std::size_t bytes, ff_stream_t stream);

ff_stream_t ff_stream_create();
void ff_stream_destroy(ff_stream_t stream) noexcept;
void ff_stream_synchronize(ff_stream_t stream);

// Allows a kernel more than 48 KiB of dynamic shared memory (up to 227 KiB).
template <class... Params>
void ff_set_max_dynamic_shared_memory(void (*kernel)(Params...), std::size_t bytes) {
  ::ff_emu::set_max_dynamic_shared_memory(kernel, bytes);
}
