// The shared benchmark workload: splitmix64, length specs and batch packing.
#include "common/workload.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>

namespace fastformer {
namespace {

using ::testing::HasSubstr;

TEST(SplitMix64Test, KnownValues) {
  SplitMix64 rng(0);
  EXPECT_EQ(rng.next(), 0xE220A8397B1DCDAFull);
  EXPECT_EQ(rng.next(), 0x6E789E6AA1B965F4ull);
  EXPECT_EQ(rng.next(), 0x06C45D188009454Full);
  SplitMix64 again(0);
  EXPECT_EQ(again.next(), 0xE220A8397B1DCDAFull);
  SplitMix64 other(1);
  EXPECT_NE(other.next(), 0xE220A8397B1DCDAFull);
}

TEST(ParseLengthsTest, Accepts) {
  LengthSpec spec;
  std::string error;
  ASSERT_TRUE(parse_lengths("fixed:256", &spec, &error)) << error;
  EXPECT_EQ(spec.min, 256);
  EXPECT_EQ(spec.max, 256);
  EXPECT_FALSE(spec.uniform);

  ASSERT_TRUE(parse_lengths("uniform:16:256", &spec, &error)) << error;
  EXPECT_EQ(spec.min, 16);
  EXPECT_EQ(spec.max, 256);
  EXPECT_TRUE(spec.uniform);

  ASSERT_TRUE(parse_lengths("uniform:7:7", &spec, &error)) << error;
  EXPECT_EQ(spec.min, 7);
  EXPECT_EQ(spec.max, 7);
}

TEST(ParseLengthsTest, Rejects) {
  for (const char* text :
       {"fixed:0", "fixed:-5", "fixed:", "fixed:12x", "fixed:1.5", "uniform:5:3", "uniform:0:3",
        "uniform:5", "uniform:a:b", "uniform:1:2:3", "foo", "", "FIXED:4", " fixed:4"}) {
    LengthSpec spec;
    std::string error;
    EXPECT_FALSE(parse_lengths(text, &spec, &error)) << text;
    EXPECT_THAT(error, HasSubstr(std::string("\"") + text + "\"")) << text;
  }
  std::string error;
  LengthSpec spec;
  parse_lengths("uniform:5:3", &spec, &error);
  EXPECT_THAT(error, HasSubstr("MIN <= MAX"));
  parse_lengths("foo", &spec, &error);
  EXPECT_THAT(error, HasSubstr("fixed:L or uniform:MIN:MAX"));
}

TEST(MakeWorkloadTest, DeterministicForASeed) {
  const LengthSpec lengths{16, 256, true};
  const auto a = make_workload(lengths, 1000, 0, 1024, 8, 42);
  const auto b = make_workload(lengths, 1000, 0, 1024, 8, 42);
  const auto c = make_workload(lengths, 1000, 0, 1024, 8, 43);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_EQ(a.size(), 8u);
}

TEST(MakeWorkloadTest, FollowsTheDocumentedRule) {
  // Lengths MIN + next() % (MAX-MIN+1), then ids r = next() % (vocab-1), skipping the pad.
  const LengthSpec lengths{3, 9, true};
  const int64_t vocab = 50;
  const int32_t pad = 7;
  const auto pool = make_workload(lengths, vocab, pad, 20, 4, 2024);
  SplitMix64 rng(2024);
  for (const auto& batch : pool) {
    for (const auto& seq : batch) {
      const int64_t n = 3 + int64_t(rng.next() % 7);
      ASSERT_EQ(int64_t(seq.size()), n);
      for (int32_t id : seq) {
        const auto r = int32_t(rng.next() % uint64_t(vocab - 1));
        ASSERT_EQ(id, r < pad ? r : r + 1);
      }
    }
  }
}

TEST(MakeWorkloadTest, BatchesRespectBatchTokens) {
  for (const auto& [lengths, batch_tokens] : {std::pair{LengthSpec{1, 300, true}, int64_t{512}},
                                              {LengthSpec{64, 64, false}, int64_t{256}},
                                              {LengthSpec{100, 400, true}, int64_t{200}},
                                              {LengthSpec{5, 5, false}, int64_t{3}}}) {
    const auto pool = make_workload(lengths, 300, 0, batch_tokens, 20, 5);
    ASSERT_EQ(pool.size(), 20u);
    for (size_t i = 0; i < pool.size(); ++i) {
      const auto& batch = pool[i];
      ASSERT_FALSE(batch.empty());
      int64_t tokens = 0;
      for (const auto& seq : batch) {
        EXPECT_GE(int64_t(seq.size()), lengths.min);
        EXPECT_LE(int64_t(seq.size()), lengths.max);
        tokens += int64_t(seq.size());
      }
      if (batch.size() > 1) {
        EXPECT_LE(tokens, batch_tokens) << "batch " << i;
      }
      // A sequence only starts a new batch when it would not fit the previous one.
      if (i + 1 < pool.size()) {
        EXPECT_GT(tokens + int64_t(pool[i + 1].front().size()), batch_tokens) << "batch " << i;
      }
    }
  }
}

TEST(MakeWorkloadTest, IdsInVocabAndNeverPad) {
  for (int32_t pad : {0, 5, 9}) {
    const int64_t vocab = 10;
    const auto pool = make_workload(LengthSpec{50, 50, false}, vocab, pad, 200, 10, 77);
    std::set<int32_t> seen;
    for (const auto& batch : pool) {
      for (const auto& seq : batch) {
        for (int32_t id : seq) {
          ASSERT_GE(id, 0);
          ASSERT_LT(id, vocab);
          ASSERT_NE(id, pad);
          seen.insert(id);
        }
      }
    }
    EXPECT_EQ(seen.size(), size_t(vocab - 1)) << "pad " << pad;  // every other id occurs
  }
}

}  // namespace
}  // namespace fastformer
