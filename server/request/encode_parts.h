// The request layer's parts (encode_input.h's build_request, by job): a row's chunks
// (chunks.cc), macro-chunks (macro_chunks.cc) and the output options (output_options.cc).
// Internal to server/request.
#pragma once

#include <optional>
#include <vector>

#include "server/request/encode_input.h"

namespace fastformer::request::detail {

// The row's chunks in `storage` (which `in->spans` then views): its token spans (already in
// `in->spans`), then its character spans and sentences (a text's, through `offsets`), then its
// windows over the tokens as tokenized (a text's special tokens, tokenizer.json's, and
// `prompt`'s tokens belonging to no window).
std::optional<Problem> add_chunks(const Row& row, size_t i, const text::Tokenizer* tokenizer,
                                  int64_t tokens, const std::vector<tokenizer::Offsets>& offsets,
                                  text::PromptTokens prompt, SequenceInput* in,
                                  std::vector<TokenSpan>* storage);

// The model's config without its position limit: a row run as macro-chunks may be longer.
engine::ModelConfig unbounded(const engine::ModelConfig& c);
// The request's macro_overlap_tokens against the model (and truncation, which excludes it).
std::optional<Problem> check_macro(const EncodeInput& input, const engine::ModelConfig& c);
// The tokens the passes of an n-token row compute (n when it fits one pass of P): what the
// token budget counts.
int64_t macro_tokens(int64_t n, int64_t P, int64_t overlap);
// Logits asked of a row run as macro-chunks: refused (a classification is one pass).
Problem macro_logits(std::optional<size_t> row, const engine::ModelConfig& c);
// Cuts row `in` (longer than P = max_position_embeddings) into passes of P tokens, each
// P - overlap after the last and the last ending at the row's end, appended to out->sequences;
// each span goes to the pass that holds it with the most context.
std::optional<Problem> add_passes(const SequenceInput& in, std::optional<size_t> row, Field field,
                                  const engine::Model& model, int32_t overlap, Prepared* out,
                                  RowPasses* plan);

// The output options every protocol shares: logits need a head, `dimensions` at most
// hidden_size, each embedding type its dimension count and calibrated ranges.
std::optional<Problem> check_output(const EncodeInput& input, const engine::Model& model,
                                    const VersionFiles* files);

}  // namespace fastformer::request::detail
