// The storage dtypes: to_float / from_float round to nearest even, and vector loads and
// stores move 4 elements in every dtype.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tests/emulation/device_buffer.h"
#include "tests/emulation/test_kernels.h"

namespace fastformer::emulation_test {
namespace {

TEST(Dtype, ConversionsRoundToNearestEven) {
  EXPECT_EQ(from_float<ff_half>(1.0f).bits, 0x3c00);
  EXPECT_EQ(from_float<ff_half>(-2.0f).bits, 0xc000);
  EXPECT_EQ(from_float<ff_half>(1.0f + 0x1p-11f).bits, 0x3c00);  // halfway: to the even 1.0
  EXPECT_EQ(from_float<ff_half>(1.0f + 3 * 0x1p-11f).bits,
            0x3c02);                                      // halfway: to the even 1 + 2^-9
  EXPECT_EQ(from_float<ff_half>(65520.0f).bits, 0x7c00);  // rounds to infinity
  EXPECT_EQ(from_float<ff_bfloat16>(1.0f).bits, 0x3f80);
  EXPECT_EQ(from_float<ff_bfloat16>(1.0f + 0x1p-8f).bits, 0x3f80);  // halfway: to the even 1.0
  EXPECT_EQ(from_float<ff_bfloat16>(1.0f + 3 * 0x1p-8f).bits, 0x3f82);
  EXPECT_EQ(to_float(ff_half{0x3555}), 0.333251953125f);
  EXPECT_EQ(to_float(ff_bfloat16{0xc0a0}), -5.0f);
  EXPECT_EQ(to_float(2.5f), 2.5f);
  EXPECT_EQ(from_float<float>(2.5f), 2.5f);
  EXPECT_TRUE(std::isnan(to_float(from_float<ff_half>(NAN))));
}

template <class T>
void expect_vector_copy() {
  const int n_vectors = 100;
  std::vector<T> input(4 * n_vectors);
  for (int i = 0; i < 4 * n_vectors; ++i)
    input[i] = from_float<T>(0.25f * static_cast<float>(i - 200));
  DeviceBuffer<T> d_input(input), d_output(input.size());
  launch_copy_float4<T>(d_input.get(), 0, n_vectors, d_output.get(), nullptr);
  const std::vector<T> output = d_output.download();
  for (int i = 0; i < 4 * n_vectors; ++i)
    EXPECT_EQ(to_float(output[i]), 0.25f * static_cast<float>(i - 200)) << i;
}

TEST(Dtype, VectorLoadsAndStoresInEveryDtype) {
  expect_vector_copy<float>();
  expect_vector_copy<ff_half>();
  expect_vector_copy<ff_bfloat16>();
}

}  // namespace
}  // namespace fastformer::emulation_test
