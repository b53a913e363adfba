// The operations the forward graph is written over (forward.cc). The CPU engine implements
// them with oneDNN and a thread pool; the CUDA engine with cuBLASLt and kernels/. Each
// operation names the line of the model contract (docs/design.md, "The model contract") it
// computes.
//
// Buffers are opaque pointers into the engine's own memory, holding elements of the
// engine's serving dtype; matrices are row-major with an explicit leading dimension so a
// view can address a column block of a wider matrix (Q, K and s share one GEMM output).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <stdexcept>
#include <utility>

#include "server/engine/config.h"
#include "server/engine/ragged_batch.h"
#include "server/engine/workspace.h"

namespace fastformer::engine {

struct Mat {
  void* data = nullptr;  ///< first element
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t ld = 0;  ///< elements between consecutive rows
};

// Columns first .. first+cols-1 of `m`, for elements of `element_size` bytes.
inline Mat columns(const Mat& m, int64_t first, int64_t cols, size_t element_size) {
  return Mat{static_cast<char*>(m.data) + first * static_cast<int64_t>(element_size), m.rows, cols,
             m.ld};
}

struct WeightRef {
  const void* weight = nullptr;  ///< [out, in] in engine memory
  const void* bias = nullptr;    ///< [out] or null
  int64_t out = 0;
  int64_t in = 0;
};

enum class Epilogue {
  kStore,       ///< C = A W^T
  kBias,        ///< C = A W^T + b
  kBiasAct,     ///< C = act(A W^T + b)
  kAccumulate,  ///< C = C + A W^T
};

// A batch's sizes, as begin_batch() copied it to the engine (its ids, offsets, mask,
// positions and pooling chunks stay in the ops until the next begin_batch()).
struct BatchRef {
  int32_t num_sequences = 0;
  int32_t num_tokens = 0;
};

class OpsReport;

class Ops {
 public:
  virtual ~Ops() = default;

  // The ops' own report (ops_report.h: the kernel each GEMM ran, ...), or null where they
  // have none.
  virtual OpsReport* report() { return nullptr; }
  // Bytes per element of the serving dtype.
  virtual size_t element_size() const = 0;
  // Bytes per element of what upload() makes (the embedding tables and the other parameters
  // the kernels read as they are): the serving dtype's unless an engine keeps float32.
  virtual size_t uploaded_element_size() const { return element_size(); }

  // Makes float32 host data available in engine memory, in the serving dtype or float32
  // (uploaded_element_size()). The host array outlives the Ops (an engine may serve it in
  // place); the result lives as long.
  virtual const void* upload(std::span<const float> host) = 0;
  // Allocates the workspace for `largest`, the plan of the largest batch the engine serves
  // (workspace.h), and sizes by it whatever per-batch memory of its own the ops keep. The
  // forward graph calls it once, before the first batch.
  virtual void reserve(const WorkspacePlan& largest) = 0;
  // Makes the first `bytes` of the workspace resident now, so that the memory the engine holds
  // is steady from its first batch: the forward graph calls it, after reserve(), with its
  // largest pass when it runs batches in passes (workspace.h), whose buffers every busy
  // minute touches, while the largest batch is reserved for the rare long sequence. A no-op
  // where reserve() makes the workspace resident (device memory).
  virtual void prefault(size_t bytes) { (void)bytes; }
  // The workspace's first byte: every buffer of a plan lies at its offset from here.
  virtual void* workspace() = 0;

  // Copies the batch's ids, offsets, mask, positions and pooling chunks to the engine ahead of
  // its begin_batch(), while another batch computes: the CUDA ops fill a pinned buffer and
  // copy it on a stream of their own. Called on another thread than the batches (the batch
  // former's), at most one call at a time. Returns a ticket for begin_batch's `staged`; 0 where
  // nothing was staged (ops that read host memory, a batch with input embeddings).
  virtual uint64_t stage(const RaggedBatch& batch, const PoolingChunks& chunks) {
    (void)batch, (void)chunks;
    return 0;
  }

  // Copies the batch's ids, input embeddings, offsets, mask and positions to the engine, and
  // takes the batch's plan (where the pooling ops find their partials and scores) and its
  // pooling chunks; both stay unchanged until the next begin_batch. `staged`: the ticket of a
  // stage() of this very batch and chunks (unchanged since), whose copy it uses; 0: none.
  virtual BatchRef begin_batch(const RaggedBatch& batch, const WorkspacePlan& plan,
                               const PoolingChunks& chunks, uint64_t staged) = 0;

  // Runs `region`, a stretch of the forward graph from embed() to attention_pool() whose ops
  // and shapes depend only on the batch's sizes (begin_batch's), no download or synchronize
  // inside. The CUDA ops with --cuda-opt-in cuda-graphs capture it into a CUDA graph the second
  // time a batch of the same sizes comes, and replay that graph afterwards instead of
  // enqueueing its kernels one by one (region() is then not called). The default calls it.
  virtual void run_region(const std::function<void()>& region) { region(); }

  // X0_t = LN_emb(W_word[id_t] + W_pos[t])  (input embedding rows instead of W_word[id]).
  virtual void embed(const BatchRef& batch, const void* word_embedding,
                     const void* position_embeddings, const void* ln_gamma, const void* ln_beta,
                     double eps, Mat x) = 0;

  // C (=|+=) A W^T (+ b, act): every Linear of the model.
  virtual void linear(const Mat& a, const WeightRef& w, Mat c, Epilogue epilogue,
                      Activation act = Activation::kGeluErf) = 0;
  // Whether linear() with these operands runs in two steps: a GEMM that stores A W^T, then a
  // pass of its own over C that adds the bias and applies `act` (bias_activation), where the
  // GEMM's epilogue cannot (the CUDA engine: cuBLASLt has no exact-erf GELU or SiLU, and no
  // bias epilogue for unaligned operands). Then linear(a, w, c, epilogue, act) is, bit for bit,
  // linear(a, w, c, Epilogue::kStore, act) followed by bias_activation(c, w.bias, epilogue, act),
  // and the profile times the two apart. False (the default): the GEMM's epilogue does it all.
  virtual bool linear_has_pass(const Mat& /*a*/, const WeightRef& /*w*/, const Mat& /*c*/,
                               Epilogue /*epilogue*/, Activation /*act*/) const {
    return false;
  }
  // C = act(C + b) in place, for `epilogue` kBias (the bias only) or kBiasAct (`bias` null: no
  // bias): the pass of a linear() that has one (linear_has_pass). An Ops without such passes
  // keeps the default, which throws.
  virtual void bias_activation(Mat /*c*/, const void* /*bias*/, Epilogue /*epilogue*/,
                               Activation /*act*/) {
    throw std::logic_error("Ops::bias_activation: this engine's linear() has no pass of its own");
  }

  // a = masked softmax over t of s (per head); pq_h = sum_t a_{t,h} Q_{t,h-slice}.
  // `scores` is [T, H] (already scaled), `q` [T, D]; writes pq [B, D].
  virtual void query_pool(const BatchRef& batch, const Mat& scores, const Mat& q, Mat pq) = 0;

  // r_t = (K_t * pq) Wka'^T + bka';  b = masked softmax over t of r (per head);
  // pk_h = pq_h * sum_t b_{t,h} K_{t,h-slice}. Writes pk [B, D].
  virtual void key_pool(const BatchRef& batch, const Mat& k, const Mat& pq,
                        const WeightRef& key_att, Mat pk) = 0;

  // U_t = pk * Q_t (pk of the token's sequence).
  virtual void mix(const BatchRef& batch, const Mat& q, const Mat& pk, Mat u) = 0;

  // The layer's additive attention: query_pool, key_pool and mix above, in that order, with
  // what each writes (pq, pk, then U over `u`). By default the three calls; an engine whose
  // passes read memory may instead run all three sequence by sequence (attention_in_one_pass),
  // so that a sequence's Q and K are fetched once and read again from its caches.
  virtual void attention(const BatchRef& batch, const Mat& scores, const Mat& q, const Mat& k,
                         const WeightRef& key_att, Mat pq, Mat pk, Mat u) {
    query_pool(batch, scores, q, pq);
    key_pool(batch, k, pq, key_att, pk);
    mix(batch, q, pk, u);
  }
  // Whether attention() is one pass of the engine's own, not the three calls: the profile then
  // times it as one op ("attention"), since its three parts interleave.
  virtual bool attention_in_one_pass() const { return false; }

  // out = LN(c + bias + residual); `out` may alias `residual`.
  virtual void bias_residual_layernorm(const Mat& c, const void* bias, const Mat& residual,
                                       const void* gamma, const void* beta, double eps,
                                       Mat out) = 0;

  // e_t = tanh(E_t) (E = X W1^T + b1, given);  z_t = e_t w2 + b2;  masked stable softmax
  // w_t with the reference's + 1e-8 in the denominator;  pooled = sum_t w_t X_t. Writes [B, D].
  virtual void attention_pool(const BatchRef& batch, const Mat& e, const WeightRef& fc2,
                              const Mat& x, Mat pooled) = 0;

  // The batch's spans (late chunking), after attention_pool, whose token scores kModel reuses:
  // row i of the result is span i of `spans` (plan_span_chunks) pooled over its real tokens,
  // by the softmax of the pooler's scores with the sequence pooling's + 1e-8 (kModel: a span
  // over a whole sequence gives its pooled row, bit for bit) or as their mean (kMean). Returns
  // [spans, D] in the serving dtype, in memory of the ops' own (one per mode, grown on
  // demand), valid until the next begin_batch.
  virtual Mat span_pool(const BatchRef& batch, const PoolingChunks& spans, SpanPooling mode,
                        const Mat& x) = 0;

  // Each row scaled to unit L2 norm (norm clamped below at 1e-12, as F.normalize).
  virtual void l2_normalize(Mat rows) = 0;

  // Copies engine memory back to float32 host rows.
  virtual void download(const Mat& src, float* dst) = 0;
  // Waits until every queued operation is done.
  virtual void synchronize() = 0;

  // Timing for a profile (profiling_ops.h). reserve_timers(n) readies at least n timestamps,
  // keeping those already taken (it may be called within a batch); timestamp(i) takes timestamp i
  // when the queue reaches it (after every op issued before it); after synchronize(), elapsed_ms(i,
  // j) is the time from timestamp i to timestamp j. The CPU ops read the wall clock (their ops are
  // synchronous), the CUDA ops record events on their stream.
  virtual void reserve_timers(int count) = 0;
  virtual void timestamp(int index) = 0;
  virtual double elapsed_ms(int from, int to) = 0;

  // Device memory this ops holds and the device's total (0, 0 for host engines).
  virtual std::pair<size_t, size_t> device_memory() const { return {0, 0}; }
};

}  // namespace fastformer::engine
