// The CUDA execution model for kernel sources: one header, two builds.
//
// Kernel files (kernels/*.cu) include only this header for execution-model features, and the
// same source compiles
//   (a) with nvcc, as real CUDA, and
//   (b) with the host C++ compiler when FF_EMULATION is defined (the fastformer_emulation
//       target defines it for whatever links it), against the emulator in kernels/emulation/,
//       so the CUDA engine runs on the CPU in `make test`.
//
// In a kernel file write
//   FF_GLOBAL / FF_DEVICE / FF_HOST_DEVICE         for __global__ / __device__ / __host__
//   __device__ FF_SHARED(float, partial, 32);                 for __shared__ float partial[32];
//   FF_DYNAMIC_SHARED(float, row);                 for the launch's dynamic shared memory
//   FF_LAUNCH(kernel, grid, block, shared_bytes, stream, args...)   for kernel<<<...>>>(args...)
//   FF_LAUNCH((kernel<float, 256>), ...)           a template kernel in parentheses
// and the CUDA names as usual: threadIdx, blockIdx, blockDim, gridDim, warpSize, dim3,
// __syncthreads, __syncwarp, __shfl_sync / _xor / _down / _up, __ballot_sync, __any_sync,
// __all_sync, atomicAdd / Max / Min / Exch / CAS, __threadfence, __ldg, __expf, rsqrtf, erff,
// tanhf, fmaxf, ... Storage dtypes are ff_half and ff_bfloat16, read and written through
// to_float / from_float<T> (round to nearest even) or load_float4 / store_float4.
// Not in emulation: CUDA keywords (__device__, __shared__, <<<>>>), cuda_fp16 arithmetic,
// the device min/max overloads (use fminf/fmaxf or a ternary), inline PTX, cooperative groups.
// The one tensor-core instruction a kernel may use is ff_mma_m16n8k16<T> (below): the PTX mma
// under nvcc, a model of it with the same register fragments in emulation.
//
// Host code (launch functions, the engine) uses ff_stream_t, ff_malloc, ff_memcpy_async,
// ff_stream_synchronize, ...: thin wrappers over the CUDA runtime that throw
// std::runtime_error on failure, or their emulated stand-ins (kernels/emulation/host_runtime.h).
#pragma once

#if defined(FF_EMULATION) && defined(__CUDACC__)
#error "FF_EMULATION is for host-compiler builds of kernel sources; nvcc builds are real CUDA"
#endif

// The CUDA build and the host emulation define the same functions (the kernels' launch
// functions, the CUDA engine's ops); a namespace per build keeps their symbols apart in a
// binary that links both.
#if defined(FF_EMULATION)
#define FF_KERNELS_ABI emulated
#else
#define FF_KERNELS_ABI device
#endif

#if !defined(FF_EMULATION)
// ============================== real CUDA ========================================================
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#define FF_GLOBAL __global__
#define FF_DEVICE __device__ __forceinline__
#define FF_HOST_DEVICE __host__ __device__ __forceinline__
#define FF_SHARED(type, name, count) __shared__ type name[count]
#define FF_DYNAMIC_SHARED(type, name)                                       \
  extern __shared__ __align__(16) unsigned char ff_dynamic_shared_memory[]; \
  type* const name = reinterpret_cast<type*>(ff_dynamic_shared_memory)
#define FF_LAUNCH(kernel, grid, block, shared_bytes, stream, ...) \
  kernel<<<(grid), (block), (shared_bytes), (stream)>>>(__VA_ARGS__)

using ff_half = __half;
using ff_bfloat16 = __nv_bfloat16;
using ff_float4 = float4;

// ---- host side -------------------------------------------------------------------------------
using ff_stream_t = cudaStream_t;
using ff_error_t = cudaError_t;
using ff_memcpy_kind = cudaMemcpyKind;
inline constexpr ff_error_t ff_success = cudaSuccess;
inline constexpr ff_memcpy_kind ff_host_to_host = cudaMemcpyHostToHost;
inline constexpr ff_memcpy_kind ff_host_to_device = cudaMemcpyHostToDevice;
inline constexpr ff_memcpy_kind ff_device_to_host = cudaMemcpyDeviceToHost;
inline constexpr ff_memcpy_kind ff_device_to_device = cudaMemcpyDeviceToDevice;
inline constexpr ff_memcpy_kind ff_copy_default = cudaMemcpyDefault;

inline void ff_check(ff_error_t err, const char* what = "CUDA call") {
  if (err != cudaSuccess)
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}
// After FF_LAUNCH: a bad configuration is reported here, not by the launch.
inline void ff_check_launch(const char* kernel_name) { ff_check(cudaGetLastError(), kernel_name); }

inline void* ff_malloc(std::size_t bytes) {
  void* p = nullptr;
  if (const cudaError_t err = cudaMalloc(&p, bytes); err != cudaSuccess) {
    throw std::runtime_error("device allocation of " + std::to_string(bytes) +
                             " bytes failed: cudaMalloc: " + cudaGetErrorString(err));
  }
  return p;
}
inline void ff_free(void* device_pointer) noexcept { (void)cudaFree(device_pointer); }
inline void* ff_malloc_host(std::size_t bytes) {
  void* p = nullptr;
  ff_check(cudaMallocHost(&p, bytes), "cudaMallocHost");
  return p;
}
inline void ff_free_host(void* host_pointer) noexcept { (void)cudaFreeHost(host_pointer); }

inline void ff_memcpy_async(void* dst, const void* src, std::size_t bytes, ff_memcpy_kind kind,
                            ff_stream_t stream) {
  ff_check(cudaMemcpyAsync(dst, src, bytes, kind, stream), "cudaMemcpyAsync");
}
inline void ff_memset_async(void* device_dst, int value, std::size_t bytes, ff_stream_t stream) {
  ff_check(cudaMemsetAsync(device_dst, value, bytes, stream), "cudaMemsetAsync");
}

inline ff_stream_t ff_stream_create() {
  cudaStream_t stream = nullptr;
  ff_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  return stream;
}
inline void ff_stream_destroy(ff_stream_t stream) noexcept { (void)cudaStreamDestroy(stream); }
inline void ff_stream_synchronize(ff_stream_t stream) {
  ff_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

// Allows a kernel more than 48 KiB of dynamic shared memory (up to 227 KiB on sm_90).
template <class... Params>
void ff_set_max_dynamic_shared_memory(void (*kernel)(Params...), std::size_t bytes) {
  ff_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(bytes)),
           "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
}

// ---- storage dtypes --------------------------------------------------------------------------
FF_HOST_DEVICE float to_float(float x) { return x; }
FF_HOST_DEVICE float to_float(ff_half x) { return __half2float(x); }
FF_HOST_DEVICE float to_float(ff_bfloat16 x) { return __bfloat162float(x); }

template <class T>
FF_HOST_DEVICE T from_float(float x);
template <>
FF_HOST_DEVICE float from_float<float>(float x) {
  return x;
}
template <>
FF_HOST_DEVICE ff_half from_float<ff_half>(float x) {
  return __float2half_rn(x);
}
template <>
FF_HOST_DEVICE ff_bfloat16 from_float<ff_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// Four consecutive elements as floats in one vector access: `p` must be aligned to 4 elements.
FF_DEVICE ff_float4 load_float4(const float* p) { return *reinterpret_cast<const float4*>(p); }
FF_DEVICE ff_float4 load_float4(const ff_half* p) {
  const __half2* pair = reinterpret_cast<const __half2*>(p);  // 4-element aligned: two pairs
  const float2 lo = __half22float2(pair[0]);
  const float2 hi = __half22float2(pair[1]);
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}
FF_DEVICE ff_float4 load_float4(const ff_bfloat16* p) {
  const __nv_bfloat162* pair = reinterpret_cast<const __nv_bfloat162*>(p);
  const float2 lo = __bfloat1622float2(pair[0]);
  const float2 hi = __bfloat1622float2(pair[1]);
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}
FF_DEVICE void store_float4(float* p, ff_float4 v) { *reinterpret_cast<float4*>(p) = v; }
FF_DEVICE void store_float4(ff_half* p, ff_float4 v) {
  __half2* pair = reinterpret_cast<__half2*>(p);
  pair[0] = __floats2half2_rn(v.x, v.y);
  pair[1] = __floats2half2_rn(v.z, v.w);
}
FF_DEVICE void store_float4(ff_bfloat16* p, ff_float4 v) {
  __nv_bfloat162* pair = reinterpret_cast<__nv_bfloat162*>(p);
  pair[0] = __floats2bfloat162_rn(v.x, v.y);
  pair[1] = __floats2bfloat162_rn(v.z, v.w);
}

// ---- tensor cores ----------------------------------------------------------------------------
// d = A B + c for one warp: mma.sync.aligned.m16n8k16.row.col.f32.T.T.f32 (T = ff_bfloat16 or
// ff_half; sm_80 and later). A is 16 x 16 (row-major), B 16 x 8 (column-major), c and d 16 x 8
// float. The fragments are the PTX ISA's ("Matrix Fragments for mma.m16n8k16 with floating
// point type"): with g = lane / 4 and t = lane % 4, each 32-bit register holding two elements,
// the lower-indexed one in its low 16 bits,
//   a[0] = A[g][2t, 2t+1]     a[1] = A[g+8][2t, 2t+1]
//   a[2] = A[g][2t+8, 2t+9]   a[3] = A[g+8][2t+8, 2t+9]
//   b[0] = B[2t, 2t+1][g]     b[1] = B[2t+8, 2t+9][g]
//   c[i], d[i] = (row g + 8 (i / 2), column 2t + i % 2)
// Every lane of the warp calls it, with the same T (it is a warp operation). d may be c.
template <class T>
FF_DEVICE void ff_mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                               const float (&c)[4]) {
  static_assert(std::is_same_v<T, ff_bfloat16> || std::is_same_v<T, ff_half>,
                "ff_mma_m16n8k16 takes bfloat16 or half operands");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (std::is_same_v<T, ff_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%10, %11, %12, %13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
          "f"(c[2]), "f"(c[3]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%10, %11, %12, %13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
          "f"(c[2]), "f"(c[3]));
  }
#elif defined(__CUDA_ARCH__)
  __trap();  // no mma.m16n8k16 before sm_80; kernels using it are launched on sm_80+ only
#endif
}

#else
// ============================== host emulation ===================================================
#include <math.h>  // erff, tanhf, fmaxf, expf, ... as in CUDA device code

#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "common/half.h"
#include "kernels/emulation/emulator.h"
#include "kernels/emulation/host_runtime.h"

#define FF_GLOBAL
#define FF_DEVICE inline
#define FF_HOST_DEVICE inline
#define FF_SHARED(type, name, count)                                                  \
  static constexpr ::ff_emu::SharedSite ff_shared_site_##name{sizeof(type) * (count), \
                                                              alignof(type), #name};  \
  type(&name)[count] = *static_cast<type(*)[count]>(::ff_emu::shared_array(ff_shared_site_##name))
#define FF_DYNAMIC_SHARED(type, name) \
  type* const name = static_cast<type*>(::ff_emu::dynamic_shared_memory())
#define FF_LAUNCH(kernel, grid, block, shared_bytes, stream, ...) \
  ::ff_emu::launch(#kernel, kernel, grid, block, shared_bytes, stream __VA_OPT__(, ) __VA_ARGS__)

// The indices of the emulated thread that is running (read-only, as in CUDA).
#define threadIdx (::ff_emu::this_thread().thread_idx)
#define blockIdx (::ff_emu::this_thread().block_idx)
#define blockDim (::ff_emu::this_thread().block_dim)
#define gridDim (::ff_emu::this_thread().grid_dim)
inline constexpr int warpSize = 32;
using dim3 = ::ff_emu::Dim3;

// ---- barriers and warp operations ------------------------------------------------------------
inline void __syncthreads() { ::ff_emu::syncthreads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  ::ff_emu::warp_op(::ff_emu::WarpOp::kSync, mask, 0, 0, warpSize);
}
template <class T>
T __shfl_sync(unsigned mask, T value, int src_lane, int width = warpSize) {
  return ::ff_emu::warp_shuffle(::ff_emu::WarpOp::kShflIdx, mask, value, src_lane, width);
}
template <class T>
T __shfl_xor_sync(unsigned mask, T value, int lane_mask, int width = warpSize) {
  return ::ff_emu::warp_shuffle(::ff_emu::WarpOp::kShflXor, mask, value, lane_mask, width);
}
template <class T>
T __shfl_down_sync(unsigned mask, T value, unsigned delta, int width = warpSize) {
  return ::ff_emu::warp_shuffle(::ff_emu::WarpOp::kShflDown, mask, value, static_cast<int>(delta),
                                width);
}
template <class T>
T __shfl_up_sync(unsigned mask, T value, unsigned delta, int width = warpSize) {
  return ::ff_emu::warp_shuffle(::ff_emu::WarpOp::kShflUp, mask, value, static_cast<int>(delta),
                                width);
}
inline unsigned __ballot_sync(unsigned mask, int predicate) {
  return static_cast<unsigned>(
      ::ff_emu::warp_op(::ff_emu::WarpOp::kBallot, mask, predicate != 0, 0, warpSize));
}
inline int __any_sync(unsigned mask, int predicate) {
  return static_cast<int>(
      ::ff_emu::warp_op(::ff_emu::WarpOp::kAny, mask, predicate != 0, 0, warpSize));
}
inline int __all_sync(unsigned mask, int predicate) {
  return static_cast<int>(
      ::ff_emu::warp_op(::ff_emu::WarpOp::kAll, mask, predicate != 0, 0, warpSize));
}

// ---- atomics and fences: the fibers of a launch take turns, so a plain update is atomic -----
#define FF_EMU_ATOMIC(name, T, combine) \
  inline T name(T* address, T value) {  \
    const T old = *address;             \
    *address = combine;                 \
    return old;                         \
  }
FF_EMU_ATOMIC(atomicAdd, float, old + value)
FF_EMU_ATOMIC(atomicAdd, double, old + value)
FF_EMU_ATOMIC(atomicAdd, unsigned, old + value)
FF_EMU_ATOMIC(atomicAdd, unsigned long long, old + value)
// int adds wrap in two's complement, as on the GPU (no signed-overflow UB)
FF_EMU_ATOMIC(atomicAdd, int,
              static_cast<int>(static_cast<unsigned>(old) + static_cast<unsigned>(value)))
FF_EMU_ATOMIC(atomicMax, int, old > value ? old : value)
FF_EMU_ATOMIC(atomicMax, unsigned, old > value ? old : value)
FF_EMU_ATOMIC(atomicMin, int, old < value ? old : value)
FF_EMU_ATOMIC(atomicMin, unsigned, old < value ? old : value)
FF_EMU_ATOMIC(atomicExch, int, value)
FF_EMU_ATOMIC(atomicExch, unsigned, value)
FF_EMU_ATOMIC(atomicExch, float, value)
#undef FF_EMU_ATOMIC
template <class T>
T ff_emu_atomic_cas(T* address, T compare, T value) {
  const T old = *address;
  if (old == compare) *address = value;
  return old;
}
inline int atomicCAS(int* address, int compare, int value) {
  return ff_emu_atomic_cas(address, compare, value);
}
inline unsigned atomicCAS(unsigned* address, unsigned compare, unsigned value) {
  return ff_emu_atomic_cas(address, compare, value);
}
inline unsigned long long atomicCAS(unsigned long long* address, unsigned long long compare,
                                    unsigned long long value) {
  return ff_emu_atomic_cas(address, compare, value);
}
inline void __threadfence() {}
inline void __threadfence_block() {}

// ---- loads, bit casts, bit counts, fast math -------------------------------------------------
template <class T>
T __ldg(const T* p) {
  return *p;
}
inline int __float_as_int(float x) { return std::bit_cast<int>(x); }
inline unsigned __float_as_uint(float x) { return std::bit_cast<unsigned>(x); }
inline float __int_as_float(int x) { return std::bit_cast<float>(x); }
inline float __uint_as_float(unsigned x) { return std::bit_cast<float>(x); }
inline int __popc(unsigned x) { return std::popcount(x); }
inline int __ffs(int x) { return x == 0 ? 0 : std::countr_zero(static_cast<unsigned>(x)) + 1; }
inline int __clz(int x) { return std::countl_zero(static_cast<unsigned>(x)); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __fdividef(float x, float y) { return x / y; }
// glibc declares (but does not export) __expf and __logf, so these are macros.
#define __expf(x) (::std::exp(static_cast<float>(x)))
#define __logf(x) (::std::log(static_cast<float>(x)))

// ---- storage dtypes --------------------------------------------------------------------------
struct ff_half {
  std::uint16_t bits;
};
struct ff_bfloat16 {
  std::uint16_t bits;
};
struct alignas(16) ff_float4 {
  float x, y, z, w;
};
static_assert(sizeof(ff_half) == 2 && sizeof(ff_bfloat16) == 2);

inline float to_float(float x) { return x; }
inline float to_float(ff_half x) { return fastformer::half_to_float(x.bits); }
inline float to_float(ff_bfloat16 x) { return fastformer::bfloat16_to_float(x.bits); }

template <class T>
T from_float(float x);
template <>
inline float from_float<float>(float x) {
  return x;
}
template <>
inline ff_half from_float<ff_half>(float x) {
  return ff_half{fastformer::float_to_half(x)};
}
template <>
inline ff_bfloat16 from_float<ff_bfloat16>(float x) {
  return ff_bfloat16{fastformer::float_to_bfloat16(x)};
}

namespace ff_emu {
template <class T>
ff_float4 load4(const T* p) {
  check_vector_alignment(p, 4 * sizeof(T), "load_float4");
  return ff_float4{to_float(p[0]), to_float(p[1]), to_float(p[2]), to_float(p[3])};
}
template <class T>
void store4(T* p, ff_float4 v) {
  check_vector_alignment(p, 4 * sizeof(T), "store_float4");
  p[0] = from_float<T>(v.x);
  p[1] = from_float<T>(v.y);
  p[2] = from_float<T>(v.z);
  p[3] = from_float<T>(v.w);
}
}  // namespace ff_emu
// Four consecutive elements as floats in one vector access: `p` must be aligned to 4 elements.
inline ff_float4 load_float4(const float* p) { return ::ff_emu::load4(p); }
inline ff_float4 load_float4(const ff_half* p) { return ::ff_emu::load4(p); }
inline ff_float4 load_float4(const ff_bfloat16* p) { return ::ff_emu::load4(p); }
inline void store_float4(float* p, ff_float4 v) { ::ff_emu::store4(p, v); }
inline void store_float4(ff_half* p, ff_float4 v) { ::ff_emu::store4(p, v); }
inline void store_float4(ff_bfloat16* p, ff_float4 v) { ::ff_emu::store4(p, v); }

// ---- tensor cores ----------------------------------------------------------------------------
// ff_mma_m16n8k16<T>: the model of mma.sync.aligned.m16n8k16.row.col.f32.T.T.f32, with the
// PTX fragments of the CUDA build (see there). The lane gathers what its four outputs need with
// warp shuffles, as the instruction's operands come from the warp's registers: rows g and g+8
// of A from lanes 4g .. 4g+3, columns 2t and 2t+1 of B from lanes 8t .. 8t+3 and 8t+4 .. 8t+7.
// Each output is c + the sum of its 16 products in float, in k order: the products of two
// 16-bit floats are exact in float, and a tensor core's order and rounding of that sum are
// its own, so a kernel must not count on a particular one (tests compare with a tolerance).
namespace ff_emu {
template <class T>
float mma_element(std::uint32_t pair, int high) {
  const auto bits = static_cast<std::uint16_t>(high ? pair >> 16 : pair & 0xffffu);
  if constexpr (std::is_same_v<T, ff_bfloat16>) {
    return fastformer::bfloat16_to_float(bits);
  } else {
    return fastformer::half_to_float(bits);
  }
}
}  // namespace ff_emu

template <class T>
inline void ff_mma_m16n8k16(float (&d)[4], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2],
                            const float (&c)[4]) {
  static_assert(std::is_same_v<T, ff_bfloat16> || std::is_same_v<T, ff_half>,
                "ff_mma_m16n8k16 takes bfloat16 or half operands");
  const ::ff_emu::ThreadIndices& self = ::ff_emu::this_thread();
  const unsigned linear =
      self.thread_idx.x +
      self.block_dim.x * (self.thread_idx.y + self.block_dim.y * self.thread_idx.z);
  const int lane = static_cast<int>(linear % 32), g = lane / 4, t = lane % 4;
  auto pack = [](std::uint32_t lo, std::uint32_t hi) {
    return std::uint64_t{lo} | (std::uint64_t{hi} << 32);
  };
  float a_rows[2][16];                 // A[g][k], A[g+8][k]
  float b_cols[2][16];                 // B[k][2t], B[k][2t+1]
  for (int src = 0; src < 4; ++src) {  // lane 4g + src holds columns 2src, 2src+1 (+8) of A
    const std::uint64_t left = __shfl_sync(0xffffffffu, pack(a[0], a[1]), 4 * g + src);
    const std::uint64_t right = __shfl_sync(0xffffffffu, pack(a[2], a[3]), 4 * g + src);
    for (int e = 0; e < 2; ++e) {
      a_rows[0][2 * src + e] = ::ff_emu::mma_element<T>(static_cast<std::uint32_t>(left), e);
      a_rows[1][2 * src + e] = ::ff_emu::mma_element<T>(static_cast<std::uint32_t>(left >> 32), e);
      a_rows[0][2 * src + 8 + e] = ::ff_emu::mma_element<T>(static_cast<std::uint32_t>(right), e);
      a_rows[1][2 * src + 8 + e] =
          ::ff_emu::mma_element<T>(static_cast<std::uint32_t>(right >> 32), e);
    }
  }
  for (int n = 0; n < 2; ++n) {
    for (int src = 0; src < 4; ++src) {  // lane 4(2t+n) + src holds rows 2src, 2src+1 (+8)
      const std::uint64_t col = __shfl_sync(0xffffffffu, pack(b[0], b[1]), 4 * (2 * t + n) + src);
      for (int e = 0; e < 2; ++e) {
        b_cols[n][2 * src + e] = ::ff_emu::mma_element<T>(static_cast<std::uint32_t>(col), e);
        b_cols[n][2 * src + 8 + e] =
            ::ff_emu::mma_element<T>(static_cast<std::uint32_t>(col >> 32), e);
      }
    }
  }
  float out[4];
  for (int r = 0; r < 2; ++r) {
    for (int n = 0; n < 2; ++n) {
      float sum = c[2 * r + n];
      for (int k = 0; k < 16; ++k) sum += a_rows[r][k] * b_cols[n][k];
      out[2 * r + n] = sum;
    }
  }
  for (int i = 0; i < 4; ++i) d[i] = out[i];
}

#endif
