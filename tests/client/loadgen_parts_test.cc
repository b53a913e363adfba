// The load generator's parts that need no server: the latency histogram, the sweep and length
// specifications, the request pool, and the report formats.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "client/loadgen/latency_histogram.h"
#include "client/loadgen/load_spec.h"
#include "client/loadgen/request_pool.h"
#include "client/loadgen/step_report.h"
#include "common/workload.h"
#include "tests/support/test_models.h"

namespace fastformer::loadgen {
namespace {

TEST(LatencyHistogram, IsExactBelow256AndWithinAPercentAbove) {
  for (int64_t v = 0; v < 256; ++v)
    EXPECT_EQ(LatencyHistogram::highest_in_bucket(LatencyHistogram::bucket_of(v)), v);
  std::mt19937_64 rng(3);
  for (int i = 0; i < 100000; ++i) {
    const int64_t v = int64_t(rng() >> std::uniform_int_distribution<int>(1, 62)(rng));
    const int b = LatencyHistogram::bucket_of(v);
    const int64_t hi = LatencyHistogram::highest_in_bucket(b);
    ASSERT_GE(hi, v);
    ASSERT_LE(double(hi - v), double(v) / 128.0) << v;
    if (b > 0) {
      ASSERT_LT(LatencyHistogram::highest_in_bucket(b - 1), v) << v;  // buckets tile the line
    }
  }
}

TEST(LatencyHistogram, PercentilesByNearestRank) {
  LatencyHistogram h;
  EXPECT_EQ(h.percentile(50), 0);
  std::vector<int64_t> values;
  std::mt19937_64 rng(7);
  for (int i = 0; i < 10000; ++i) values.push_back(1000 + int64_t(rng() % 100'000'000));
  for (int64_t v : values) h.record(v);
  std::sort(values.begin(), values.end());
  for (double p : {1.0, 50.0, 90.0, 99.0, 99.9}) {
    const int64_t exact = values[size_t(std::ceil(p / 100 * double(values.size()))) - 1];
    EXPECT_GE(h.percentile(p), exact) << p;
    EXPECT_LE(double(h.percentile(p)), double(exact) * (1 + 1.0 / 128)) << p;
  }
  EXPECT_EQ(h.percentile(100), values.back());
  EXPECT_EQ(h.max(), values.back());
  EXPECT_EQ(h.min(), values.front());
  EXPECT_EQ(h.count(), 10000);

  LatencyHistogram other;
  other.record(5);
  h.merge(other);
  EXPECT_EQ(h.count(), 10001);
  EXPECT_EQ(h.min(), 5);
  EXPECT_EQ(h.percentile(0), 5);
}

TEST(Sweep, MultipliesOrAddsUpToTheEnd) {
  std::vector<double> v;
  std::string error;
  ASSERT_TRUE(parse_sweep("1:64:x2", true, &v, &error)) << error;
  EXPECT_EQ(v, (std::vector<double>{1, 2, 4, 8, 16, 32, 64}));
  ASSERT_TRUE(parse_sweep("1:10:x1.5", true, &v, &error)) << error;
  EXPECT_EQ(v, (std::vector<double>{1, 2, 3, 5,
                                    8}));  // 1, 1.5, 2.25, 3.4, 5.1, 7.6 rounded, repeats dropped
  ASSERT_TRUE(parse_sweep("100:350:+100", false, &v, &error)) << error;
  EXPECT_EQ(v, (std::vector<double>{100, 200, 300}));
  ASSERT_TRUE(parse_sweep("0.5:2:x2", false, &v, &error)) << error;
  EXPECT_EQ(v, (std::vector<double>{0.5, 1, 2}));
  ASSERT_TRUE(parse_sweep("7", true, &v, &error)) << error;
  EXPECT_EQ(v, (std::vector<double>{7}));
  for (const char* bad :
       {"", "1:64", "1:64:2", "0:4:x2", "4:1:x2", "1:4:x1", "1:4:+0", "a:4:x2", "1:4:x"}) {
    EXPECT_FALSE(parse_sweep(bad, true, &v, &error)) << bad;
    EXPECT_NE(error.find("A:B:xF"), std::string::npos) << error;
  }
}

TEST(Lengths, FixedUniformAndFile) {
  LengthsSpec spec;
  std::string error;
  ASSERT_TRUE(parse_lengths_spec("uniform:16:256", &spec, &error)) << error;
  EXPECT_FALSE(spec.from_file);
  EXPECT_EQ(spec.max_length(), 256);
  ASSERT_TRUE(parse_lengths_spec("fixed:64", &spec, &error)) << error;
  EXPECT_EQ(spec.max_length(), 64);

  test::TempDir dir;
  test::write_file(dir / "lengths.txt", "16\n\n  300 \n42\n");
  ASSERT_TRUE(parse_lengths_spec("file:" + (dir / "lengths.txt").string(), &spec, &error)) << error;
  EXPECT_TRUE(spec.from_file);
  EXPECT_EQ(spec.file_lengths, (std::vector<int64_t>{16, 300, 42}));
  EXPECT_EQ(spec.max_length(), 300);

  test::write_file(dir / "bad.txt", "16\nx\n");
  EXPECT_FALSE(parse_lengths_spec("file:" + (dir / "bad.txt").string(), &spec, &error));
  EXPECT_NE(error.find("line 2"), std::string::npos) << error;
  test::write_file(dir / "empty.txt", "\n");
  EXPECT_FALSE(parse_lengths_spec("file:" + (dir / "empty.txt").string(), &spec, &error));
  EXPECT_FALSE(parse_lengths_spec("file:/nonexistent", &spec, &error));
  EXPECT_FALSE(parse_lengths_spec("gaussian:3", &spec, &error));
  EXPECT_NE(error.find("file:PATH"), std::string::npos) << error;
}

TEST(RequestPool, HoldsFastformerBenchSequenceStream) {
  LengthsSpec spec;
  std::string error;
  ASSERT_TRUE(parse_lengths_spec("uniform:3:40", &spec, &error));
  const auto pool = make_request_pool(spec, 500, 0, 3, 4, 9);
  ASSERT_EQ(pool.size(), 4u);
  // The same stream, cut into batches of up to 40 tokens by fastformer-bench's own packer.
  std::vector<TokenSequence> stream;
  for (const auto& batch : make_workload(spec.range, 500, 0, 40, 12, 9)) {
    stream.insert(stream.end(), batch.begin(), batch.end());
  }
  ASSERT_GE(stream.size(), 12u);
  for (size_t r = 0; r < pool.size(); ++r) {
    ASSERT_EQ(pool[r].request.sequences_size(), 3);
    EXPECT_EQ(pool[r].sequences, 3);
    int64_t tokens = 0;
    for (int s = 0; s < 3; ++s) {
      const auto& ids = pool[r].request.sequences(s).token_ids();
      EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.end()), stream[r * 3 + size_t(s)]);
      tokens += ids.size();
      for (int32_t id : ids) EXPECT_TRUE(id >= 1 && id < 500) << id;  // never the pad token
    }
    EXPECT_EQ(pool[r].tokens, tokens);
  }
}

TEST(RequestPool, FileLengthsAreDrawnFromTheFile) {
  test::TempDir dir;
  test::write_file(dir / "lengths.txt", "5\n9\n");
  LengthsSpec spec;
  std::string error;
  ASSERT_TRUE(parse_lengths_spec("file:" + (dir / "lengths.txt").string(), &spec, &error));
  const auto pool = make_request_pool(spec, 100, 7, 1, 64, 1);
  int fives = 0;
  for (const auto& r : pool) {
    const auto& ids = r.request.sequences(0).token_ids();
    EXPECT_TRUE(ids.size() == 5 || ids.size() == 9);
    fives += ids.size() == 5;
    for (int32_t id : ids) EXPECT_TRUE(id != 7 && id >= 0 && id < 100) << id;
  }
  EXPECT_GT(fives, 10);
  EXPECT_LT(fives, 54);
}

TEST(RequestPool, TextsGoInOrderCycled) {
  const auto pool = make_text_request_pool({"a b", "c", "d e f"}, 2, 4);
  ASSERT_EQ(pool.size(), 4u);
  const char* want[] = {"a b", "c", "d e f", "a b", "c", "d e f", "a b", "c"};
  for (size_t r = 0; r < pool.size(); ++r) {
    ASSERT_EQ(pool[r].request.sequences_size(), 2);
    EXPECT_EQ(pool[r].sequences, 2);
    EXPECT_EQ(pool[r].tokens, 0);  // known from the answers only
    for (int s = 0; s < 2; ++s) {
      EXPECT_EQ(pool[r].request.sequences(s).text(), want[r * 2 + size_t(s)]);
      EXPECT_EQ(pool[r].request.sequences(s).token_ids_size(), 0);
    }
  }
}

TEST(StepReport, JsonCarriesTheAgreedFieldsAndCsvOneRow) {
  StepResult r;
  r.step.open_loop = false;
  r.step.concurrency = 4;
  r.step.duration_s = 2;
  r.elapsed_s = 2;
  r.requests = 12;
  r.succeeded = 10;
  r.sequences = 20;
  r.tokens = 2000;
  r.errors["RESOURCE_EXHAUSTED"] = 2;
  for (int i = 1; i <= 10; ++i) r.latency.record(i * 1'000'000);
  const auto j = nlohmann::json::parse(step_json(r, {"fixed:100", 2}));
  EXPECT_EQ(j["requests"], 12);
  EXPECT_EQ(j["requests_per_second"], 5.0);  // successful requests per second
  EXPECT_EQ(j["sequences_per_second"], 10.0);
  EXPECT_EQ(j["tokens_per_second"], 1000.0);
  EXPECT_NEAR(j["latency_ms"]["p50"].get<double>(), 5.0, 5.0 / 128);  // the bucket's top
  EXPECT_EQ(j["latency_ms"]["max"], 10.0);
  for (const char* p : {"p90", "p99", "p999"}) EXPECT_TRUE(j["latency_ms"][p].is_number()) << p;
  EXPECT_TRUE(j["server_queue_ms"]["p50"].is_null());  // nothing recorded
  EXPECT_EQ(j["errors"]["RESOURCE_EXHAUSTED"], 2);
  EXPECT_EQ(j["concurrency"], 4);
  EXPECT_EQ(csv_header(false),
            "concurrency,requests_per_second,tokens_per_second,p50_ms,p90_ms,p99_ms,p999_ms,max_ms,"
            "errors");
  EXPECT_EQ(csv_row(r), "4,5.000,1000.0,5.014,9.044,10.000,10.000,10.000,2");
  r.step.open_loop = true;
  r.step.rate = 12.5;
  EXPECT_EQ(csv_row(r).substr(0, 5), "12.5,");
  EXPECT_EQ(csv_header(true).substr(0, 5), "rate,");
}

}  // namespace
}  // namespace fastformer::loadgen
