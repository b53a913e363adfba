#include "server/engine/workspace.h"

#include <algorithm>

#include "kernels/pooling_chunks.h"
#include "server/engine/prepared_weights.h"  // qks_width
#include "server/engine/ragged_batch.h"

namespace fastformer::engine {

WorkspacePlan plan_workspace(const ModelConfig& c, int64_t num_labels, int64_t tokens,
                             int64_t sequences, size_t element_size) {
  const int64_t T = tokens, B = sequences;
  const int64_t D = c.hidden_size, H = c.num_attention_heads, I = c.intermediate_size;
  WorkspacePlan plan;
  plan.tokens = T;
  plan.sequences = B;
  // Each sequence has one chunk plus one per further kChunkTokens of its tokens.
  plan.chunks = B + std::max<int64_t>(T - B, 0) / kernels::kChunkTokens;
  size_t end = 0;
  // Every buffer starts at a multiple of kWorkspaceAlignment; `ld` is cols unless given.
  auto place = [&](int64_t rows, int64_t cols, size_t element, int64_t ld = 0) {
    const WorkspacePlan::Buffer buffer{end, rows, cols, ld > 0 ? ld : cols};
    const size_t bytes = size_t(rows * buffer.ld) * element;
    end += (bytes + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment;
    return buffer;
  };
  plan.x = place(T, D, element_size);
  plan.qks = place(T, qks_width(c), element_size);
  plan.y = place(T, D, element_size);
  plan.h = place(T, I, element_size);
  plan.pq = place(B, D, element_size);
  plan.pk = place(B, D, element_size);
  plan.pooled = place(B, D, element_size);
  // The head's GEMM writes its num_labels columns into rows of padded_ld(num_labels): a
  // 16-byte C/D row for cuBLASLt whatever the label count (workspace.h). N stays num_labels
  // (the weight is not padded): the alignment cuBLASLt assumes comes from ldc and the
  // pointers, not from N, so padding N would only compute and store columns nobody reads.
  // The download reads the num_labels columns of each row (Ops::download honours ld).
  plan.logits = place(B, num_labels, element_size, padded_ld(num_labels));
  plan.partial_max = place(plan.chunks, H, sizeof(float));
  plan.partial_sum = place(plan.chunks, H, sizeof(float));
  plan.partial_values = place(plan.chunks, D, sizeof(float));
  plan.token_scores = place(T, H, sizeof(float));
  plan.bytes = end;
  return plan;
}

int64_t pass_tokens(const ModelConfig& c, int64_t num_labels, size_t element_size,
                    size_t cache_bytes) {
  // A pass's buffers grow with its tokens; the per-sequence rows are few beside them.
  constexpr int64_t kProbe = 4096;
  const double per_token =
      double(plan_workspace(c, num_labels, kProbe, 1, element_size).bytes) / double(kProbe);
  const int64_t D = c.hidden_size, I = c.intermediate_size;
  const double layer_weights =
      double(element_size) * double(D * qks_width(c) + 2 * D * D + 2 * D * I);
  const double room = double(cache_bytes) / 2 - layer_weights;
  const int64_t tokens = room > 0 ? int64_t(room / per_token) : 0;
  return tokens >= kMinPassTokens ? tokens : 0;
}

void plan_passes(const RaggedBatch& batch, int64_t pass_tokens, std::vector<int32_t>& ends) {
  ends.clear();
  const int32_t B = batch.num_sequences();
  const int64_t T = batch.num_tokens(), limit = std::max<int64_t>(pass_tokens, 1);
  const int64_t passes = std::max<int64_t>((T + limit - 1) / limit, 1);
  const int64_t share = (T + passes - 1) / passes;
  auto length = [&](int32_t b) {
    return int64_t(batch.cu_seqlens[size_t(b) + 1] - batch.cu_seqlens[size_t(b)]);
  };
  for (int32_t last = 0; last < B;) {
    int64_t tokens = length(last++);
    while (last < B && tokens < share && tokens + length(last) <= limit) tokens += length(last++);
    ends.push_back(last);
  }
}

void plan_chunks(const RaggedBatch& batch, PoolingChunks& chunks) {
  chunks.begin.clear();
  chunks.end.clear();
  chunks.sequence.clear();
  chunks.first.assign(1, 0);
  for (int32_t b = 0; b < batch.num_sequences(); ++b) {
    const int32_t end = batch.cu_seqlens[size_t(b) + 1];
    for (int32_t t = batch.cu_seqlens[size_t(b)]; t < end; t += kernels::kChunkTokens) {
      chunks.begin.push_back(t);
      chunks.end.push_back(std::min(t + kernels::kChunkTokens, end));
      chunks.sequence.push_back(b);
    }
    chunks.first.push_back(chunks.count());
  }
}

void plan_span_chunks(const RaggedBatch& batch, std::span<const SpanPooling> modes,
                      SpanPooling mode, PoolingChunks& chunks, std::vector<int32_t>& owners) {
  chunks.begin.clear();
  chunks.end.clear();
  chunks.sequence.clear();
  chunks.first.assign(1, 0);
  owners.clear();
  for (int32_t b = 0; b < batch.num_sequences(); ++b) {
    if (modes[size_t(b)] != mode) continue;
    for (int32_t i = batch.span_first[size_t(b)]; i < batch.span_first[size_t(b) + 1]; ++i) {
      const TokenSpan span = batch.spans[size_t(i)];
      for (int32_t t = span.begin; t < span.end; t += kernels::kChunkTokens) {
        chunks.begin.push_back(t);
        chunks.end.push_back(std::min(t + kernels::kChunkTokens, span.end));
        chunks.sequence.push_back(static_cast<int32_t>(owners.size()));
      }
      owners.push_back(i);
      chunks.first.push_back(chunks.count());
    }
  }
}

}  // namespace fastformer::engine
