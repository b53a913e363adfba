// The emulation's model of the tensor-core instruction mma.m16n8k16 (ff_mma_m16n8k16 in
// kernels/runtime.h) against a plain matrix multiply: the test kernel (test_kernels.cu) loads
// and stores every fragment by the PTX ISA's formulas, so a model that mapped a register to
// the wrong rows or columns gives the wrong product. Small integers make the products and
// sums exact, so the comparison is exact; deliberately wrong layouts must be seen as wrong.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "tests/emulation/device_buffer.h"
#include "tests/emulation/test_kernels.h"

namespace fastformer::emulation_test {
namespace {

struct MmaProblems {
  int count;
  std::vector<float> a, b, c;  // [count][16][16], [count][16][8] ([k][n]), [count][16][8]

  // Integers in [-range, range] (exact in half and bfloat16 up to 256), or uniform reals.
  MmaProblems(int n, bool integers, std::mt19937& rng) : count(n) {
    std::uniform_int_distribution<int> small(-8, 8);
    std::uniform_real_distribution<float> real(-2.0f, 2.0f);
    auto draw = [&] { return integers ? float(small(rng)) : real(rng); };
    for (int i = 0; i < n * 256; ++i) a.push_back(draw());
    for (int i = 0; i < n * 128; ++i) b.push_back(draw());
    for (int i = 0; i < n * 128; ++i) c.push_back(draw());
  }

  // a b + c in double, over the operands as rounded to T.
  template <class T>
  std::vector<double> reference() const {
    auto rounded = [](float x) { return double(to_float(from_float<T>(x))); };
    std::vector<double> d(size_t(count) * 128);
    for (int p = 0; p < count; ++p) {
      for (int i = 0; i < 16; ++i) {
        for (int n = 0; n < 8; ++n) {
          double sum = c[size_t(p * 128 + i * 8 + n)];
          for (int k = 0; k < 16; ++k) {
            sum +=
                rounded(a[size_t(p * 256 + i * 16 + k)]) * rounded(b[size_t(p * 128 + k * 8 + n)]);
          }
          d[size_t(p * 128 + i * 8 + n)] = sum;
        }
      }
    }
    return d;
  }

  template <class T>
  std::vector<float> run(int mislayout) const {
    auto convert = [](const std::vector<float>& x) {
      std::vector<T> out;
      for (float v : x) out.push_back(from_float<T>(v));
      return out;
    };
    DeviceBuffer<T> d_a(convert(a)), d_b(convert(b));
    DeviceBuffer<float> d_c(c), d_d(c.size());
    launch_mma_m16n8k16<T>(count, d_a.get(), d_b.get(), d_c.get(), mislayout, d_d.get(), nullptr);
    return d_d.download();
  }
};

template <class T>
class MmaTest : public ::testing::Test {};
using MmaDtypes = ::testing::Types<ff_half, ff_bfloat16>;
TYPED_TEST_SUITE(MmaTest, MmaDtypes);

// Two warps of one block, each its own problem: exact on integers.
TYPED_TEST(MmaTest, MatchesAPlainMatrixMultiplyExactlyOnIntegers) {
  using T = TypeParam;
  std::mt19937 rng(5);
  const MmaProblems problems(2, true, rng);
  const std::vector<float> got = problems.run<T>(kMmaLayoutRight);
  const std::vector<double> want = problems.reference<T>();
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(double(got[i]), want[i])
        << "problem " << i / 128 << " row " << i % 128 / 8 << " column " << i % 8;
  }
}

// Reals: float sums of exact products, to float rounding of the sum of |terms|.
TYPED_TEST(MmaTest, MatchesAPlainMatrixMultiplyOnReals) {
  using T = TypeParam;
  std::mt19937 rng(6);
  const MmaProblems problems(2, false, rng);
  const std::vector<float> got = problems.run<T>(kMmaLayoutRight);
  const std::vector<double> want = problems.reference<T>();
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(double(got[i]), want[i], 1e-5 * (std::abs(want[i]) + 16.0)) << "element " << i;
  }
}

// One-hot operands: D[i][n] = A[i][k0] B[k0][n] names the element each output reads, so a wrong
// row or column mapping in any register shows at a known place.
TYPED_TEST(MmaTest, EachOutputReadsItsOwnRowAndColumn) {
  using T = TypeParam;
  for (int k0 = 0; k0 < 16; ++k0) {
    std::mt19937 rng(7);
    MmaProblems problems(1, true, rng);
    for (int i = 0; i < 16; ++i) {
      for (int k = 0; k < 16; ++k) problems.a[size_t(i * 16 + k)] = k == k0 ? float(i + 1) : 0.0f;
    }
    for (int k = 0; k < 16; ++k) {
      for (int n = 0; n < 8; ++n)
        problems.b[size_t(k * 8 + n)] = k == k0 ? float(n + 1) * 32 : 0.0f;
    }
    std::fill(problems.c.begin(), problems.c.end(), 0.5f);
    const std::vector<float> got = problems.run<T>(kMmaLayoutRight);
    for (int i = 0; i < 16; ++i) {
      for (int n = 0; n < 8; ++n) {
        EXPECT_EQ(got[size_t(i * 8 + n)], float((i + 1) * (n + 1) * 32) + 0.5f)
            << "k " << k0 << " row " << i << " column " << n;
      }
    }
  }
}

// The layout test has teeth: each wrong mapping of a register gives a different product.
TYPED_TEST(MmaTest, AWrongFragmentLayoutIsSeen) {
  using T = TypeParam;
  std::mt19937 rng(8);
  const MmaProblems problems(1, true, rng);
  const std::vector<double> want = problems.reference<T>();
  for (const int mislayout :
       {kMmaSwapARows, kMmaSwapPairHalves, kMmaSwapBRegisters, kMmaSwapDRows}) {
    const std::vector<float> got = problems.run<T>(mislayout);
    int differences = 0;
    for (size_t i = 0; i < want.size(); ++i) differences += double(got[i]) != want[i];
    EXPECT_GT(differences, 0) << "mislayout " << mislayout << " went unnoticed";
  }
}

}  // namespace
}  // namespace fastformer::emulation_test
