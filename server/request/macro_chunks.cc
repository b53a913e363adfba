// Macro-chunks ("long late chunking", docs/api.md): a row over max_position_embeddings run as
// overlapping passes, each chunk pooled from the pass that holds it with the most context, and
// the passes' results merged back into one per row.
#include <algorithm>
#include <cmath>
#include <limits>

#include "server/engine/error.h"
#include "server/engine/ragged_batch.h"
#include "server/request/encode_parts.h"

namespace fastformer::request {
namespace {

// Where the passes of an n-token row (n > P) start: every P - overlap tokens, the last one
// ending at the row's end.
std::vector<int32_t> pass_starts(int64_t n, int64_t P, int64_t overlap) {
  std::vector<int32_t> starts;
  for (int64_t s = 0; s + P < n; s += P - overlap) starts.push_back(int32_t(s));
  starts.push_back(int32_t(n - P));
  return starts;
}

// The pass of `starts` (each P tokens) that holds `span` whole with the most context on both
// sides (the earlier on a tie); -1 if none holds it.
int32_t pass_for(TokenSpan span, const std::vector<int32_t>& starts, int32_t P) {
  int32_t best = -1;
  int64_t most = -1;
  for (size_t w = 0; w < starts.size(); ++w) {
    const int32_t a = starts[w], b = a + P;
    if (span.begin < a || span.end > b) continue;
    const int64_t context = std::min(span.begin - a, b - span.end);
    if (context > most) {
      most = context;
      best = int32_t(w);
    }
  }
  return best;
}

}  // namespace

engine::ModelConfig detail::unbounded(const engine::ModelConfig& c) {
  engine::ModelConfig u = c;
  u.max_position_embeddings = std::numeric_limits<int32_t>::max();
  return u;
}

std::optional<Problem> detail::check_macro(const EncodeInput& input, const engine::ModelConfig& c) {
  if (!input.macro_overlap_tokens) return std::nullopt;
  const int64_t overlap = *input.macro_overlap_tokens, P = c.max_position_embeddings;
  if (overlap < 0 || overlap >= P)
    return Problem{std::nullopt,
                   Field::kMacroChunks,
                   {},
                   std::to_string(overlap) + " must be in [0, max_position_embeddings " +
                       std::to_string(P) + ")"};
  if (input.truncate != Truncate::kNone)
    return Problem{std::nullopt,
                   Field::kMacroChunks,
                   {},
                   "macro-chunks keep the whole row, truncation cuts it: ask for one of them"};
  return std::nullopt;
}

int64_t detail::macro_tokens(int64_t n, int64_t P, int64_t overlap) {
  return n <= P ? n : int64_t(pass_starts(n, P, overlap).size()) * P;
}

Problem detail::macro_logits(std::optional<size_t> row, const engine::ModelConfig& c) {
  return Problem{row,
                 Field::kMacroChunks,
                 {},
                 "logits are not served for a row over max_position_embeddings " +
                     std::to_string(c.max_position_embeddings) +
                     " run as macro-chunks (a classification is one pass)"};
}

std::optional<Problem> detail::add_passes(const SequenceInput& in, std::optional<size_t> row,
                                          Field field, const engine::Model& model, int32_t overlap,
                                          Prepared* out, RowPasses* plan) {
  const engine::ModelConfig& c = model.config();
  const int64_t D = c.hidden_size;
  const int32_t P = c.max_position_embeddings, n = int32_t(engine::sequence_length(in, D));
  plan->first = int32_t(out->sequences.size());
  plan->starts = pass_starts(n, P, overlap);
  const size_t passes = plan->starts.size();
  plan->count = int32_t(passes);
  std::vector<std::vector<TokenSpan>> local(passes);
  plan->span_pass.assign(in.spans.size(), 0);
  plan->span_index.assign(in.spans.size(), 0);
  for (size_t k = 0; k < in.spans.size(); ++k) {
    const TokenSpan span = in.spans[k];
    const int32_t w = pass_for(span, plan->starts, P);
    if (w < 0) {
      return Problem{row,
                     Field::kSpans,
                     {},
                     "span " + std::to_string(k) + " [" + std::to_string(span.begin) + ", " +
                         std::to_string(span.end) + ") lies in no single macro-chunk: passes of " +
                         "max_position_embeddings " + std::to_string(P) + " tokens start every " +
                         std::to_string(P - overlap) + " tokens (macro_overlap_tokens " +
                         std::to_string(overlap) + "), so a chunk of at most " +
                         std::to_string(overlap + 1) +
                         " tokens always fits one; raise macro_overlap_tokens or cut the chunk"};
    }
    const int32_t start = plan->starts[size_t(w)];
    plan->span_pass[k] = w;
    plan->span_index[k] = int32_t(local[size_t(w)].size());
    local[size_t(w)].push_back({span.begin - start, span.end - start});
  }
  for (size_t w = 0; w < passes; ++w) {
    const int32_t start = plan->starts[w];
    SequenceInput pass;
    if (!in.token_ids.empty())
      pass.token_ids = in.token_ids.subspan(size_t(start), size_t(P));
    else
      pass.input_embeddings = in.input_embeddings.subspan(size_t(start * D), size_t(P * D));
    out->spans.push_back(std::move(local[w]));  // its buffer, which the view keeps, moves along
    pass.spans = out->spans.back();
    if (auto error = engine::validate_sequence(c, model.has_word_embedding(), pass, 0)) {
      return Problem{row,
                     field,
                     {},
                     "macro-chunk " + std::to_string(w) + " (tokens [" + std::to_string(start) +
                         ", " + std::to_string(start + P) + ")): " + error->message};
    }
    out->sequences.push_back(pass);
  }
  return std::nullopt;
}

void merge_passes(const Prepared& prepared, batching::Job* job) {
  batching::Job& r = *job;
  if (prepared.passes.empty()) return;
  std::vector<EncodedSequence> merged(prepared.passes.size());
  for (size_t i = 0; i < prepared.passes.size(); ++i) {
    const RowPasses& plan = prepared.passes[i];
    EncodedSequence& row = merged[i];
    if (plan.count == 1) {
      row = std::move(r.results[size_t(plan.first)]);
      continue;
    }
    const EncodedSequence* pass = r.results.data() + plan.first;
    const size_t width = pass[0].embedding.size();
    const int64_t P = pass[0].num_tokens;
    // The row's embedding: the mean of its passes' (each normalised by the engine if asked).
    std::vector<double> sum(width, 0.0);
    for (int32_t w = 0; w < plan.count; ++w)
      for (size_t j = 0; j < width; ++j) sum[j] += pass[w].embedding[j];
    double norm = 0.0;
    for (size_t j = 0; j < width; ++j) {
      sum[j] /= plan.count;
      norm += sum[j] * sum[j];
    }
    norm = std::sqrt(norm);
    row.embedding.resize(width);
    for (size_t j = 0; j < width; ++j)
      row.embedding[j] = float(r.options.normalize && norm > 0 ? sum[j] / norm : sum[j]);
    // Each chunk from the pass that holds it with the most context.
    row.span_embeddings.resize(plan.span_pass.size() * width);
    for (size_t k = 0; k < plan.span_pass.size(); ++k) {
      const std::vector<float>& from = pass[plan.span_pass[k]].span_embeddings;
      std::copy_n(from.begin() + int64_t(size_t(plan.span_index[k]) * width), width,
                  row.span_embeddings.begin() + int64_t(k * width));
    }
    const int64_t n = int64_t(plan.starts.back()) + P;
    row.num_tokens = n;
    if (!pass[0].token_embeddings.empty()) {
      // Token t from the pass that holds it with the most context on both sides.
      const size_t D = pass[0].token_embeddings.size() / size_t(P);
      row.token_embeddings.resize(size_t(n) * D);
      for (int64_t t = 0; t < n; ++t) {
        const TokenSpan token{int32_t(t), int32_t(t + 1)};
        const int32_t w = pass_for(token, plan.starts, int32_t(P));
        std::copy_n(pass[w].token_embeddings.begin() + (t - plan.starts[size_t(w)]) * int64_t(D), D,
                    row.token_embeddings.begin() + t * int64_t(D));
      }
    }
  }
  r.results = std::move(merged);
  r.sequences = prepared.rows;
}

}  // namespace fastformer::request
