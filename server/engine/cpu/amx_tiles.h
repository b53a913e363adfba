// The AMX tile layer under the hand-written bfloat16 GEMM (amx_gemm.h): two implementations of
// one interface, so the kernel is written once (a template over the layer) and runs
//
//   HardwareTiles  the instructions themselves, through the compiler's intrinsics
//                  (_tile_loadconfig, _tile_loadd, _tile_dpbf16ps, _tile_stored, _tile_zero,
//                  _tile_release); only in a translation unit compiled with -mamx-tile
//                  -mamx-bf16 (FASTFORMER_AMX_INTRINSICS), and only after amx_available();
//   ModelTiles     a portable C++ model of the same instructions as Intel's ISA reference (the
//                  SDM's pseudocode for LDTILECFG, TILELOADD, TILESTORED, TILEZERO, TDPBF16PS
//                  and TILERELEASE) defines them, on any CPU: the unit tests run the kernel
//                  through it on machines without AMX.
//
// The interface (both classes; T, C, A, B are tile numbers 0..7, template arguments because
// the instructions take the tile number as an immediate):
//   load_config(cfg)           LDTILECFG: palette 1, per tile `rows` <= 16 and `colsb` <= 64
//                              bytes; zeroes every tile
//   load<T>(base, stride)      TILELOADD: rows x colsb bytes, row r from base + r * stride
//   store<T>(base, stride)     TILESTORED: the same rows x colsb bytes back to memory
//   zero<T>()                  TILEZERO
//   dpbf16ps<C, A, B>()        TDPBF16PS: C.fp32[m][n] += sum over k of the bf16 pairs
//                              A.bf16[m][2k+i] * B.bf16[k][2n+i] (B in "VNNI" pairs)
//   release()                  TILERELEASE: back to the init state
//
// What the model follows of the reference, and where it stops, is said at ModelTiles.
#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

// -mamx-tile -mamx-bf16 define __AMX_TILE__ and __AMX_BF16__ in GCC, __AMXTILE__ and
// __AMXBF16__ in clang.
#if defined(__x86_64__) && ((defined(__AMX_TILE__) && defined(__AMX_BF16__)) || \
                            (defined(__AMXTILE__) && defined(__AMXBF16__)))
#include <immintrin.h>
#define FASTFORMER_AMX_INTRINSICS 1
#endif

namespace fastformer::engine {

// Whether this process may run AMX instructions: CPUID leaf 7 (AMX-BF16, EDX bit 22; AMX-TILE,
// bit 24), the OS saving tile state (XCR0 bits 17 XTILECFG and 18 XTILEDATA, read with xgetbv),
// a build with the intrinsics, then, once per process, the kernel's permission for tile data
// (arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA): Linux refuses tile instructions (SIGILL)
// to a process that has not asked. False, with a one-line reason naming what is missing in
// `why` (when not null), where any step fails. Thread-safe; the request is made once.
bool amx_available(std::string* why);

// What amx_available() found, step by step, and its reason; apart so that the tests can give
// every answer (this machine shows only one).
struct AmxProbe {
  bool x86_64 = false;         ///< an x86-64 build (CPUID exists)
  bool cpu_amx_bf16 = false;   ///< CPUID.(7,0):EDX[22]
  bool cpu_amx_tile = false;   ///< CPUID.(7,0):EDX[24]
  bool os_xsave = false;       ///< CPUID.1:ECX[27] OSXSAVE (xgetbv may run)
  bool xcr0_tilecfg = false;   ///< XCR0[17]
  bool xcr0_tiledata = false;  ///< XCR0[18]
  bool intrinsics = false;     ///< built with -mamx-tile -mamx-bf16
  int permission_errno = 0;    ///< errno of ARCH_REQ_XCOMP_PERM; 0 when granted (or not asked)
};
// "" when the probe allows AMX, else the first thing missing, in the order amx_available checks.
std::string amx_unavailable_reason(const AmxProbe& probe);

}  // namespace fastformer::engine

namespace fastformer::engine::amx {

// Palette 1 (the only palette so far; CPUID leaf 0x1D): 8 tiles of up to 16 rows x 64 bytes.
inline constexpr int kTiles = 8;
inline constexpr int kMaxRows = 16;
inline constexpr int kBytesPerRow = 64;

// LDTILECFG's 64-byte memory operand. Tiles 8..15 of the arrays must stay zero in palette 1.
struct alignas(64) TileConfig {
  uint8_t palette_id = 0;     ///< 1; 0 returns every tile to the init state
  uint8_t start_row = 0;      ///< where an interrupted TILELOADD/TILESTORED resumes; 0
  uint8_t reserved[14] = {};  ///< must be zero
  uint16_t colsb[16] = {};    ///< bytes per row of each tile (0: tile unused)
  uint8_t rows[16] = {};      ///< rows of each tile (0: tile unused)

  // Tile t as `rows` x `colsb` bytes.
  void set_tile(int t, int tile_rows, int tile_colsb) {
    rows[t] = static_cast<uint8_t>(tile_rows);
    colsb[t] = static_cast<uint16_t>(tile_colsb);
  }
};
static_assert(sizeof(TileConfig) == 64);

// An instruction the CPU would fault on (#GP or #UD), raised by the model: a bug in the kernel
// (a bad configuration, a shape mismatch), never a data-dependent event.
class TileFault : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

// The model of the tile instructions, one object per thread (the tile registers and the tile
// configuration are per-thread architectural state; here, this object's members).
//
// It follows the Intel SDM's pseudocode (Vol. 2, "TDPBF16PS", "TILELOADD", "TILESTORED",
// "TILEZERO", "LDTILECFG", "TILERELEASE"):
//  - LDTILECFG checks what the reference checks (palette 0 or 1, reserved bytes zero,
//    rows <= 16, colsb <= 64, a tile's rows and colsb both zero or both non-zero, tiles 8..15
//    zero) and zeroes every tile; palette 0 is the init state (no tile configured).
//  - TILELOADD writes rows x colsb bytes and zeroes the rest of each row and the rows past
//    `rows` (write_row_and_zero, zero_upper_rows); it starts at start_row, then start_row = 0.
//  - TDPBF16PS: for each row m, two float32 accumulators per output column n (temp1[2n] for
//    the even elements of the pairs, temp1[2n+1] for the odd ones), each updated over k by an
//    FMA (one rounding), then C[m][n] = C[m][n] + (temp1[2n] + temp1[2n+1]): the SDM's order.
//    (The intrinsics guide writes a shorter form, both products added straight into C in
//    turn; the two differ in the last bits only. How the hardware orders its adds inside is
//    not documented, so hardware results may differ from the model by float32 rounding.)
//    Every step rounds to nearest even, treats denormal inputs as zero (DAZ), flushes
//    denormal results to zero (FTZ), raises nothing, and reads no MXCSR, as the reference
//    says. The shape checks of its #UD list: three distinct tiles, C.rows == A.rows,
//    A.colsb / 4 == B.rows, C.colsb == B.colsb, every colsb a multiple of 4.
//  - Any instruction but LDTILECFG before a configuration, or on a tile not configured,
//    faults (#UD).
// Left out: the TSX, XFD and page-fault paths; the T1 hint of TILELOADDT1 (a cache hint).
// The FMA is computed in double (the bfloat16 product is exact there, and a float32 result
// rounded from the double sum equals the single-rounding FMA), so the model assumes the host's
// default rounding mode.
class ModelTiles {
 public:
  void load_config(const TileConfig& config);
  template <int T>
  void load(const void* base, int64_t stride) {
    static_assert(T >= 0 && T < kTiles);
    tileloadd(T, base, stride);
  }
  template <int T>
  void store(void* base, int64_t stride) {
    static_assert(T >= 0 && T < kTiles);
    tilestored(T, base, stride);
  }
  template <int T>
  void zero() {
    static_assert(T >= 0 && T < kTiles);
    tilezero(T);
  }
  template <int C, int A, int B>
  void dpbf16ps() {
    static_assert(C >= 0 && C < kTiles && A >= 0 && A < kTiles && B >= 0 && B < kTiles);
    tdpbf16ps(C, A, B);
  }
  void release();

  // The whole 16 x 64-byte register of tile t, bytes past its shape included (tests).
  const uint8_t* tile_bytes(int t) const { return tiles_[t][0]; }
  bool configured() const { return configured_; }

 private:
  void tileloadd(int t, const void* base, int64_t stride);
  void tilestored(int t, void* base, int64_t stride);
  void tilezero(int t);
  void tdpbf16ps(int c, int a, int b);
  // #UD unless the tiles are configured and tile t is: `instruction` names the fault.
  void check_valid(const char* instruction, int t) const;
  void zero_rows_from(int t, int first_row);

  TileConfig config_{};
  bool configured_ = false;
  alignas(64) uint8_t tiles_[kTiles][kMaxRows][kBytesPerRow] = {};
};

#if defined(FASTFORMER_AMX_INTRINSICS)
// The instructions. GCC 12's intrinsics are macros that paste the tile number into the asm
// text, so each call below spells its tile number as a literal: an `if constexpr` per tile
// number, all but one discarded at compile time (clang's builtins take the template argument
// as it is).
#define FASTFORMER_AMX_EACH_TILE(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)

class HardwareTiles {
 public:
  void load_config(const TileConfig& config) {
    // GCC 12's _tile_loadconfig names only 8 bytes of its operand as read: make every store to
    // the 64 bytes happen before it.
    __asm__ volatile("" : : "r"(&config) : "memory");
    _tile_loadconfig(&config);
  }
  template <int T>
  void load(const void* base, int64_t stride) {
    static_assert(T >= 0 && T < kTiles);
    // GCC 12's tileloadd asm names no memory operand: earlier stores must not sink past it.
    __asm__ volatile("" : : "r"(base) : "memory");
#define FASTFORMER_AMX_LOAD(t) \
  if constexpr (T == t) _tile_loadd(t, base, stride);
    FASTFORMER_AMX_EACH_TILE(FASTFORMER_AMX_LOAD)
#undef FASTFORMER_AMX_LOAD
  }
  template <int T>
  void store(void* base, int64_t stride) {
    static_assert(T >= 0 && T < kTiles);
#define FASTFORMER_AMX_STORE(t) \
  if constexpr (T == t) _tile_stored(t, base, stride);
    FASTFORMER_AMX_EACH_TILE(FASTFORMER_AMX_STORE)
#undef FASTFORMER_AMX_STORE
  }
  template <int T>
  void zero() {
    static_assert(T >= 0 && T < kTiles);
#define FASTFORMER_AMX_ZERO(t) \
  if constexpr (T == t) _tile_zero(t);
    FASTFORMER_AMX_EACH_TILE(FASTFORMER_AMX_ZERO)
#undef FASTFORMER_AMX_ZERO
  }
  template <int C, int A, int B>
  void dpbf16ps() {
    static_assert(C >= 0 && C < kTiles && A >= 0 && A < kTiles && B >= 0 && B < kTiles);
    static_assert(C != A && C != B && A != B, "TDPBF16PS needs three distinct tiles (#UD)");
#if defined(__clang__)
    _tile_dpbf16ps(C, A, B);
#else
// clang-format off
#define FASTFORMER_AMX_DP(c, a, b) \
  if constexpr (C == c && A == a && B == b) _tile_dpbf16ps(c, a, b);
#define FASTFORMER_AMX_DP_A(c, a) \
  FASTFORMER_AMX_DP(c, a, 0) FASTFORMER_AMX_DP(c, a, 1) FASTFORMER_AMX_DP(c, a, 2) \
  FASTFORMER_AMX_DP(c, a, 3) FASTFORMER_AMX_DP(c, a, 4) FASTFORMER_AMX_DP(c, a, 5) \
  FASTFORMER_AMX_DP(c, a, 6) FASTFORMER_AMX_DP(c, a, 7)
#define FASTFORMER_AMX_DP_C(c) \
  FASTFORMER_AMX_DP_A(c, 0) FASTFORMER_AMX_DP_A(c, 1) FASTFORMER_AMX_DP_A(c, 2) \
  FASTFORMER_AMX_DP_A(c, 3) FASTFORMER_AMX_DP_A(c, 4) FASTFORMER_AMX_DP_A(c, 5) \
  FASTFORMER_AMX_DP_A(c, 6) FASTFORMER_AMX_DP_A(c, 7)
    // clang-format on
    FASTFORMER_AMX_EACH_TILE(FASTFORMER_AMX_DP_C)
#undef FASTFORMER_AMX_DP_C
#undef FASTFORMER_AMX_DP_A
#undef FASTFORMER_AMX_DP
#endif
  }
  void release() { _tile_release(); }
};
#undef FASTFORMER_AMX_EACH_TILE
#endif  // FASTFORMER_AMX_INTRINSICS

// The probe loops' frame: tiles 0..`count` - 1 configured full (16 rows x 64 bytes), the four
// accumulators 0..3 zeroed; at the end their sums stored to `c` (4 x 16 x 16 float32) and the
// tiles released.
template <class Tiles>
void start_four_sums(Tiles& tiles, int count) {
  TileConfig config;
  config.palette_id = 1;
  for (int t = 0; t < count; ++t) {
    config.rows[t] = kMaxRows;
    config.colsb[t] = kBytesPerRow;
  }
  tiles.load_config(config);
  tiles.template zero<0>();
  tiles.template zero<1>();
  tiles.template zero<2>();
  tiles.template zero<3>();
}
template <class Tiles>
void finish_four_sums(Tiles& tiles, float* c) {
  tiles.template store<0>(c, kBytesPerRow);
  tiles.template store<1>(c + 256, kBytesPerRow);
  tiles.template store<2>(c + 512, kBytesPerRow);
  tiles.template store<3>(c + 768, kBytesPerRow);
  tiles.release();
}

// The matrix units' peak loop (fastformer-bench's hardware peak, peak_probe.h): TDPBF16PS back
// to back on four independent accumulator tiles (tiles 0..3, 16 x 16 float32), against one A
// tile (4: 16 rows x 32 bfloat16, `a` of 16 x 32) and one B tile (5: 16 pair rows x 16
// columns, `b` of 16 x 32), `iterations` times: 4 x 16 x 16 x 32 x 2 = 65,536 FLOPs an
// iteration. Leaves the four sums in `c` (4 x 16 x 16 float32) and the tiles released. Over the
// tile layer, so the unit tests run it on the model.
template <class Tiles>
void peak_loop(Tiles& tiles, const uint16_t* a, const uint16_t* b, int64_t iterations, float* c) {
  start_four_sums(tiles, 6);
  tiles.template load<4>(a, kBytesPerRow);
  tiles.template load<5>(b, kBytesPerRow);
  for (int64_t i = 0; i < iterations; ++i) {
    tiles.template dpbf16ps<0, 4, 5>();
    tiles.template dpbf16ps<1, 4, 5>();
    tiles.template dpbf16ps<2, 4, 5>();
    tiles.template dpbf16ps<3, 4, 5>();
  }
  finish_four_sums(tiles, c);
}
inline constexpr double kPeakLoopFlops = 4.0 * 16 * 16 * 32 * 2;  ///< per iteration

// peak_loop on the instructions, with operands of bfloat16 1.0 and 2^-20; returns c[0][0][0]
// (iterations x 32 x 2^-20). Call only where amx_available(); EngineError in a build without
// the intrinsics.
float hardware_peak_loop(int64_t iterations);

// The tile loop fed from memory (fastformer-bench --gemm-probe's ceilings, peak_probe.h): 2 x 2
// accumulator tiles (0..3) as the GEMM's micro-kernel keeps them, and at every step two A tiles
// (4, 5) and two B tiles (6, 7) loaded from the next four 1 KB tiles of `buffer` (`buffer_tiles`
// of them, cycled: the working set), then four TDPBF16PS: kPeakLoopFlops an iteration, as
// peak_loop. Leaves the four sums in `c` (4 x 16 x 16 float32) and the tiles released. Over the
// tile layer, so the unit tests run it on the model.
template <class Tiles>
void fed_loop(Tiles& tiles, const uint16_t* buffer, int64_t buffer_tiles, int64_t iterations,
              float* c) {
  start_four_sums(tiles, kTiles);
  constexpr int64_t kTileElements = kMaxRows * kBytesPerRow / 2;
  const int64_t groups = std::max<int64_t>(1, buffer_tiles / 4);
  for (int64_t i = 0, g = 0; i < iterations; ++i, g = g + 1 == groups ? 0 : g + 1) {
    const uint16_t* t = buffer + g * 4 * kTileElements;
    tiles.template load<4>(t, kBytesPerRow);
    tiles.template load<5>(t + kTileElements, kBytesPerRow);
    tiles.template load<6>(t + 2 * kTileElements, kBytesPerRow);
    tiles.template load<7>(t + 3 * kTileElements, kBytesPerRow);
    tiles.template dpbf16ps<0, 4, 6>();
    tiles.template dpbf16ps<1, 4, 7>();
    tiles.template dpbf16ps<2, 5, 6>();
    tiles.template dpbf16ps<3, 5, 7>();
  }
  finish_four_sums(tiles, c);
}

// fed_loop on the instructions over a working set of `bytes` (rounded down to whole groups of
// four tiles, at least one), every element bfloat16 1.0 in A's tiles' places and 2^-20 in B's;
// returns c[0][0][0] (iterations x 32 x 2^-20). Call only where amx_available(); EngineError in
// a build without the intrinsics.
float hardware_fed_loop(int64_t bytes, int64_t iterations);

}  // namespace fastformer::engine::amx
