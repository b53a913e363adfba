// The CPU implementation of Ops: float32, GEMMs through OpenBLAS, element-wise and
// reduction passes fused per row and spread over a thread pool. It is also the oracle
// every CUDA kernel is tested against.
#pragma once

#include <cstddef>
#include <memory>
#include <new>

#include "server/engine/cpu/thread_pool.h"
#include "server/engine/ops.h"

namespace fastformer::engine {

class CpuOps final : public Ops {
 public:
  // `threads` workers share every pass.
  CpuOps(int threads, const ModelConfig& config);

  size_t element_size() const override { return sizeof(float); }
  const void* upload(std::span<const float> host) override;
  void reserve(const WorkspacePlan& largest) override;
  void* workspace() override { return arena_.get(); }
  BatchRef begin_batch(const RaggedBatch& batch, const WorkspacePlan& plan,
                       const PoolingChunks& chunks) override;
  void embed(const BatchRef& batch, const void* word_embedding, const void* position_embeddings,
             const void* ln_gamma, const void* ln_beta, double eps, Mat x) override;
  void linear(const Mat& a, const WeightRef& w, Mat c, Epilogue epilogue, Activation act) override;
  void query_pool(const BatchRef& batch, const Mat& scores, const Mat& q, Mat pq) override;
  void key_pool(const BatchRef& batch, const Mat& k, const Mat& pq, const WeightRef& key_att,
                Mat pk) override;
  void mix(const BatchRef& batch, const Mat& q, const Mat& pk, Mat u) override;
  void bias_residual_layernorm(const Mat& c, const void* bias, const Mat& residual, const void* gamma,
                               const void* beta, double eps, Mat out) override;
  void attention_pool(const BatchRef& batch, const Mat& e, const WeightRef& fc2, const Mat& x,
                      Mat pooled) override;
  void l2_normalize(Mat rows) override;
  void download(const Mat& src, float* dst) override;
  void synchronize() override {}

 private:
  // Online-softmax partials of every chunk, per head: running max m [chunks, H], sum l
  // [chunks, H], and the weighted value vector v [chunks, D] (head h owns columns
  // h*d .. h*d+d-1), at the plan's offsets in the workspace.
  struct Partials {
    float *m = nullptr, *l = nullptr, *v = nullptr;
  };
  // Scores are per (token, head) in `scores` ([T, heads], ld heads); values [T, D].
  void pool_chunks(int64_t heads, const float* scores, int64_t score_ld, const Mat& values);
  // Combines chunk partials into one row per sequence: out_b = v / (L + extra * exp(-M)).
  void combine(int64_t heads, Mat out, const float* scale_by, float denominator_extra);

  const ModelConfig config_;
  ThreadPool pool_;
  // The workspace, sized at start-up, kWorkspaceAlignment-aligned.
  struct AlignedDelete {
    void operator()(std::byte* p) const { ::operator delete(p, std::align_val_t{kWorkspaceAlignment}); }
  };
  std::unique_ptr<std::byte, AlignedDelete> arena_;

  // The current batch, as begin_batch received it.
  const RaggedBatch* batch_ = nullptr;
  const PoolingChunks* chunks_ = nullptr;
  Partials partials_;
  float* token_scores_ = nullptr;  // [T, H] key scores r, or [T] pooler scores z
};

}  // namespace fastformer::engine
