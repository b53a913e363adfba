// An Ops that passes every call to another: the base of the ops that watch the graph's calls on
// their way through (the profile, profiling_ops.h; the tests' recorders), each overriding only
// the calls it watches.
#pragma once

#include <cstddef>
#include <span>
#include <utility>

#include "server/engine/ops.h"

namespace fastformer::engine {

class ForwardingOps : public Ops {
 public:
  explicit ForwardingOps(Ops& inner) : inner_(inner) {}

  size_t element_size() const override { return inner_.element_size(); }
  size_t uploaded_element_size() const override { return inner_.uploaded_element_size(); }
  const void* upload(std::span<const float> host) override { return inner_.upload(host); }
  void reserve(const WorkspacePlan& largest) override { inner_.reserve(largest); }
  void prefault(size_t bytes) override { inner_.prefault(bytes); }
  void* workspace() override { return inner_.workspace(); }
  // Not forwarded: a wrapper's own work between the ops (the profile's events) would be
  // captured into the inner ops' graph. The region runs op by op.
  void run_region(const std::function<void()>& region) override { region(); }
  uint64_t stage(const RaggedBatch& batch, const PoolingChunks& chunks) override {
    return inner_.stage(batch, chunks);
  }
  BatchRef begin_batch(const RaggedBatch& batch, const WorkspacePlan& plan,
                       const PoolingChunks& chunks, uint64_t staged) override {
    return inner_.begin_batch(batch, plan, chunks, staged);
  }
  void embed(const BatchRef& batch, const void* word_embedding, const void* position_embeddings,
             const void* ln_gamma, const void* ln_beta, double eps, Mat x) override {
    inner_.embed(batch, word_embedding, position_embeddings, ln_gamma, ln_beta, eps, x);
  }
  void linear(const Mat& a, const WeightRef& w, Mat c, Epilogue epilogue, Activation act) override {
    inner_.linear(a, w, c, epilogue, act);
  }
  bool linear_has_pass(const Mat& a, const WeightRef& w, const Mat& c, Epilogue epilogue,
                       Activation act) const override {
    return inner_.linear_has_pass(a, w, c, epilogue, act);
  }
  void bias_activation(Mat c, const void* bias, Epilogue epilogue, Activation act) override {
    inner_.bias_activation(c, bias, epilogue, act);
  }
  void query_pool(const BatchRef& batch, const Mat& scores, const Mat& q, Mat pq) override {
    inner_.query_pool(batch, scores, q, pq);
  }
  void key_pool(const BatchRef& batch, const Mat& k, const Mat& pq, const WeightRef& key_att,
                Mat pk) override {
    inner_.key_pool(batch, k, pq, key_att, pk);
  }
  void mix(const BatchRef& batch, const Mat& q, const Mat& pk, Mat u) override {
    inner_.mix(batch, q, pk, u);
  }
  void attention(const BatchRef& batch, const Mat& scores, const Mat& q, const Mat& k,
                 const WeightRef& key_att, Mat pq, Mat pk, Mat u) override {
    inner_.attention(batch, scores, q, k, key_att, pq, pk, u);
  }
  bool attention_in_one_pass() const override { return inner_.attention_in_one_pass(); }
  void bias_residual_layernorm(const Mat& c, const void* bias, const Mat& residual,
                               const void* gamma, const void* beta, double eps, Mat out) override {
    inner_.bias_residual_layernorm(c, bias, residual, gamma, beta, eps, out);
  }
  void attention_pool(const BatchRef& batch, const Mat& e, const WeightRef& fc2, const Mat& x,
                      Mat pooled) override {
    inner_.attention_pool(batch, e, fc2, x, pooled);
  }
  Mat span_pool(const BatchRef& batch, const PoolingChunks& spans, SpanPooling mode,
                const Mat& x) override {
    return inner_.span_pool(batch, spans, mode, x);
  }
  void l2_normalize(Mat rows) override { inner_.l2_normalize(rows); }
  void download(const Mat& src, float* dst) override { inner_.download(src, dst); }
  void synchronize() override { inner_.synchronize(); }
  void reserve_timers(int count) override { inner_.reserve_timers(count); }
  void timestamp(int index) override { inner_.timestamp(index); }
  double elapsed_ms(int from, int to) override { return inner_.elapsed_ms(from, to); }
  std::pair<size_t, size_t> device_memory() const override { return inner_.device_memory(); }

 protected:
  Ops& inner_;
};

}  // namespace fastformer::engine
