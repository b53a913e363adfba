// What the pooling kernels' tests share (pooling_test.cc, key_pool_test.cc): a ragged batch with
// the chunk layout of plan_chunks() in host and device memory, the partials' device buffers,
// random inputs, the double-precision reference of a softmax pooling and its comparison.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/kernels.h"
#include "tests/emulation/device_buffer.h"

namespace fastformer::emulation_test {

// A ragged batch in host and device memory, with the chunk layout of plan_chunks().
struct Batch {
  std::vector<int32_t> cu{0}, token_seq, chunk_begin, chunk_end, first{0};
  std::vector<uint8_t> mask;
  int32_t max_chunks = 0;

  // About a fifth of the tokens are padding (`masked`), every sequence's first token real.
  Batch(const std::vector<int32_t>& lengths, std::mt19937& rng, double masked_share = 0.2) {
    std::bernoulli_distribution masked(masked_share);
    for (size_t b = 0; b < lengths.size(); ++b) {
      const int32_t start = cu.back(), n = lengths[b];
      cu.push_back(start + n);
      for (int32_t i = 0; i < n; ++i) {
        token_seq.push_back(int32_t(b));
        mask.push_back(i == 0 || !masked(rng) ? 1 : 0);  // every sequence keeps a real token
      }
      for (int32_t t = start; t < start + n; t += kernels::kChunkTokens) {
        chunk_begin.push_back(t);
        chunk_end.push_back(std::min(t + kernels::kChunkTokens, start + n));
      }
      first.push_back(int32_t(chunk_begin.size()));
      max_chunks = std::max(max_chunks, first.back() - first[first.size() - 2]);
    }
  }
  int32_t tokens() const { return cu.back(); }
  int32_t sequences() const { return int32_t(cu.size()) - 1; }
  int32_t chunks() const { return int32_t(chunk_begin.size()); }
  // Tokens [from, to) of sequence b become padding (the caller keeps a real token).
  void pad(int32_t b, int32_t from, int32_t to) {
    for (int32_t i = from; i < to; ++i) mask[size_t(cu[size_t(b)] + i)] = 0;
  }
};

struct DeviceBatch {
  DeviceBuffer<int32_t> cu, token_seq, chunk_begin, chunk_end, first;
  DeviceBuffer<uint8_t> mask;
  kernels::BatchArgs args;
  explicit DeviceBatch(const Batch& b)
      : cu(b.cu),
        token_seq(b.token_seq),
        chunk_begin(b.chunk_begin),
        chunk_end(b.chunk_end),
        first(b.first),
        mask(b.mask) {
    args.num_tokens = b.tokens();
    args.num_sequences = b.sequences();
    args.cu_seqlens = cu.get();
    args.token_seq = token_seq.get();
    args.mask = mask.get();
    args.num_chunks = int32_t(b.chunk_begin.size());
    args.chunk_begin = chunk_begin.get();
    args.chunk_end = chunk_end.get();
    args.seq_first_chunk = first.get();
    args.max_sequence_chunks = b.max_chunks;
  }
};

struct DevicePartials {
  DeviceBuffer<float> m, l, v;
  DevicePartials(const Batch& b, int32_t H, int32_t D)
      : m(b.chunk_begin.size() * size_t(H)),
        l(b.chunk_begin.size() * size_t(H)),
        v(b.chunk_begin.size() * size_t(D)) {}
  kernels::Partials get() const { return kernels::Partials{m.get(), l.get(), v.get()}; }
};

template <class T>
std::vector<T> random_values(size_t count, float lo, float hi, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<T> out(count);
  for (T& x : out) x = from_float<T>(u(rng));
  return out;
}

template <class T>
double value(const T& x) {
  return double(to_float(x));
}

// sum_t softmax_t(score(t, h)) value(t, j) over the real tokens of sequence b, for every column
// j of head h = j / (D / heads), with `extra` added to the softmax denominator as the reference
// pooler does (sum_t e^{z_t} + extra), times scale(j) when given.
template <class Score, class Value>
std::vector<double> reference_pool(const Batch& batch, int32_t b, int32_t heads, int32_t D,
                                   Score score, Value val, double extra) {
  const int32_t d = D / heads;
  std::vector<double> out(size_t(D), 0.0);
  for (int32_t h = 0; h < heads; ++h) {
    double M = -INFINITY;
    for (int32_t t = batch.cu[size_t(b)]; t < batch.cu[size_t(b) + 1]; ++t) {
      if (batch.mask[size_t(t)]) M = std::max(M, score(t, h));
    }
    double L = 0.0;
    std::vector<double> acc(size_t(d), 0.0);
    for (int32_t t = batch.cu[size_t(b)]; t < batch.cu[size_t(b) + 1]; ++t) {
      if (!batch.mask[size_t(t)]) continue;
      const double w = std::exp(score(t, h) - M);
      L += w;
      for (int32_t i = 0; i < d; ++i) acc[size_t(i)] += w * val(t, h * d + i);
    }
    for (int32_t i = 0; i < d; ++i)
      out[size_t(h * d + i)] = acc[size_t(i)] / (L + extra * std::exp(-M));
  }
  return out;
}

// Relative error allowed on an output element: float accumulation, then rounding to T.
template <class T>
double tolerance() {
  if constexpr (sizeof(T) == 4) return 2e-5;
  if constexpr (std::is_same_v<T, ff_half>) return 2e-3;
  return 8e-3;
}

template <class T>
void expect_rows_near(const std::vector<T>& got, const Batch& batch, int32_t D,
                      const std::function<std::vector<double>(int32_t)>& reference,
                      const std::string& what) {
  int failures = 0;
  for (int32_t b = 0; b < batch.sequences(); ++b) {
    const std::vector<double> want = reference(b);
    double scale = 0.0;
    for (double x : want) scale = std::max(scale, std::abs(x));
    for (int32_t j = 0; j < D; ++j) {
      const double g = value(got[size_t(b) * size_t(D) + size_t(j)]), w = want[size_t(j)];
      const double allowed = tolerance<T>() * (std::abs(w) + 0.01 * scale) + 1e-30;
      if (!(std::abs(g - w) <= allowed) && failures++ < 5) {
        ADD_FAILURE() << what << ": sequence " << b << " column " << j << ": " << g << ", expected "
                      << w;
      }
    }
  }
  EXPECT_EQ(failures, 0) << what;
}

}  // namespace fastformer::emulation_test
