// The ragged batch: every token of every sequence packed into one [T, D] matrix.
//
// Sequence b owns rows cu_seqlens[b] .. cu_seqlens[b+1]-1; positions restart at 0 per
// sequence. No padding is ever computed. A sequence arrives either as token ids or as
// input embeddings (rows of width D); both kinds may share a batch.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/sequence.h"  // SequenceInput, OutputOptions, EncodedSequence
#include "server/engine/config.h"
#include "server/engine/error.h"

namespace fastformer::engine {

// Checks one sequence against the model's limits. `index` names it in the error.
std::optional<InputError> validate_sequence(const ModelConfig& config, bool has_word_embedding,
                                            const SequenceInput& sequence, size_t index);

// Checks a sequence's spans (SequenceInput::spans) against its length: each inside it, not
// reversed, not empty, and holding a real (not pad) token. The field is "spans".
std::optional<InputError> validate_spans(const ModelConfig& config, const SequenceInput& sequence,
                                         size_t index);

// The words for a token id outside the vocabulary: "has id 1000, outside [0, vocab_size 1000)"
// (validate_sequence and the request layer put the token's position before it).
std::string id_outside_vocabulary(int64_t id, int64_t vocab_size);

// Number of tokens of a sequence (valid or not): ids, or embedding rows of width hidden_size.
int64_t sequence_length(const SequenceInput& sequence, int64_t hidden_size);

// Marks token rows that come from input embeddings rather than the word table.
inline constexpr int32_t kEmbeddingRow = -1;

struct RaggedBatch {
  std::vector<int32_t> cu_seqlens{0};    ///< B+1 offsets into the packed rows
  std::vector<int32_t> token_ids;        ///< [T]; kEmbeddingRow where input embeddings are used
  std::vector<int32_t> embedding_index;  ///< [T]; row of input_embeddings, or -1
  std::vector<float> input_embeddings;   ///< [E, D] rows supplied by callers
  std::vector<uint8_t> mask;             ///< [T]; 1 for a real token, 0 for padding
  std::vector<int32_t> position_ids;     ///< [T]; position of the token within its sequence
  std::vector<TokenSpan> spans;          ///< the sequences' spans, in batch rows
  std::vector<int32_t> span_first{0};    ///< B+1: sequence b owns spans span_first[b] ..

  int32_t num_sequences() const { return static_cast<int32_t>(cu_seqlens.size()) - 1; }
  int32_t num_tokens() const { return cu_seqlens.back(); }

  // Appends a sequence that validate_sequence accepted.
  void add(const SequenceInput& sequence, const ModelConfig& config);
  void clear();
  // Sequences first .. last-1 as a batch of their own: their rows, input embeddings (rows
  // of width hidden_size) and spans, offsets counted from the first's first row.
  RaggedBatch sequences(int32_t first, int32_t last, int64_t hidden_size) const;
};

}  // namespace fastformer::engine
