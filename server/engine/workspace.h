// The memory plan of one batch of the forward graph: where each per-batch buffer lives in
// the engine's workspace, and how the batch's sequences split into pooling chunks.
//
// plan_workspace() and plan_chunks() are defined in workspace.cc, and are the only place their
// sizes are written down: the engine sizes its workspace once from the plan of the largest batch
// (max_batch_tokens one-token sequences, every buffer at its largest) and lays out every batch with
// the plan of that batch, so a buffer added to the graph is sized everywhere at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "server/engine/config.h"
#include "server/engine/ragged_batch.h"

namespace fastformer::engine {

// The padded leading dimension of a narrow GEMM output (or width, for Q|K|s): `cols`
// rounded up to a multiple of 8 elements (16 bytes in float16 and
// bfloat16, 32 in float32). cuBLASLt derives the alignment it may assume for C and D from the
// pointer and ldc * element size, and with a bias epilogue the heuristic may offer no
// algorithm at all below 16 bytes (a 5-label head: 10-byte rows in bfloat16). The one place
// leading dimensions are padded: the plan's buffers (plan_workspace) and the Q|K|s width
// (qks_width, prepared_weights.h).
inline constexpr int64_t kLdMultiple = 8;
inline constexpr int64_t padded_ld(int64_t cols) {
  return (cols + kLdMultiple - 1) / kLdMultiple * kLdMultiple;
}

// What cuBLASLt's fastest kernels ask of every GEMM operand (A, W, C and the bias): the
// pointer and the leading dimension in bytes both multiples of 16.
inline constexpr size_t kGemmOperandAlignment = 16;

struct WorkspacePlan {
  // A row-major [rows, cols] buffer at byte `offset` of the workspace, `ld` elements between
  // rows (ld >= cols; the columns past cols are padding that nothing writes or reads).
  struct Buffer {
    size_t offset = 0;
    int64_t rows = 0;
    int64_t cols = 0;
    int64_t ld = 0;
  };

  int64_t tokens = 0;     ///< T, the batch's tokens
  int64_t sequences = 0;  ///< B <= T (sequences are never empty)
  int64_t chunks = 0;     ///< the most pooling chunks a batch of T tokens in B sequences has

  // In the serving dtype (the engine's element_size()). Q|K|s is padded in its width (the
  // GEMM writes qks_width columns) and the logits in their ld; the others are dense (ld =
  // cols, as their kernels read them): D and I are multiples of 8 in every preset and test
  // model (GemmSites in tests/unit/cuda_gemm_test.cc walks every GEMM site), and a model where
  // they are not runs those GEMMs at the alignment it has, with any bias added by our kernel
  // rather than a cuBLASLt epilogue (cuda_ops.cc, linear).
  Buffer x;       ///< [T, D] hidden state, updated in place layer by layer
  Buffer qks;     ///< [T, qks_width] Q | K | s | padding; K's block is reused for U, Q's for A
  Buffer y;       ///< [T, D] GEMM outputs before their LayerNorm
  Buffer h;       ///< [T, I] feed-forward activations
  Buffer pq;      ///< [B, D] pooled query
  Buffer pk;      ///< [B, D] pooled key
  Buffer pooled;  ///< [B, D] the attention pooler's output
  Buffer logits;  ///< [B, num_labels], ld padded_ld(num_labels)
  // In float32 whatever the serving dtype (the pooling ops' reductions):
  Buffer partial_max;     ///< [chunks, H] online-softmax running max per chunk and head
  Buffer partial_sum;     ///< [chunks, H] sum of weights
  Buffer partial_values;  ///< [chunks, D] weighted value sums
  Buffer token_scores;    ///< [T, H] the key scores r (the pooler's scores z use column 0)

  size_t bytes = 0;  ///< the workspace the plan spans
};

// Byte alignment of every buffer: cuBLASLt's and cudaMalloc's, a multiple of a cache line.
inline constexpr size_t kWorkspaceAlignment = 256;

// The buffers of a batch of `tokens` tokens in `sequences` sequences, elements of the
// serving dtype being `element_size` bytes. Every size grows with tokens and sequences, so
// plan_workspace(c, labels, T_max, T_max, e) bounds every batch of at most T_max tokens.
WorkspacePlan plan_workspace(const ModelConfig& config, int64_t num_labels, int64_t tokens,
                             int64_t sequences, size_t element_size);

// Passes (the CPU engine): a batch whose buffers exceed the cache runs as passes of whole
// sequences, each the whole forward graph, so that every op reads what the op before it wrote
// from the cache rather than from memory. A pass holds at most pass_tokens() tokens (a longer
// sequence is a pass of its own); 0 runs every batch in one pass.
//
// pass_tokens() sizes a pass so that its buffers and one layer's GEMM weights fill at most
// half of `cache_bytes` (the last-level cache the engine's threads share; the other half is the
// GEMMs' own blocking, and what else the threads touch). A pass below kMinPassTokens is not
// made: there the GEMMs, rereading the layer's weights each pass with fewer rows, lose more
// than the other ops gain (docs/benchmarks/cpu-row-passes.md, "Passes sized to the cache"), so
// such a model (base-long: 14 MB of bfloat16 weights a layer) runs its batches whole.
inline constexpr int64_t kMinPassTokens = 1024;
int64_t pass_tokens(const ModelConfig& config, int64_t num_labels, size_t element_size,
                    size_t cache_bytes);

// A batch's passes, in order: pass i is sequences ends[i-1] (0 for the first) .. ends[i]-1.
// As few passes as `pass_tokens` allows, of about equal size: each takes sequences until it
// holds the batch's share, never more than pass_tokens (but always one sequence). So 8,192
// tokens at a limit of 6,006 are two passes of about 4,096, not 6,006 and 2,186.
void plan_passes(const RaggedBatch& batch, int64_t pass_tokens, std::vector<int32_t>& ends);

// The pooling chunks of a batch: each sequence's tokens in consecutive chunks of at most
// kernels::kChunkTokens, in sequence order.
struct PoolingChunks {
  std::vector<int32_t> begin;     ///< [chunks] first token of the chunk
  std::vector<int32_t> end;       ///< [chunks] one past its last token
  std::vector<int32_t> sequence;  ///< [chunks] the sequence that owns it
  std::vector<int32_t> first;     ///< [B+1] sequence b owns chunks first[b] .. first[b+1]-1

  int32_t count() const { return static_cast<int32_t>(begin.size()); }
};

// Fills `chunks` for `batch`, reusing its capacity.
void plan_chunks(const RaggedBatch& batch, PoolingChunks& chunks);

// The pooling chunks of the batch's spans that are pooled by `mode` (sequence b's spans are
// when modes[b] == mode): each span's tokens in chunks of at most kernels::kChunkTokens, as a
// sequence's are, so a span over a whole sequence gets the sequence's chunks. Span i of the
// plan owns chunks first[i] .. first[i+1]-1 (`sequence` holds i); owners[i] is its index in
// batch.spans.
void plan_span_chunks(const RaggedBatch& batch, std::span<const SpanPooling> modes,
                      SpanPooling mode, PoolingChunks& chunks, std::vector<int32_t>& owners);

}  // namespace fastformer::engine
