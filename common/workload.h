// The synthetic benchmark workload, shared by fastformer-bench and tools/bench_pytorch.py
// (tools/workload.py implements the same rule, so both run the same sequences):
//  - splitmix64 from `seed`;
//  - lengths `fixed:L` or `uniform:MIN:MAX` (MIN + next() % (MAX-MIN+1), drawn only for
//    uniform), then `length` ids, each r = next() % (vocab-1), id = r < pad ? r : r + 1;
//  - sequences packed greedily into batches of at most batch_tokens tokens (at least one
//    sequence each); the sequence that would overflow starts the next batch;
//  - the pool is the first pool_batches batches, cycled by the benchmark.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fastformer {

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    state_ += 0x9E3779B97F4A7C15ull;
    uint64_t z = state_;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }

 private:
  uint64_t state_;
};

struct LengthSpec {
  int64_t min = 0;  ///< shortest sequence (equals max for fixed:L)
  int64_t max = 0;  ///< longest sequence
  bool uniform = false;
};

// Parses "fixed:L" or "uniform:MIN:MAX"; on failure returns false and sets `error`.
bool parse_lengths(const std::string& text, LengthSpec* out, std::string* error);

using TokenSequence = std::vector<int32_t>;
using WorkloadBatch = std::vector<TokenSequence>;

// `length` ids of the stream: each r = next() % (vocab_size-1), id = r < pad ? r : r + 1, so
// never the pad id. The load generator draws its file: lengths' sequences with it too.
TokenSequence random_token_ids(SplitMix64& rng, int64_t length, int64_t vocab_size,
                               int32_t pad_token_id);

std::vector<WorkloadBatch> make_workload(const LengthSpec& lengths, int64_t vocab_size,
                                         int32_t pad_token_id, int64_t batch_tokens,
                                         int pool_batches, uint64_t seed);

}  // namespace fastformer
