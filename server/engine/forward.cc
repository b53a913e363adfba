#include "server/engine/forward.h"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kernels/pooling_chunks.h"
#include "server/engine/error.h"

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

namespace {

// The ops report failures of the layer below them as std::runtime_error (the CUDA ops: the
// CUDA runtime's, through ff_check in kernels/runtime.h); an Engine reports EngineError.
// Call inside a catch block.
[[noreturn]] void rethrow_as_engine_error() {
  try {
    throw;
  } catch (const EngineError&) {
    throw;
  } catch (const ModelError&) {
    throw;
  } catch (const std::runtime_error& e) {
    throw EngineError(e.what());
  }
}

// What each op of the graph must move and compute, from the shapes the graph passes it: the
// profile's bytes and FLOPs (fastformer-bench --profile) and the per-token figures of the cost
// model (docs/kernels.md, "Cost model"; tools/cost_model.py writes the same formulas). Bytes:
// every operand read once and every result written once, in the serving dtype (`e` bytes an
// element; float32 host rows at 4), weights included, and nothing a kernel keeps in between
// (chunk partials, token scores), so bytes / time is the share of bandwidth an op reaches.
// FLOPs: 2 per multiply-add; a LayerNorm 8 per element, an exp or tanh 1.
namespace cost {

struct Cost {
  double bytes = 0, flops = 0;
};

double n(int64_t v) { return static_cast<double>(v); }

Cost begin_batch(const RaggedBatch& batch) {  // ids, embedding indices, positions, mask, offsets
  const double T = n(batch.num_tokens()), B = n(batch.num_sequences());
  return {T * (4 + 4 + 4 + 1) + (B + 1) * 4 + n(int64_t(batch.input_embeddings.size())) * 4, 0};
}
Cost embed(const BatchRef& b, const Mat& x, size_t e) {  // word + position rows in, LN, x out
  const double T = n(b.num_tokens), D = n(x.cols);
  return {T * (8 + 3 * D * n(e)) + 2 * D * n(e), 8 * T * D};
}
Cost linear(const Mat& a, const WeightRef& w, Epilogue epilogue, size_t e) {
  const double M = n(a.rows), N = n(w.out), K = n(w.in);
  const bool bias = w.bias && (epilogue == Epilogue::kBias || epilogue == Epilogue::kBiasAct);
  const double c_passes = epilogue == Epilogue::kAccumulate ? 2 : 1;  // C read and written
  return {n(e) * (M * K + N * K + c_passes * M * N + (bias ? N : 0)), 2 * M * N * K};
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
Cost l2_normalize(const Mat& rows, size_t e) {
  return {n(e) * 2 * n(rows.rows * rows.cols), 3 * n(rows.rows * rows.cols)};
}
Cost download(const Mat& src, size_t e) {  // read in the serving dtype, written as float32
  return {n(src.rows * src.cols) * n(e + 4), 0};
}

}  // namespace cost

}  // namespace

// Times the ops of each batch (set_profiling): before each op a timestamp on the ops' queue
// and one after the last, read after the batch's synchronize, so the ops' times add up to the
// batch's. Rows are keyed by (name, layer), in the order the graph first issues them.
class ForwardEngine::Profiler {
 public:
  Profiler(Ops& ops, int timers) : ops_(ops), timers_(timers) { ops_.reserve_timers(timers); }

  void start_batch() { issued_.clear(); }
  void begin(const char* name, int layer, cost::Cost cost, const WeightRef* weight) {
    timestamp();
    issued_.push_back({name, layer, cost, weight});
  }
  void end_batch() { timestamp(); }  // before the batch's synchronize
  void collect() {                   // after it
    for (size_t i = 0; i < issued_.size(); ++i) {
      const Issued& op = issued_[i];
      auto [it, added] = index_.try_emplace({op.name, op.layer}, rows_.size());
      if (added) rows_.push_back(OpProfile{op.name, op.layer, 0, 0, 0, 0, {}});
      OpProfile& row = rows_[it->second];
      row.calls += 1;
      row.ms += ops_.elapsed_ms(int(i), int(i + 1));
      row.bytes += op.cost.bytes;
      row.flops += op.cost.flops;
      if (op.weight != nullptr && row.kernel.empty()) row.kernel = ops_.gemm_kernel(*op.weight);
    }
    ++batches_;
  }
  std::vector<OpProfile> rows() const {  // per batch
    std::vector<OpProfile> out = rows_;
    for (OpProfile& row : out) {
      for (double* v : {&row.calls, &row.ms, &row.bytes, &row.flops})
        *v /= double(std::max(batches_, 1));
    }
    return out;
  }

 private:
  struct Issued {
    const char* name;
    int layer;
    cost::Cost cost;
    const WeightRef* weight;  // a GEMM's, for its kernel's name
  };
  void timestamp() {
    const int index = int(issued_.size());
    if (index >= timers_)
      throw std::logic_error("profile: more ops in a batch than timers reserved");
    ops_.timestamp(index);
  }

  Ops& ops_;
  const int timers_;
  std::vector<Issued> issued_;
  std::vector<OpProfile> rows_;
  std::map<std::pair<std::string, int>, size_t> index_;
  int batches_ = 0;
};

ForwardEngine::~ForwardEngine() = default;

void ForwardEngine::set_profiling(bool on) {
  profiler_.reset();
  // A batch issues 10 ops per layer and at most 10 others (run() below), and the closing timestamp.
  if (on) profiler_ = std::make_unique<Profiler>(*ops_, 10 * int(layers_.size()) + 11);
}

std::vector<OpProfile> ForwardEngine::profile() const {
  return profiler_ ? profiler_->rows() : std::vector<OpProfile>{};
}

ForwardEngine::ForwardEngine(std::shared_ptr<const Model> model, std::unique_ptr<Ops> ops,
                             int64_t max_batch_tokens, std::string backend, std::string device) try
    : model_(std::move(model)),
      prepared_(prepare_weights(*model_)),
      ops_(std::move(ops)),
      max_batch_tokens_(max_batch_tokens),
      backend_(std::move(backend)),
      device_(std::move(device)) {
  const ModelConfig& c = model_->config();
  const ModelWeights& w = model_->weights();
  const int64_t D = c.hidden_size;
  if (w.word_embedding)
    word_embedding_ = ops_->upload({w.word_embedding, size_t(c.vocab_size * D)});
  position_embeddings_ =
      ops_->upload({w.position_embeddings, size_t(c.max_position_embeddings * D)});
  embedding_ln_gamma_ = ops_->upload({w.embedding_layernorm.gamma, size_t(D)});
  embedding_ln_beta_ = ops_->upload({w.embedding_layernorm.beta, size_t(D)});

  const PreparedWeights& prepared = prepared_;
  std::map<const PreparedLayer*, LayerRefs> uploaded;  // shared layers are uploaded once
  for (const auto& layer : prepared.layers) {
    auto it = uploaded.find(layer.get());
    if (it == uploaded.end()) {
      LayerRefs r;
      r.query_key_scores = upload(layer->query_key_scores);
      r.key_att = upload(layer->key_att);
      r.transform = upload(layer->transform);
      r.attention_output = upload(layer->attention_output);
      r.intermediate = upload(layer->intermediate);
      r.output = upload(layer->output);
      r.ln1_gamma = ops_->upload(layer->ln1_gamma);
      r.ln1_beta = ops_->upload(layer->ln1_beta);
      r.ln2_gamma = ops_->upload(layer->ln2_gamma);
      r.ln2_beta = ops_->upload(layer->ln2_beta);
      it = uploaded.emplace(layer.get(), r).first;
    }
    layers_.push_back(it->second);
  }
  pooler_fc1_ = upload(prepared.pooler_fc1);
  pooler_fc2_ = upload(prepared.pooler_fc2);
  if (prepared.classifier.out > 0) classifier_ = upload(prepared.classifier);
  // The largest batch: max_batch_tokens one-token sequences bound every buffer at once.
  const WorkspacePlan largest = plan_workspace(c, model_->num_labels(), max_batch_tokens_,
                                               max_batch_tokens_, ops_->element_size());
  ops_->reserve(largest);
  reserved_bytes_ = largest.bytes;
} catch (...) {
  rethrow_as_engine_error();
}

std::vector<std::string> ForwardEngine::gemm_report() const {
  // One line per site name (the layers' sites share one), in the order the graph ran them.
  struct Line {
    std::string shape;
    std::vector<std::string> kernels;
    int weights = 0;
  };
  std::vector<std::string> order;
  std::map<std::string, Line> lines;
  for (const GemmSite& site : gemm_sites_) {
    auto [it, added] = lines.try_emplace(site.name);
    if (added) {
      order.push_back(site.name);
      it->second.shape = "[M, " + std::to_string(site.weight->in) + "] x [" +
                         std::to_string(site.weight->out) + ", " + std::to_string(site.weight->in) +
                         "]^T";
    }
    Line& line = it->second;
    ++line.weights;
    std::string kernel = ops_->gemm_kernel(*site.weight);
    if (kernel.empty()) kernel = "kernel not reported";
    if (std::find(line.kernels.begin(), line.kernels.end(), kernel) == line.kernels.end())
      line.kernels.push_back(kernel);
  }
  std::vector<std::string> out;
  for (const std::string& name : order) {
    const Line& line = lines[name];
    std::string kernels;
    for (const std::string& k : line.kernels) kernels += (kernels.empty() ? "" : " | ") + k;
    out.push_back(name + " " + line.shape + " x" + std::to_string(line.weights) + ": " + kernels);
  }
  return out;
}

WeightRef ForwardEngine::upload(const PreparedLinear& linear) {
  WeightRef r;
  r.out = linear.out;
  r.in = linear.in;
  r.weight = ops_->upload(linear.weight);
  if (!linear.bias.empty()) r.bias = ops_->upload(linear.bias);
  return r;
}

std::vector<EncodedSequence> ForwardEngine::encode(const RaggedBatch& batch,
                                                   std::span<const OutputOptions> options) {
  try {
    return run(batch, options);
  } catch (...) {
    rethrow_as_engine_error();
  }
}

std::vector<EncodedSequence> ForwardEngine::run(const RaggedBatch& batch,
                                                std::span<const OutputOptions> options) {
  const ModelConfig& c = model_->config();
  const int64_t T = batch.num_tokens();
  const int32_t B = batch.num_sequences();
  if (B == 0) return {};
  if (T > max_batch_tokens_) {
    throw EngineError("batch of " + std::to_string(T) + " tokens exceeds max_batch_tokens " +
                      std::to_string(max_batch_tokens_));
  }
  if (options.size() != 1 && options.size() != static_cast<size_t>(B)) {
    throw EngineError("encode: expected 1 or " + std::to_string(B) + " output options, got " +
                      std::to_string(options.size()));
  }
  auto option = [&](int32_t b) -> const OutputOptions& {
    return options[options.size() == 1 ? 0 : b];
  };

  const int64_t D = c.hidden_size, H = c.num_attention_heads;
  Ops& ops = *ops_;
  const size_t elem = ops.element_size();
  const WorkspacePlan plan = plan_workspace(c, model_->num_labels(), T, B, elem);
  // The plan bounds B <= T (a sequence has at least one token); a batch outside what was
  // reserved is an error here, never a write past the workspace.
  if (B > T || plan.bytes > reserved_bytes_) {
    throw EngineError("batch of " + std::to_string(B) + " sequences and " + std::to_string(T) +
                      " tokens does not fit the workspace (every sequence needs a token)");
  }
  char* const workspace = static_cast<char*>(ops.workspace());
  auto mat = [&](const WorkspacePlan::Buffer& buffer) {
    return Mat{workspace + buffer.offset, buffer.rows, buffer.cols, buffer.ld};
  };

  // The profile hook: a null check per op while profiling is off; costs are computed only when on.
  auto op = [&](const char* name, int layer, auto cost, const WeightRef* weight = nullptr) {
    if (profiler_) profiler_->begin(name, layer, cost(), weight);
  };
  if (profiler_) profiler_->start_batch();
  // Every Linear: its profile hook, its site (first seen), the op.
  auto gemm = [&](const char* name, int layer, const Mat& a, const WeightRef& w, Mat out,
                  Epilogue epilogue, Activation act = Activation::kGeluErf) {
    op(
        name, layer, [&] { return cost::linear(a, w, epilogue, elem); }, &w);
    if (site_keys_.insert({name, w.weight}).second) {
      gemm_sites_.push_back(GemmSite{name, &w, a.ld, out.ld, epilogue, act});
    }
    ops.linear(a, w, out, epilogue, act);
  };

  plan_chunks(batch, chunks_);
  op("begin_batch", -1, [&] { return cost::begin_batch(batch); });
  const BatchRef ref = ops.begin_batch(batch, plan, chunks_);
  Mat x = mat(plan.x), qks = mat(plan.qks), y = mat(plan.y), h = mat(plan.h);
  Mat pq = mat(plan.pq), pk = mat(plan.pk), pooled = mat(plan.pooled);
  const Mat q = columns(qks, 0, D, elem), k = columns(qks, D, D, elem);
  const Mat s = columns(qks, 2 * D, H, elem);

  op("embed", -1, [&] { return cost::embed(ref, x, elem); });
  ops.embed(ref, word_embedding_, position_embeddings_, embedding_ln_gamma_, embedding_ln_beta_,
            c.layer_norm_eps, x);
  for (size_t i = 0; i < layers_.size(); ++i) {
    const LayerRefs& l = layers_[i];
    const int n = int(i);
    gemm("qks_gemm", n, x, l.query_key_scores, qks, Epilogue::kBias);  // Q, K, s
    op("query_pool", n, [&] { return cost::query_pool(ref, s, q, elem); });
    ops.query_pool(ref, s, q, pq);  // pq
    op("key_pool", n, [&] { return cost::key_pool(ref, k, l.key_att, elem); });
    ops.key_pool(ref, k, pq, l.key_att, pk);  // pk
    op("mix", n, [&] { return cost::mix(ref, q, elem); });
    ops.mix(ref, q, pk, k);                                                // U = pk * Q, over K
    gemm("transform_gemm", n, k, l.transform, q, Epilogue::kAccumulate);   // A = Q + U Wt^T
    gemm("attn_out_gemm", n, q, l.attention_output, y, Epilogue::kStore);  // A Wo^T
    op("attn_ln", n, [&] { return cost::bias_residual_layernorm(y, elem); });
    ops.bias_residual_layernorm(y, l.attention_output.bias, x, l.ln1_gamma, l.ln1_beta,
                                c.layer_norm_eps, x);  // X1
    gemm("ffn_in_gemm", n, x, l.intermediate, h, Epilogue::kBiasAct,
         c.hidden_act);  // act(X1 Wi^T + bi)
    gemm("ffn_out_gemm", n, h, l.output, y, Epilogue::kStore);
    op("ffn_ln", n, [&] { return cost::bias_residual_layernorm(y, elem); });
    ops.bias_residual_layernorm(y, l.output.bias, x, l.ln2_gamma, l.ln2_beta, c.layer_norm_eps,
                                x);  // X'
  }
  gemm("pooler_fc1_gemm", -1, x, pooler_fc1_, y, Epilogue::kBias);
  op("attention_pool", -1, [&] { return cost::attention_pool(ref, x, elem); });
  ops.attention_pool(ref, y, pooler_fc2_, x, pooled);

  std::vector<EncodedSequence> out(static_cast<size_t>(B));
  bool any_logits = false, any_normalize = false;
  for (int32_t b = 0; b < B; ++b) {
    any_logits |= option(b).logits && classifier_.out > 0;
    any_normalize |= option(b).normalize;
  }
  std::vector<float> logits_host;
  if (any_logits) {
    const Mat logits = mat(plan.logits);
    gemm("classifier_gemm", -1, pooled, classifier_, logits, Epilogue::kBias);
    logits_host.resize(size_t(B * classifier_.out));
    op("download_logits", -1, [&] { return cost::download(logits, elem); });
    ops.download(logits, logits_host.data());
  }
  std::vector<float> pooled_host(size_t(B * D)), normalized_host;
  op("download_pooled", -1, [&] { return cost::download(pooled, elem); });
  ops.download(pooled, pooled_host.data());
  if (any_normalize) {
    op("l2_normalize", -1, [&] { return cost::l2_normalize(pooled, elem); });
    ops.l2_normalize(pooled);
    normalized_host.resize(pooled_host.size());
    op("download_normalized", -1, [&] { return cost::download(pooled, elem); });
    ops.download(pooled, normalized_host.data());
  }
  std::vector<float> tokens_host;
  bool any_tokens = false;
  for (int32_t b = 0; b < B; ++b) any_tokens |= option(b).token_embeddings;
  if (any_tokens) {
    tokens_host.resize(size_t(T * D));
    op("download_tokens", -1, [&] { return cost::download(x, elem); });
    ops.download(x, tokens_host.data());
  }
  if (profiler_) profiler_->end_batch();
  ops.synchronize();
  if (profiler_) profiler_->collect();

  for (int32_t b = 0; b < B; ++b) {
    EncodedSequence& e = out[size_t(b)];
    const OutputOptions& o = option(b);
    const int32_t begin = batch.cu_seqlens[size_t(b)], end = batch.cu_seqlens[size_t(b) + 1];
    e.num_tokens = end - begin;
    const std::vector<float>& src = o.normalize ? normalized_host : pooled_host;
    e.embedding.assign(src.begin() + b * D, src.begin() + (b + 1) * D);
    if (o.token_embeddings) {
      e.token_embeddings.assign(tokens_host.begin() + begin * D, tokens_host.begin() + end * D);
    }
    if (o.logits && classifier_.out > 0) {
      e.logits.assign(logits_host.begin() + b * classifier_.out,
                      logits_host.begin() + (b + 1) * classifier_.out);
    }
  }
  return out;
}

}  // namespace fastformer::engine
