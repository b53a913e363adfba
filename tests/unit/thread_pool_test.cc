// ThreadPool::parallel_for: exact coverage for many shapes, with 1 and 3 threads.
#include "server/engine/cpu/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace fastformer::engine {
namespace {

// Runs parallel_for(n, grain) and checks every index in [0, n) is visited exactly once by
// pieces inside the range.
void expect_exact_cover(ThreadPool& pool, int64_t n, int64_t grain) {
  std::unique_ptr<std::atomic<int>[]> hits(new std::atomic<int>[size_t(std::max<int64_t>(n, 1))]);
  for (int64_t i = 0; i < n; ++i) hits[size_t(i)] = 0;
  std::atomic<int64_t> bad_pieces{0}, calls{0};
  pool.parallel_for(n, grain, [&](int64_t begin, int64_t end) {
    ++calls;
    if (begin < 0 || end > n || begin >= end) {
      ++bad_pieces;
      return;
    }
    for (int64_t i = begin; i < end; ++i) hits[size_t(i)].fetch_add(1);
  });
  EXPECT_EQ(bad_pieces.load(), 0) << "n " << n << " grain " << grain;
  int64_t wrong = 0;
  for (int64_t i = 0; i < n; ++i) wrong += hits[size_t(i)].load() != 1;
  EXPECT_EQ(wrong, 0) << "n " << n << " grain " << grain;
  if (n <= 0) {
    EXPECT_EQ(calls.load(), 0);
  }
}

class ThreadPoolTest : public ::testing::TestWithParam<int> {};

TEST_P(ThreadPoolTest, CoversEveryIndexExactlyOnce) {
  ThreadPool pool(GetParam());
  EXPECT_EQ(pool.size(), std::max(GetParam(), 1));
  for (int64_t n : {0, 1, 2, 3, 7, 16, 17, 100, 1000, 4099}) {
    for (int64_t grain : {-1, 0, 1, 2, 3, 16, 64, 1000, 5000}) expect_exact_cover(pool, n, grain);
  }
}

TEST_P(ThreadPoolTest, ManySequentialCalls) {
  ThreadPool pool(GetParam());
  std::atomic<int64_t> total{0};
  for (int round = 0; round < 2000; ++round) {
    const int64_t n = 1 + round % 37;
    pool.parallel_for(n, 1 + round % 5, [&](int64_t begin, int64_t end) { total += end - begin; });
  }
  int64_t expected = 0;
  for (int round = 0; round < 2000; ++round) expected += 1 + round % 37;
  EXPECT_EQ(total.load(), expected);
}

TEST_P(ThreadPoolTest, NestedSequentialCallsInsideLoop) {
  // parallel_for calls made back to back from inside an outer (serial) loop, each using the
  // results of the previous one: no piece of one call may run after it returns.
  ThreadPool pool(GetParam());
  std::vector<int64_t> values(500, 1);
  for (int step = 0; step < 50; ++step) {
    std::vector<int64_t> next(values.size());
    pool.parallel_for(int64_t(values.size()), 7, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) next[size_t(i)] = values[size_t(i)] + int64_t(i);
    });
    pool.parallel_for(int64_t(values.size()), 13, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) values[size_t(i)] = next[size_t(i)];
    });
  }
  for (size_t i = 0; i < values.size(); ++i) ASSERT_EQ(values[i], 1 + 50 * int64_t(i)) << i;
}

TEST_P(ThreadPoolTest, UsesSeveralThreadsWhenAvailable) {
  ThreadPool pool(GetParam());
  std::mutex mu;
  std::set<std::thread::id> ids;
  pool.parallel_for(3000, 1, [&](int64_t, int64_t) {
    std::this_thread::sleep_for(std::chrono::microseconds(20));
    std::lock_guard lock(mu);
    ids.insert(std::this_thread::get_id());
  });
  EXPECT_GE(ids.size(), 1u);
  EXPECT_LE(ids.size(), size_t(pool.size()));
}

INSTANTIATE_TEST_SUITE_P(Threads, ThreadPoolTest, ::testing::Values(1, 3),
                         [](const auto& info) { return std::to_string(info.param) + "threads"; });

TEST(ThreadPoolSizeTest, ZeroOrNegativeThreadsMeansOne) {
  ThreadPool zero(0), negative(-2);
  EXPECT_EQ(zero.size(), 1);
  EXPECT_EQ(negative.size(), 1);
  expect_exact_cover(zero, 50, 4);
}

}  // namespace
}  // namespace fastformer::engine
