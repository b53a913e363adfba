// The pooling kernels (kernels/additive_pooling.cu, kernels/key_scores.cu) on the emulation,
// against a double-precision reference written here from the model's formulas: the query
// pooling, the key scores and key pooling, and the attention pooler, on ragged batches with
// masked tokens (rows of padding hold NaN, so a masked token that weighed anything would
// show), a one-token sequence, chunks of padding only, a 2,000-token sequence of 8 chunks,
// scores far from 0 (the max subtraction), base-long's heads (12 x 64), odd shapes (hidden
// 40 in 5 or 20 heads) whose vector paths have tails, and Q|K|s rows both at their natural
// width (2D + H, narrower vectors) and padded to a multiple of 8 elements (16-byte vectors).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "tests/emulation/device_buffer.h"
#include "tests/emulation/pooling_batch.h"

namespace fastformer::emulation_test {
namespace {

namespace k = ::fastformer::kernels;

struct Shape {
  int32_t D, H;
  bool padded;  // Q|K|s rows padded to a multiple of 8 elements
  int64_t ld() const { return padded ? (2 * D + H + 7) / 8 * 8 : 2 * D + H; }
};

// The lengths every test uses: one token, several chunks, exactly one chunk and one more,
// 2,000 tokens (8 chunks); sequence 3's third chunk and sequence 5's first are padding only.
const std::vector<int32_t> kLengths{1, 300, 7, 2000, 256, 257, 513};
Batch make_batch(std::mt19937& rng) {
  Batch batch(kLengths, rng);
  batch.pad(3, 512, 768);
  batch.pad(5, 0, 256);
  batch.mask[size_t(batch.cu[5] + 256)] = 1;  // its one real token is its last
  return batch;
}

// One batch and Q|K|s rows of random values; padding rows and the columns past 2D + H are
// NaN. Scores of sequence 1 are shifted by +60 (exp without the max subtraction overflows float).
template <class T>
struct QksBatch {
  Shape shape;
  std::mt19937 rng{1234};
  Batch batch = make_batch(rng);
  std::vector<T> qks;
  QksBatch(Shape s) : shape(s) {
    const int32_t D = s.D, H = s.H;
    const int64_t ld = s.ld();
    qks.assign(size_t(batch.tokens()) * size_t(ld), from_float<T>(NAN));
    std::uniform_real_distribution<float> u(-1.0f, 1.0f), score(-3.0f, 3.0f);
    for (int32_t t = 0; t < batch.tokens(); ++t) {
      if (!batch.mask[size_t(t)]) continue;
      T* row = qks.data() + size_t(t) * size_t(ld);
      for (int32_t j = 0; j < 2 * D; ++j) row[j] = from_float<T>(u(rng));
      const float shift = batch.token_seq[size_t(t)] == 1 ? 60.0f : 0.0f;
      for (int32_t h = 0; h < H; ++h) row[2 * D + h] = from_float<T>(score(rng) + shift);
    }
  }
  double at(int32_t t, int32_t column) const {
    return value(qks[size_t(t) * size_t(shape.ld()) + size_t(column)]);
  }
};

template <class T>
class PoolingTest : public ::testing::Test {};
using Dtypes = ::testing::Types<float, ff_half, ff_bfloat16>;
TYPED_TEST_SUITE(PoolingTest, Dtypes);

// 20 heads of 2 columns: more heads than a block has warps, and than the key scores keep in
// registers at once (two passes of G); 40 heads of 1 column: the partials split D = 40 in
// column groups of 32 (a block keeps the weights of at most 33 heads).
const Shape kShapes[] = {{768, 12, false}, {768, 12, true}, {40, 5, false},
                         {40, 5, true},    {40, 20, true},  {40, 40, false}};
std::string name(const Shape& s) {
  return "D " + std::to_string(s.D) + ", " + std::to_string(s.H) + " heads, ld " +
         std::to_string(s.ld());
}

// pq = pool(softmax(s), Q): the scores and Q both from the Q|K|s rows (S = T).
template <class T>
std::vector<T> run_query_pool(const QksBatch<T>& in, DeviceBuffer<T>& d_qks, const DeviceBatch& dev,
                              const DevicePartials& partials) {
  const int32_t D = in.shape.D, H = in.shape.H;
  const int64_t ld = in.shape.ld();
  DeviceBuffer<T> d_out(size_t(in.batch.sequences()) * size_t(D));
  k::launch_pool_partials<T, T>(dev.args, d_qks.get() + 2 * D, ld, H, d_qks.get(), ld, D,
                                partials.get(), nullptr);
  k::launch_pool_combine<T>(dev.args, partials.get(), H, D, nullptr, 0.0f, d_out.get(), nullptr);
  return d_out.download();
}

TYPED_TEST(PoolingTest, QueryPoolingMatchesTheReference) {
  using T = TypeParam;
  for (const Shape& shape : kShapes) {
    const QksBatch<T> in(shape);
    const int32_t D = shape.D, H = shape.H;
    DeviceBatch dev(in.batch);
    DeviceBuffer<T> d_qks(in.qks);
    DevicePartials partials(in.batch, H, D);
    const std::vector<T> pq = run_query_pool(in, d_qks, dev, partials);
    expect_rows_near<T>(
        pq, in.batch, D,
        [&](int32_t b) {
          return reference_pool(
              in.batch, b, H, D, [&](int32_t t, int32_t h) { return in.at(t, 2 * D + h); },
              [&](int32_t t, int32_t j) { return in.at(t, j); }, 0.0);
        },
        "query pooling, " + name(shape));
  }
}

TYPED_TEST(PoolingTest, KeyScoresAndKeyPoolingMatchTheReference) {
  using T = TypeParam;
  for (const Shape& shape : kShapes) {
    QksBatch<T> in(shape);
    const int32_t D = shape.D, H = shape.H, B = in.batch.sequences(), Tn = in.batch.tokens();
    const int64_t ld = shape.ld();
    const std::vector<T> pq = random_values<T>(size_t(B) * size_t(D), -1.0f, 1.0f, in.rng);
    const std::vector<T> wka = random_values<T>(size_t(H) * size_t(D), -0.2f, 0.2f, in.rng);
    const std::vector<T> bka = random_values<T>(size_t(H), -1.0f, 1.0f, in.rng);
    DeviceBatch dev(in.batch);
    DeviceBuffer<T> d_qks(in.qks), d_pq(pq), d_wka(wka), d_bka(bka), d_pk(size_t(B) * size_t(D));
    DeviceBuffer<float> d_r(size_t(Tn) * size_t(H));
    DevicePartials partials(in.batch, H, D);
    k::launch_key_scores<T>(dev.args, d_qks.get() + D, ld, d_pq.get(), d_wka.get(), d_bka.get(), H,
                            D, d_r.get(), nullptr);
    k::launch_pool_partials<T, float>(dev.args, d_r.get(), H, H, d_qks.get() + D, ld, D,
                                      partials.get(), nullptr);
    k::launch_pool_combine<T>(dev.args, partials.get(), H, D, d_pq.get(), 0.0f, d_pk.get(),
                              nullptr);

    // r_t = (K_t * pq_b) . Wka[h] + bka[h], to float rounding of the sum of |terms|.
    auto r_ref = [&](int32_t t, int32_t h, double* magnitude) {
      const int32_t b = in.batch.token_seq[size_t(t)];
      double r = value(bka[size_t(h)]), mag = std::abs(r);
      for (int32_t j = 0; j < D; ++j) {
        const double term = in.at(t, D + j) * value(pq[size_t(b) * size_t(D) + size_t(j)]) *
                            value(wka[size_t(h) * size_t(D) + size_t(j)]);
        r += term;
        mag += std::abs(term);
      }
      if (magnitude) *magnitude = mag;
      return r;
    };
    const std::vector<float> r = d_r.download();
    int bad = 0;
    for (int32_t t = 0; t < Tn; ++t) {
      if (!in.batch.mask[size_t(t)])
        continue;  // padding rows hold NaN: their scores are never read
      for (int32_t h = 0; h < H; ++h) {
        double mag = 0.0;
        const double want = r_ref(t, h, &mag);
        if (!(std::abs(double(r[size_t(t) * size_t(H) + size_t(h)]) - want) <= 1e-5 * mag + 1e-6) &&
            bad++ < 5) {
          ADD_FAILURE() << "key score token " << t << " head " << h << ": "
                        << r[size_t(t) * size_t(H) + size_t(h)] << ", expected " << want << " ("
                        << name(shape) << ")";
        }
      }
    }
    EXPECT_EQ(bad, 0);
    expect_rows_near<T>(
        d_pk.download(), in.batch, D,
        [&](int32_t b) {
          std::vector<double> pk = reference_pool(
              in.batch, b, H, D, [&](int32_t t, int32_t h) { return r_ref(t, h, nullptr); },
              [&](int32_t t, int32_t j) { return in.at(t, D + j); }, 0.0);
          for (int32_t j = 0; j < D; ++j)
            pk[size_t(j)] *= value(pq[size_t(b) * size_t(D) + size_t(j)]);
          return pk;
        },
        "key pooling, " + name(shape));
  }
}

// The pooler: one "head" over all D columns, float scores, dense values, + 1e-8 in the
// denominator; sequence 2's scores near -25 make that term matter (e^-25 ~ 1.4e-11 per token).
TYPED_TEST(PoolingTest, AttentionPoolerMatchesTheReference) {
  using T = TypeParam;
  for (const int32_t D : {768, 40}) {
    std::mt19937 rng(99);
    const Batch batch = make_batch(rng);
    const int32_t Tn = batch.tokens();
    std::vector<T> x = random_values<T>(size_t(Tn) * size_t(D), -1.0f, 1.0f, rng);
    std::vector<float> z(static_cast<size_t>(Tn));
    std::uniform_real_distribution<float> u(-2.0f, 2.0f);
    for (int32_t t = 0; t < Tn; ++t) {
      z[size_t(t)] =
          batch.mask[size_t(t)] ? u(rng) + (batch.token_seq[size_t(t)] == 2 ? -25.0f : 0.0f) : NAN;
      if (!batch.mask[size_t(t)]) std::fill_n(x.begin() + ptrdiff_t(t) * D, D, from_float<T>(NAN));
    }
    DeviceBatch dev(batch);
    DeviceBuffer<T> d_x(x), d_pooled(size_t(batch.sequences()) * size_t(D));
    DeviceBuffer<float> d_z(z);
    DevicePartials partials(batch, 1, D);
    k::launch_pool_partials<T, float>(dev.args, d_z.get(), 1, 1, d_x.get(), D, D, partials.get(),
                                      nullptr);
    k::launch_pool_combine<T>(dev.args, partials.get(), 1, D, nullptr, 1e-8f, d_pooled.get(),
                              nullptr);
    expect_rows_near<T>(
        d_pooled.download(), batch, D,
        [&](int32_t b) {
          return reference_pool(
              batch, b, 1, D, [&](int32_t t, int32_t) { return double(z[size_t(t)]); },
              [&](int32_t t, int32_t j) { return value(x[size_t(t) * size_t(D) + size_t(j)]); },
              1e-8);
        },
        "attention pooler, D " + std::to_string(D));
  }
}

// The combine's split of a sequence's chunks over threads changes the order of its float
// sums only: any hint (unknown, too small, exact) gives the reference.
TYPED_TEST(PoolingTest, CombineIsRightForAnyChunkSplit) {
  using T = TypeParam;
  const Shape shape{40, 5, true};
  const QksBatch<T> in(shape);
  DeviceBuffer<T> d_qks(in.qks);
  for (const int32_t hint : {0, 1, 3, 8, 100}) {
    DeviceBatch dev(in.batch);
    dev.args.max_sequence_chunks = hint;
    DevicePartials partials(in.batch, shape.H, shape.D);
    const std::vector<T> pq = run_query_pool(in, d_qks, dev, partials);
    expect_rows_near<T>(
        pq, in.batch, shape.D,
        [&](int32_t b) {
          return reference_pool(
              in.batch, b, shape.H, shape.D,
              [&](int32_t t, int32_t h) { return in.at(t, 2 * shape.D + h); },
              [&](int32_t t, int32_t j) { return in.at(t, j); }, 0.0);
        },
        "query pooling, chunk split hint " + std::to_string(hint));
  }
}

std::vector<std::uint8_t> bytes_of(const std::vector<float>& a, const std::vector<ff_bfloat16>& b) {
  std::vector<std::uint8_t> out(a.size() * sizeof(float) + b.size() * sizeof(ff_bfloat16));
  std::memcpy(out.data(), a.data(), a.size() * sizeof(float));
  std::memcpy(out.data() + a.size() * sizeof(float), b.data(), b.size() * sizeof(ff_bfloat16));
  return out;
}

// Every pooling kernel under the race check: threads and blocks in reverse order give the
// same bytes (key scores, partials and the pooled rows).
TEST(PoolingRaceCheck, KeyPoolingAndQueryPoolingDoNotDependOnTheSchedule) {
  for (const Shape& shape : {Shape{768, 12, true}, Shape{40, 5, false}, Shape{40, 20, true}}) {
    using T = ff_bfloat16;
    QksBatch<T> in(shape);
    const int32_t D = shape.D, H = shape.H, B = in.batch.sequences();
    const int64_t ld = shape.ld();
    DeviceBatch dev(in.batch);
    DeviceBuffer<T> d_qks(in.qks), d_pq(size_t(B) * size_t(D)), d_pk(size_t(B) * size_t(D));
    DeviceBuffer<T> d_wka(random_values<T>(size_t(H) * size_t(D), -0.2f, 0.2f, in.rng));
    DeviceBuffer<T> d_bka(random_values<T>(size_t(H), -1.0f, 1.0f, in.rng));
    DeviceBuffer<float> d_r(size_t(in.batch.tokens()) * size_t(H));
    DevicePartials partials(in.batch, H, D);
    const ff_emu::RaceCheckResult result = ff_emu::racecheck(
        [&] {
          d_r.fill_zero();  // padding rows' scores are computed too (from NaN): zero them first
          k::launch_pool_partials<T, T>(dev.args, d_qks.get() + 2 * D, ld, H, d_qks.get(), ld, D,
                                        partials.get(), nullptr);
          k::launch_pool_combine<T>(dev.args, partials.get(), H, D, nullptr, 0.0f, d_pq.get(),
                                    nullptr);
          k::launch_key_scores<T>(dev.args, d_qks.get() + D, ld, d_pq.get(), d_wka.get(),
                                  d_bka.get(), H, D, d_r.get(), nullptr);
          k::launch_pool_partials<T, float>(dev.args, d_r.get(), H, H, d_qks.get() + D, ld, D,
                                            partials.get(), nullptr);
          k::launch_pool_combine<T>(dev.args, partials.get(), H, D, d_pq.get(), 0.0f, d_pk.get(),
                                    nullptr);
        },
        [&] {
          std::vector<float> floats = d_r.download();
          for (const float x : partials.v.download()) floats.push_back(x);
          std::vector<ff_bfloat16> pooled = d_pq.download(), pk = d_pk.download();
          pooled.insert(pooled.end(), pk.begin(), pk.end());
          // NaN != NaN bytewise is fine: the same NaN bits come out in both orders.
          return bytes_of(floats, pooled);
        });
    EXPECT_FALSE(result.order_dependent) << result.message << " (" << name(shape) << ")";
  }
}

// The pooler's shape under the race check: one head split over 3 column groups, of which only
// the first writes the head's m and l.
TEST(PoolingRaceCheck, AttentionPoolerDoesNotDependOnTheSchedule) {
  using T = ff_half;
  const int32_t D = 768;
  std::mt19937 rng(7);
  const Batch batch = make_batch(rng);
  DeviceBatch dev(batch);
  DeviceBuffer<T> d_x(random_values<T>(size_t(batch.tokens()) * size_t(D), -1.0f, 1.0f, rng));
  DeviceBuffer<T> d_pooled(size_t(batch.sequences()) * size_t(D));
  DeviceBuffer<float> d_z(random_values<float>(size_t(batch.tokens()), -2.0f, 2.0f, rng));
  DevicePartials partials(batch, 1, D);
  const ff_emu::RaceCheckResult result = ff_emu::racecheck(
      [&] {
        partials.m.fill_zero();
        partials.l.fill_zero();
        k::launch_pool_partials<T, float>(dev.args, d_z.get(), 1, 1, d_x.get(), D, D,
                                          partials.get(), nullptr);
        k::launch_pool_combine<T>(dev.args, partials.get(), 1, D, nullptr, 1e-8f, d_pooled.get(),
                                  nullptr);
      },
      [&] {
        std::vector<float> floats = partials.m.download();
        for (const float x : partials.l.download()) floats.push_back(x);
        for (const float x : partials.v.download()) floats.push_back(x);
        std::vector<ff_bfloat16> pooled(d_pooled.size());
        const std::vector<T> out = d_pooled.download();
        std::memcpy(pooled.data(), out.data(), out.size() * sizeof(T));
        return bytes_of(floats, pooled);
      });
  EXPECT_FALSE(result.order_dependent) << result.message;
}

}  // namespace
}  // namespace fastformer::emulation_test
