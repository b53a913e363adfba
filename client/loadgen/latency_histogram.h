// A log-linear histogram of durations in nanoseconds (HdrHistogram's layout): exact below
// 256 ns, then 128 buckets per power of two, so a reported percentile is within 0.8% of the
// true value; count, sum, min and max are exact. Fixed size (about 58 KB), mergeable.
#pragma once

#include <cstdint>
#include <vector>

namespace fastformer::loadgen {

class LatencyHistogram {
 public:
  LatencyHistogram();
  void record(int64_t value_ns);  ///< negative values count as 0
  void merge(const LatencyHistogram& other);

  int64_t count() const { return count_; }
  int64_t min() const { return count_ ? min_ : 0; }
  int64_t max() const { return max_; }
  double mean() const { return count_ ? double(sum_) / double(count_) : 0.0; }
  // Nearest-rank percentile, p in [0, 100]: the highest value of the bucket holding that rank,
  // clamped to [min, max] (so p = 100 is the exact max). 0 when empty.
  int64_t percentile(double p) const;

  static int bucket_of(int64_t value);
  static int64_t highest_in_bucket(int bucket);

 private:
  std::vector<int64_t> counts_;
  int64_t count_ = 0;
  int64_t sum_ = 0;
  int64_t min_ = 0;
  int64_t max_ = 0;
};

}  // namespace fastformer::loadgen
