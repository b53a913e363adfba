// What the request targets (fuzz_request, fuzz_infer_request) share: four small served models
// that differ in what validation depends on, and the path an accepted request takes through the
// batch queue, as the server batches it, and the CPU engine, with invariants at each step.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "server/batching/job.h"
#include "server/engine/engine.h"
#include "server/engine/model.h"
#include "server/text/text.h"

namespace fastformer::fuzz {

inline constexpr int64_t kMaxPositions = 16;
inline constexpr int64_t kMaxBatchTokens = 24;  // under the largest request: requests span batches

struct Served {
  std::shared_ptr<const engine::Model> model;
  std::shared_ptr<const text::Tokenizer> tokenizer;  ///< null: the model takes no text
  std::unique_ptr<engine::Engine> engine;
};

// 0: token ids and a classifier head; 1: input embeddings only; 2: pad_token_id 5, bare names,
// F16; 3: shared layers, BF16, relu. Hidden 8, vocab 12, kMaxPositions positions. Models 0 and
// 2 take text (a WordLevel and a WordPiece tokenizer.json).
std::vector<Served>& served_models();

// Queues `request` (converted and accepted), forms its batches and encodes them, checking every
// batch and result; fills request->results. Its on_complete is replaced.
void run_request(Served& served, const std::shared_ptr<batching::Job>& request);

}  // namespace fastformer::fuzz
