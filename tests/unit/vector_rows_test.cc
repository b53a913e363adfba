// The CPU engine's row passes (server/engine/cpu/vector_rows.h), each of the three builds this
// CPU runs (AVX-512, AVX2, baseline; the others are skipped, with the reason), against a
// double-precision reference computed here from the same inputs (rounded to bfloat16 first
// where the rows are bfloat16). Shapes include tails: widths that are not a multiple of any
// vector, partial token and head blocks of the key-score kernel, masked tokens and a chunk
// with no real token.
#include "server/engine/cpu/vector_rows.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "common/half.h"
#include "tests/support/random_values.h"

namespace fastformer::engine::rows {
namespace {

using ::fastformer::test::random_floats;
std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = float_to_bfloat16(v[i]);
  return out;
}
std::vector<float> from_bf16(const std::vector<uint16_t>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = bfloat16_to_float(v[i]);
  return out;
}
// float32 arithmetic on sums of `terms` products; a bfloat16 store adds half an ulp (2^-9).
double tol(double want, double scale, bool bf16_out) {
  return (bf16_out ? 0x1p-8 : 2e-6) * std::abs(want) + 2e-6 * scale;
}

class VectorRowsTest : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!isa_supported(GetParam()))
      GTEST_SKIP() << "this CPU does not run the " << isa_name(GetParam()) << " build";
  }
  Isa isa() const { return GetParam(); }
};

void reference_layernorm(const std::vector<double>& x, const std::vector<float>& gamma,
                         const std::vector<float>& beta, double eps, std::vector<double>& out) {
  const size_t D = x.size();
  double mean = 0, var = 0;
  for (double v : x) mean += v;
  mean /= double(D);
  for (double v : x) var += (v - mean) * (v - mean);
  var /= double(D);
  out.resize(D);
  for (size_t j = 0; j < D; ++j) out[j] = (x[j] - mean) / std::sqrt(var + eps) * gamma[j] + beta[j];
}

TEST_P(VectorRowsTest, ResidualLayerNormFloatAndBfloat16) {
  for (int64_t D : {768, 256, 36, 1}) {
    SCOPED_TRACE("D " + std::to_string(D));
    const auto c = random_floats(size_t(D), -2, 2, 1), res = random_floats(size_t(D), -1, 3, 2);
    const auto bias = random_floats(size_t(D), -0.5, 0.5, 3);
    const auto gamma = random_floats(size_t(D), 0.5, 1.5, 4),
               beta = random_floats(size_t(D), -1, 1, 5);
    std::vector<float> scratch(static_cast<size_t>(D));
    // float32, out aliasing the residual
    std::vector<float> out = res;
    residual_layernorm_row(isa(), c.data(), bias.data(), out.data(), gamma.data(), beta.data(), D,
                           1e-5f, scratch.data(), out.data());
    std::vector<double> x(static_cast<size_t>(D)), want;
    for (int64_t j = 0; j < D; ++j)
      x[size_t(j)] = double(c[size_t(j)]) + bias[size_t(j)] + res[size_t(j)];
    reference_layernorm(x, gamma, beta, 1e-5, want);
    for (int64_t j = 0; j < D; ++j)
      ASSERT_NEAR(out[size_t(j)], want[size_t(j)], tol(want[size_t(j)], 4, false)) << j;
    // bfloat16 rows
    const auto c16 = to_bf16(c), r16 = to_bf16(res);
    std::vector<uint16_t> out16(static_cast<size_t>(D));
    residual_layernorm_row(isa(), c16.data(), bias.data(), r16.data(), gamma.data(), beta.data(), D,
                           1e-5f, scratch.data(), out16.data());
    const auto cf = from_bf16(c16), rf = from_bf16(r16);
    for (int64_t j = 0; j < D; ++j)
      x[size_t(j)] = double(cf[size_t(j)]) + bias[size_t(j)] + rf[size_t(j)];
    reference_layernorm(x, gamma, beta, 1e-5, want);
    const auto got = from_bf16(out16);
    for (int64_t j = 0; j < D; ++j)
      ASSERT_NEAR(got[size_t(j)], want[size_t(j)], tol(want[size_t(j)], 4, true)) << j;
  }
}

TEST_P(VectorRowsTest, EmbedRow) {
  const int64_t D = 260;
  const auto word = random_floats(size_t(D), -1, 1, 6), pos = random_floats(size_t(D), -1, 1, 7);
  const auto gamma = random_floats(size_t(D), 0.5, 1.5, 8),
             beta = random_floats(size_t(D), -1, 1, 9);
  std::vector<float> scratch(static_cast<size_t>(D)), out(static_cast<size_t>(D));
  std::vector<uint16_t> out16(static_cast<size_t>(D));
  embed_row(isa(), word.data(), pos.data(), gamma.data(), beta.data(), D, 1e-12f, scratch.data(),
            out.data());
  embed_row(isa(), word.data(), pos.data(), gamma.data(), beta.data(), D, 1e-12f, scratch.data(),
            out16.data());
  std::vector<double> x(static_cast<size_t>(D)), want;
  for (int64_t j = 0; j < D; ++j) x[size_t(j)] = double(word[size_t(j)]) + pos[size_t(j)];
  reference_layernorm(x, gamma, beta, 1e-12, want);
  for (int64_t j = 0; j < D; ++j) {
    ASSERT_NEAR(out[size_t(j)], want[size_t(j)], tol(want[size_t(j)], 4, false)) << j;
    ASSERT_NEAR(bfloat16_to_float(out16[size_t(j)]), want[size_t(j)], tol(want[size_t(j)], 4, true))
        << j;
  }
}

TEST_P(VectorRowsTest, ScaleRows) {
  const int64_t n = 77;
  const auto x = random_floats(size_t(n), -3, 3, 10), s = random_floats(size_t(n), -2, 2, 11);
  std::vector<float> out(static_cast<size_t>(n));
  scale_row(isa(), x.data(), s.data(), n, out.data());
  for (int64_t j = 0; j < n; ++j)
    ASSERT_FLOAT_EQ(out[size_t(j)], x[size_t(j)] * s[size_t(j)]) << j;  // one rounding, exact
  const auto x16 = to_bf16(x);
  std::vector<uint16_t> out16(static_cast<size_t>(n));
  scale_row(isa(), x16.data(), s.data(), n, out16.data());
  for (int64_t j = 0; j < n; ++j) {
    const float xf = bfloat16_to_float(x16[size_t(j)]);
    ASSERT_EQ(out16[size_t(j)], float_to_bfloat16(xf * s[size_t(j)])) << j;
  }
}

// n tokens x H heads, D wide, rows ldk apart: every block shape the kernels take, tails too.
TEST_P(VectorRowsTest, KeyScoresAgainstDouble) {
  struct Case {
    int64_t n, H, D, ldk;
  };
  // Heads a multiple of the lanes take the kernel vectorised over heads (16 and 32 on every
  // build, 8 on AVX2 and baseline, 12 on baseline), the rest the token x head blocks.
  for (const Case& cs :
       {Case{37, 12, 768, 770}, Case{5, 16, 256, 256}, Case{1, 12, 768, 768}, Case{3, 5, 36, 40},
        Case{9, 1, 20, 20}, Case{29, 16, 256, 531}, Case{13, 32, 64, 64}, Case{11, 8, 40, 48}}) {
    SCOPED_TRACE("n " + std::to_string(cs.n) + " H " + std::to_string(cs.H) + " D " +
                 std::to_string(cs.D));
    const auto wka = random_floats(size_t(cs.H * cs.D), -1, 1, 13);
    const auto pq = random_floats(size_t(cs.D), -1, 1, 17);
    const auto bias = random_floats(size_t(cs.H), -1, 1, 14);
    std::vector<float> w(size_t(cs.H * cs.D)), wka_t(size_t(cs.H * cs.D));
    transpose_key_att(wka.data(), cs.H, cs.D, wka_t.data());
    key_weight(isa(), wka.data(), wka_t.data(), pq.data(), cs.H, cs.D, w.data());
    const int64_t ldr = cs.H + 3;
    const float guard = 12345.0f;
    const auto k = random_floats(size_t(cs.n * cs.ldk), -1, 1, 12);
    const auto k16 = to_bf16(k);
    for (const bool bf16 : {false, true}) {
      SCOPED_TRACE(bf16 ? "bfloat16 K" : "float K");
      std::vector<float> r(size_t(cs.n * ldr), guard);
      if (bf16)
        key_scores(isa(), k16.data(), cs.ldk, cs.n, w.data(), bias.data(), cs.H, cs.D, r.data(),
                   ldr);
      else
        key_scores(isa(), k.data(), cs.ldk, cs.n, w.data(), bias.data(), cs.H, cs.D, r.data(), ldr);
      for (int64_t t = 0; t < cs.n; ++t) {
        for (int64_t h = 0; h < ldr; ++h) {
          const float got = r[size_t(t * ldr + h)];
          if (h >= cs.H) {
            ASSERT_EQ(got, guard) << "wrote past the heads at token " << t;
            continue;
          }
          double want = bias[size_t(h)];
          for (int64_t j = 0; j < cs.D; ++j) {
            const size_t at = size_t(t * cs.ldk + j);
            const double kj = bf16 ? double(bfloat16_to_float(k16[at])) : double(k[at]);
            want += kj * double(pq[size_t(j)]) * double(wka[size_t(h * cs.D + j)]);
          }
          ASSERT_NEAR(got, want, 2e-6 * double(cs.D)) << "token " << t << " head " << h;
        }
      }
    }
  }
}

// The key scores on VDPBF16PS and on its model: both against double over the same bfloat16
// weight (pq * Wka rounded to nearest even, in pairs), and the instruction bit for bit equal to
// the model where the CPU has it; odd D (the last element alone), partial token blocks, strided
// rows and scores.
TEST_P(VectorRowsTest, KeyScoresOnBfloat16PairsAgainstDoubleAndTheInstruction) {
  struct Case {
    int64_t n, H, D, ldk;
  };
  for (const Case& cs :
       {Case{37, 16, 256, 531}, Case{16, 32, 64, 64}, Case{5, 16, 37, 40}, Case{1, 16, 2, 2}}) {
    SCOPED_TRACE("n " + std::to_string(cs.n) + " H " + std::to_string(cs.H) + " D " +
                 std::to_string(cs.D));
    const auto wka = random_floats(size_t(cs.H * cs.D), -1, 1, 13);
    const auto pq = random_floats(size_t(cs.D), -1, 1, 17);
    const auto bias = random_floats(size_t(cs.H), -1, 1, 14);
    const auto k16 = to_bf16(random_floats(size_t(cs.n * cs.ldk), -1, 1, 12));
    std::vector<float> wka_t(size_t(cs.H * cs.D));
    transpose_key_att(wka.data(), cs.H, cs.D, wka_t.data());
    std::vector<uint32_t> pairs(size_t((cs.D + 1) / 2 * cs.H));
    key_weight_pairs(isa(), wka_t.data(), pq.data(), cs.H, cs.D, pairs.data());
    const int64_t ldr = cs.H + 3;
    const float guard = 12345.0f;
    auto run = [&](DotBf16 how) {
      std::vector<float> r(size_t(cs.n * ldr), guard);
      key_scores_pairs(how, k16.data(), cs.ldk, cs.n, pairs.data(), bias.data(), cs.H, cs.D,
                       r.data(), ldr);
      return r;
    };
    const auto model = run(DotBf16::kModel);
    for (int64_t t = 0; t < cs.n; ++t) {
      for (int64_t h = 0; h < ldr; ++h) {
        const float got = model[size_t(t * ldr + h)];
        if (h >= cs.H) {
          ASSERT_EQ(got, guard) << "wrote past the heads at token " << t;
          continue;
        }
        double want = bias[size_t(h)];
        for (int64_t j = 0; j < cs.D; ++j) {
          // The weight as the pairs hold it: pq * Wka rounded to bfloat16.
          const float wj =
              bfloat16_to_float(float_to_bfloat16(wka[size_t(h * cs.D + j)] * pq[size_t(j)]));
          want += double(bfloat16_to_float(k16[size_t(t * cs.ldk + j)])) * double(wj);
        }
        ASSERT_NEAR(got, want, 2e-6 * double(cs.D)) << "token " << t << " head " << h;
      }
    }
    if (dot_bf16_available()) {
      EXPECT_EQ(run(DotBf16::kHardware), model) << "VDPBF16PS and its model differ";
    } else {
      RecordProperty("vdpbf16ps", "not on this CPU: the model only");
    }
  }
}

// The masked softmax partials of one chunk, as the reference model's softmax would weigh it.
struct Partials {
  std::vector<double> m, l, v;
};
Partials reference_chunk(const std::vector<float>& scores, int64_t heads,
                         const std::vector<float>& values, int64_t D,
                         const std::vector<uint8_t>& mask) {
  const int64_t len = int64_t(mask.size()), d = D / heads;
  Partials p{std::vector<double>(size_t(heads), -INFINITY), std::vector<double>(size_t(heads), 0),
             std::vector<double>(size_t(D), 0)};
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t t = 0; t < len; ++t)
      if (mask[size_t(t)])
        p.m[size_t(h)] = std::max(p.m[size_t(h)], double(scores[size_t(t * heads + h)]));
    for (int64_t t = 0; t < len; ++t) {
      if (!mask[size_t(t)]) continue;
      const double e = std::exp(double(scores[size_t(t * heads + h)]) - p.m[size_t(h)]);
      p.l[size_t(h)] += e;
      for (int64_t j = 0; j < d; ++j)
        p.v[size_t(h * d + j)] += e * values[size_t(t * D + h * d + j)];
    }
  }
  return p;
}

// Every layout the pooling takes: head-major weights (4 heads of 16, 12 of 64, 8 of 32: one head
// at a time, or a group of heads whose slices fill the registers, by the build), token-major
// (heads a multiple of the lanes: 16 of 16, the official model's; 32 of 32), one head (the
// pooler's), on every build; rows and scores strided as the engine passes them.
TEST_P(VectorRowsTest, PoolChunkFloatAndBfloat16) {
  struct Shape {
    int64_t heads, D, score_ld, values_ld;
  };
  for (const Shape shape :
       {Shape{4, 64, 4, 64}, Shape{16, 256, 16 + 3, 256 + 32}, Shape{1, 64, 1, 64},
        Shape{1, 256, 1, 256 + 16}, Shape{12, 768, 12, 768}, Shape{8, 256, 8 + 1, 256 + 16},
        Shape{32, 1024, 32 + 1, 1024}}) {
    const int64_t len = 37, heads = shape.heads, D = shape.D;
    SCOPED_TRACE(std::to_string(heads) + " heads, D " + std::to_string(D));
    auto scores = random_floats(size_t(len * heads), -6, 6, 15);
    const auto values = random_floats(size_t(len * D), -2, 2, 16);
    std::vector<uint8_t> mask(size_t(len), 1);
    mask[3] = mask[20] = mask[36] = 0;
    scores[size_t(20 * heads + heads - 1)] = 1e4f;  // a masked token's score must not be the max
    std::vector<float> m(static_cast<size_t>(heads)), l(static_cast<size_t>(heads)),
        v(static_cast<size_t>(D)), scratch(static_cast<size_t>(pool_scratch_floats(heads, len, D)));
    // The engine's strides: scores and rows inside wider matrices.
    auto strided = [&](const auto& x, int64_t cols, int64_t ld) {
      std::remove_cvref_t<decltype(x)> out(size_t(len * ld), 0);
      for (int64_t t = 0; t < len; ++t)
        std::copy_n(x.begin() + t * cols, cols, out.begin() + t * ld);
      return out;
    };
    auto check = [&](const Partials& want, const char* what) {
      SCOPED_TRACE(what);
      for (int64_t h = 0; h < heads; ++h) {
        ASSERT_NEAR(m[size_t(h)], want.m[size_t(h)], 1e-6) << h;
        ASSERT_NEAR(l[size_t(h)], want.l[size_t(h)], 1e-5 * want.l[size_t(h)]) << h;
      }
      for (int64_t j = 0; j < D; ++j) ASSERT_NEAR(v[size_t(j)], want.v[size_t(j)], 2e-5 * 37) << j;
    };
    const int64_t sld = shape.score_ld, vld = shape.values_ld;
    const auto scores_s = strided(scores, heads, sld);
    const auto values_s = strided(values, D, vld);
    pool_chunk(isa(), scores_s.data(), sld, heads, values_s.data(), vld, D, mask.data(), len,
               m.data(), l.data(), v.data(), scratch.data());
    check(reference_chunk(scores, heads, values, D, mask), "float scores, float values");
    // bfloat16 values (the key pool's), then bfloat16 scores too (the query pool's)
    const auto values16 = to_bf16(values), scores16 = to_bf16(scores);
    const auto values16_s = strided(values16, D, vld), scores16_s = strided(scores16, heads, sld);
    pool_chunk(isa(), scores_s.data(), sld, heads, values16_s.data(), vld, D, mask.data(), len,
               m.data(), l.data(), v.data(), scratch.data());
    check(reference_chunk(scores, heads, from_bf16(values16), D, mask), "bfloat16 values");
    pool_chunk(isa(), scores16_s.data(), sld, heads, values16_s.data(), vld, D, mask.data(), len,
               m.data(), l.data(), v.data(), scratch.data());
    check(reference_chunk(from_bf16(scores16), heads, from_bf16(values16), D, mask),
          "bfloat16 scores and values");
    // No real token: m = -inf, l = 0, v = 0 (combine() skips such a chunk).
    std::fill(mask.begin(), mask.end(), 0);
    pool_chunk(isa(), scores_s.data(), sld, heads, values_s.data(), vld, D, mask.data(), len,
               m.data(), l.data(), v.data(), scratch.data());
    for (int64_t h = 0; h < heads; ++h) {
      EXPECT_EQ(m[size_t(h)], -std::numeric_limits<float>::infinity());
      EXPECT_EQ(l[size_t(h)], 0.0f);
    }
    for (float x : v) ASSERT_EQ(x, 0.0f);
  }
}

// One row's score through tanh_scores, no bias (the row of x it fetches: e's own).
template <class E>
float tanh_dot(Isa isa, const E* e, const float* w, int64_t D) {
  float z = 0;
  tanh_scores(isa, e, D, 1, w, 0.0f, D, &z, e, D);
  return z;
}

// Lengths with and without the four-vector steps' remainder and a scalar tail.
TEST_P(VectorRowsTest, TanhDot) {
  for (const int64_t D : {771, 800, 256, 5}) {
    SCOPED_TRACE("D " + std::to_string(D));
    const auto e = random_floats(size_t(D), -4, 4, 17), w = random_floats(size_t(D), -1, 1, 18);
    double want = 0;
    for (int64_t j = 0; j < D; ++j) want += std::tanh(double(e[size_t(j)])) * w[size_t(j)];
    EXPECT_NEAR(tanh_dot(isa(), e.data(), w.data(), D), want, 1e-6 * double(D));
    const auto e16 = to_bf16(e);
    want = 0;
    for (int64_t j = 0; j < D; ++j)
      want += std::tanh(double(bfloat16_to_float(e16[size_t(j)]))) * w[size_t(j)];
    EXPECT_NEAR(tanh_dot(isa(), e16.data(), w.data(), D), want, 1e-6 * double(D));
  }
}

// The pooler's scores over strided rows (lde > D), with the bias: each row's z against tanh in
// double; the rows of x it fetches are any rows (here, unaligned to the cache's lines).
TEST_P(VectorRowsTest, TanhScoresRowByRow) {
  for (const int64_t D : {771, 256, 5}) {
    SCOPED_TRACE("D " + std::to_string(D));
    const int64_t n = 37, lde = D + 9, ldx = D + 3;
    const auto e = random_floats(size_t(n * lde), -4, 4, 19),
               w = random_floats(size_t(D), -1, 1, 20);
    const auto x = random_floats(size_t(n * ldx + 1), -1, 1, 21);
    const auto e16 = to_bf16(e), x16 = to_bf16(x);
    std::vector<float> z(static_cast<size_t>(n)), z16(static_cast<size_t>(n));
    tanh_scores(isa(), e.data(), lde, n, w.data(), 0.25f, D, z.data(), x.data() + 1, ldx);
    tanh_scores(isa(), e16.data(), lde, n, w.data(), 0.25f, D, z16.data(), x16.data() + 1, ldx);
    for (int64_t t = 0; t < n; ++t) {
      double want = 0.25, want16 = 0.25;
      for (int64_t j = 0; j < D; ++j) {
        want += std::tanh(double(e[size_t(t * lde + j)])) * w[size_t(j)];
        want16 += std::tanh(double(bfloat16_to_float(e16[size_t(t * lde + j)]))) * w[size_t(j)];
      }
      EXPECT_NEAR(z[size_t(t)], want, 1e-6 * double(D)) << "row " << t;
      EXPECT_NEAR(z16[size_t(t)], want16, 1e-6 * double(D)) << "row " << t;
    }
  }
}

// tanh lane by lane (a one-hot weight picks one lane of a 64-wide row: the four-vector steps),
// over [-20, 20] (past the clamp on both sides, and its edge), against std::tanh in double:
// within 3e-7 absolute, as vector_math.h states. A NaN lane gives a NaN.
TEST_P(VectorRowsTest, TanhLanesWithin3e7) {
  constexpr int64_t D = 64;
  std::vector<float> e(D), w(D, 0.0f);
  double worst = 0;
  float worst_at = 0;
  for (int i = -200000; i <= 200000; i += 7) {
    const float x = float(i) * 1e-4f;
    const int64_t lane = (i / 7 % D + D) % D;
    std::fill(e.begin(), e.end(), 0.5f);
    e[size_t(lane)] = x;
    w[size_t(lane)] = 1.0f;
    const double err = std::abs(double(tanh_dot(isa(), e.data(), w.data(), D)) - std::tanh(x));
    w[size_t(lane)] = 0.0f;
    if (err > worst) worst = err, worst_at = x;
  }
  EXPECT_LT(worst, 3e-7) << "at x = " << worst_at;
  e.assign(D, std::numeric_limits<float>::quiet_NaN());
  w.assign(D, 1.0f);
  EXPECT_TRUE(std::isnan(tanh_dot(isa(), e.data(), w.data(), D)));
}

INSTANTIATE_TEST_SUITE_P(Builds, VectorRowsTest,
                         ::testing::Values(Isa::kBaseline, Isa::kAvx2, Isa::kAvx512),
                         [](const auto& info) { return std::string(isa_name(info.param)); });

}  // namespace
}  // namespace fastformer::engine::rows
