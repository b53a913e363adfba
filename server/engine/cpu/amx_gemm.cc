// The AMX bfloat16 GEMM (amx_gemm.h): packing, blocking, the 2 x 2-tile micro-kernel and the
// fused epilogue, written once over the tile layer (amx_tiles.h) and instantiated for the
// model and, where this file is compiled with -mamx-tile -mamx-bf16, for the instructions.
// It computes the model contract's Linear layers, `y = x W^T + b` (docs/design.md, "The model
// contract"), with the epilogues of engine::Epilogue.
#include "server/engine/cpu/amx_gemm.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <new>
#include <string>
#include <vector>

#include "common/half.h"
#include "server/engine/cpu/vector_math.h"
#include "server/engine/error.h"

namespace fastformer::engine {

namespace {

constexpr int kTileRows = amx::kMaxRows;  // 16 rows of A and C per tile
constexpr int kTileColumns = 16;          // 16 float32 columns of C, 16 n of B per tile
constexpr int kStepK = 32;                // k per tile step: 32 bfloat16 in a 64-byte row
constexpr int kBlockRows = AmxBlocking::kBlockRows;        // the micro-kernel's 2 x 2 tiles of C
constexpr int kBlockColumns = AmxBlocking::kBlockColumns;  // a pair of B tiles
static_assert(kBlockRows == 2 * kTileRows && kBlockColumns == 2 * kTileColumns);
constexpr int64_t kTileElements = kTileRows * amx::kBytesPerRow / 2;  // bfloat16 per B tile
constexpr int64_t kPanelBytes = AmxBlocking::kPanelBytes;             // packed weights per N panel

// Packed weights start on a cache line: each 1 KB B tile is 16 whole lines.
constexpr std::align_val_t kWeightAlignment{64};

// Tile numbers: C blocks (row tile, column tile), A row tiles, B column tiles.
constexpr int kC00 = 0, kC01 = 1, kC10 = 2, kC11 = 3, kA0 = 4, kA1 = 5, kB0 = 6, kB1 = 7;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---- Epilogue ------------------------------------------------------------------------------

// erf on float, branch-free and vectorisable (std::erf is a scalar library call): |x| < 1 by
// x P(x^2), else 1 - exp(-x^2) R(t) with t = 1 / (1 + |x| / 2), R ~ exp(x^2) erfc(x), both
// least-squares fits (degree 6 in x^2; degree 5 in t on [1, 4]); |x| clamped to 4, where
// erf(x) is 1 in float32. Absolute error below 1.5e-7 (relative 2e-7) over the real line.
inline float erf_approx(float x) {
  const float ax = std::min(std::fabs(x), 4.0f);
  const float x2 = ax * ax;
  float p = 7.680762771e-05f;
  p = p * x2 - 7.953756667e-04f;
  p = p * x2 + 5.181251012e-03f;
  p = p * x2 - 2.684955528e-02f;
  p = p * x2 + 1.128346095e-01f;
  p = p * x2 - 3.761261040e-01f;
  p = p * x2 + 1.128379160e+00f;
  const float small = ax * p;
  const float t = 1.0f / (1.0f + 0.5f * ax);
  float r = -2.310418651e-01f;
  r = r * t + 6.373887574e-01f;
  r = r * t - 6.529474341e-02f;
  r = r * t + 3.972914668e-01f;
  r = r * t + 2.595574845e-01f;
  r = r * t + 1.839172554e-03f;
  const float large = 1.0f - vmath::exp(-x2) * r;
  // A blend, not a branch: both halves are computed for every lane (GCC leaves `?:` here as
  // control flow, and the loop unvectorised).
  const float below = ax < 1.0f ? 1.0f : 0.0f;
  return std::copysign(large + below * (small - large), x);
}

struct GeluErf {
  float operator()(float x) const { return 0.5f * x * (1.0f + erf_approx(x * 0.70710678f)); }
};
struct GeluTanh {
  float operator()(float x) const {
    return 0.5f * x * (1.0f + vmath::tanh(0.7978845608f * (x + 0.044715f * x * x * x)));
  }
};
struct Relu {
  float operator()(float x) const { return x > 0.0f ? x : 0.0f; }
};
struct Silu {
  float operator()(float x) const { return x / (1.0f + vmath::exp(-x)); }
};

template <class Act>
void activate(float* v, int cols) {
  const Act act;
  for (int j = 0; j < cols; ++j) v[j] = act(v[j]);
}

// Rows x cols of C from the block's float32 accumulators (`acc`, rows of kBlockColumns):
// bias, activation or the old C on float32, one rounding to bfloat16. `bias` is the block's
// first column's, or null. Vectorised by the loops over a row (clones per ISA where GCC makes
// them: the hardware path runs on CPUs with AVX-512). Flattened: every call in it (activate<>,
// erf_approx, vmath::exp and tanh, the bfloat16 conversions) is inlined into each clone, so
// the activations run on that clone's vectors (zmm in the AVX-512 one); out of line they were
// compiled for baseline x86-64 (4-wide SSE, no FMA) and cost more than the GEMM (issue 51).
FASTFORMER_VECTOR_CLONES __attribute__((flatten)) void finish_block(const float* acc, int rows,
                                                                    int cols, const float* bias,
                                                                    uint16_t* c, int64_t ldc,
                                                                    Epilogue epilogue,
                                                                    Activation act) {
  static constexpr float kNoBias[kBlockColumns] = {};
  const float* b = bias ? bias : kNoBias;
  for (int r = 0; r < rows; ++r) {
    const float* x = acc + r * kBlockColumns;
    uint16_t* out = c + r * ldc;
    float v[kBlockColumns];
    switch (epilogue) {
      case Epilogue::kStore:
        for (int j = 0; j < cols; ++j) v[j] = x[j];
        break;
      case Epilogue::kBias:
      case Epilogue::kBiasAct:
        for (int j = 0; j < cols; ++j) v[j] = x[j] + b[j];
        break;
      case Epilogue::kAccumulate:  // C is read before it is written: each element once
        for (int j = 0; j < cols; ++j) v[j] = x[j] + bfloat16_to_float(out[j]);
        break;
    }
    if (epilogue == Epilogue::kBiasAct) {
      switch (act) {
        case Activation::kGeluErf:
          activate<GeluErf>(v, cols);
          break;
        case Activation::kGeluTanh:
          activate<GeluTanh>(v, cols);
          break;
        case Activation::kRelu:
          activate<Relu>(v, cols);
          break;
        case Activation::kSilu:
          activate<Silu>(v, cols);
          break;
      }
    }
    for (int j = 0; j < cols; ++j) out[j] = float_to_bfloat16(v[j]);
  }
}

// ---- The kernel, over a tile layer ---------------------------------------------------------

// The configuration of a row block: A0, C00, C01 with `rows0` rows; A1, C10, C11 with `rows1`
// (0: not configured, the block has one row tile); B0, B1 full (16 k pairs x 64 bytes).
amx::TileConfig block_config(int rows0, int rows1) {
  amx::TileConfig config;
  config.palette_id = 1;
  for (const int t : {kA0, kC00, kC01}) config.set_tile(t, rows0, amx::kBytesPerRow);
  if (rows1 > 0) {
    for (const int t : {kA1, kC10, kC11}) config.set_tile(t, rows1, amx::kBytesPerRow);
  }
  for (const int t : {kB0, kB1}) config.set_tile(t, kTileRows, amx::kBytesPerRow);
  return config;
}

// One block of C (kRowTiles x kColumnTiles tiles) over all of K into `acc` (float32 rows of
// kBlockColumns). `a`: the block's first row of A; `b`: the block's packed weights, in k steps
// of kColumnTiles tiles.
template <class Tiles, int kRowTiles, int kColumnTiles>
void multiply_block(Tiles& tiles, const uint16_t* a, int64_t lda, const uint16_t* b,
                    int64_t k_steps, float* acc) {
  const int64_t a_stride = lda * int64_t(sizeof(uint16_t));
  constexpr int64_t b_stride = amx::kBytesPerRow;  // B tiles are dense
  tiles.template zero<kC00>();
  if constexpr (kColumnTiles == 2) tiles.template zero<kC01>();
  if constexpr (kRowTiles == 2) {
    tiles.template zero<kC10>();
    if constexpr (kColumnTiles == 2) tiles.template zero<kC11>();
  }
  for (int64_t step = 0; step < k_steps; ++step) {
    const uint16_t* a_step = a + step * kStepK;
    const uint16_t* b_step = b + step * kColumnTiles * kTileElements;
    tiles.template load<kA0>(a_step, a_stride);
    if constexpr (kRowTiles == 2) tiles.template load<kA1>(a_step + kTileRows * lda, a_stride);
    tiles.template load<kB0>(b_step, b_stride);
    if constexpr (kColumnTiles == 2) tiles.template load<kB1>(b_step + kTileElements, b_stride);
    tiles.template dpbf16ps<kC00, kA0, kB0>();
    if constexpr (kColumnTiles == 2) tiles.template dpbf16ps<kC01, kA0, kB1>();
    if constexpr (kRowTiles == 2) {
      tiles.template dpbf16ps<kC10, kA1, kB0>();
      if constexpr (kColumnTiles == 2) tiles.template dpbf16ps<kC11, kA1, kB1>();
    }
  }
  constexpr int64_t acc_stride = kBlockColumns * int64_t(sizeof(float));
  float* lower = acc + kTileRows * kBlockColumns;  // rows 16..31 of the block
  tiles.template store<kC00>(acc, acc_stride);
  if constexpr (kColumnTiles == 2) tiles.template store<kC01>(acc + kTileColumns, acc_stride);
  if constexpr (kRowTiles == 2) {
    tiles.template store<kC10>(lower, acc_stride);
    if constexpr (kColumnTiles == 2) tiles.template store<kC11>(lower + kTileColumns, acc_stride);
  }
}

template <class Tiles>
void multiply(Tiles& tiles, int row_tiles, int column_tiles, const uint16_t* a, int64_t lda,
              const uint16_t* b, int64_t k_steps, float* acc) {
  if (row_tiles == 2 && column_tiles == 2) {
    multiply_block<Tiles, 2, 2>(tiles, a, lda, b, k_steps, acc);
  } else if (row_tiles == 2) {
    multiply_block<Tiles, 2, 1>(tiles, a, lda, b, k_steps, acc);
  } else if (column_tiles == 2) {
    multiply_block<Tiles, 1, 2>(tiles, a, lda, b, k_steps, acc);
  } else {
    multiply_block<Tiles, 1, 1>(tiles, a, lda, b, k_steps, acc);
  }
}

// C rows [0, m): per N panel, every row block of 32 rows, each over the panel's column pairs.
template <class Tiles>
void run_kernel(const AmxMatmul::Shape& shape, int64_t panel_pairs, int64_t m, const uint16_t* a,
                const uint16_t* w, const float* bias, uint16_t* c) {
  Tiles tiles;  // the model's registers live here; the hardware's are this thread's
  alignas(64) float acc[kBlockRows * kBlockColumns];
  const int64_t k_steps = shape.k / kStepK;
  const int64_t column_tiles = ceil_div(shape.n, kTileColumns);
  const int64_t pairs = ceil_div(column_tiles, 2);
  const int64_t pair_elements = k_steps * 2 * kTileElements;  // a full pair's packed weights
  int configured_rows0 = -1, configured_rows1 = -1;
  for (int64_t first_pair = 0; first_pair < pairs; first_pair += panel_pairs) {
    const int64_t end_pair = std::min(pairs, first_pair + panel_pairs);
    for (int64_t row = 0; row < m; row += kBlockRows) {
      const int rows = int(std::min<int64_t>(kBlockRows, m - row));
      const int rows0 = std::min(rows, kTileRows), rows1 = rows - rows0;
      if (rows0 != configured_rows0 || rows1 != configured_rows1) {  // a tail: fewer rows
        tiles.load_config(block_config(rows0, rows1));
        configured_rows0 = rows0;
        configured_rows1 = rows1;
      }
      for (int64_t pair = first_pair; pair < end_pair; ++pair) {
        const int64_t column = pair * kBlockColumns;
        const int pair_tiles = int(std::min<int64_t>(2, column_tiles - 2 * pair));
        multiply(tiles, rows1 > 0 ? 2 : 1, pair_tiles, a + row * shape.lda, shape.lda,
                 w + pair * pair_elements, k_steps, acc);
        finish_block(acc, rows, int(std::min<int64_t>(kBlockColumns, shape.n - column)),
                     bias ? bias + column : nullptr, c + row * shape.ldc + column, shape.ldc,
                     shape.epilogue, shape.act);
      }
    }
  }
  tiles.release();  // the init state: no tile data for the OS to save on a context switch
}

}  // namespace

bool AmxMatmul::supports(const Shape& shape, std::string* why) {
  std::string reason;
  if (shape.k <= 0 || shape.k % kStepK != 0) {
    reason = "k " + std::to_string(shape.k) +
             " is not a positive multiple of 32 (one A tile row, one B tile of k pairs)";
  } else if (shape.n <= 0) {
    reason = "n " + std::to_string(shape.n) + " is not positive";
  } else if (shape.lda < shape.k) {
    reason = "lda " + std::to_string(shape.lda) + " < k " + std::to_string(shape.k);
  } else if (shape.ldc < shape.n) {
    reason = "ldc " + std::to_string(shape.ldc) + " < n " + std::to_string(shape.n);
  }
  if (why) *why = reason;
  return reason.empty();
}

AmxMatmul::AmxMatmul(const Shape& shape, TileBackend backend) : shape_(shape), backend_(backend) {
  std::string why;
  if (!supports(shape, &why)) throw EngineError("AMX GEMM: " + why);
  if (backend == TileBackend::kHardware && !amx_available(&why)) {
    throw EngineError("AMX GEMM: " + why);
  }
}

int64_t AmxMatmul::panel_columns() const {
  const int64_t pair_bytes = shape_.k * kBlockColumns * int64_t(sizeof(uint16_t));
  return std::max<int64_t>(1, kPanelBytes / pair_bytes) * kBlockColumns;
}

std::string AmxMatmul::implementation() const {
  const int64_t padded_n = ceil_div(shape_.n, kTileColumns) * kTileColumns;
  return std::string(backend_ == TileBackend::kHardware ? "amx:hand" : "amx:model") +
         " bf16 (tiles 2x2, N panel " + std::to_string(std::min(panel_columns(), padded_n)) + ")";
}

AmxMatmul::Weights AmxMatmul::pack(const float* weight) const {
  const int64_t n = shape_.n, k = shape_.k;
  const int64_t k_steps = k / kStepK;
  const int64_t column_tiles = ceil_div(n, kTileColumns);
  Weights packed;
  packed.n_ = n;
  packed.k_ = k;
  packed.elements_ = column_tiles * kTileColumns * k;
  auto* tiles = static_cast<uint16_t*>(
      ::operator new(size_t(packed.elements_) * sizeof(uint16_t), kWeightAlignment));
  packed.tiles_.reset(tiles, [](const uint16_t* p) {
    ::operator delete(const_cast<uint16_t*>(p), kWeightAlignment);
  });
  // Pair p's tiles start at p * (k_steps * 2 tiles); within a pair, k step s's tiles are
  // consecutive (one or two), in the order multiply_block loads them.
  for (int64_t tile = 0; tile < column_tiles; ++tile) {
    const int64_t pair = tile / 2, in_pair = tile % 2;
    const int64_t pair_tiles = std::min<int64_t>(2, column_tiles - 2 * pair);
    for (int64_t step = 0; step < k_steps; ++step) {
      uint16_t* out = tiles + (pair * k_steps * 2 + step * pair_tiles + in_pair) * kTileElements;
      // Row r holds k pairs (2r, 2r + 1) of the step; element 2 j + i is column j's k = 2r + i.
      for (int r = 0; r < kTileRows; ++r) {
        for (int j = 0; j < kTileColumns; ++j) {
          const int64_t col = tile * kTileColumns + j;
          for (int i = 0; i < 2; ++i) {
            const int64_t kk = step * kStepK + 2 * r + i;
            out[r * 2 * kTileColumns + 2 * j + i] =
                col < n ? float_to_bfloat16(weight[col * k + kk]) : uint16_t(0);
          }
        }
      }
    }
  }
  return packed;
}

void AmxMatmul::run(int64_t m, const uint16_t* a, const Weights& weights, const float* bias,
                    uint16_t* c) const {
  if (weights.n_ != shape_.n || weights.k_ != shape_.k || !weights.tiles_) {
    throw EngineError("AMX GEMM: weights packed for [" + std::to_string(weights.n_) + ", " +
                      std::to_string(weights.k_) + "], not [" + std::to_string(shape_.n) + ", " +
                      std::to_string(shape_.k) + "]");
  }
  if (m <= 0) return;
  const int64_t panel_pairs = panel_columns() / kBlockColumns;
  if (backend_ == TileBackend::kModel) {
    run_kernel<amx::ModelTiles>(shape_, panel_pairs, m, a, weights.tiles_.get(), bias, c);
    return;
  }
#if defined(FASTFORMER_AMX_INTRINSICS)
  run_kernel<amx::HardwareTiles>(shape_, panel_pairs, m, a, weights.tiles_.get(), bias, c);
#else
  throw EngineError("AMX GEMM: this build has no AMX intrinsics");  // the constructor refused
#endif
}

double epilogue_ns_per_element(Epilogue epilogue, Activation act, double seconds) {
  // One block's accumulators (values around the activations' interesting range), the bias, and
  // C: 32 rows of 64 blocks (128 KiB of bfloat16: L2, as the kernel's C rows are).
  alignas(64) float acc[kBlockRows * kBlockColumns];
  for (int i = 0; i < kBlockRows * kBlockColumns; ++i) acc[i] = float((i * 37) % 61 - 30) * 0.1f;
  float bias[kBlockColumns];
  for (int j = 0; j < kBlockColumns; ++j) bias[j] = float(j) * 0.01f;
  constexpr int kBlocks = 64;
  const int64_t ldc = int64_t(kBlocks) * kBlockColumns;
  std::vector<uint16_t> c(size_t(kBlockRows * ldc), float_to_bfloat16(0.5f));
  int64_t elements = 0;
  const auto start = std::chrono::steady_clock::now();
  double elapsed = 0;
  do {
    for (int b = 0; b < kBlocks; ++b) {
      finish_block(acc, kBlockRows, kBlockColumns, bias, c.data() + b * kBlockColumns, ldc,
                   epilogue, act);
    }
    elements += int64_t(kBlocks) * kBlockRows * kBlockColumns;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  } while (elapsed < seconds);
  volatile uint16_t keep = c[size_t(ldc) + 3];
  (void)keep;
  return elapsed * 1e9 / double(elements);
}

}  // namespace fastformer::engine
