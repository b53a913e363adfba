// The hand-written AMX GEMM (server/engine/cpu/amx_gemm.h) and its tile layer (amx_tiles.h):
// the model of the tile instructions on hand-computed values and on the reference's own
// order, rounding and faults; the GEMM through the model on the engine's shapes, every row
// count tail, N not a multiple of 16, column views (lda > k, ldc > n), every epilogue and
// activation, against double over the same bfloat16-rounded inputs, with guard values around C;
// the same GEMM tests on the AMX instructions where amx_available() (else skipped, with its
// reason); and amx_available()'s reasons.
#include "server/engine/cpu/amx_gemm.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <ostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/half.h"
#include "server/engine/cpu/amx_tiles.h"
#include "server/engine/error.h"
#include "tests/support/random_values.h"
#include "tests/support/reference_activation.h"

namespace fastformer::engine {

// The backend by name in the tests' descriptions (ctest -N, failures).
void PrintTo(TileBackend backend, std::ostream* out) {
  *out << (backend == TileBackend::kModel ? "model" : "hardware");
}

namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// ---- The tile model, instruction by instruction ---------------------------------------------

uint16_t bf(float x) { return float_to_bfloat16(x); }

// A configuration of palette 1 with the given (tile, rows, colsb).
amx::TileConfig config_of(std::initializer_list<std::array<int, 3>> tiles) {
  amx::TileConfig config;
  config.palette_id = 1;
  for (const auto& [t, rows, colsb] : tiles) config.set_tile(t, rows, colsb);
  return config;
}

// B in the tile's layout from B as a [k][n] matrix: row p holds k pairs (2p, 2p + 1), element
// 2 n + i is B[2p + i][n].
std::vector<uint16_t> vnni(const std::vector<std::vector<float>>& b) {
  const size_t k = b.size(), n = b[0].size();
  std::vector<uint16_t> out(k * n);
  for (size_t p = 0; p < k / 2; ++p)
    for (size_t j = 0; j < n; ++j)
      for (size_t i = 0; i < 2; ++i) out[p * 2 * n + 2 * j + i] = bf(b[2 * p + i][j]);
  return out;
}

// C (2 x 2, float32) += A (2 x 4) B (4 x 2) on hand-computed values, from a non-zero C.
TEST(AmxTileModel, DotProductOfKnownValues) {
  amx::ModelTiles tiles;
  // C: 2 rows x 2 float32; A: 2 rows x 2 pairs; B: 2 pair rows x 2 columns of pairs.
  tiles.load_config(config_of({{0, 2, 8}, {4, 2, 8}, {6, 2, 8}}));
  const float c0[2][2] = {{100.0f, 0.0f}, {0.0f, -1.0f}};
  const uint16_t a[2][4] = {{bf(1), bf(2), bf(3), bf(4)}, {bf(0.5f), bf(-1), bf(2), bf(0.25f)}};
  const std::vector<uint16_t> b = vnni({{1, 10}, {2, 20}, {3, 30}, {4, 40}});
  tiles.load<0>(c0, sizeof c0[0]);
  tiles.load<4>(a, sizeof a[0]);
  tiles.load<6>(b.data(), 8);
  tiles.dpbf16ps<0, 4, 6>();
  float c[2][2] = {};
  tiles.store<0>(c, sizeof c[0]);
  // Row 0: 1 + 4 + 9 + 16 = 30 (and 300); row 1: 0.5 - 2 + 6 + 1 = 5.5 (and 55).
  EXPECT_EQ(c[0][0], 130.0f);
  EXPECT_EQ(c[0][1], 300.0f);
  EXPECT_EQ(c[1][0], 5.5f);
  EXPECT_EQ(c[1][1], 54.0f);
  // The sources are unchanged; the destination's bytes past its 8 are zero.
  uint16_t a_back[2][4];
  tiles.store<4>(a_back, sizeof a_back[0]);
  EXPECT_EQ(std::memcmp(a, a_back, sizeof a), 0);
  for (int r = 0; r < amx::kMaxRows; ++r)
    for (int byte = (r < 2 ? 8 : 0); byte < amx::kBytesPerRow; ++byte)
      ASSERT_EQ(tiles.tile_bytes(0)[r * amx::kBytesPerRow + byte], 0) << r << " " << byte;
}

// The SDM's order: the even elements of the pairs in one float32 accumulator and the odd ones in
// another, each over all of k, then their sum added to C. Here the exact sum is 1; adding the
// four products into C in turn (the intrinsics guide's shorter form) gives 0.
TEST(AmxTileModel, DotProductAccumulatesEvenAndOddElementsApart) {
  amx::ModelTiles tiles;
  tiles.load_config(config_of({{0, 1, 4}, {1, 1, 8}, {2, 2, 4}}));
  const uint16_t a[4] = {bf(1), bf(1), bf(1), bf(1)};
  // B[k][0] for k = 0..3: 2^24, 1, 1, -2^24. Even: 2^24 + 1 = 2^24 (a tie, to even); odd:
  // 1 - 2^24, exact; their sum 1.
  const std::vector<uint16_t> b = vnni({{16777216.0f}, {1.0f}, {1.0f}, {-16777216.0f}});
  tiles.zero<0>();
  tiles.load<1>(a, sizeof a);
  tiles.load<2>(b.data(), 4);
  tiles.dpbf16ps<0, 1, 2>();
  float c = -7;
  tiles.store<0>(&c, 4);
  EXPECT_EQ(c, 1.0f);
}

// DAZ: a denormal bfloat16 input counts as zero; FTZ: a result below float32's normal range is
// flushed to zero.
TEST(AmxTileModel, DenormalInputsAreZeroAndDenormalResultsAreFlushed) {
  amx::ModelTiles tiles;
  tiles.load_config(config_of({{0, 1, 4}, {1, 1, 4}, {2, 1, 4}}));
  auto dot = [&](uint16_t a0, uint16_t a1, float b0, float b1) {
    const uint16_t a[2] = {a0, a1};
    const uint16_t b[2] = {bf(b0), bf(b1)};
    tiles.zero<0>();
    tiles.load<1>(a, 4);
    tiles.load<2>(b, 4);
    tiles.dpbf16ps<0, 1, 2>();
    float c = 0;
    tiles.store<0>(&c, 4);
    return c;
  };
  // 0x0001 is 2^-133 (denormal): times 2^100 it would be 2^-33, but it is read as zero.
  EXPECT_EQ(dot(0x0001, 0, std::ldexp(1.0f, 100), 0), 0.0f);
  EXPECT_EQ(dot(bf(std::ldexp(1.0f, -120)), 0, std::ldexp(1.0f, 100), 0), std::ldexp(1.0f, -20));
  // 2^-70 * 2^-70 = 2^-140, a float32 denormal: flushed to zero.
  EXPECT_EQ(dot(bf(std::ldexp(1.0f, -70)), 0, std::ldexp(1.0f, -70), 0), 0.0f);
  EXPECT_EQ(dot(bf(std::ldexp(1.0f, -60)), 0, std::ldexp(1.0f, -60), 0), std::ldexp(1.0f, -120));

  // Each step flushes, not only the last: C = 2^-126 (the smallest normal) plus two pairs.
  tiles.load_config(config_of({{0, 1, 4}, {1, 1, 8}, {2, 2, 4}}));
  const float min_normal = std::ldexp(1.0f, -126);
  auto dot2 = [&](const std::vector<std::vector<float>>& a_pairs,
                  const std::vector<std::vector<float>>& b_pairs) {
    const uint16_t a[4] = {bf(a_pairs[0][0]), bf(a_pairs[0][1]), bf(a_pairs[1][0]),
                           bf(a_pairs[1][1])};
    const std::vector<uint16_t> b =
        vnni({{b_pairs[0][0]}, {b_pairs[0][1]}, {b_pairs[1][0]}, {b_pairs[1][1]}});
    tiles.load<0>(&min_normal, 4);
    tiles.load<1>(a, 8);
    tiles.load<2>(b.data(), 4);
    tiles.dpbf16ps<0, 1, 2>();
    float c = 0;
    tiles.store<0>(&c, 4);
    return c;
  };
  const float p63 = std::ldexp(1.0f, -63), p70 = std::ldexp(1.0f, -70);
  // The FMAs: the even accumulator's 2^-140 is flushed before 2^-126 is added to it
  // (unflushed, the sum would be 2^-126 + 2^-140, a float32).
  EXPECT_EQ(dot2({{p70, 0}, {p63, 0}}, {{p70, 0}, {p63, 0}}), 2 * min_normal);
  // The horizontal add: even 1.5 * 2^-126 plus odd -2^-126 is 2^-127, flushed before C is
  // added (unflushed, C would be 1.5 * 2^-126).
  EXPECT_EQ(dot2({{1.5f * p63, p63}, {0, 0}}, {{p63, -p63}, {0, 0}}), min_normal);
}

// TILELOADD reads rows x colsb bytes at the stride; TILESTORED writes exactly those bytes back,
// at its own stride, and nothing between the rows.
TEST(AmxTileModel, LoadAndStoreMoveRowsByColsbAtTheStride) {
  amx::ModelTiles tiles;
  tiles.load_config(config_of({{3, 3, 12}}));
  std::vector<uint8_t> memory(4 * 100);
  for (size_t i = 0; i < memory.size(); ++i) memory[i] = uint8_t(i * 7 + 1);
  tiles.load<3>(memory.data(), 100);
  for (int r = 0; r < amx::kMaxRows; ++r) {
    for (int byte = 0; byte < amx::kBytesPerRow; ++byte) {
      const uint8_t want = r < 3 && byte < 12 ? memory[size_t(r * 100 + byte)] : 0;
      ASSERT_EQ(tiles.tile_bytes(3)[r * amx::kBytesPerRow + byte], want) << r << " " << byte;
    }
  }
  std::vector<uint8_t> out(3 * 20, 0xee);
  tiles.store<3>(out.data(), 20);
  for (int r = 0; r < 3; ++r) {
    for (int byte = 0; byte < 20; ++byte) {
      const uint8_t want = byte < 12 ? memory[size_t(r * 100 + byte)] : 0xee;
      ASSERT_EQ(out[size_t(r * 20 + byte)], want) << r << " " << byte;
    }
  }
}

// A start_row (an interrupted load resumed) loads from that row on, then goes back to 0.
TEST(AmxTileModel, ALoadStartsAtStartRowThenAtZero) {
  amx::ModelTiles tiles;
  amx::TileConfig config = config_of({{0, 4, 4}});
  config.start_row = 2;
  tiles.load_config(config);
  const float rows[4] = {1, 2, 3, 4};
  tiles.load<0>(rows, 4);
  float out[4];
  tiles.store<0>(out, 4);
  EXPECT_THAT(out, ::testing::ElementsAre(0, 0, 3, 4));
  tiles.load<0>(rows, 4);
  tiles.store<0>(out, 4);
  EXPECT_THAT(out, ::testing::ElementsAre(1, 2, 3, 4));
}

TEST(AmxTileModel, ZeroClearsTheTile) {
  amx::ModelTiles tiles;
  tiles.load_config(config_of({{5, 16, 64}}));
  std::vector<uint8_t> ones(16 * 64, 0xff);
  tiles.load<5>(ones.data(), 64);
  tiles.zero<5>();
  for (int i = 0; i < 16 * 64; ++i) ASSERT_EQ(tiles.tile_bytes(5)[i], 0) << i;
}

// What the hardware faults on, the model throws: configurations past palette 1's limits,
// instructions before a configuration or on an unconfigured tile, and TDPBF16PS on tiles whose
// shapes do not fit.
TEST(AmxTileModel, FaultsWhereTheReferenceFaults) {
  amx::ModelTiles tiles;
  const float data[16 * 16] = {};
  EXPECT_THROW(tiles.load<0>(data, 64), amx::TileFault);  // not configured
  EXPECT_THROW(tiles.load_config(config_of({{0, 17, 64}})), amx::TileFault);
  EXPECT_THROW(tiles.load_config(config_of({{0, 16, 65}})), amx::TileFault);
  EXPECT_THROW(tiles.load_config(config_of({{0, 0, 4}})), amx::TileFault);
  EXPECT_THROW(tiles.load_config(config_of({{0, 4, 0}})), amx::TileFault);
  EXPECT_THROW(tiles.load_config(config_of({{8, 1, 4}})), amx::TileFault);  // tile 8 of 8
  amx::TileConfig bad = config_of({{0, 1, 4}});
  bad.palette_id = 2;
  EXPECT_THROW(tiles.load_config(bad), amx::TileFault);
  bad = config_of({{0, 1, 4}});
  bad.reserved[3] = 1;
  EXPECT_THROW(tiles.load_config(bad), amx::TileFault);
  EXPECT_FALSE(tiles.configured());

  tiles.load_config(config_of({{0, 16, 64}, {1, 16, 64}, {2, 16, 64}, {3, 8, 64}, {4, 16, 32}}));
  EXPECT_TRUE(tiles.configured());
  EXPECT_THROW(tiles.load<7>(data, 64), amx::TileFault);  // tile 7 not configured
  tiles.load<0>(data, 64);
  EXPECT_THROW((tiles.dpbf16ps<0, 0, 1>()), amx::TileFault);  // not distinct
  EXPECT_THROW((tiles.dpbf16ps<3, 1, 2>()), amx::TileFault);  // C.rows 8 != A.rows 16
  EXPECT_THROW((tiles.dpbf16ps<0, 4, 2>()), amx::TileFault);  // A.colsb / 4 = 8 != B.rows 16
  EXPECT_THROW((tiles.dpbf16ps<0, 1, 4>()), amx::TileFault);  // C.colsb 64 != B.colsb 32
  tiles.dpbf16ps<0, 1, 2>();
  try {
    tiles.dpbf16ps<3, 1, 2>();
    ADD_FAILURE() << "no fault";
  } catch (const amx::TileFault& fault) {
    EXPECT_THAT(fault.what(), HasSubstr("TDPBF16PS: #UD: C.rows != A.rows"));
  }
  // Palette 0 and TILERELEASE both return to the init state.
  tiles.load_config(amx::TileConfig{});
  EXPECT_FALSE(tiles.configured());
  EXPECT_THROW(tiles.zero<0>(), amx::TileFault);
  tiles.load_config(config_of({{0, 16, 64}}));
  tiles.release();
  EXPECT_THROW(tiles.zero<0>(), amx::TileFault);
}

// ---- The GEMM against double ---------------------------------------------------------------

using ::fastformer::test::random_values;

struct GemmCase {
  int64_t m, n, k, lda, ldc;
  Epilogue epilogue;
  Activation act = Activation::kGeluErf;
};

std::string describe(const GemmCase& c) {
  return "m " + std::to_string(c.m) + " n " + std::to_string(c.n) + " k " + std::to_string(c.k) +
         " lda " + std::to_string(c.lda) + " ldc " + std::to_string(c.ldc) + " epilogue " +
         std::to_string(int(c.epilogue)) + " act " + std::to_string(int(c.act));
}

constexpr uint16_t kGuard = 0x7fa5;    // a NaN nobody writes: C's rows and columns not computed
constexpr uint16_t kPadding = 0x7fc0;  // NaN in A's columns past k: read, they would show

// The inputs of one case, rounded to bfloat16 as the kernel takes them, and C with a guard row
// above and below and guard columns past n.
struct GemmData {
  GemmCase c;
  std::vector<uint16_t> a;  // [m, lda], NaN past k
  std::vector<float> w;     // [n, k] float32 as given to pack()
  std::vector<float> bias;
  std::vector<uint16_t> c_buffer;  // [m + 2, ldc]: C is rows 1 .. m
  std::vector<uint16_t> c_before;

  explicit GemmData(const GemmCase& gemm, uint32_t seed = 1) : c(gemm) {
    const auto a_values = random_values(size_t(c.m * c.k), seed, 0.5f);
    a.assign(size_t(c.m * c.lda), kPadding);
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t p = 0; p < c.k; ++p)
        a[size_t(i * c.lda + p)] = bf(a_values[size_t(i * c.k + p)]);
    w = random_values(size_t(c.n * c.k), seed + 1, 0.1f);
    bias = random_values(size_t(c.n), seed + 2, 1.0f);
    const auto old_c = random_values(size_t(c.m * c.n), seed + 3, 1.0f);
    c_buffer.assign(size_t((c.m + 2) * c.ldc), kGuard);
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t j = 0; j < c.n; ++j) c_out()[i * c.ldc + j] = bf(old_c[size_t(i * c.n + j)]);
    c_before = c_buffer;
  }
  uint16_t* c_out() { return c_buffer.data() + c.ldc; }
};

// Every C element against double over the bfloat16 inputs: within a bfloat16 rounding of the
// value (2^-8 relative) plus float32 accumulation over k (relative to the sum of |products|,
// growing as sqrt(k)) and the activations' float32 approximations; everything outside C's
// m x n unchanged.
void expect_matches_double(GemmData& d) {
  const GemmCase& c = d.c;
  std::vector<double> w16(d.w.size());
  for (size_t i = 0; i < d.w.size(); ++i) w16[i] = bfloat16_to_float(bf(d.w[i]));
  double worst = 0;
  int64_t failures = 0;
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < c.n; ++j) {
      double acc = 0, magnitude = 0;
      for (int64_t p = 0; p < c.k; ++p) {
        const double product =
            bfloat16_to_float(d.a[size_t(i * c.lda + p)]) * w16[size_t(j * c.k + p)];
        acc += product;
        magnitude += std::abs(product);
      }
      const double old = bfloat16_to_float(d.c_before[size_t((i + 1) * c.ldc + j)]);
      double want = acc;
      if (c.epilogue == Epilogue::kBias) want = acc + d.bias[size_t(j)];
      if (c.epilogue == Epilogue::kBiasAct)
        want = test::reference_activation(acc + d.bias[size_t(j)], c.act);
      if (c.epilogue == Epilogue::kAccumulate) want = old + acc;
      const double got = bfloat16_to_float(d.c_out()[i * c.ldc + j]);
      const double tolerance = std::ldexp(std::abs(want), -8) +
                               8 * std::sqrt(double(c.k)) * std::ldexp(magnitude, -24) + 1e-6;
      const double error = std::abs(got - want);
      worst = std::max(worst, error / tolerance);
      if (!(error <= tolerance) && failures++ < 5) {
        ADD_FAILURE() << describe(c) << ": C[" << i << "][" << j << "] = " << got << ", want "
                      << want << " (tolerance " << tolerance << ")";
      }
    }
  }
  EXPECT_EQ(failures, 0) << describe(c) << ": worst error / tolerance " << worst;
  int64_t guards_written = 0;
  for (int64_t row = 0; row < c.m + 2; ++row) {
    for (int64_t j = 0; j < c.ldc; ++j) {
      const bool in_c = row >= 1 && row <= c.m && j < c.n;
      const size_t at = size_t(row * c.ldc + j);
      if (!in_c && d.c_buffer[at] != d.c_before[at] && guards_written++ < 5) {
        ADD_FAILURE() << describe(c) << ": row " << row - 1 << " column " << j
                      << " outside C was written";
      }
    }
  }
  EXPECT_EQ(guards_written, 0);
}

// The GEMM tests run on both tile layers; the hardware's are skipped where the CPU, the OS or
// the build cannot run AMX, with amx_available()'s reason.
class AmxGemmTest : public ::testing::TestWithParam<TileBackend> {
 protected:
  void SetUp() override {
    std::string why;
    if (GetParam() == TileBackend::kHardware && !amx_available(&why)) {
      GTEST_SKIP() << "AMX not available: " << why
                   << " (the model ran the same kernel: AmxGemmTest/Model)";
    }
  }
  void check(const GemmCase& c) {
    SCOPED_TRACE(describe(c));
    GemmData d(c, uint32_t(c.m * 7 + c.n * 3 + c.k));
    const AmxMatmul mm({c.n, c.k, c.lda, c.ldc, c.epilogue, c.act}, GetParam());
    const AmxMatmul::Weights w = mm.pack(d.w.data());
    mm.run(c.m, d.a.data(), w, d.bias.data(), d.c_out());
    expect_matches_double(d);
  }
};

// Every epilogue and activation, on a block with a row tail (17 rows: 16 + 1) and a column tail
// (40 = 32 + 8: a pair of tiles, then one tile of which 8 columns are real).
TEST_P(AmxGemmTest, EveryEpilogueAndActivation) {
  for (const Epilogue epilogue : {Epilogue::kStore, Epilogue::kBias, Epilogue::kAccumulate})
    check({17, 40, 64, 64, 40, epilogue});
  for (const Activation act :
       {Activation::kGeluErf, Activation::kGeluTanh, Activation::kRelu, Activation::kSilu})
    check({17, 40, 64, 64, 40, Epilogue::kBiasAct, act});
}

// Row counts around the 16-row tiles and 32-row blocks (tails of 1, 15, 16, 17 rows; 33 = one
// block + 1; 100 = 3 blocks + 4), with N not a multiple of 16 (12, 44) and column views: A with
// lda > k (its padding NaN), C with ldc > n (its other columns guards).
TEST_P(AmxGemmTest, RowTailsColumnTailsAndColumnViews) {
  for (const int64_t m : {1, 15, 16, 17, 33, 100}) {
    check({m, 12, 32, 48, 20, Epilogue::kBias});
    check({m, 44, 96, 100, 45, Epilogue::kAccumulate});
  }
  check({33, 44, 96, 96, 44, Epilogue::kBiasAct, Activation::kSilu});
}

// The engine's shapes (base model: D 768, Q|K|s 1548 in rows of 1552, ffn 3072) and the demo
// model's (256, 528), with few rows: the model is slow.
TEST_P(AmxGemmTest, EngineShapes) {
  check({33, 528, 256, 256, 528, Epilogue::kBias});
  check({100, 256, 256, 528, 528, Epilogue::kAccumulate});  // a column view of a wider C
  check({17, 1548, 768, 768, 1552, Epilogue::kBias});       // Q|K|s
  check({37, 3072, 768, 768, 3072, Epilogue::kBiasAct});    // ffn in, erf GELU
  check({5, 768, 3072, 3072, 768, Epilogue::kStore});       // ffn out
}

// base-long's GEMM shapes (D 768, Q|K|s 1548 in rows of 1552, ffn 3072) at a small M, against
// double: every epilogue and activation on ffn_in's (3072, 768), the site of the GELU the AVX-512
// clone now runs inline (issue 51), and each other site with the engine's own epilogue. (Each
// case is one row tile on the model; the set takes about 0.9 s in Release, 7 s under ASan.)
TEST_P(AmxGemmTest, BaseLongsShapesAndEveryEpilogue) {
  for (const Epilogue epilogue : {Epilogue::kStore, Epilogue::kBias, Epilogue::kAccumulate})
    check({2, 3072, 768, 768, 3072, epilogue});
  for (const Activation act :
       {Activation::kGeluErf, Activation::kGeluTanh, Activation::kRelu, Activation::kSilu})
    check({2, 3072, 768, 768, 3072, Epilogue::kBiasAct, act});
  check({3, 1548, 768, 768, 1552, Epilogue::kBias});        // Q|K|s
  check({3, 768, 768, 768, 768, Epilogue::kBias});          // transform
  check({3, 768, 768, 768, 768, Epilogue::kAccumulate});    // attention output + residual
  check({3, 768, 3072, 3072, 768, Epilogue::kAccumulate});  // ffn out + residual
}

// Pool threads run one AmxMatmul at once on disjoint rows: the result is the one-thread result,
// bit for bit.
TEST_P(AmxGemmTest, ThreadsRunDisjointRows) {
  const GemmCase c{70, 48, 64, 64, 48, Epilogue::kBiasAct, Activation::kGeluTanh};
  GemmData one(c), four(c);
  const AmxMatmul mm({c.n, c.k, c.lda, c.ldc, c.epilogue, c.act}, GetParam());
  const AmxMatmul::Weights w = mm.pack(one.w.data());
  mm.run(c.m, one.a.data(), w, one.bias.data(), one.c_out());
  const int64_t pieces[][2] = {{0, 16}, {16, 17}, {33, 32}, {65, 5}};  // (first row, rows)
  std::vector<std::thread> threads;
  for (const auto& [first, rows] : pieces) {
    threads.emplace_back([&, first = first, rows = rows] {
      mm.run(rows, four.a.data() + first * c.lda, w, four.bias.data(),
             four.c_out() + first * c.ldc);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(one.c_buffer, four.c_buffer);
}

// A null bias is a zero bias.
TEST_P(AmxGemmTest, NullBiasIsZero) {
  const GemmCase c{3, 20, 32, 32, 20, Epilogue::kBias};
  GemmData with_zero(c), with_null(c);
  std::fill(with_zero.bias.begin(), with_zero.bias.end(), 0.0f);
  const AmxMatmul mm({c.n, c.k, c.lda, c.ldc, c.epilogue, c.act}, GetParam());
  const AmxMatmul::Weights w = mm.pack(with_zero.w.data());
  mm.run(c.m, with_zero.a.data(), w, with_zero.bias.data(), with_zero.c_out());
  mm.run(c.m, with_null.a.data(), w, nullptr, with_null.c_out());
  EXPECT_EQ(with_zero.c_buffer, with_null.c_buffer);
  mm.run(0, with_null.a.data(), w, nullptr, with_null.c_out());  // no rows: nothing
  EXPECT_EQ(with_zero.c_buffer, with_null.c_buffer);
}

INSTANTIATE_TEST_SUITE_P(Backends, AmxGemmTest,
                         ::testing::Values(TileBackend::kModel, TileBackend::kHardware),
                         [](const ::testing::TestParamInfo<TileBackend>& info) {
                           return info.param == TileBackend::kModel ? "Model" : "Hardware";
                         });

// ---- Shapes, packing, the implementation's name --------------------------------------------

TEST(AmxMatmul, SupportsKMultipleOf32AndRefusesTheRest) {
  std::string why;
  EXPECT_TRUE(AmxMatmul::supports({1548, 768, 768, 1552, Epilogue::kBias}, &why));
  EXPECT_EQ(why, "");
  EXPECT_FALSE(AmxMatmul::supports({64, 48, 48, 64, Epilogue::kStore}, &why));
  EXPECT_THAT(why, HasSubstr("k 48 is not a positive multiple of 32"));
  EXPECT_FALSE(AmxMatmul::supports({64, 0, 0, 64, Epilogue::kStore}, nullptr));
  EXPECT_FALSE(AmxMatmul::supports({0, 32, 32, 0, Epilogue::kStore}, &why));
  EXPECT_THAT(why, HasSubstr("n 0"));
  EXPECT_FALSE(AmxMatmul::supports({64, 64, 32, 64, Epilogue::kStore}, &why));
  EXPECT_THAT(why, HasSubstr("lda 32 < k 64"));
  EXPECT_FALSE(AmxMatmul::supports({64, 64, 64, 63, Epilogue::kStore}, &why));
  EXPECT_THAT(why, HasSubstr("ldc 63 < n 64"));
  try {
    AmxMatmul({64, 48, 48, 64, Epilogue::kStore}, TileBackend::kModel);
    ADD_FAILURE() << "k 48 accepted";
  } catch (const EngineError& e) {
    EXPECT_THAT(e.what(), HasSubstr("k 48"));
  }
}

// N padded to 16 with zero weights: 12 columns pack as 16, 1548 as 1552; weights of another
// shape are refused.
TEST(AmxMatmul, PacksNPaddedTo16AndChecksTheWeightsShape) {
  const AmxMatmul narrow({12, 64, 64, 12, Epilogue::kStore}, TileBackend::kModel);
  EXPECT_EQ(narrow.pack(std::vector<float>(12 * 64).data()).bytes(), size_t(16 * 64 * 2));
  const AmxMatmul qks({1548, 32, 32, 1552, Epilogue::kStore}, TileBackend::kModel);
  const AmxMatmul::Weights qks_weights = qks.pack(std::vector<float>(1548 * 32).data());
  EXPECT_EQ(qks_weights.bytes(), size_t(1552 * 32 * 2));
  std::vector<uint16_t> a(32), c(12);
  EXPECT_THROW(narrow.run(1, a.data(), qks_weights, nullptr, c.data()), EngineError);
  EXPECT_THROW(narrow.run(1, a.data(), AmxMatmul::Weights{}, nullptr, c.data()), EngineError);
}

// Panels of ~1 MiB of packed weights: 672 columns for k = 768, 160 for k = 3072; the name says
// which tile layer ran and the blocking.
TEST(AmxMatmul, PanelsOfAboutAMegabyteAndTheImplementationsName) {
  const AmxMatmul ffn_in({3072, 768, 768, 3072, Epilogue::kBiasAct}, TileBackend::kModel);
  EXPECT_EQ(ffn_in.panel_columns(), 672);
  EXPECT_LE(ffn_in.panel_columns() * 768 * 2, 1 << 20);
  EXPECT_EQ(ffn_in.implementation(), "amx:model bf16 (tiles 2x2, N panel 672)");
  const AmxMatmul ffn_out({768, 3072, 3072, 768, Epilogue::kStore}, TileBackend::kModel);
  EXPECT_EQ(ffn_out.panel_columns(), 160);
  const AmxMatmul small({528, 256, 256, 528, Epilogue::kBias}, TileBackend::kModel);
  EXPECT_EQ(small.implementation(), "amx:model bf16 (tiles 2x2, N panel 528)");
  std::string why;
  if (amx_available(&why)) {
    const AmxMatmul hand({528, 256, 256, 528, Epilogue::kBias}, TileBackend::kHardware);
    EXPECT_THAT(hand.implementation(), StartsWith("amx:hand bf16"));
  }
}

// ---- amx_available --------------------------------------------------------------------------

// Where AMX cannot run (this repository's machines: AMD Zen 4), amx_available says why, and the
// hardware backend is refused with that reason.
TEST(AmxAvailable, FalseComesWithAReason) {
  std::string why = "unset";
  const bool available = amx_available(&why);
  EXPECT_EQ(amx_available(nullptr), available);  // asked twice: the same answer
  if (available) {
    EXPECT_EQ(why, "");
    return;
  }
  EXPECT_FALSE(why.empty());
  EXPECT_EQ(why.find('\n'), std::string::npos);
  try {
    AmxMatmul({64, 64, 64, 64, Epilogue::kStore}, TileBackend::kHardware);
    ADD_FAILURE() << "the hardware backend was built without AMX";
  } catch (const EngineError& e) {
    EXPECT_THAT(e.what(), HasSubstr(why));
  }
}

// Every step's reason, in the order amx_available checks them.
TEST(AmxAvailable, EachMissingStepNamesItself) {
  AmxProbe probe{true, true, true, true, true, true, true, 0};
  EXPECT_EQ(amx_unavailable_reason(probe), "");
  AmxProbe no_cpu = probe;
  no_cpu.cpu_amx_tile = false;
  EXPECT_EQ(amx_unavailable_reason(no_cpu), "no AMX on this CPU (CPUID AMX-BF16/AMX-TILE not set)");
  AmxProbe no_xsave = probe;
  no_xsave.os_xsave = false;
  EXPECT_THAT(amx_unavailable_reason(no_xsave), HasSubstr("OSXSAVE"));
  AmxProbe no_xcr0 = probe;
  no_xcr0.xcr0_tiledata = false;
  EXPECT_THAT(amx_unavailable_reason(no_xcr0), HasSubstr("XCR0"));
  AmxProbe no_intrinsics = probe;
  no_intrinsics.intrinsics = false;
  EXPECT_THAT(amx_unavailable_reason(no_intrinsics), HasSubstr("-mamx-tile"));
  AmxProbe refused = probe;
  refused.permission_errno = EPERM;
  EXPECT_EQ(
      amx_unavailable_reason(refused),
      std::string("the kernel refused tile data permission (arch_prctl ARCH_REQ_XCOMP_PERM: ") +
          std::strerror(EPERM) + ")");
  AmxProbe arm;
  EXPECT_THAT(amx_unavailable_reason(arm), HasSubstr("not an x86-64 build"));
}

}  // namespace
}  // namespace fastformer::engine
