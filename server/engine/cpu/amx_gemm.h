// A hand-written AMX bfloat16 GEMM, beside the oneDNN one (PackedMatmul, onednn_gemm.h), with
// the same contract as PackedMatmul::run in bfloat16:
//
//   C[m, n] (=|+=) A[m, k] W[n, k]^T (+ bias, activation)
//
// A and C bfloat16 rows (leading dimensions lda, ldc, in elements: C may be a column view of
// a wider matrix), W float32 [n, k] packed once into bfloat16, bias float32 [n] or null (zero),
// float32 accumulation, one rounding to bfloat16 (to nearest even, as common/half.h) at the
// end. Epilogues as engine::Epilogue: kStore, kBias, kBiasAct (act(A W^T + b)), kAccumulate
// (the old C, read in bfloat16, plus A W^T).
//
// The kernel (amx_gemm.cc) is written once over the tile layer (amx_tiles.h) and runs either
// on the AMX instructions (TileBackend::kHardware) or on the portable model of them
// (TileBackend::kModel: any CPU, a few GFLOP/s, hundreds of times slower than the tiles; what
// the unit tests run here).
//
// Layout and blocking:
//  - Micro-kernel: a block of 32 rows x 32 columns of C in four C tiles (2 x 2 tiles of
//    16 x 16 float32), accumulated over K in steps of 32 with two A tiles (16 rows x 32
//    bfloat16, loaded straight from A's rows with stride lda) and two B tiles: 8 tiles.
//  - Packed weights: W^T in TDPBF16PS's B layout, a tile per (32 k, 16 n): 16 rows of k pairs,
//    each row 16 n x 2 bfloat16 ("VNNI" pairs), 1 KB. Tiles ordered as the kernel reads them:
//    by pair of 16-column tiles (32 columns), then by k step, then the pair's one or two
//    tiles, so a block streams its weights in order. N is padded to a multiple of 16 with
//    zero weights; only the real columns of C are stored.
//  - L2 blocking over N: the columns go in panels whose packed weights take at most ~1 MiB
//    (panel_columns(): 672 columns for k = 768, 160 for k = 3072); every row block of the call
//    runs over one panel before the next, so the panel stays in L2 (a 2 MB L2 does not hold
//    ffn_in's 4.7 MB of weights) while A's rows stream.
//  - Epilogue, per 32 x 32 block: the C tiles are stored to a float32 buffer on the calling
//    thread's stack, then bias, activation (a vectorisable erf for GELU, tanh form, ReLU,
//    SiLU through exp) or the old C are applied on float32, rounded to bfloat16 and stored:
//    only rows < m and columns < n are written.
//  - Why k % 32 == 0: a K step is one A tile (32 bfloat16 per row) against one B tile (16 rows
//    of pairs); a K tail would need a second tile configuration with a narrower A and a shorter
//    B, or a zero-padded copy of A on every call. The engine's K are 256, 768 and 3072, so
//    supports() refuses other K and the engine keeps oneDNN for them.
//  - Rows: any m >= 1. A tail of fewer than 32 rows gets a tile configuration with fewer rows
//    (its A and C tiles have m % 16 rows; one A tile when 16 or fewer remain), loaded only
//    when the shape of a row block changes, so no row of A past m is read and no padded copy is
//    made.
//
// Thread safety: run() runs on the calling thread alone (its tiles, its buffer); several
// threads may run one AmxMatmul at once on disjoint rows of C (the engine's pool splits the
// rows, as for PackedMatmul). The tile registers are per-thread state: each call configures
// them and releases them (TILERELEASE) before returning.
#pragma once

#include <compare>
#include <cstdint>
#include <memory>
#include <string>

#include "server/engine/cpu/amx_tiles.h"
#include "server/engine/ops.h"

namespace fastformer::engine {

// The kernel's blocking, in one place (docs/kernels.md, "Blocking", explains each against the
// tile loop's measured ceilings: no loads, L1-fed, L2-fed; fastformer-bench --gemm-probe).
struct AmxBlocking {
  /// Micro-kernel: 2 x 2 C tiles, a block of 32 rows x 32 columns of C over all of K; each k
  /// step loads two A and two B tiles (4 KB) for four TDPBF16PS.
  static constexpr int kBlockRows = 32;
  static constexpr int kBlockColumns = 32;
  /// Packed weights per N panel (half of a Sapphire Rapids core's 2 MiB L2): every row block of
  /// a call runs over one panel before the next, so the panel is read from memory once a call.
  static constexpr int64_t kPanelBytes = int64_t(1) << 20;
  /// Most rows of A per call of run() (a piece of the engine's pool): A's 512 rows stream
  /// through a panel; the pool gets four pieces a worker, in multiples of kBlockRows.
  static constexpr int64_t kPieceRows = 512;
};

enum class TileBackend {
  kHardware,  ///< the AMX instructions; needs amx_available()
  kModel,     ///< the portable model of the instructions (amx_tiles.h): any CPU, slow (tests)
};

// The kernel's epilogue alone (finish_block: bias, activation or the old C, the bfloat16 store)
// on whole 32 x 32 blocks, on the calling thread for about `seconds`: nanoseconds per output
// element (fastformer-bench --gemm-probe's epilogue table). Needs no AMX: the epilogue is
// vector code (the AVX-512, AVX2 or baseline clone, as the CPU picks).
double epilogue_ns_per_element(Epilogue epilogue, Activation act, double seconds);

class AmxMatmul {
 public:
  struct Shape {
    int64_t n = 0, k = 0;
    int64_t lda = 0, ldc = 0;  ///< leading dimensions of A and C, in elements
    Epilogue epilogue = Epilogue::kStore;
    Activation act = Activation::kGeluErf;  ///< for kBiasAct
    auto operator<=>(const Shape&) const = default;
  };
  // W [n, k] in bfloat16 B tiles (layout above), N padded to 16; shared by copies.
  class Weights {
   public:
    size_t bytes() const { return size_t(elements_) * sizeof(uint16_t); }

   private:
    friend class AmxMatmul;
    int64_t n_ = 0, k_ = 0, elements_ = 0;
    std::shared_ptr<const uint16_t> tiles_;
  };

  // Whether the kernel computes `shape`: k > 0 and a multiple of 32, n > 0, lda >= k,
  // ldc >= n. False with the reason in `why` (when not null).
  static bool supports(const Shape& shape, std::string* why);

  // EngineError where !supports(shape), or for kHardware where !amx_available() (its reason).
  AmxMatmul(const Shape& shape, TileBackend backend);

  Weights pack(const float* weight) const;  // W [n, k] float32, rounded to bfloat16; at load
  // C rows [0, m) from A rows [0, m); m >= 0 (0: nothing). EngineError if `weights` were packed
  // for another (n, k).
  void run(int64_t m, const uint16_t* a, const Weights& weights, const float* bias,
           uint16_t* c) const;

  const Shape& shape() const { return shape_; }
  TileBackend backend() const { return backend_; }
  int64_t panel_columns() const;  ///< N columns per L2 panel
  // "amx:hand bf16 (tiles 2x2, N panel 672)", or "amx:model bf16 (...)" on the model.
  std::string implementation() const;

 private:
  Shape shape_;
  TileBackend backend_;
};

}  // namespace fastformer::engine
