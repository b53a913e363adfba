#include "client/loadgen/latency_histogram.h"

#include <algorithm>
#include <bit>
#include <cmath>

namespace fastformer::loadgen {
namespace {

constexpr int kExactBits = 8;  // values below 256 have a bucket each
constexpr int64_t kExact = int64_t(1) << kExactBits;
constexpr int kHalf = int(kExact / 2);  // buckets per power of two above that
constexpr int kBuckets = int(kExact) + (63 - kExactBits) * kHalf;

}  // namespace

LatencyHistogram::LatencyHistogram() : counts_(size_t(kBuckets), 0) {}

int LatencyHistogram::bucket_of(int64_t value) {
  if (value < kExact) return int(std::max<int64_t>(value, 0));
  // value = sub * 2^shift with sub in [128, 256): the bucket is (shift, sub).
  const int shift = std::bit_width(uint64_t(value)) - kExactBits;
  const int sub = int(value >> shift);
  return int(kExact) + (shift - 1) * kHalf + (sub - kHalf);
}

int64_t LatencyHistogram::highest_in_bucket(int bucket) {
  if (bucket < kExact) return bucket;
  const int shift = (bucket - int(kExact)) / kHalf + 1;
  const uint64_t sub = uint64_t((bucket - int(kExact)) % kHalf + kHalf);
  return int64_t(((sub + 1) << shift) - 1);  // unsigned: the top bucket ends at 2^63 - 1
}

void LatencyHistogram::record(int64_t value_ns) {
  const int64_t v = std::max<int64_t>(value_ns, 0);
  ++counts_[size_t(bucket_of(v))];
  min_ = count_ ? std::min(min_, v) : v;
  max_ = std::max(max_, v);
  sum_ += v;
  ++count_;
}

void LatencyHistogram::merge(const LatencyHistogram& other) {
  if (other.count_ == 0) return;
  for (size_t i = 0; i < counts_.size(); ++i) counts_[i] += other.counts_[i];
  min_ = count_ ? std::min(min_, other.min_) : other.min_;
  max_ = std::max(max_, other.max_);
  sum_ += other.sum_;
  count_ += other.count_;
}

int64_t LatencyHistogram::percentile(double p) const {
  if (count_ == 0) return 0;
  const double clamped = std::clamp(p, 0.0, 100.0);
  const int64_t rank = std::max<int64_t>(1, int64_t(std::ceil(clamped / 100.0 * double(count_))));
  int64_t seen = 0;
  for (size_t i = 0; i < counts_.size(); ++i) {
    seen += counts_[i];
    if (seen >= rank) return std::clamp(highest_in_bucket(int(i)), min_, max_);
  }
  return max_;
}

}  // namespace fastformer::loadgen
