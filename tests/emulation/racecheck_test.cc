// The race check: a kernel with a deliberately missing barrier is caught, the correct kernel
// passes, and what the check cannot tell apart is shown too.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "tests/emulation/device_buffer.h"
#include "tests/emulation/test_kernels.h"

namespace fastformer::emulation_test {
namespace {

template <class T>
std::vector<std::uint8_t> bytes_of(const DeviceBuffer<T>& buffer) {
  const std::vector<T> host = buffer.download();
  std::vector<std::uint8_t> bytes(host.size() * sizeof(T));
  std::memcpy(bytes.data(), host.data(), bytes.size());
  return bytes;
}

ff_emu::RaceCheckResult check_block_sum(bool synchronize) {
  std::vector<float> input(512);
  for (int i = 0; i < 512; ++i) input[i] = static_cast<float>(i % 13);
  DeviceBuffer<float> d_input(input), d_sums(2);
  return ff_emu::racecheck(
      [&] {
        d_sums.fill_zero();
        launch_block_sum(d_input.get(), 512, synchronize, d_sums.get(), nullptr);
      },
      [&] { return bytes_of(d_sums); });
}

TEST(RaceCheck, MissingSyncthreadsIsCaughtAndTheCorrectKernelPasses) {
  const ff_emu::RaceCheckResult racy = check_block_sum(/*synchronize=*/false);
  EXPECT_TRUE(racy.order_dependent) << racy.message;
  EXPECT_EQ(racy.snapshot_bytes, 2 * sizeof(float));

  const ff_emu::RaceCheckResult correct = check_block_sum(/*synchronize=*/true);
  EXPECT_FALSE(correct.order_dependent) << correct.message;
  EXPECT_EQ(ff_emu::schedule(), ff_emu::Schedule::kForward);  // restored
}

TEST(RaceCheck, MissingSyncwarpIsCaughtAndTheCorrectKernelPasses) {
  std::vector<int> input(32);
  for (int l = 0; l < 32; ++l) input[l] = 10 * l;
  DeviceBuffer<int> d_input(input), d_output(32);
  for (const bool synchronize : {false, true}) {
    const ff_emu::RaceCheckResult result = ff_emu::racecheck(
        [&] { launch_warp_neighbour(d_input.get(), synchronize, d_output.get(), nullptr); },
        [&] { return bytes_of(d_output); });
    EXPECT_EQ(result.order_dependent, !synchronize) << result.message;
  }
}

TEST(RaceCheck, FloatAtomicsAreOrderDependentIntegerAtomicsAreNot) {
  // One large value and many ones: the float sum depends on the order of the additions, on a
  // GPU as well. The check reports that; snapshot a rounded view where it is intended.
  std::vector<float> input(256, 1.0f);
  input[0] = 1.0e8f;
  DeviceBuffer<float> d_input(input), d_sum(1);
  const ff_emu::RaceCheckResult floats = ff_emu::racecheck(
      [&] {
        d_sum.fill_zero();
        launch_atomic_float_sum(d_input.get(), 256, d_sum.get(), nullptr);
      },
      [&] { return bytes_of(d_sum); });
  EXPECT_TRUE(floats.order_dependent);

  DeviceBuffer<int> counter(1), max_id(1);
  DeviceBuffer<float> float_sum(1);
  DeviceBuffer<unsigned> histogram(16);
  const ff_emu::RaceCheckResult integers = ff_emu::racecheck(
      [&] {
        counter.fill_zero();
        max_id.fill_zero();
        float_sum.fill_zero();
        histogram.fill_zero();
        launch_atomic_counts(4, 128, counter.get(), float_sum.get(), max_id.get(), histogram.get(),
                             nullptr);
      },
      [&] {
        std::vector<std::uint8_t> bytes = bytes_of(counter);
        const std::vector<std::uint8_t> more = bytes_of(histogram);
        bytes.insert(bytes.end(), more.begin(), more.end());
        return bytes;
      });
  EXPECT_FALSE(integers.order_dependent) << integers.message;
}

}  // namespace
}  // namespace fastformer::emulation_test
