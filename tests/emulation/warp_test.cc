// Warp shuffles and votes under the emulator.
#include <gtest/gtest.h>

#include <vector>

#include "tests/emulation/device_buffer.h"
#include "tests/emulation/test_kernels.h"

namespace fastformer::emulation_test {
namespace {

int lane_value(int t) { return t % 32 + 1 + 100 * (t / 32); }

TEST(Warp, ShufflesGiveTheExpectedLaneValues) {
  const int threads = 64;
  DeviceBuffer<int> d_out(static_cast<std::size_t>(kShuffleKinds) * threads);
  DeviceBuffer<ff_half> d_half(threads);

  launch_warp_shuffles(threads, d_out.get(), d_half.get(), nullptr);

  const std::vector<int> out = d_out.download();
  const auto at = [&](int kind, int t) {
    return out[static_cast<std::size_t>(kind) * threads + t];
  };
  for (int t = 0; t < threads; ++t) {
    const int lane = t % 32, warp_base = t - lane;
    int warp_sum = 0;
    for (int l = 0; l < 32; ++l) warp_sum += lane_value(warp_base + l);
    int group_sum = 0;
    for (int l = lane / 8 * 8; l < lane / 8 * 8 + 8; ++l) group_sum += lane_value(warp_base + l);

    EXPECT_EQ(at(0, t), warp_sum) << "xor reduction, thread " << t;
    if (lane == 0) {
      EXPECT_EQ(at(1, t), warp_sum) << "down reduction, warp " << t / 32;
    }
    EXPECT_EQ(at(2, t), lane_value(warp_base + 5)) << "broadcast, thread " << t;
    EXPECT_EQ(at(3, t), lane_value(lane == 31 ? t : t + 1)) << "shfl_down 1, thread " << t;
    EXPECT_EQ(at(4, t), lane_value(lane < 2 ? t : t - 2)) << "shfl_up 2, thread " << t;
    EXPECT_EQ(at(5, t), lane_value(t ^ 1)) << "shfl_xor 1, thread " << t;
    EXPECT_EQ(at(6, t), group_sum) << "xor reduction over width 8, thread " << t;
  }
  for (const ff_half h : d_half.download()) EXPECT_EQ(to_float(h), 1.5f);  // lane 3's 0.5 * 3
}

TEST(Warp, BallotAnyAllOverEachWarp) {
  const int threads = 96;  // warp 0 all true, warp 1 the odd lanes and lane 0, warp 2 all false
  std::vector<int> predicate(threads, 0);
  for (int l = 0; l < 32; ++l) {
    predicate[l] = 7;
    predicate[32 + l] = l % 2 == 1 || l == 0;
  }
  DeviceBuffer<int> d_predicate(predicate), d_any(threads), d_all(threads);
  DeviceBuffer<unsigned> d_ballot(threads);

  launch_votes(threads, d_predicate.get(), d_ballot.get(), d_any.get(), d_all.get(), nullptr);

  const std::vector<unsigned> ballot = d_ballot.download();
  const std::vector<int> any = d_any.download(), all = d_all.download();
  const unsigned expected_ballot[3] = {0xffffffffu, 0xaaaaaaabu, 0u};
  const int expected_any[3] = {1, 1, 0}, expected_all[3] = {1, 0, 0};
  for (int t = 0; t < threads; ++t) {
    EXPECT_EQ(ballot[t], expected_ballot[t / 32]) << "thread " << t;
    EXPECT_EQ(any[t] != 0, expected_any[t / 32] != 0) << "thread " << t;
    EXPECT_EQ(all[t] != 0, expected_all[t / 32] != 0) << "thread " << t;
  }
}

}  // namespace
}  // namespace fastformer::emulation_test
