// Errors the engine reports across its boundary.
//
// Loading a model is all-or-nothing: any problem throws ModelError with a message that
// names the file, the tensor or key, and what was expected versus found. Per-sequence
// input problems are values (InputError), never exceptions: one bad sequence must not
// cost another its answer.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>

namespace fastformer::engine {

// A model directory that cannot be served (bad config.json, bad or mismatched weights).
class ModelError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A request or batch the engine cannot run (too large for its buffers, wrong backend).
class EngineError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// One sequence of a request that can never succeed; the server maps it to INVALID_ARGUMENT.
struct InputError {
  size_t sequence_index = 0;  ///< position of the sequence in its request
  std::string field;          ///< the offending field: "token_ids", "input_embeddings"
  std::string message;        ///< what is wrong and the limit, for the user

  std::string to_string() const {
    return "sequence " + std::to_string(sequence_index) + ": " + field + ": " + message;
  }
};

}  // namespace fastformer::engine
