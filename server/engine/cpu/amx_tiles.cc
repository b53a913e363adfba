// The AMX runtime check and the portable model of the tile instructions (amx_tiles.h).
#include "server/engine/cpu/amx_tiles.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

#include "server/engine/error.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif
#if defined(__x86_64__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace fastformer::engine {

namespace {

#if defined(__x86_64__)
uint64_t read_xcr0() {
  uint32_t low = 0, high = 0;
  __asm__ volatile("xgetbv" : "=a"(low), "=d"(high) : "c"(0));
  return uint64_t(high) << 32 | low;
}
#endif

// Linux gives a process the 8 KB of tile data state only on request (since 5.16); the request
// is process-wide and is made once. Returns 0 or the errno of the refusal.
int request_tile_permission() {
#if defined(__x86_64__) && defined(__linux__)
  constexpr int kArchReqXcompPerm = 0x1023;  // ARCH_REQ_XCOMP_PERM (asm/prctl.h)
  constexpr int kXfeatureXtiledata = 18;     // XFEATURE_XTILEDATA
  static std::once_flag once;
  static int refused = 0;
  std::call_once(once, [] {
    if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) refused = errno;
  });
  return refused;
#else
  return ENOSYS;
#endif
}

}  // namespace

std::string amx_unavailable_reason(const AmxProbe& probe) {
  if (!probe.x86_64) return "no AMX: not an x86-64 build";
  if (!probe.cpu_amx_bf16 || !probe.cpu_amx_tile) {
    return "no AMX on this CPU (CPUID AMX-BF16/AMX-TILE not set)";
  }
  if (!probe.os_xsave) return "the OS has not enabled XSAVE (CPUID OSXSAVE not set)";
  if (!probe.xcr0_tilecfg || !probe.xcr0_tiledata) {
    return "the OS does not enable AMX state (XCR0 XTILECFG/XTILEDATA, bits 17 and 18, not set)";
  }
  if (!probe.intrinsics) {
    return "this build has no AMX intrinsics (compiled without -mamx-tile -mamx-bf16)";
  }
  if (probe.permission_errno != 0) {
    return std::string(
               "the kernel refused tile data permission (arch_prctl "
               "ARCH_REQ_XCOMP_PERM: ") +
           std::strerror(probe.permission_errno) + ")";
  }
  return "";
}

bool amx_available(std::string* why) {
  AmxProbe probe;
#if defined(__x86_64__)
  probe.x86_64 = true;
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) {
    probe.cpu_amx_bf16 = (edx >> 22 & 1u) != 0;
    probe.cpu_amx_tile = (edx >> 24 & 1u) != 0;
  }
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx)) probe.os_xsave = (ecx >> 27 & 1u) != 0;
  if (probe.os_xsave) {  // xgetbv is #UD without OSXSAVE
    const uint64_t xcr0 = read_xcr0();
    probe.xcr0_tilecfg = (xcr0 >> 17 & 1u) != 0;
    probe.xcr0_tiledata = (xcr0 >> 18 & 1u) != 0;
  }
#endif
#if defined(FASTFORMER_AMX_INTRINSICS)
  probe.intrinsics = true;
#endif
  // Asked only where everything else is there: the request itself is the last step.
  if (amx_unavailable_reason(probe).empty()) probe.permission_errno = request_tile_permission();
  std::string reason = amx_unavailable_reason(probe);
  const bool available = reason.empty();
  if (why) *why = std::move(reason);
  return available;
}

namespace amx {

namespace {

// The bfloat16 (upper half of a float32) as the float32 it denotes: the reference's make_fp32.
float make_fp32(uint16_t x) { return std::bit_cast<float>(uint32_t(x) << 16); }

// Denormal to zero of the same sign: DAZ on an input, FTZ on a result.
float flush_denormal(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  return (bits & 0x7f800000u) == 0 ? std::bit_cast<float>(bits & 0x80000000u) : x;
}

// fp32 FMA a * b + c with one rounding (to nearest even), then FTZ. a and b are bfloat16
// values (8 significant bits): their product is exact in double, and the double sum rounded
// to float equals the single-rounding FMA (the sum is exact in double unless the exponents are
// more than 29 apart, and then it lies next to a float, far from a rounding midpoint).
float fma_ftz(float a, float b, float c) {
  return flush_denormal(static_cast<float>(double(a) * double(b) + double(c)));
}

}  // namespace

void ModelTiles::load_config(const TileConfig& config) {
  auto fault = [](const std::string& what) { throw TileFault("LDTILECFG: #GP: " + what); };
  if (config.palette_id == 0) {  // the init state
    release();
    return;
  }
  if (config.palette_id != 1) {
    fault("palette " + std::to_string(config.palette_id) + " (palette 1 only)");
  }
  if (std::any_of(std::begin(config.reserved), std::end(config.reserved),
                  [](uint8_t b) { return b != 0; })) {
    fault("reserved bytes 2..15 not zero");
  }
  for (int t = 0; t < 16; ++t) {
    const int rows = config.rows[t], colsb = config.colsb[t];
    const std::string tile = "tile " + std::to_string(t) + ": ";
    if (t >= kTiles && (rows != 0 || colsb != 0)) fault(tile + "palette 1 has 8 tiles");
    if (rows > kMaxRows) fault(tile + "rows " + std::to_string(rows) + " > 16");
    if (colsb > kBytesPerRow) fault(tile + "colsb " + std::to_string(colsb) + " > 64");
    if ((rows == 0) != (colsb == 0)) fault(tile + "one of rows and colsb is 0, not both");
  }
  config_ = config;
  std::memset(tiles_, 0, sizeof tiles_);
  configured_ = true;
}

void ModelTiles::release() {
  config_ = TileConfig{};
  std::memset(tiles_, 0, sizeof tiles_);
  configured_ = false;
}

void ModelTiles::check_valid(const char* instruction, int t) const {
  if (!configured_) {
    throw TileFault(std::string(instruction) + ": #UD: tiles not configured (no LDTILECFG)");
  }
  if (config_.rows[t] == 0) {
    throw TileFault(std::string(instruction) + ": #UD: tmm" + std::to_string(t) +
                    " not configured (rows 0, colsb 0)");
  }
}

void ModelTiles::zero_rows_from(int t, int first_row) {
  for (int r = first_row; r < kMaxRows; ++r) std::memset(tiles_[t][r], 0, kBytesPerRow);
}

void ModelTiles::tileloadd(int t, const void* base, int64_t stride) {
  check_valid("TILELOADD", t);
  const int rows = config_.rows[t], colsb = config_.colsb[t];
  int start = config_.start_row;
  zero_rows_from(t, start);
  for (; start < rows; ++start) {  // write_row_and_zero: the row, then zeros to 64 bytes
    std::memcpy(tiles_[t][start], static_cast<const char*>(base) + start * stride, size_t(colsb));
    std::memset(tiles_[t][start] + colsb, 0, size_t(kBytesPerRow - colsb));
  }
  zero_rows_from(t, rows);
  config_.start_row = 0;
}

void ModelTiles::tilestored(int t, void* base, int64_t stride) {
  check_valid("TILESTORED", t);
  const int rows = config_.rows[t], colsb = config_.colsb[t];
  for (int start = config_.start_row; start < rows; ++start) {
    std::memcpy(static_cast<char*>(base) + start * stride, tiles_[t][start], size_t(colsb));
  }
  config_.start_row = 0;
}

void ModelTiles::tilezero(int t) {
  check_valid("TILEZERO", t);
  zero_rows_from(t, 0);
  config_.start_row = 0;
}

void ModelTiles::tdpbf16ps(int c, int a, int b) {
  for (const int t : {c, a, b}) check_valid("TDPBF16PS", t);
  auto fault = [](const std::string& what) { throw TileFault("TDPBF16PS: #UD: " + what); };
  if (c == a || c == b || a == b) fault("tiles not distinct");
  const int c_rows = config_.rows[c], c_colsb = config_.colsb[c];
  const int a_rows = config_.rows[a], a_colsb = config_.colsb[a];
  const int b_rows = config_.rows[b], b_colsb = config_.colsb[b];
  if (c_colsb % 4 != 0 || a_colsb % 4 != 0 || b_colsb % 4 != 0) fault("colsb not a multiple of 4");
  if (c_rows != a_rows) fault("C.rows != A.rows");
  if (a_colsb / 4 != b_rows) fault("A.colsb / 4 != B.rows");
  if (c_colsb != b_colsb) fault("C.colsb != B.colsb");

  const int pairs = a_colsb / 4;    // k: bfloat16 pairs along a row of A, rows of B
  const int columns = c_colsb / 4;  // n: float32 columns of C
  float b_fp32[kMaxRows][2 * 16];   // B as float32 after DAZ, [k][2n + i]
  for (int k = 0; k < pairs; ++k) {
    for (int j = 0; j < 2 * columns; ++j) {
      uint16_t x;
      std::memcpy(&x, tiles_[b][k] + 2 * j, 2);
      b_fp32[k][j] = flush_denormal(make_fp32(x));
    }
  }
  for (int m = 0; m < c_rows; ++m) {
    float temp1[2 * 16] = {};  // [2n + 0]: even elements of the pairs; [2n + 1]: odd ones
    for (int k = 0; k < pairs; ++k) {
      uint16_t pair[2];
      std::memcpy(pair, tiles_[a][m] + 4 * k, 4);
      const float a_even = flush_denormal(make_fp32(pair[0]));
      const float a_odd = flush_denormal(make_fp32(pair[1]));
      for (int n = 0; n < columns; ++n) {
        temp1[2 * n + 0] = fma_ftz(a_even, b_fp32[k][2 * n + 0], temp1[2 * n + 0]);
        temp1[2 * n + 1] = fma_ftz(a_odd, b_fp32[k][2 * n + 1], temp1[2 * n + 1]);
      }
    }
    float row[16];
    std::memcpy(row, tiles_[c][m], size_t(c_colsb));
    for (int n = 0; n < columns; ++n) {
      const float sum = flush_denormal(temp1[2 * n] + temp1[2 * n + 1]);
      row[n] = flush_denormal(flush_denormal(row[n]) + sum);
    }
    std::memcpy(tiles_[c][m], row, size_t(c_colsb));  // write_row_and_zero
    std::memset(tiles_[c][m] + c_colsb, 0, size_t(kBytesPerRow - c_colsb));
  }
  zero_rows_from(c, c_rows);
  config_.start_row = 0;
}

float hardware_peak_loop(int64_t iterations) {
#if defined(FASTFORMER_AMX_INTRINSICS)
  uint16_t a[16 * 32], b[16 * 32];
  std::fill(std::begin(a), std::end(a), uint16_t{0x3f80});  // 1.0
  std::fill(std::begin(b), std::end(b), uint16_t{0x3580});  // 2^-20
  alignas(64) float c[4 * 16 * 16];
  HardwareTiles tiles;
  peak_loop(tiles, a, b, iterations, c);
  return c[0];
#else
  (void)iterations;
  throw EngineError("this build has no AMX intrinsics (built without -mamx-tile -mamx-bf16)");
#endif
}

float hardware_fed_loop(int64_t bytes, int64_t iterations) {
#if defined(FASTFORMER_AMX_INTRINSICS)
  constexpr int64_t kTileElements = kMaxRows * kBytesPerRow / 2;
  const int64_t groups = std::max<int64_t>(1, bytes / (4 * kTileElements * 2));
  std::vector<uint16_t> buffer(size_t(groups * 4 * kTileElements));
  for (int64_t g = 0; g < groups; ++g) {
    uint16_t* t = buffer.data() + g * 4 * kTileElements;
    std::fill(t, t + 2 * kTileElements, uint16_t{0x3f80});                      // A tiles: 1.0
    std::fill(t + 2 * kTileElements, t + 4 * kTileElements, uint16_t{0x3580});  // B: 2^-20
  }
  alignas(64) float c[4 * 16 * 16];
  HardwareTiles tiles;
  fed_loop(tiles, buffer.data(), groups * 4, iterations, c);
  return c[0];
#else
  (void)bytes;
  (void)iterations;
  throw EngineError("this build has no AMX intrinsics (built without -mamx-tile -mamx-bf16)");
#endif
}

}  // namespace amx

}  // namespace fastformer::engine
