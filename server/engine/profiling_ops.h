// The forward graph's profile (Engine::set_profiling, fastformer-bench --profile): an Ops that
// wraps the serving ops. Before each call it takes a timestamp on their queue, and one more at
// the batch's synchronize, so the calls' times add up to the batch's; it charges each call the
// bytes and FLOPs that its formula (profiling_ops.cc) gives from the shapes the call was
// handed. The graph (forward.cc) runs over it unchanged and knows nothing of it.
//
// Rows are keyed by (name, layer), in the order the graph first issues them. A GEMM is named
// by its site (the graph's name for the weight, ForwardEngine::gemm_sites); the LayerNorm that
// follows "<x>_out_gemm" is "<x>_ln"; a download is named by the buffer it reads. Other ops
// take the name of their call and the layer of the GEMM before them (-1 outside the layers).
// A linear() whose bias and activation the inner ops run as a pass of their own after the GEMM
// (Ops::linear_has_pass: the CUDA engine's exact-erf GELU and SiLU) is two rows: "<x>_gemm",
// the GEMM alone (a store: A and W read, C written), then "<x>_bias" with the activation's name
// ("ffn_in_bias_gelu", "<x>_bias_gelu_tanh", "<x>_bias_relu", "<x>_bias_silu"), the pass (C
// read and written, the bias read). Where the GEMM's epilogue does it all, one row, "<x>_gemm".
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "server/engine/engine.h"  // OpProfile
#include "server/engine/forwarding_ops.h"

namespace fastformer::engine {

class ProfilingOps final : public ForwardingOps {
 public:
  // A GEMM's site: the graph's name for its weight and the layer (-1 outside the layers).
  struct Site {
    const char* name;
    int layer;
  };
  ProfilingOps(Ops& inner, std::function<Site(const WeightRef&)> site_of,
               std::function<std::string(const WeightRef&)> kernel_of);

  // Per batch, averaged over the batches profiled so far (end_batch() counts them; a batch
  // run in passes, workspace.h, is one batch of several passes).
  std::vector<OpProfile> rows() const;
  void end_batch() { ++batches_; }

  BatchRef begin_batch(const RaggedBatch& batch, const WorkspacePlan& plan,
                       const PoolingChunks& chunks, uint64_t staged) override;
  void embed(const BatchRef& batch, const void* word_embedding, const void* position_embeddings,
             const void* ln_gamma, const void* ln_beta, double eps, Mat x) override;
  // One row, the GEMM's; or two where the inner ops have a pass after it (linear_has_pass).
  void linear(const Mat& a, const WeightRef& w, Mat c, Epilogue epilogue, Activation act) override;
  // The pass's row, named after the GEMM before it.
  void bias_activation(Mat c, const void* bias, Epilogue epilogue, Activation act) override;
  void query_pool(const BatchRef& batch, const Mat& scores, const Mat& q, Mat pq) override;
  void key_pool(const BatchRef& batch, const Mat& k, const Mat& pq, const WeightRef& key_att,
                Mat pk) override;
  void mix(const BatchRef& batch, const Mat& q, const Mat& pk, Mat u) override;
  // One row, "attention", where the inner ops run it in one pass; else its three calls' rows.
  void attention(const BatchRef& batch, const Mat& scores, const Mat& q, const Mat& k,
                 const WeightRef& key_att, Mat pq, Mat pk, Mat u) override;
  void bias_residual_layernorm(const Mat& c, const void* bias, const Mat& residual,
                               const void* gamma, const void* beta, double eps, Mat out) override;
  void attention_pool(const BatchRef& batch, const Mat& e, const WeightRef& fc2, const Mat& x,
                      Mat pooled) override;
  Mat span_pool(const BatchRef& batch, const PoolingChunks& spans, SpanPooling mode,
                const Mat& x) override;
  void l2_normalize(Mat rows) override;
  void download(const Mat& src, float* dst) override;
  // The closing timestamp, the inner synchronize, then the pass's calls added to the rows.
  void synchronize() override;

  // What one call must move and compute.
  struct Cost {
    double bytes = 0, flops = 0;
  };

 private:
  // A timestamp now, and the call it opens.
  void issue(std::string name, int layer, Cost cost, const WeightRef* weight = nullptr);
  void take_timestamp();

  struct Issued {
    std::string name;
    int layer;
    Cost cost;
    const WeightRef* weight;  // a GEMM's, for its kernel's name
  };
  std::function<Site(const WeightRef&)> site_of_;
  std::function<std::string(const WeightRef&)> kernel_of_;
  int timers_ = 0;              // timestamps the inner ops hold; grown on demand
  std::vector<Issued> issued_;  // this batch's calls
  int layer_ = -1;              // the layer of the last GEMM
  std::string last_gemm_;       // its site name
  const char* workspace_ = nullptr;
  WorkspacePlan plan_;       // this batch's, to name the downloads
  bool normalized_ = false;  // the pooled rows were normalized in this batch
  std::vector<OpProfile> rows_;
  std::map<std::pair<std::string, int>, size_t> index_;
  int batches_ = 0;
};

}  // namespace fastformer::engine
