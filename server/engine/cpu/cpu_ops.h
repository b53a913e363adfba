// The CPU implementation of Ops: float32 activations, GEMMs through oneDNN (float32, or
// bfloat16 weights and inputs with float32 accumulation), element-wise and reduction passes
// fused per row and spread over a thread pool. In float32 it is also the oracle every CUDA
// kernel is tested against.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <new>
#include <vector>

#include "server/engine/cpu/onednn_gemm.h"
#include "server/engine/cpu/thread_pool.h"
#include "server/engine/ops.h"

namespace fastformer::engine {

class CpuOps final : public Ops {
 public:
  // `threads` workers share every pass. With `bf16` the GEMMs take bfloat16 weights and
  // inputs (the caller checks cpu_gemm_info().has_bf16 first); everything else is float32.
  CpuOps(int threads, const ModelConfig& config, bool bf16 = false);

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
  // The wall clock: every op has finished when its call returns.
  void reserve_timers(int count) override { timers_.assign(size_t(count), {}); }
  void timestamp(int index) override { timers_.at(size_t(index)) = std::chrono::steady_clock::now(); }
  double elapsed_ms(int from, int to) override {
    return std::chrono::duration<double, std::milli>(timers_.at(size_t(to)) - timers_.at(size_t(from))).count();
  }
  SpeedCheck speed_check() override;

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

  // The primitive for `shape`, created on first use (load and warm-up), then reused.
  const CpuMatmul& matmul(const CpuMatmul::Shape& shape);
  // The weights as the GEMMs take them: the float32 array itself, or its bfloat16 copy
  // (made on first use).
  const void* gemm_weights(const WeightRef& w);

  const ModelConfig config_;
  const bool bf16_;
  ThreadPool pool_;
  std::map<CpuMatmul::Shape, std::unique_ptr<CpuMatmul>> matmuls_;
  std::map<const void*, std::vector<uint16_t>> bf16_weights_;
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
  std::vector<std::chrono::steady_clock::time_point> timers_;  // the profile's timestamps
};

}  // namespace fastformer::engine
