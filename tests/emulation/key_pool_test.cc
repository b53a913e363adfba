// launch_key_pool_partials (kernels/key_pool.cu), the key pool's chunk partials in one pass over
// K, on the emulation: its partials against those of the old two launches (key_scores +
// pool_partials<T, float>), and the key pool it leads to (pool_combine times pq) against a
// double-precision reference of the formula. Ragged batches of 1, 7, 300, 5,000 (20 chunks),
// 256 and 513 tokens, a fifth of the tokens padding (their K rows NaN, so a padding token that
// weighed anything, or was multiplied by a zero weight, would show), a chunk of padding only in
// the middle of the long sequence. Shapes: base-long's 12 heads of 64 in Q|K|s rows padded
// (16-byte copies) and at their natural width (8-byte copies), tiny ones (2 heads of 16, 3 of
// 16, 5 of 8 with D not a multiple of 16, 12 heads of 3 columns), the widest the kernel takes
// (16 heads, D = 1024), and shapes it hands to the old launches (20 heads, D over 1024, half or
// bfloat16 rows only 2-byte aligned). The race check runs it under two schedules.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "tests/emulation/device_buffer.h"
#include "tests/emulation/pooling_batch.h"

namespace fastformer::emulation_test {
namespace {

namespace kn = ::fastformer::kernels;

struct Case {
  int32_t D, H;
  int64_t ld, offset;             // K is `D` columns at `offset` in rows of `ld` elements
  bool fused_16bit, fused_float;  // whether the one-pass kernel takes it (else the old launches)
};
const Case kCases[] = {
    {768, 12, 1552, 768, true, true},  // Q|K|s rows padded to 8 elements: 16-byte copies
    {768, 12, 1548, 768, true, true},  // natural width 2D + H: 8-byte copies in 16-bit
    {32, 2, 32, 0, true, true},        // tiny: 4 vectors, 64 slots of tokens
    {48, 3, 56, 0, true, true},        // an odd number of heads
    {40, 5, 40, 0, true, true},        // D not a multiple of 16: zero columns in the tiles
    {36, 12, 36, 0, true, true},       // heads of 3 columns: a column a vector
    {1024, 16, 1024, 0, true, true},   // the widest: 8 steps of 16 columns a warp, 16 heads
    {48, 3, 49, 0, false, true},       // rows 2-byte aligned in 16-bit: no cp.async
    {40, 20, 40, 0, false, false},     // over 16 heads
    {1040, 8, 1040, 0, false, false},  // over 1024 columns
};
std::string name(const Case& c) {
  return "D " + std::to_string(c.D) + ", " + std::to_string(c.H) + " heads, ld " +
         std::to_string(c.ld);
}

// 1, 7, 300, 1,300 (6 chunks; its tokens 512 .. 767, a whole chunk, padding), 256, 513: every
// case of a chunk, at a size the emulation runs in seconds.
Batch make_batch(std::mt19937& rng) {
  Batch batch({1, 7, 300, 1300, 256, 513}, rng);
  batch.pad(3, 500, 800);
  return batch;
}

// The inputs of one key pool: K rows (padding rows and the other columns NaN), pq, Wka', bka'.
template <class T>
struct KeyPoolInputs {
  Case shape;
  std::mt19937 rng{4321};
  Batch batch = make_batch(rng);
  std::vector<T> rows, pq, wka, bka;

  explicit KeyPoolInputs(const Case& c) : shape(c) {
    const int32_t D = c.D, H = c.H, B = batch.sequences();
    rows.assign(size_t(batch.tokens()) * size_t(c.ld), from_float<T>(NAN));
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (int32_t t = 0; t < batch.tokens(); ++t) {
      if (!batch.mask[size_t(t)]) continue;
      for (int32_t j = 0; j < D; ++j)
        rows[size_t(t) * size_t(c.ld) + size_t(c.offset + j)] = from_float<T>(u(rng));
    }
    pq = random_values<T>(size_t(B) * size_t(D), -1.0f, 1.0f, rng);
    // Scores of about unit spread at every D. (Not far from 0: a computed float score's
    // absolute rounding grows with its size, and the weights' error with it; pooling_test.cc
    // has scores near 60 as inputs.)
    const float w = 0.2f * std::sqrt(768.0f / float(D));
    wka = random_values<T>(size_t(H) * size_t(D), -w, w, rng);
    bka = random_values<T>(size_t(H), -1.0f, 1.0f, rng);
  }
  double k_at(int32_t t, int32_t j) const {
    return value(rows[size_t(t) * size_t(shape.ld) + size_t(shape.offset + j)]);
  }
  // r_{t,h} = (K_t * pq_b) . Wka'[h] + bka'[h] in double.
  double score(int32_t t, int32_t h) const {
    const int32_t b = batch.token_seq[size_t(t)], D = shape.D;
    double r = value(bka[size_t(h)]);
    for (int32_t j = 0; j < D; ++j) {
      r += k_at(t, j) * value(pq[size_t(b) * size_t(D) + size_t(j)]) *
           value(wka[size_t(h) * size_t(D) + size_t(j)]);
    }
    return r;
  }
};

struct HostPartials {
  std::vector<float> m, l, v;
};

// The inputs in device memory, and the two ways to the partials.
template <class T>
struct KeyPoolRun {
  const KeyPoolInputs<T>& in;
  DeviceBatch dev;
  DeviceBuffer<T> rows, pq, wka, bka;
  DeviceBuffer<float> scores;
  DevicePartials partials;
  explicit KeyPoolRun(const KeyPoolInputs<T>& inputs)
      : in(inputs),
        dev(inputs.batch),
        rows(inputs.rows),
        pq(inputs.pq),
        wka(inputs.wka),
        bka(inputs.bka),
        scores(size_t(inputs.batch.tokens()) * size_t(inputs.shape.H)),
        partials(inputs.batch, inputs.shape.H, inputs.shape.D) {}
  const T* k() const { return rows.get() + in.shape.offset; }

  // Returns whether the one-pass kernel ran.
  bool fused() {
    bool ran = false;
    ff_emu::set_launch_observer([&](const ff_emu::LaunchInfo& info) {
      ran = ran || std::strstr(info.kernel_name, "key_pool_partials_kernel") != nullptr;
    });
    kn::launch_key_pool_partials<T>(dev.args, k(), in.shape.ld, pq.get(), wka.get(), bka.get(),
                                    in.shape.H, in.shape.D, scores.get(), partials.get(), nullptr);
    ff_emu::set_launch_observer({});
    return ran;
  }
  void old_path() {
    kn::launch_key_scores<T>(dev.args, k(), in.shape.ld, pq.get(), wka.get(), bka.get(), in.shape.H,
                             in.shape.D, scores.get(), nullptr);
    kn::launch_pool_partials<T, float>(dev.args, scores.get(), in.shape.H, in.shape.H, k(),
                                       in.shape.ld, in.shape.D, partials.get(), nullptr);
  }
  HostPartials download() const {
    return {partials.m.download(), partials.l.download(), partials.v.download()};
  }
  std::vector<T> combine() {
    DeviceBuffer<T> pk(size_t(in.batch.sequences()) * size_t(in.shape.D));
    kn::launch_pool_combine<T>(dev.args, partials.get(), in.shape.H, in.shape.D, pq.get(), 0.0f,
                               pk.get(), nullptr);
    return pk.download();
  }
};

// Fused against old partials: the scores' float rounding (and, in 16-bit, G_b as hi + lo parts
// of T) moves m by a few float ulps; l and v are compared rescaled to the expected m (partials
// of a chunk with m shifted by e and l, v scaled by e^-e are the same to pool_combine), l
// relative to itself, v relative to l max|K| + |v| (|K| <= 1 here; v may be a cancellation).
template <class T>
double partials_tolerance() {
  return sizeof(T) == 4 ? 1e-5 : 2e-5;
}

struct Worst {
  double m = 0, l = 0, v = 0;
};

Worst expect_partials_near(const HostPartials& got, const HostPartials& want, int32_t chunks,
                           int32_t H, int32_t D, double tol, const std::string& what) {
  Worst worst;
  int failures = 0;
  auto fail = [&](int32_t c, const std::string& field, double g, double w) {
    if (failures++ < 5) {
      ADD_FAILURE() << what << ": chunk " << c << " " << field << ": " << g << ", expected " << w;
    }
  };
  const int32_t d = D / H;
  for (int32_t c = 0; c < chunks; ++c) {
    for (int32_t h = 0; h < H; ++h) {
      const size_t s = size_t(c) * size_t(H) + size_t(h);
      const double gm = got.m[s], wm = want.m[s], gl = got.l[s], wl = want.l[s];
      if (std::isinf(wm)) {  // padding only: m = -inf, l = 0, v = 0 exactly
        if (!(gm == wm && gl == 0.0))
          fail(c, "m, l of padding (head " + std::to_string(h) + ")", gm, wm);
      } else {
        const double rescale = std::exp(gm - wm);
        const double em = std::abs(gm - wm) / (std::abs(wm) + 1.0);
        const double el = std::abs(gl * rescale - wl) / wl;
        worst.m = std::max(worst.m, em);
        worst.l = std::max(worst.l, el);
        if (!(em <= tol)) fail(c, "m (head " + std::to_string(h) + ")", gm, wm);
        if (!(el <= tol)) fail(c, "l (head " + std::to_string(h) + ")", gl, wl);
      }
      for (int32_t j = h * d; j < (h + 1) * d; ++j) {
        const size_t i = size_t(c) * size_t(D) + size_t(j);
        const double wv = want.v[i];
        const double gv = std::isinf(wm) ? got.v[i] : got.v[i] * std::exp(double(got.m[s]) - wm);
        const double ev =
            std::isinf(wm) ? std::abs(gv - wv) : std::abs(gv - wv) / (wl + std::abs(wv));
        worst.v = std::max(worst.v, ev);
        if (!(ev <= tol)) fail(c, "v column " + std::to_string(j), gv, wv);
      }
    }
  }
  EXPECT_EQ(failures, 0) << what;
  return worst;
}

template <class T>
class KeyPoolTest : public ::testing::Test {};
using Dtypes = ::testing::Types<float, ff_half, ff_bfloat16>;
TYPED_TEST_SUITE(KeyPoolTest, Dtypes);

TYPED_TEST(KeyPoolTest, OnePassPartialsMatchTheTwoLaunches) {
  using T = TypeParam;
  for (const Case& shape : kCases) {
    const KeyPoolInputs<T> in(shape);
    KeyPoolRun<T> run(in);
    run.old_path();
    const HostPartials want = run.download();
    for (DeviceBuffer<float>* part : {&run.partials.m, &run.partials.l, &run.partials.v})
      part->upload(std::vector<float>(part->size(), NAN));  // a value not written shows
    const bool fused = run.fused();
    EXPECT_EQ(fused, sizeof(T) == 4 ? shape.fused_float : shape.fused_16bit) << name(shape);
    const Worst worst = expect_partials_near(run.download(), want, in.batch.chunks(), shape.H,
                                             shape.D, partials_tolerance<T>(), name(shape));
    std::cout << "[ info ] "
              << (sizeof(T) == 4               ? "float"
                  : std::is_same_v<T, ff_half> ? "half"
                                               : "bfloat16")
              << ", " << name(shape) << (fused ? ", one pass" : ", two launches")
              << ": largest difference from the two launches: m " << worst.m << ", l " << worst.l
              << ", v " << worst.v << " (relative)\n";
  }
}

// The shapes the one-pass kernel takes (the old launches have pooling_test.cc), base-long once.
TYPED_TEST(KeyPoolTest, KeyPoolMatchesTheReference) {
  using T = TypeParam;
  for (const Case& shape : kCases) {
    if (!(sizeof(T) == 4 ? shape.fused_float : shape.fused_16bit) || &shape == &kCases[1]) continue;
    const KeyPoolInputs<T> in(shape);
    KeyPoolRun<T> run(in);
    run.fused();
    const int32_t D = shape.D, H = shape.H;
    expect_rows_near<T>(
        run.combine(), in.batch, D,
        [&](int32_t b) {
          std::vector<double> pk = reference_pool(
              in.batch, b, H, D, [&](int32_t t, int32_t h) { return in.score(t, h); },
              [&](int32_t t, int32_t j) { return in.k_at(t, j); }, 0.0);
          for (int32_t j = 0; j < D; ++j)
            pk[size_t(j)] *= value(in.pq[size_t(b) * size_t(D) + size_t(j)]);
          return pk;
        },
        "key pool, " + name(shape));
  }
}

std::vector<uint8_t> bytes_of(const HostPartials& p) {
  std::vector<uint8_t> out;
  for (const std::vector<float>* part : {&p.m, &p.l, &p.v}) {
    const size_t at = out.size();
    out.resize(at + part->size() * sizeof(float));
    std::memcpy(out.data() + at, part->data(), part->size() * sizeof(float));
  }
  return out;
}

// Threads and blocks in reverse order give the same partials: base-long in bfloat16 (2 slots of
// tokens), the tiny shape in half (64 slots summed at the end) and base-long in float (one slot,
// a quarter of the threads without a vector).
template <class T>
void expect_schedule_independent(const Case& shape) {
  const KeyPoolInputs<T> in(shape);
  KeyPoolRun<T> run(in);
  const ff_emu::RaceCheckResult result = ff_emu::racecheck(
      [&] { EXPECT_TRUE(run.fused()); }, [&] { return bytes_of(run.download()); });
  EXPECT_FALSE(result.order_dependent) << result.message << " (" << name(shape) << ")";
}

TEST(KeyPoolRaceCheck, OnePassPartialsDoNotDependOnTheSchedule) {
  expect_schedule_independent<ff_bfloat16>(kCases[1]);
  expect_schedule_independent<ff_half>(kCases[2]);
  expect_schedule_independent<float>(kCases[1]);
}

}  // namespace
}  // namespace fastformer::emulation_test
