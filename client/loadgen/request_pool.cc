#include "client/loadgen/request_pool.h"

namespace fastformer::loadgen {
namespace {

// `count` sequences of the workload stream.
std::vector<TokenSequence> make_sequences(const LengthsSpec& lengths, int64_t vocab_size,
                                          int32_t pad_token_id, int count, uint64_t seed) {
  std::vector<TokenSequence> sequences;
  if (!lengths.from_file) {
    // A token budget of 1 puts every sequence in a batch of its own: the batches are the stream.
    for (auto& batch : make_workload(lengths.range, vocab_size, pad_token_id,
                                     /*batch_tokens=*/1, count, seed)) {
      sequences.push_back(std::move(batch.front()));
    }
    return sequences;
  }
  SplitMix64 rng(seed);
  for (int i = 0; i < count; ++i) {
    const int64_t n = lengths.file_lengths[rng.next() % lengths.file_lengths.size()];
    sequences.push_back(random_token_ids(rng, n, vocab_size, pad_token_id));
  }
  return sequences;
}

}  // namespace

std::vector<PooledRequest> make_request_pool(const LengthsSpec& lengths, int64_t vocab_size,
                                             int32_t pad_token_id, int sequences_per_request,
                                             int pool_requests, uint64_t seed) {
  const auto sequences = make_sequences(lengths, vocab_size, pad_token_id,
                                        sequences_per_request * pool_requests, seed);
  std::vector<PooledRequest> pool(static_cast<size_t>(pool_requests));
  for (size_t i = 0; i < sequences.size(); ++i) {
    PooledRequest& pooled = pool[i / size_t(sequences_per_request)];
    pooled.request.add_sequences()->mutable_token_ids()->Assign(sequences[i].begin(),
                                                                sequences[i].end());
    pooled.tokens += int64_t(sequences[i].size());
    ++pooled.sequences;
  }
  return pool;
}

std::vector<PooledRequest> make_text_request_pool(const std::vector<std::string>& texts,
                                                  int sequences_per_request, int pool_requests) {
  std::vector<PooledRequest> pool(static_cast<size_t>(pool_requests));
  for (size_t i = 0; i < pool.size() * size_t(sequences_per_request); ++i) {
    PooledRequest& pooled = pool[i / size_t(sequences_per_request)];
    pooled.request.add_sequences()->set_text(texts[i % texts.size()]);
    ++pooled.sequences;
  }
  return pool;
}

}  // namespace fastformer::loadgen
