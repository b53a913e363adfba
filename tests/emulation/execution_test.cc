// Blocks, threads, shared memory, barriers and atomics under the emulator.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <set>
#include <vector>

#include "tests/emulation/device_buffer.h"
#include "tests/emulation/test_kernels.h"

namespace fastformer::emulation_test {
namespace {

TEST(Execution, BlockSumOverSeveralBlocksEqualsHandSum) {
  const int n = 1000;  // 4 blocks of 256, the last one partial
  std::vector<float> input(n);
  for (int i = 0; i < n; ++i)
    input[i] = static_cast<float>(i % 7 - 3) + 0.5f * static_cast<float>(i % 2);
  DeviceBuffer<float> d_input(input);
  DeviceBuffer<float> d_sums(4);

  launch_block_sum(d_input.get(), n, /*synchronize=*/true, d_sums.get(), nullptr);

  const std::vector<float> sums = d_sums.download();
  for (int b = 0; b < 4; ++b) {
    double expected = 0;
    for (int i = 256 * b; i < std::min(n, 256 * (b + 1)); ++i) expected += input[i];
    EXPECT_EQ(sums[b], expected) << "block " << b;  // small halves: exact in float
  }
}

TEST(Execution, AtomicsFromEveryThreadOfSeveralBlocksCountExactly) {
  const int blocks = 8, threads = 256, total = blocks * threads;
  DeviceBuffer<int> counter(1), max_id(1);
  DeviceBuffer<float> float_sum(1);
  DeviceBuffer<unsigned> histogram(16);
  counter.fill_zero();
  max_id.upload({-1});
  float_sum.fill_zero();
  histogram.fill_zero();

  launch_atomic_counts(blocks, threads, counter.get(), float_sum.get(), max_id.get(),
                       histogram.get(), nullptr);

  EXPECT_EQ(counter.download()[0], total);
  EXPECT_EQ(float_sum.download()[0], static_cast<float>(total));
  EXPECT_EQ(max_id.download()[0], total - 1);
  for (unsigned count : histogram.download()) EXPECT_EQ(count, static_cast<unsigned>(total / 16));
}

TEST(Execution, DynamicSharedMemoryHoldsEachBlocksSlice) {
  const int n = 250, threads = 100;  // 3 blocks, neither a warp multiple nor full
  std::vector<float> input(n);
  for (int i = 0; i < n; ++i) input[i] = static_cast<float>(i);
  DeviceBuffer<float> d_input(input), d_output(n);
  DeviceBuffer<int> d_counts(3);

  launch_reverse_in_block(d_input.get(), n, threads, d_output.get(), d_counts.get(), nullptr);

  const std::vector<float> output = d_output.download();
  for (int i = 0; i < n; ++i) {
    const int base = i / threads * threads;
    const int mirrored = base + (threads - 1 - (i - base));
    EXPECT_EQ(output[i], mirrored < n ? static_cast<float>(mirrored) : 0.0f) << "element " << i;
  }
  EXPECT_EQ(d_counts.download(), (std::vector<int>{threads, threads, threads}));
}

TEST(Execution, TwoAndThreeDimensionalIndicesCoverGridAndBlockOnce) {
  const dim3 grid(2, 3, 2), block(4, 2, 3);
  const int total = 2 * 3 * 2 * 4 * 2 * 3;
  DeviceBuffer<int> records(static_cast<std::size_t>(total) * kIndexRecordInts), next(1);
  next.fill_zero();

  launch_index_records(grid, block, records.get(), next.get(), nullptr);

  ASSERT_EQ(next.download()[0], total);
  const std::vector<int> r = records.download();
  std::set<std::array<int, 6>> seen;
  for (int k = 0; k < total; ++k) {
    const int* record = &r[static_cast<std::size_t>(k) * kIndexRecordInts];
    EXPECT_EQ(
        (std::array<int, 6>{record[6], record[7], record[8], record[9], record[10], record[11]}),
        (std::array<int, 6>{4, 2, 3, 2, 3, 2}));
    seen.insert({record[0], record[1], record[2], record[3], record[4], record[5]});
  }
  std::set<std::array<int, 6>> expected;
  for (int bz = 0; bz < 2; ++bz)
    for (int by = 0; by < 3; ++by)
      for (int bx = 0; bx < 2; ++bx)
        for (int tz = 0; tz < 3; ++tz)
          for (int ty = 0; ty < 2; ++ty)
            for (int tx = 0; tx < 4; ++tx) expected.insert({bx, by, bz, tx, ty, tz});
  EXPECT_EQ(seen, expected);
}

TEST(Execution, SharedDeclarationInDeviceFunctionIsOneStorageAndStartsUndefined) {
  const int threads = 64;
  DeviceBuffer<int> out(1 + threads);
  launch_shared_identity(threads, out.get(), nullptr);
  const std::vector<int> result = out.download();
  EXPECT_EQ(result[0], 1);
  // The emulator fills new shared memory with 0xff bytes: a NaN, so a read before any write shows.
  for (int t = 0; t < threads; ++t) EXPECT_EQ(static_cast<unsigned>(result[1 + t]), 0xffffffffu);
}

TEST(Execution, ScheduleSetsTheOrderThreadsAndBlocksRunBetweenBarriers) {
  const int blocks = 2, threads = 64, total = blocks * threads;
  DeviceBuffer<int> order(total), next(1);
  std::vector<int> forward(total), reverse(total);
  for (int i = 0; i < total; ++i) {
    forward[i] = i;
    reverse[i] = total - 1 - i;
  }

  ff_emu::set_schedule(ff_emu::Schedule::kReverse);
  next.fill_zero();
  launch_arrival_order(blocks, threads, order.get(), next.get(), nullptr);
  EXPECT_EQ(order.download(), reverse);

  ff_emu::set_schedule(ff_emu::Schedule::kForward);
  next.fill_zero();
  launch_arrival_order(blocks, threads, order.get(), next.get(), nullptr);
  EXPECT_EQ(order.download(), forward);
}

TEST(Execution, DeviceMemoryStartsUndefined) {
  DeviceBuffer<std::uint32_t> buffer(8);
  for (std::uint32_t word : buffer.download()) EXPECT_EQ(word, 0xffffffffu);
}

}  // namespace
}  // namespace fastformer::emulation_test
