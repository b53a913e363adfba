#include "server/engine/forward.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "server/engine/error.h"

namespace fastformer::engine {

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

}  // namespace

ForwardEngine::~ForwardEngine() = default;

void ForwardEngine::set_profiling(bool on) {
  profiling_.reset();
  if (!on) return;
  // A GEMM is named by its site, which the graph records before it runs the GEMM.
  auto site_of = [this](const WeightRef& w) {
    for (const GemmSite& site : gemm_sites_)
      if (site.weight == &w) return ProfilingOps::Site{site.name, site.layer};
    return ProfilingOps::Site{"gemm", -1};
  };
  auto kernel_of = [this](const WeightRef& w) {
    return report_ != nullptr ? report_->gemm_kernel(w) : std::string();
  };
  profiling_ = std::make_unique<ProfilingOps>(*ops_, site_of, kernel_of);
}

std::vector<OpProfile> ForwardEngine::profile() const {
  return profiling_ ? profiling_->rows() : std::vector<OpProfile>{};
}

SpeedCheck ForwardEngine::speed_check() {
  return report_ != nullptr ? report_->speed_check() : SpeedCheck{};
}

size_t ForwardEngine::packed_weight_bytes() const {
  return report_ != nullptr ? report_->packed_weight_bytes() : 0;
}

ForwardEngine::ForwardEngine(std::shared_ptr<const Model> model, std::unique_ptr<Ops> ops,
                             int64_t max_batch_tokens, std::string backend, std::string device,
                             DtypeChoice dtype, OpsReport* report, int64_t pass_tokens) try
    : model_(std::move(model)),
      prepared_(prepare_weights(*model_)),
      ops_(std::move(ops)),
      report_(report),
      max_batch_tokens_(max_batch_tokens),
      pass_tokens_(pass_tokens),
      backend_(std::move(backend)),
      device_(std::move(device)),
      dtype_(std::move(dtype)) {
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
  // A batch's passes (workspace.h) touch at most the plan of pass_tokens_ one-token sequences.
  if (pass_tokens_ > 0) {
    ops_->prefault(
        plan_workspace(c, model_->num_labels(), pass_tokens_, pass_tokens_, ops_->element_size())
            .bytes);
  }
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
    std::string kernel = report_ != nullptr ? report_->gemm_kernel(*site.weight) : "";
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

namespace {
// Downloads `rows` in pieces of at most `max_rows` rows (the ops' download staging holds a
// batch's [T, D]; a batch may have more spans than tokens).
void download_in_pieces(Ops& ops, const Mat& rows, int64_t max_rows, float* dst) {
  const size_t elem = ops.element_size();
  for (int64_t r0 = 0; r0 < rows.rows; r0 += max_rows) {
    const int64_t n = std::min(max_rows, rows.rows - r0);
    const Mat piece{static_cast<char*>(rows.data) + r0 * rows.ld * int64_t(elem), n, rows.cols,
                    rows.ld};
    ops.download(piece, dst + r0 * rows.cols);
  }
}
}  // namespace

uint64_t ForwardEngine::stage(const RaggedBatch& batch) try {
  // Only a batch that runs in one pass and fits the workspace; its own chunks (chunks_ is
  // the computing batch's).
  if (batch.num_sequences() == 0 || batch.num_tokens() > max_batch_tokens_ ||
      (pass_tokens_ > 0 && batch.num_tokens() > pass_tokens_)) {
    return 0;
  }
  PoolingChunks chunks;
  plan_chunks(batch, chunks);
  return ops_->stage(batch, chunks);
} catch (...) {
  rethrow_as_engine_error();
}

std::vector<EncodedSequence> ForwardEngine::encode_staged(const RaggedBatch& batch,
                                                          std::span<const OutputOptions> options,
                                                          uint64_t staged) {
  try {
    std::vector<EncodedSequence> out;
    const int32_t B = batch.num_sequences();
    if (B > 0 && options.size() != 1 && options.size() != static_cast<size_t>(B)) {
      throw EngineError("encode: expected 1 or " + std::to_string(B) + " output options, got " +
                        std::to_string(options.size()));
    }
    if (batch.num_tokens() > max_batch_tokens_) {
      throw EngineError("batch of " + std::to_string(batch.num_tokens()) +
                        " tokens exceeds max_batch_tokens " + std::to_string(max_batch_tokens_));
    }
    if (pass_tokens_ <= 0 || batch.num_tokens() <= pass_tokens_) {
      out = run(batch, options, staged);
    } else {
      // Passes of whole sequences (plan_passes, workspace.h): sequences ends[i-1] .. ends[i]-1.
      plan_passes(batch, pass_tokens_, pass_ends_);
      for (int32_t first = 0; const int32_t last : pass_ends_) {
        const RaggedBatch part = batch.sequences(first, last, model_->config().hidden_size);
        std::vector<EncodedSequence> encoded = run(
            part,
            options.size() == 1 ? options : options.subspan(size_t(first), size_t(last - first)),
            0);
        std::move(encoded.begin(), encoded.end(), std::back_inserter(out));
        first = last;
      }
    }
    if (profiling_) profiling_->end_batch();
    return out;
  } catch (...) {
    rethrow_as_engine_error();
  }
}

std::vector<EncodedSequence> ForwardEngine::run(const RaggedBatch& batch,
                                                std::span<const OutputOptions> options,
                                                uint64_t staged) {
  const ModelConfig& c = model_->config();
  const int64_t T = batch.num_tokens();
  const int32_t B = batch.num_sequences();
  if (B == 0) return {};
  auto option = [&](int32_t b) -> const OutputOptions& {
    return options[options.size() == 1 ? 0 : b];
  };

  const int64_t D = c.hidden_size, H = c.num_attention_heads;
  // The profile, when on, wraps the ops (profiling_ops.h); the graph is the same either way.
  Ops& ops = profiling_ ? static_cast<Ops&>(*profiling_) : *ops_;
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

  // Every Linear: its site (first seen: the GEMM report's and the profile's name), the op.
  auto gemm = [&](const char* name, int layer, const Mat& a, const WeightRef& w, Mat out,
                  Epilogue epilogue, Activation act = Activation::kGeluErf) {
    if (site_keys_.insert({name, w.weight}).second) {
      gemm_sites_.push_back(GemmSite{name, layer, &w, a.ld, out.ld, epilogue, act});
    }
    ops.linear(a, w, out, epilogue, act);
  };

  plan_chunks(batch, chunks_);
  const BatchRef ref = ops.begin_batch(batch, plan, chunks_, staged);
  Mat x = mat(plan.x), qks = mat(plan.qks), y = mat(plan.y), h = mat(plan.h);
  Mat pq = mat(plan.pq), pk = mat(plan.pk), pooled = mat(plan.pooled);
  const Mat q = columns(qks, 0, D, elem), k = columns(qks, D, D, elem);
  const Mat s = columns(qks, 2 * D, H, elem);

  // From the embedding to the pooler: the ops of a batch's sizes, one region (Ops::run_region:
  // a CUDA graph where asked for).
  ops.run_region([&] {
    ops.embed(ref, word_embedding_, position_embeddings_, embedding_ln_gamma_, embedding_ln_beta_,
              c.layer_norm_eps, x);
    for (size_t i = 0; i < layers_.size(); ++i) {
      const LayerRefs& l = layers_[i];
      const int n = int(i);
      gemm("qks_gemm", n, x, l.query_key_scores, qks, Epilogue::kBias);  // Q, K, s
      ops.attention(ref, s, q, k, l.key_att, pq, pk, k);  // pq, pk, then U = pk * Q over K
      gemm("transform_gemm", n, k, l.transform, q, Epilogue::kAccumulate);   // A = Q + U Wt^T
      gemm("attn_out_gemm", n, q, l.attention_output, y, Epilogue::kStore);  // A Wo^T
      ops.bias_residual_layernorm(y, l.attention_output.bias, x, l.ln1_gamma, l.ln1_beta,
                                  c.layer_norm_eps, x);  // X1
      gemm("ffn_in_gemm", n, x, l.intermediate, h, Epilogue::kBiasAct,
           c.hidden_act);  // act(X1 Wi^T + bi)
      gemm("ffn_out_gemm", n, h, l.output, y, Epilogue::kStore);
      ops.bias_residual_layernorm(y, l.output.bias, x, l.ln2_gamma, l.ln2_beta, c.layer_norm_eps,
                                  x);  // X'
    }
    gemm("pooler_fc1_gemm", -1, x, pooler_fc1_, y, Epilogue::kBias);
    ops.attention_pool(ref, y, pooler_fc2_, x, pooled);
  });

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
    ops.download(logits, logits_host.data());
  }
  std::vector<float> pooled_host(size_t(B * D)), normalized_host;
  ops.download(pooled, pooled_host.data());
  if (any_normalize) {
    ops.l2_normalize(pooled);
    normalized_host.resize(pooled_host.size());
    ops.download(pooled, normalized_host.data());
  }
  // Spans (late chunking): per pooling mode, one plan over the sequences that ask for it.
  // span_rows[i]: where batch span i's row is (mode, row), in span_host / span_normalized.
  std::vector<float> span_host[2], span_normalized[2];
  std::vector<std::pair<int, int32_t>> span_rows(batch.spans.size());
  if (!batch.spans.empty()) {
    std::vector<SpanPooling> modes(static_cast<size_t>(B));
    for (int32_t b = 0; b < B; ++b) modes[size_t(b)] = option(b).span_pooling;
    for (int m = 0; m < 2; ++m) {
      const SpanPooling mode = m == 0 ? SpanPooling::kModel : SpanPooling::kMean;
      plan_span_chunks(batch, modes, mode, span_chunks_[m], span_owners_[m]);
      const std::vector<int32_t>& owners = span_owners_[m];
      if (owners.empty()) continue;
      for (size_t r = 0; r < owners.size(); ++r)
        span_rows[size_t(owners[r])] = {m, static_cast<int32_t>(r)};
      const Mat rows = ops.span_pool(ref, span_chunks_[m], mode, x);
      span_host[m].resize(size_t(rows.rows * D));
      download_in_pieces(ops, rows, T, span_host[m].data());
      bool normalize = false;
      for (int32_t b = 0; b < B; ++b)
        normalize |= modes[size_t(b)] == mode && option(b).normalize &&
                     batch.span_first[size_t(b) + 1] > batch.span_first[size_t(b)];
      if (normalize) {
        ops.l2_normalize(rows);
        span_normalized[m].resize(span_host[m].size());
        download_in_pieces(ops, rows, T, span_normalized[m].data());
      }
    }
  }
  std::vector<float> tokens_host;
  bool any_tokens = false;
  for (int32_t b = 0; b < B; ++b) any_tokens |= option(b).token_embeddings;
  if (any_tokens) {
    tokens_host.resize(size_t(T * D));
    ops.download(x, tokens_host.data());
  }
  ops.synchronize();

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
    const int32_t s0 = batch.span_first[size_t(b)], s1 = batch.span_first[size_t(b) + 1];
    e.span_embeddings.reserve(size_t((s1 - s0) * D));
    for (int32_t i = s0; i < s1; ++i) {
      const auto [m, row] = span_rows[size_t(i)];
      const std::vector<float>& from = o.normalize ? span_normalized[m] : span_host[m];
      e.span_embeddings.insert(e.span_embeddings.end(), from.begin() + row * D,
                               from.begin() + (row + 1) * D);
    }
  }
  return out;
}

}  // namespace fastformer::engine
