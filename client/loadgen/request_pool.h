// The requests a load run cycles through, made before it starts. Token ids follow
// fastformer-bench's workload rule (common/workload.h: splitmix64 from the seed, ids
// never the pad token): for fixed:/uniform: lengths the sequences are exactly the first ones of
// fastformer-bench's and tools/workload.py's stream; for file: lengths each length is drawn
// uniformly from the file with the same generator.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "client/loadgen/load_spec.h"
#include "fastformer/v1/encoder.pb.h"

namespace fastformer::loadgen {

struct PooledRequest {
  v1::EncodeRequest request;
  int64_t tokens = 0;  ///< over all its sequences; 0 for texts (known from the answer only)
  int64_t sequences = 0;
};

std::vector<PooledRequest> make_request_pool(const LengthsSpec& lengths, int64_t vocab_size,
                                             int32_t pad_token_id, int sequences_per_request,
                                             int pool_requests, uint64_t seed);

// --texts: the texts (one a line of the file) as Sequence.text, in order, cycled to fill the pool.
std::vector<PooledRequest> make_text_request_pool(const std::vector<std::string>& texts,
                                                  int sequences_per_request, int pool_requests);

}  // namespace fastformer::loadgen
