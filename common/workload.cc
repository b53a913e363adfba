#include "common/workload.h"

#include <charconv>

namespace fastformer {
namespace {

bool parse_int(std::string_view s, int64_t* out) {
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && ptr == s.data() + s.size() && *out > 0;
}

}  // namespace

bool parse_lengths(const std::string& text, LengthSpec* out, std::string* error) {
  const std::string_view s(text);
  if (s.starts_with("fixed:")) {
    if (!parse_int(s.substr(6), &out->min)) {
      *error = "lengths \"" + text + "\": expected fixed:L with L a positive integer";
      return false;
    }
    out->max = out->min;
    out->uniform = false;
    return true;
  }
  if (s.starts_with("uniform:")) {
    const std::string_view rest = s.substr(8);
    const size_t colon = rest.find(':');
    if (colon == std::string_view::npos || !parse_int(rest.substr(0, colon), &out->min) ||
        !parse_int(rest.substr(colon + 1), &out->max) || out->min > out->max) {
      *error = "lengths \"" + text + "\": expected uniform:MIN:MAX with 0 < MIN <= MAX";
      return false;
    }
    out->uniform = true;
    return true;
  }
  *error = "lengths \"" + text + "\": expected fixed:L or uniform:MIN:MAX";
  return false;
}

TokenSequence random_token_ids(SplitMix64& rng, int64_t length, int64_t vocab_size,
                               int32_t pad_token_id) {
  TokenSequence ids(static_cast<size_t>(length));
  for (auto& id : ids) {
    const auto r = static_cast<int32_t>(rng.next() % uint64_t(vocab_size - 1));
    id = r < pad_token_id ? r : r + 1;
  }
  return ids;
}

std::vector<WorkloadBatch> make_workload(const LengthSpec& lengths, int64_t vocab_size,
                                         int32_t pad_token_id, int64_t batch_tokens,
                                         int pool_batches, uint64_t seed) {
  SplitMix64 rng(seed);
  auto next_sequence = [&] {
    int64_t n = lengths.min;
    if (lengths.uniform)
      n = lengths.min + int64_t(rng.next() % uint64_t(lengths.max - lengths.min + 1));
    return random_token_ids(rng, n, vocab_size, pad_token_id);
  };
  std::vector<WorkloadBatch> pool;
  WorkloadBatch current;
  int64_t tokens = 0;
  while (static_cast<int>(pool.size()) < pool_batches) {
    TokenSequence seq = next_sequence();
    const auto n = static_cast<int64_t>(seq.size());
    if (!current.empty() && tokens + n > batch_tokens) {
      pool.push_back(std::move(current));
      current.clear();
      tokens = 0;
      if (static_cast<int>(pool.size()) == pool_batches) break;
    }
    current.push_back(std::move(seq));
    tokens += n;
  }
  return pool;
}

}  // namespace fastformer
