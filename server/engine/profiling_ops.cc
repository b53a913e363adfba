#include "server/engine/profiling_ops.h"

#include <algorithm>
#include <string>
#include <utility>

namespace fastformer::engine {
namespace {

// What each op of the graph must move and compute, from the shapes the graph passes it: the
// profile's bytes and FLOPs (fastformer-bench --profile) and the per-token figures of the cost
// model (docs/kernels.md, "Cost model"; tools/cost_model.py writes the same formulas). Bytes:
// every operand read once and every result written once, in the serving dtype (`e` bytes an
// element; float32 host rows at 4; the embedding tables as uploaded, float32 on the CPU
// engine), weights included, and nothing a kernel keeps in between
// (chunk partials, token scores), so bytes / time is the share of bandwidth an op reaches.
// FLOPs: 2 per multiply-add; a LayerNorm 8 per element, an exp or tanh 1.
namespace cost {

using Cost = ProfilingOps::Cost;

double n(int64_t v) { return static_cast<double>(v); }

Cost begin_batch(const RaggedBatch& batch) {  // ids, embedding indices, positions, mask, offsets
  const double T = n(batch.num_tokens()), B = n(batch.num_sequences());
  return {T * (4 + 4 + 4 + 1) + (B + 1) * 4 + n(int64_t(batch.input_embeddings.size())) * 4, 0};
}
// word + position rows in (`p` bytes an element: the tables as uploaded), LN, x out
Cost embed(const BatchRef& b, const Mat& x, size_t e, size_t p) {
  const double T = n(b.num_tokens), D = n(x.cols);
  return {T * (8 + 2 * D * n(p) + D * n(e)) + 2 * D * n(p), 8 * T * D};
}
Cost linear(const Mat& a, const WeightRef& w, Epilogue epilogue, size_t e) {
  const double M = n(a.rows), N = n(w.out), K = n(w.in);
  const bool bias = w.bias && (epilogue == Epilogue::kBias || epilogue == Epilogue::kBiasAct);
  const double c_passes = epilogue == Epilogue::kAccumulate ? 2 : 1;  // C read and written
  return {n(e) * (M * K + N * K + c_passes * M * N + (bias ? N : 0)), 2 * M * N * K};
}
// The pass after a GEMM that stores (Ops::linear_has_pass): C read and written, the bias read;
// the bias add 1 FLOP and the activation 1 (as an exp or tanh) per element.
Cost bias_activation(const Mat& c, const void* bias, Epilogue epilogue, size_t e) {
  const double M = n(c.rows), N = n(c.cols);
  const double per_element = (bias ? 1 : 0) + (epilogue == Epilogue::kBiasAct ? 1 : 0);
  return {n(e) * (2 * M * N + (bias ? N : 0)), per_element * M * N};
}
Cost query_pool(const BatchRef& b, const Mat& scores, const Mat& q, size_t e) {
  const double T = n(b.num_tokens), B = n(b.num_sequences), H = n(scores.cols), D = n(q.cols);
  return {n(e) * (T * H + T * D + B * D), T * (2 * D + 4 * H)};
}
Cost key_pool(const BatchRef& b, const Mat& k, const WeightRef& key_att, size_t e) {
  const double T = n(b.num_tokens), B = n(b.num_sequences), D = n(k.cols);
  const double H = n(key_att.out), W = n(key_att.out * key_att.in);
  // K once, pq in and pk out, the key-attention weights once; scores r_t = (K_t*pq) Wka'^T.
  return {n(e) * (T * D + 2 * B * D + W + H), T * (D + 2 * W + 2 * D + 4 * H)};
}
Cost mix(const BatchRef& b, const Mat& q, size_t e) {
  const double T = n(b.num_tokens), B = n(b.num_sequences), D = n(q.cols);
  return {n(e) * (2 * T * D + B * D), T * D};
}
Cost bias_residual_layernorm(const Mat& c, size_t e) {  // c and residual in, out; bias, gamma, beta
  const double T = n(c.rows), D = n(c.cols);
  return {n(e) * (3 * T * D + 3 * D), 10 * T * D};
}
Cost attention_pool(const BatchRef& b, const Mat& x, size_t e) {  // E and X in, fc2, pooled out
  const double T = n(b.num_tokens), B = n(b.num_sequences), D = n(x.cols);
  return {n(e) * (2 * T * D + D + 1 + B * D), T * (5 * D + 4)};
}
Cost span_pool(const PoolingChunks& spans, const Mat& x, size_t e) {  // span rows of X, out
  double tokens = 0;
  for (int32_t c = 0; c < spans.count(); ++c)
    tokens += n(spans.end[size_t(c)] - spans.begin[size_t(c)]);
  const double S = n(int64_t(spans.first.size()) - 1), D = n(x.cols);
  return {n(e) * (tokens * D + S * D) + tokens * 4, 2 * tokens * D};
}
Cost l2_normalize(const Mat& rows, size_t e) {
  return {n(e) * 2 * n(rows.rows * rows.cols), 3 * n(rows.rows * rows.cols)};
}
Cost download(const Mat& src, size_t e) {  // read in the serving dtype, written as float32
  return {n(src.rows * src.cols) * n(e + 4), 0};
}

}  // namespace cost

// The pass after the GEMM "<x>_gemm": "<x>_bias", then the activation's name where it applies
// one ("ffn_in_bias_gelu" for the exact-erf GELU, the cost model's row; "_gelu_tanh", "_relu",
// "_silu").
std::string pass_name(const std::string& gemm, Epilogue epilogue, Activation act) {
  const std::string suffix = "_gemm";
  std::string name = gemm.empty() ? "gemm" : gemm;
  if (name.size() > suffix.size() && name.ends_with(suffix))
    name.resize(name.size() - suffix.size());
  name += "_bias";
  if (epilogue != Epilogue::kBiasAct) return name;
  switch (act) {
    case Activation::kGeluErf:
      return name + "_gelu";
    case Activation::kGeluTanh:
      return name + "_gelu_tanh";
    case Activation::kRelu:
      return name + "_relu";
    case Activation::kSilu:
      return name + "_silu";
  }
  return name + "_act";
}

}  // namespace

ProfilingOps::ProfilingOps(Ops& inner, std::function<Site(const WeightRef&)> site_of,
                           std::function<std::string(const WeightRef&)> kernel_of)
    : ForwardingOps(inner), site_of_(std::move(site_of)), kernel_of_(std::move(kernel_of)) {}

void ProfilingOps::take_timestamp() {
  const int index = int(issued_.size());
  if (index >= timers_) {  // grown on demand, keeping the timestamps already taken
    timers_ = std::max(64, 2 * index);
    inner_.reserve_timers(timers_);
  }
  inner_.timestamp(index);
}

void ProfilingOps::issue(std::string name, int layer, Cost cost, const WeightRef* weight) {
  take_timestamp();
  issued_.push_back({std::move(name), layer, cost, weight});
}

BatchRef ProfilingOps::begin_batch(const RaggedBatch& batch, const WorkspacePlan& plan,
                                   const PoolingChunks& chunks, uint64_t staged) {
  issued_.clear();
  layer_ = -1;
  last_gemm_.clear();
  normalized_ = false;
  plan_ = plan;
  workspace_ = static_cast<const char*>(inner_.workspace());
  issue("begin_batch", -1, cost::begin_batch(batch));
  return inner_.begin_batch(batch, plan, chunks, staged);
}

void ProfilingOps::embed(const BatchRef& batch, const void* word_embedding,
                         const void* position_embeddings, const void* ln_gamma, const void* ln_beta,
                         double eps, Mat x) {
  issue("embed", layer_, cost::embed(batch, x, element_size(), uploaded_element_size()));
  inner_.embed(batch, word_embedding, position_embeddings, ln_gamma, ln_beta, eps, x);
}

void ProfilingOps::linear(const Mat& a, const WeightRef& w, Mat c, Epilogue epilogue,
                          Activation act) {
  const Site site = site_of_(w);
  layer_ = site.layer;
  last_gemm_ = site.name;
  if (!inner_.linear_has_pass(a, w, c, epilogue, act)) {  // the GEMM's epilogue does it all
    issue(site.name, layer_, cost::linear(a, w, epilogue, element_size()), &w);
    inner_.linear(a, w, c, epilogue, act);
    return;
  }
  // The inner linear's two steps, issued one by one: the GEMM alone (a store), then its pass.
  issue(site.name, layer_, cost::linear(a, w, Epilogue::kStore, element_size()), &w);
  inner_.linear(a, w, c, Epilogue::kStore, act);
  bias_activation(c, w.bias, epilogue, act);
}

void ProfilingOps::bias_activation(Mat c, const void* bias, Epilogue epilogue, Activation act) {
  issue(pass_name(last_gemm_, epilogue, act), layer_,
        cost::bias_activation(c, bias, epilogue, element_size()));
  inner_.bias_activation(c, bias, epilogue, act);
}

void ProfilingOps::query_pool(const BatchRef& batch, const Mat& scores, const Mat& q, Mat pq) {
  issue("query_pool", layer_, cost::query_pool(batch, scores, q, element_size()));
  inner_.query_pool(batch, scores, q, pq);
}

void ProfilingOps::key_pool(const BatchRef& batch, const Mat& k, const Mat& pq,
                            const WeightRef& key_att, Mat pk) {
  issue("key_pool", layer_, cost::key_pool(batch, k, key_att, element_size()));
  inner_.key_pool(batch, k, pq, key_att, pk);
}

void ProfilingOps::mix(const BatchRef& batch, const Mat& q, const Mat& pk, Mat u) {
  issue("mix", layer_, cost::mix(batch, q, element_size()));
  inner_.mix(batch, q, pk, u);
}

void ProfilingOps::attention(const BatchRef& batch, const Mat& scores, const Mat& q, const Mat& k,
                             const WeightRef& key_att, Mat pq, Mat pk, Mat u) {
  if (!inner_.attention_in_one_pass()) {  // the three calls, each timed
    Ops::attention(batch, scores, q, k, key_att, pq, pk, u);
    return;
  }
  const size_t e = element_size();
  const Cost parts[] = {cost::query_pool(batch, scores, q, e), cost::key_pool(batch, k, key_att, e),
                        cost::mix(batch, q, e)};
  Cost sum;
  for (const Cost& part : parts) sum.bytes += part.bytes, sum.flops += part.flops;
  issue("attention", layer_, sum);
  inner_.attention(batch, scores, q, k, key_att, pq, pk, u);
}

void ProfilingOps::bias_residual_layernorm(const Mat& c, const void* bias, const Mat& residual,
                                           const void* gamma, const void* beta, double eps,
                                           Mat out) {
  // The LayerNorm after "<x>_out_gemm" is "<x>_ln" (attn_ln, ffn_ln).
  const std::string suffix = "_out_gemm";
  std::string name = "layernorm";
  if (last_gemm_.size() > suffix.size() && last_gemm_.ends_with(suffix))
    name = last_gemm_.substr(0, last_gemm_.size() - suffix.size()) + "_ln";
  issue(std::move(name), layer_, cost::bias_residual_layernorm(c, element_size()));
  inner_.bias_residual_layernorm(c, bias, residual, gamma, beta, eps, out);
}

void ProfilingOps::attention_pool(const BatchRef& batch, const Mat& e, const WeightRef& fc2,
                                  const Mat& x, Mat pooled) {
  issue("attention_pool", layer_, cost::attention_pool(batch, x, element_size()));
  inner_.attention_pool(batch, e, fc2, x, pooled);
}

Mat ProfilingOps::span_pool(const BatchRef& batch, const PoolingChunks& spans, SpanPooling mode,
                            const Mat& x) {
  issue(mode == SpanPooling::kModel ? "span_pool_model" : "span_pool_mean", layer_,
        cost::span_pool(spans, x, element_size()));
  return inner_.span_pool(batch, spans, mode, x);
}

void ProfilingOps::l2_normalize(Mat rows) {
  issue("l2_normalize", layer_, cost::l2_normalize(rows, element_size()));
  inner_.l2_normalize(rows);
  normalized_ = true;
}

void ProfilingOps::download(const Mat& src, float* dst) {
  // Named by the buffer it reads: the logits, the pooled rows (normalized or not), the tokens.
  const char* at = static_cast<const char*>(src.data);
  const std::string name = at == workspace_ + plan_.logits.offset ? "download_logits"
                           : at == workspace_ + plan_.pooled.offset
                               ? (normalized_ ? "download_normalized" : "download_pooled")
                           : at == workspace_ + plan_.x.offset ? "download_tokens"
                                                               : "download";
  issue(name, layer_, cost::download(src, element_size()));
  inner_.download(src, dst);
}

void ProfilingOps::synchronize() {
  if (issued_.empty()) {  // outside a batch: nothing to time
    inner_.synchronize();
    return;
  }
  take_timestamp();  // closes the last call, before the batch's synchronize
  inner_.synchronize();
  for (size_t i = 0; i < issued_.size(); ++i) {
    const Issued& op = issued_[i];
    auto [it, added] = index_.try_emplace({op.name, op.layer}, rows_.size());
    if (added) rows_.push_back(OpProfile{op.name, op.layer, 0, 0, 0, 0, {}});
    OpProfile& row = rows_[it->second];
    row.calls += 1;
    row.ms += inner_.elapsed_ms(int(i), int(i + 1));
    row.bytes += op.cost.bytes;
    row.flops += op.cost.flops;
    if (op.weight != nullptr && row.kernel.empty()) row.kernel = kernel_of_(*op.weight);
  }
  issued_.clear();
}

std::vector<OpProfile> ProfilingOps::rows() const {
  std::vector<OpProfile> out = rows_;
  for (OpProfile& row : out) {
    for (double* v : {&row.calls, &row.ms, &row.bytes, &row.flops})
      *v /= double(std::max(batches_, 1));
  }
  return out;
}

}  // namespace fastformer::engine
