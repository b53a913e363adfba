// What this CPU's hardware does at best, for the profile's bounds (fastformer-bench --profile
// and --gemm-probe): the copy bandwidth and the vector multiply-add peak on N threads, and the
// bfloat16 peaks of the matrix instructions the CPU has (AVX512_BF16's VDPBF16PS, AMX's
// TDPBF16PS). Each is a short timed loop, best of a few runs; none is used on a serving path.
//
// An op's roofline time is the larger of the time to copy the bytes it moves and the time of
// its FLOPs at the multiply-add peak: bytes / copy_gbps, where the bytes are the profile's (every
// operand read once and every result written once) and copy_gbps is memcpy's rate, bytes copied
// per second, measured on a copy of about the op's size (caches hold a small one).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fastformer::engine {

struct HardwarePeak {
  double gflops = 0;  ///< 0: the CPU (or the OS) does not run it
  std::string how;    ///< the loop, e.g. "VFMADD231PS zmm x 16 chains"; or why it did not run
};

// memcpy of `bytes` in all (split over the threads): bytes copied per second / 1e9 (each byte
// read once and written once).
double copy_gbps(int threads, size_t bytes);
// float32 multiply-adds on the widest vectors the CPU has (AVX-512, AVX2 with FMA, or SSE2
// multiply and add), independent chains per thread: 2 FLOPs per lane per multiply-add.
HardwarePeak fma_peak(int threads);
// AVX512_BF16's VDPBF16PS (2 bfloat16 products per float32 lane: 4 FLOPs per lane).
HardwarePeak avx512_bf16_peak(int threads);
// AMX's TDPBF16PS back to back on four independent accumulator tiles (amx::peak_loop: 16 x 16 x
// 32 products each); 0 with the reason where there is no AMX or the kernel refuses the tiles.
HardwarePeak amx_bf16_peak(int threads);

// The ceilings of a tile loop that loads its operands (issue 51): on one thread, amx::fed_loop's
// 2 x 2 accumulators with two A and two B tiles loaded at every step, from a working set that
// L1 holds (16 KiB) and one that L2 holds (256 KiB); with the no-load peak (amx_bf16_peak on one
// thread) first. What the GEMM kernel's blocking is measured against (--gemm-probe, --profile:
// each GEMM's share of the L2-fed one). Each 0 with the reason where there is no AMX.
struct TileCeiling {
  const char* name;  ///< "no loads", "L1-fed", "L2-fed"
  int64_t bytes;     ///< the working set (0: none)
  HardwarePeak peak;
};
std::vector<TileCeiling> amx_tile_ceilings();

}  // namespace fastformer::engine
