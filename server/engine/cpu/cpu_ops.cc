#include "server/engine/cpu/cpu_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <type_traits>

#include "common/half.h"
#include "server/engine/cpu/vector_rows.h"
#include "server/engine/error.h"

namespace fastformer::engine {
namespace {

// Rows per piece of work in the row-wise passes.
constexpr int64_t kRowGrain = 16;
// Tokens per piece of the embedding gather: each piece's first rows are fetched cold, so
// pieces are long (16 tokens lost a quarter of each piece to waiting).
constexpr int64_t kGatherGrain = 256;

float* f(void* p) { return static_cast<float*>(p); }
const float* f(const void* p) { return static_cast<const float*>(p); }
// Row r of a buffer of elements E (float, or uint16_t holding bfloat16).
template <class E>
E* row_of(const Mat& m, int64_t r) {
  return static_cast<E*>(m.data) + r * m.ld;
}

template <class E>
constexpr bool kFloat = std::is_same_v<E, float>;
inline float to_float(float x) { return x; }
inline float to_float(uint16_t x) { return bfloat16_to_float(x); }
inline void store(float* p, float v) { *p = v; }
inline void store(uint16_t* p, float v) { *p = float_to_bfloat16(v); }

// Row r of `m` (D elements of E) widened to float32 into `out`.
template <class E>
void row_to_float(const Mat& m, int64_t r, int64_t D, float* out) {
  if constexpr (kFloat<E>)
    std::copy_n(row_of<float>(m, r), D, out);
  else
    bfloat16_to_float_row(row_of<uint16_t>(m, r), out, D);
}

// The sequence that owns packed row t.
int32_t sequence_of(const RaggedBatch& batch, int64_t t) {
  const auto it = std::upper_bound(batch.cu_seqlens.begin(), batch.cu_seqlens.end(), t);
  return static_cast<int32_t>(it - batch.cu_seqlens.begin()) - 1;
}

}  // namespace

namespace {
// The key scores' head count: H, or H rounded up to a multiple of 16 where that costs at most
// a third more (base-long's 12 heads: 16), so the kernels vectorised over heads (and
// VDPBF16PS) serve it; the padding heads have zero weights and bias, and no one reads them.
int64_t key_heads(int64_t H) {
  const int64_t padded = (H + 15) / 16 * 16;
  return 3 * padded <= 4 * H ? padded : H;
}

std::optional<rows::DotBf16> choose_key_dot(CpuDtype dtype, int64_t heads) {
  if (dtype == CpuDtype::kFloat32 || key_heads(heads) % 16 != 0) return std::nullopt;
  if (rows::dot_bf16_available()) return rows::DotBf16::kHardware;
  if (dtype == CpuDtype::kBfloat16Emulated) return rows::DotBf16::kModel;
  return std::nullopt;
}

// Who runs the GEMMs: oneDNN's runtime-M primitives in float32; in bfloat16 oneDNN's packed
// fixed-M ones (over float32 primitives when emulated), or the AMX kernel on the tiles or their
// model with those for the shapes it does not take.
std::unique_ptr<GemmBackend> make_gemm_backend(CpuDtype dtype, Bf16Gemm bf16_gemm,
                                               ThreadPool& pool) {
  if (dtype == CpuDtype::kFloat32) return std::make_unique<OnednnGemm>(pool);
  auto packed = std::make_unique<PackedGemm>(pool, dtype == CpuDtype::kBfloat16Emulated);
  if (bf16_gemm == Bf16Gemm::kOnednn) return packed;
  if (bf16_gemm == Bf16Gemm::kAuto) {
    // The kernel's own fallback is never used: AutoGemm gives oneDNN the shapes it refuses.
    auto amx = std::make_unique<AmxGemm>(pool, TileBackend::kHardware,
                                         std::make_unique<PackedGemm>(pool, false));
    return std::make_unique<AutoGemm>(std::move(packed), std::move(amx));
  }
  return std::make_unique<AmxGemm>(
      pool, bf16_gemm == Bf16Gemm::kAmx ? TileBackend::kHardware : TileBackend::kModel,
      std::move(packed));
}
}  // namespace

Bf16Gemm pick_bf16_gemm(std::string_view requested, CpuDtype dtype, const std::string& amx_why,
                        bool tile_model, std::string* note) {
  if (dtype == CpuDtype::kFloat32) {
    if (requested == "amx") *note = "; --cpu-gemm amx is for bfloat16: oneDNN's GEMMs";
    return Bf16Gemm::kOnednn;
  }
  if (tile_model) {
    *note = "; GEMMs on the AMX kernel over the tile model (tests)";
    return Bf16Gemm::kAmxModel;
  }
  if (requested == "onednn") return Bf16Gemm::kOnednn;
  if (!amx_why.empty()) {
    *note = requested == "amx"
                ? "; --cpu-gemm amx refused (" + amx_why + "): oneDNN's GEMMs"
                : "; --cpu-gemm auto: oneDNN's GEMMs (the AMX kernel cannot run: " + amx_why + ")";
    return Bf16Gemm::kOnednn;
  }
  if (requested == "amx") {
    *note = "; GEMMs on the hand-written AMX kernel (K % 32 == 0; oneDNN for the others)";
    return Bf16Gemm::kAmx;
  }
  *note =
      "; GEMMs picked per shape by measurement at load, oneDNN or the AMX kernel "
      "(--cpu-gemm auto)";
  return Bf16Gemm::kAuto;
}

CpuOps::CpuOps(int threads, const ModelConfig& config, CpuDtype dtype, Bf16Gemm bf16_gemm)
    : config_(config),
      dtype_(dtype),
      bf16_(dtype != CpuDtype::kFloat32),
      isa_(rows::detected_isa()),
      key_dot_(choose_key_dot(dtype, config.num_attention_heads)),
      pool_(threads),
      gemm_(make_gemm_backend(dtype, bf16_gemm, pool_)) {}

std::string CpuOps::gemm_kernel(const WeightRef& w) const { return gemm_->kernel(w); }

size_t CpuOps::packed_weight_bytes() const { return gemm_->packed_weight_bytes(); }

SpeedCheck CpuOps::speed_check() {
  const GemmSelfCheck check = gemm_self_check();
  SpeedCheck out{true, check.below_floor(), check.message()};
  if (dtype_ == CpuDtype::kBfloat16) {
    const Bf16SelfCheck bf16 = bf16_self_check();
    out.message += "; " + bf16.message();
    out.warning |= bf16.ran && bf16.gflops < bf16.floor_gflops;
  }
  return out;
}

const void* CpuOps::upload(std::span<const float> host) {
  // The host arrays (the model's and the prepared weights, both owned by the engine) are
  // used in place, with no copy, in either dtype: the bfloat16 GEMMs pack their own copy of
  // the weights (packed_site), and every other parameter stays float32.
  return host.data();
}

void CpuOps::reserve(const WorkspacePlan& largest) {
  // Left uninitialised: untouched pages cost no memory. Aligned as the plan's offsets are.
  arena_.reset(static_cast<std::byte*>(
      ::operator new (std::max<size_t>(largest.bytes, 1), std::align_val_t{kWorkspaceAlignment})));
  reserved_bytes_ = largest.bytes;
}

void CpuOps::prefault(size_t bytes) {
  std::memset(arena_.get(), 0, std::min(bytes, reserved_bytes_));
}

BatchRef CpuOps::begin_batch(const RaggedBatch& batch, const WorkspacePlan& plan,
                             const PoolingChunks& chunks,
                             uint64_t /*staged: never, stage() is 0*/) {
  batch_ = &batch;
  chunks_ = &chunks;
  auto floats = [&](const WorkspacePlan::Buffer& buffer) {
    return reinterpret_cast<float*>(arena_.get() + buffer.offset);
  };
  partials_ =
      Partials{floats(plan.partial_max), floats(plan.partial_sum), floats(plan.partial_values)};
  token_scores_ = floats(plan.token_scores);
  attention_by_sequence_ = attention_by_sequence(batch.cu_seqlens, pool_.size());
  return BatchRef{batch.num_sequences(), batch.num_tokens()};
}

template <class E>
void CpuOps::embed_rows(const BatchRef& ref, const float* word, const float* pos_table,
                        const float* gamma, const float* beta, float eps, Mat x) {
  const RaggedBatch& batch = *batch_;
  const int64_t D = config_.hidden_size;
  pool_.parallel_for(ref.num_tokens, kGatherGrain, [&](int64_t begin, int64_t end) {
    std::vector<float> scratch(static_cast<size_t>(D));
    for (int64_t t = begin; t < end; ++t) {
      // The word row a few tokens ahead, fetched while this one is normalised (rows of a table
      // far larger than the caches, in the order of the text: no prefetcher follows them).
      if (const int64_t ahead = t + 4; ahead < end && batch.token_ids[size_t(ahead)] >= 0) {
        const char* next =
            reinterpret_cast<const char*>(word + int64_t(batch.token_ids[size_t(ahead)]) * D);
        for (int64_t byte = 0; byte < D * int64_t(sizeof(float)); byte += 64)
          __builtin_prefetch(next + byte);
      }
      const int32_t id = batch.token_ids[size_t(t)];
      const float* src =
          id >= 0 ? word + int64_t(id) * D
                  : batch.input_embeddings.data() + int64_t(batch.embedding_index[size_t(t)]) * D;
      const float* pos = pos_table + int64_t(batch.position_ids[size_t(t)]) * D;
      rows::embed_row(isa_, src, pos, gamma, beta, D, eps, scratch.data(), row_of<E>(x, t));
    }
  });
}

void CpuOps::embed(const BatchRef& ref, const void* word_embedding, const void* position_embeddings,
                   const void* ln_gamma, const void* ln_beta, double eps, Mat x) {
  if (bf16_) {
    embed_rows<uint16_t>(ref, f(word_embedding), f(position_embeddings), f(ln_gamma), f(ln_beta),
                         float(eps), x);
  } else {
    embed_rows<float>(ref, f(word_embedding), f(position_embeddings), f(ln_gamma), f(ln_beta),
                      float(eps), x);
  }
}

void CpuOps::linear(const Mat& a, const WeightRef& w, Mat c, Epilogue epilogue, Activation act) {
  gemm_->linear(a, w, c, epilogue, act);
}

template <class S, class E>
void CpuOps::pool_chunks(const S* scores, int64_t score_ld, const Mat& values,
                         const PoolingChunks& plan, const Partials& partials, const Combine<E>& how,
                         const std::function<void(int32_t, int64_t)>& score_chunk) {
  const int64_t heads = how.heads;
  const int64_t chunks = plan.count();
  pool_.parallel_for(chunks, 1, [&](int64_t first, int64_t last) {
    thread_local std::vector<float> scratch;
    for (int64_t c = first; c < last; ++c) {
      const int32_t begin = plan.begin[size_t(c)], end = plan.end[size_t(c)];
      const int64_t len = end - begin;
      if (score_chunk) score_chunk(begin, len);
      pool_one_chunk<E>(scores + int64_t(begin) * score_ld, score_ld, values, plan, partials, heads,
                        c, scratch, /*values_cached=*/bool(score_chunk));
      finish_single(how, c, plan, partials);
    }
  });
  combine(how, plan, partials);
}

template <class E, class S>
void CpuOps::pool_one_chunk(const S* chunk_scores, int64_t score_ld, const Mat& values,
                            const PoolingChunks& plan, const Partials& partials, int64_t heads,
                            int64_t c, std::vector<float>& scratch, bool values_cached) const {
  const int32_t begin = plan.begin[size_t(c)];
  const int64_t len = plan.end[size_t(c)] - begin, D = values.cols;
  scratch.resize(size_t(rows::pool_scratch_floats(heads, len, D)));
  rows::pool_chunk(isa_, chunk_scores, score_ld, heads, row_of<E>(values, begin), values.ld, D,
                   batch_->mask.data() + begin, len, partials.m + c * heads, partials.l + c * heads,
                   partials.v + c * D, scratch.data(), values_cached);
}

template <class E>
void CpuOps::combine_sequence(const Combine<E>& how, int64_t b, const PoolingChunks& plan,
                              const Partials& partials, double* acc) const {
  const int64_t heads = how.heads, D = how.out.cols, d = D / heads;
  const int32_t c0 = plan.first[size_t(b)], c1 = plan.first[size_t(b) + 1];
  E* o = row_of<E>(how.out, b);
  for (int64_t h = 0; h < heads; ++h) {
    double M = -std::numeric_limits<double>::infinity();
    for (int32_t c = c0; c < c1; ++c) M = std::max(M, double(partials.m[size_t(c * heads + h)]));
    double L = 0.0;
    // One chunk: its partial sums are the sums (no rescaling, no accumulation in double).
    const float* v1 = c1 - c0 == 1 ? partials.v + int64_t(c0) * D + h * d : nullptr;
    if (v1 != nullptr && !std::isinf(M)) L = double(partials.l[size_t(c0 * heads + h)]);
    if (v1 == nullptr) std::fill_n(acc, d, 0.0);
    for (int32_t c = c0; c < c1 && v1 == nullptr; ++c) {
      const float mc = partials.m[size_t(c * heads + h)];
      if (std::isinf(mc)) continue;  // chunk of padding only
      // The chunk holding the maximum scales by exactly 1 (every chunk of a one-chunk sequence).
      const double scale = double(mc) == M ? 1.0 : std::exp(double(mc) - M);
      L += double(partials.l[size_t(c * heads + h)]) * scale;
      const float* v = partials.v + int64_t(c) * D + h * d;
      for (int64_t j = 0; j < d; ++j) acc[j] += double(v[j]) * scale;
    }
    const double extra =
        how.denominator_extra == 0.0f ? 0.0 : double(how.denominator_extra) * std::exp(-M);
    const double inverse = 1.0 / (L + extra);  // one division a head, not one an element
    auto sum = [&](int64_t j) { return v1 != nullptr ? double(v1[j]) : acc[j]; };
    if (how.scale_by != nullptr) {
      const E* scale = how.scale_by + b * D + h * d;
      for (int64_t j = 0; j < d; ++j)
        store(o + h * d + j, static_cast<float>(sum(j) * inverse * to_float(scale[j])));
    } else {
      for (int64_t j = 0; j < d; ++j) store(o + h * d + j, static_cast<float>(sum(j) * inverse));
    }
  }
}

template <class E>
void CpuOps::finish_single(const Combine<E>& how, int64_t c, const PoolingChunks& plan,
                           const Partials& partials) const {
  const int32_t b = plan.sequence[size_t(c)];
  if (plan.first[size_t(b) + 1] - plan.first[size_t(b)] != 1) return;
  thread_local std::vector<double> acc;
  acc.resize(size_t(how.out.cols / how.heads));
  combine_sequence(how, b, plan, partials, acc.data());
}

template <class E>
void CpuOps::combine(const Combine<E>& how, const PoolingChunks& plan, const Partials& partials) {
  std::vector<int32_t>& several = several_chunks_;
  several.clear();
  for (int32_t b = 0; b + 1 < int32_t(plan.first.size()); ++b)
    if (plan.first[size_t(b) + 1] - plan.first[size_t(b)] > 1) several.push_back(b);
  pool_.parallel_for(int64_t(several.size()), 1, [&](int64_t first, int64_t last) {
    std::vector<double> acc(static_cast<size_t>(how.out.cols / how.heads));
    for (int64_t i = first; i < last; ++i)
      combine_sequence(how, several[size_t(i)], plan, partials, acc.data());
  });
}

void CpuOps::query_pool(const BatchRef&, const Mat& scores, const Mat& q, Mat pq) {
  const int64_t H = config_.num_attention_heads;
  if (bf16_) {
    pool_chunks(static_cast<const uint16_t*>(scores.data), scores.ld, q, *chunks_, partials_,
                Combine<uint16_t>{H, pq});
  } else {
    pool_chunks(f(scores.data), scores.ld, q, *chunks_, partials_, Combine<float>{H, pq});
  }
}

const CpuOps::KeyAtt& CpuOps::key_att(const WeightRef& key_att) {
  const int64_t D = config_.hidden_size, H = config_.num_attention_heads, Hs = key_heads(H);
  KeyAtt& att = key_att_[key_att.weight];
  if (att.wka_t.empty()) {
    // Wka [Hs, D], Wka^T [D, Hs] and the bias [Hs], zero past the model's H heads.
    att.wka.assign(static_cast<size_t>(Hs * D), 0.0f);
    std::copy_n(f(key_att.weight), H * D, att.wka.begin());
    att.wka_t.resize(static_cast<size_t>(Hs * D));
    rows::transpose_key_att(att.wka.data(), Hs, D, att.wka_t.data());
    att.bias.assign(static_cast<size_t>(Hs), 0.0f);
    std::copy_n(f(key_att.bias), H, att.bias.begin());
  }
  return att;
}

// One pass over K per chunk, which stays in L2 between its two uses: the scores
// r_t = K_t (pq_b * Wka')^T + bka' (the weight formed once per sequence and worker, in the
// kernel's layout, then a register-blocked kernel over the chunk's tokens; K * pq is never
// formed), then the chunk's softmax partials pk_h = sum_t b_{t,h} K_{t,h-slice} (vector_rows.h).
template <class E>
void CpuOps::key_pool_chunk(const KeyAtt& att, const Mat& k, const Mat& pq, int64_t c,
                            KeyPoolWorker& worker) const {
  const int64_t D = config_.hidden_size, H = config_.num_attention_heads, Hs = key_heads(H);
  bool on_pairs = false;
  if constexpr (!kFloat<E>) on_pairs = key_dot_.has_value();
  const int32_t b = chunks_->sequence[size_t(c)];
  const int32_t begin = chunks_->begin[size_t(c)], end = chunks_->end[size_t(c)];
  const int64_t len = end - begin;
  if (b != worker.formed) {
    // The sequence's weight in float32, or in bfloat16 pairs with key_dot_.
    worker.pq_row.resize(static_cast<size_t>(D));
    row_to_float<E>(pq, b, D, worker.pq_row.data());
    if (on_pairs) {
      worker.pairs.resize(static_cast<size_t>((D + 1) / 2 * Hs));
      rows::key_weight_pairs(isa_, att.wka_t.data(), worker.pq_row.data(), Hs, D,
                             worker.pairs.data());
    } else {
      worker.weight.resize(static_cast<size_t>(Hs * D));
      rows::key_weight(isa_, att.wka.data(), att.wka_t.data(), worker.pq_row.data(), Hs, D,
                       worker.weight.data());
    }
    worker.formed = b;
  }
  const E* keys = row_of<E>(k, begin);
  // The chunk's scores [len, Hs], the worker's: read by the pooling right after.
  worker.scores.resize(static_cast<size_t>(len * Hs));
  float* scores = worker.scores.data();
  const float* bka = att.bias.data();
  if (on_pairs) {
    if constexpr (!kFloat<E>)
      rows::key_scores_pairs(*key_dot_, keys, k.ld, len, worker.pairs.data(), bka, Hs, D, scores,
                             Hs);
  } else {
    rows::key_scores(isa_, keys, k.ld, len, worker.weight.data(), bka, Hs, D, scores, Hs);
  }
  pool_one_chunk<E>(scores, Hs, k, *chunks_, partials_, H, c, worker.scratch,
                    /*values_cached=*/true);
}

template <class E>
void CpuOps::key_pool_rows(const BatchRef&, const Mat& k, const Mat& pq, const WeightRef& key_att,
                           Mat pk) {
  const KeyAtt& att = this->key_att(key_att);
  // pk_h = pq_h * (the chunks' partials combined).
  const Combine<E> how{config_.num_attention_heads, pk, static_cast<const E*>(pq.data), 0.0f};
  pool_.parallel_for(chunks_->count(), 1, [&](int64_t first, int64_t last) {
    // A piece is often one chunk: the buffers are the worker's, not the piece's.
    thread_local KeyPoolWorker worker;
    worker.formed = -1;
    for (int64_t c = first; c < last; ++c) {
      key_pool_chunk<E>(att, k, pq, c, worker);
      finish_single(how, c, *chunks_, partials_);
    }
  });
  combine(how, *chunks_, partials_);
}

void CpuOps::key_pool(const BatchRef& ref, const Mat& k, const Mat& pq, const WeightRef& key_att,
                      Mat pk) {
  if (bf16_)
    key_pool_rows<uint16_t>(ref, k, pq, key_att, pk);
  else
    key_pool_rows<float>(ref, k, pq, key_att, pk);
}

template <class E>
void CpuOps::mix_rows(const BatchRef& ref, const Mat& q, const Mat& pk, Mat u) {
  const RaggedBatch& batch = *batch_;
  const int64_t D = config_.hidden_size;
  pool_.parallel_for(ref.num_tokens, kRowGrain, [&](int64_t begin, int64_t end) {
    std::vector<float> pk_row(static_cast<size_t>(D));
    int32_t b = -1;
    for (int64_t t = begin; t < end; ++t) {
      if (b < 0 || batch.cu_seqlens[size_t(b) + 1] <= t) {
        b = sequence_of(batch, t);
        row_to_float<E>(pk, b, D, pk_row.data());
      }
      rows::scale_row(isa_, row_of<E>(q, t), pk_row.data(), D, row_of<E>(u, t));
    }
  });
}

void CpuOps::mix(const BatchRef& ref, const Mat& q, const Mat& pk, Mat u) {
  if (bf16_)
    mix_rows<uint16_t>(ref, q, pk, u);
  else
    mix_rows<float>(ref, q, pk, u);
}

bool attention_by_sequence(std::span<const int32_t> cu_seqlens, int threads) {
  int64_t longest = 0;
  for (size_t b = 1; b < cu_seqlens.size(); ++b)
    longest = std::max<int64_t>(longest, cu_seqlens[b] - cu_seqlens[b - 1]);
  return longest > 0 && longest * 4 * threads <= int64_t(cu_seqlens.back());
}

template <class E>
void CpuOps::attention_rows(const Mat& scores, const Mat& q, const Mat& k, const WeightRef& key_att,
                            Mat pq, Mat pk, Mat u) {
  const RaggedBatch& batch = *batch_;
  const PoolingChunks& plan = *chunks_;
  const int64_t D = config_.hidden_size, H = config_.num_attention_heads;
  const KeyAtt& att = this->key_att(key_att);
  const Combine<E> query_how{H, pq};
  const Combine<E> key_how{H, pk, static_cast<const E*>(pq.data), 0.0f};
  // A sequence a job: its query pool reads its Q and s from memory, its key pool its K; its
  // mix then reads Q again and writes U over K, both still in the caches (a 512-token
  // sequence's Q and K are 1.5 MB in bfloat16), where the three ops in turn read each from
  // memory and the mix's stores first fetch K's lines again. The chunks' arithmetic and the
  // combine are the three ops', so the results are theirs, bit for bit.
  pool_.parallel_for(batch.num_sequences(), 1, [&](int64_t first, int64_t last) {
    thread_local KeyPoolWorker worker;
    thread_local std::vector<float> scratch, pk_row;
    thread_local std::vector<double> acc;
    worker.formed = -1;
    acc.resize(size_t(D / H));
    pk_row.resize(size_t(D));
    for (int64_t b = first; b < last; ++b) {
      const int32_t c0 = plan.first[size_t(b)], c1 = plan.first[size_t(b) + 1];
      for (int32_t c = c0; c < c1; ++c) {
        pool_one_chunk<E>(row_of<E>(scores, plan.begin[size_t(c)]), scores.ld, q, plan, partials_,
                          H, c, scratch, /*values_cached=*/false);
      }
      combine_sequence(query_how, b, plan, partials_, acc.data());
      for (int32_t c = c0; c < c1; ++c) key_pool_chunk<E>(att, k, pq, c, worker);
      combine_sequence(key_how, b, plan, partials_, acc.data());
      row_to_float<E>(pk, b, D, pk_row.data());
      for (int64_t t = batch.cu_seqlens[size_t(b)]; t < batch.cu_seqlens[size_t(b) + 1]; ++t)
        rows::scale_row(isa_, row_of<E>(q, t), pk_row.data(), D, row_of<E>(u, t));
    }
  });
}

void CpuOps::attention(const BatchRef& ref, const Mat& scores, const Mat& q, const Mat& k,
                       const WeightRef& key_att, Mat pq, Mat pk, Mat u) {
  if (!attention_by_sequence_) {  // few long sequences
    Ops::attention(ref, scores, q, k, key_att, pq, pk, u);
  } else if (bf16_) {
    attention_rows<uint16_t>(scores, q, k, key_att, pq, pk, u);
  } else {
    attention_rows<float>(scores, q, k, key_att, pq, pk, u);
  }
}

template <class E>
void CpuOps::layernorm_rows(const Mat& c, const float* bias, const Mat& residual,
                            const float* gamma, const float* beta, float eps, Mat out) {
  const int64_t D = c.cols;
  pool_.parallel_for(c.rows, kRowGrain, [&](int64_t begin, int64_t end) {
    std::vector<float> scratch(static_cast<size_t>(D));
    for (int64_t r = begin; r < end; ++r) {
      rows::residual_layernorm_row(isa_, row_of<E>(c, r), bias, row_of<E>(residual, r), gamma, beta,
                                   D, eps, scratch.data(), row_of<E>(out, r));
    }
  });
}

void CpuOps::bias_residual_layernorm(const Mat& c, const void* bias, const Mat& residual,
                                     const void* gamma, const void* beta, double eps, Mat out) {
  if (bf16_)
    layernorm_rows<uint16_t>(c, f(bias), residual, f(gamma), f(beta), float(eps), out);
  else
    layernorm_rows<float>(c, f(bias), residual, f(gamma), f(beta), float(eps), out);
}

template <class E>
void CpuOps::attention_pool_rows(const BatchRef&, const Mat& e, const WeightRef& fc2, const Mat& x,
                                 Mat pooled) {
  const int64_t D = config_.hidden_size;
  const float* w2 = f(fc2.weight);
  const float b2 = f(fc2.bias)[0];
  float* z = token_scores_;
  // w_t = m_t exp(z_t) / (sum_u m_u exp(z_u) + 1e-8), as a stable softmax: the 1e-8 term
  // becomes 1e-8 exp(-M) after subtracting the max M, so results equal the reference.
  // One pass per chunk: its scores (the tanh, arithmetic-bound, fetching the chunk's rows of X
  // as it goes), then its partials over those rows, now in cache; the scores stay in
  // token_scores_ for span_pool.
  pool_chunks(z, 1, x, *chunks_, partials_, Combine<E>{1, pooled, nullptr, 1e-8f},
              [&](int32_t begin, int64_t len) {
                rows::tanh_scores(isa_, row_of<E>(e, begin), e.ld, len, w2, b2, D, z + begin,
                                  row_of<E>(x, begin), x.ld);
              });
}

template <class E>
void CpuOps::span_pool_rows(const PoolingChunks& spans, SpanPooling mode, const Mat& x, Mat out,
                            const Partials& partials) {
  // kModel: the pooler's scores z (token_scores_, from attention_pool) and its + 1e-8, as the
  // sequence's pooling; kMean: every score 0 (one value read at stride 0), so each real token
  // weighs exp(0) = 1 and the combine divides by their count.
  static constexpr float kZero = 0.0f;
  if (mode == SpanPooling::kModel) {
    pool_chunks(token_scores_, 1, x, spans, partials, Combine<E>{1, out, nullptr, 1e-8f});
  } else {
    pool_chunks(&kZero, 0, x, spans, partials, Combine<E>{1, out, nullptr, 0.0f});
  }
}

Mat CpuOps::span_pool(const BatchRef&, const PoolingChunks& spans, SpanPooling mode, const Mat& x) {
  SpanMemory& memory = span_memory_[mode == SpanPooling::kModel ? 0 : 1];
  const int64_t D = x.cols, chunks = spans.count();
  const int64_t count = int64_t(spans.first.size()) - 1;
  memory.m.resize(size_t(std::max<int64_t>(chunks, 1)));
  memory.l.resize(size_t(std::max<int64_t>(chunks, 1)));
  memory.v.resize(size_t(std::max<int64_t>(chunks * D, 1)));
  memory.out.resize(size_t(std::max<int64_t>(count * D, 1)) * element_size());
  const Partials partials{memory.m.data(), memory.l.data(), memory.v.data()};
  Mat out{memory.out.data(), count, D, D};
  if (count == 0) return out;
  if (bf16_)
    span_pool_rows<uint16_t>(spans, mode, x, out, partials);
  else
    span_pool_rows<float>(spans, mode, x, out, partials);
  return out;
}

void CpuOps::attention_pool(const BatchRef& ref, const Mat& e, const WeightRef& fc2, const Mat& x,
                            Mat pooled) {
  if (bf16_)
    attention_pool_rows<uint16_t>(ref, e, fc2, x, pooled);
  else
    attention_pool_rows<float>(ref, e, fc2, x, pooled);
}

template <class E>
void CpuOps::l2_normalize_rows(Mat rows) {
  for (int64_t r = 0; r < rows.rows; ++r) {
    E* x = row_of<E>(rows, r);
    double sq = 0.0;
    for (int64_t j = 0; j < rows.cols; ++j) sq += double(to_float(x[j])) * to_float(x[j]);
    const double norm = std::max(std::sqrt(sq), 1e-12);
    for (int64_t j = 0; j < rows.cols; ++j) store(x + j, static_cast<float>(to_float(x[j]) / norm));
  }
}

void CpuOps::l2_normalize(Mat rows) {
  if (bf16_)
    l2_normalize_rows<uint16_t>(rows);
  else
    l2_normalize_rows<float>(rows);
}

template <class E>
void CpuOps::download_rows(const Mat& src, float* dst) {
  for (int64_t r = 0; r < src.rows; ++r) {
    const E* in = row_of<E>(src, r);
    if constexpr (kFloat<E>)
      std::memcpy(dst + r * src.cols, in, size_t(src.cols) * sizeof(float));
    else
      bfloat16_to_float_row(in, dst + r * src.cols, src.cols);
  }
}

void CpuOps::download(const Mat& src, float* dst) {
  if (bf16_)
    download_rows<uint16_t>(src, dst);
  else
    download_rows<float>(src, dst);
}

size_t last_level_cache_bytes(const std::string& sysfs_cpu) {
  int best_level = 0;
  size_t best = 0;
  for (int index = 0;; ++index) {
    const std::string dir = sysfs_cpu + "/cache/index" + std::to_string(index) + "/";
    std::ifstream level_file(dir + "level"), type_file(dir + "type"), size_file(dir + "size");
    if (!level_file) break;
    int level = 0;
    std::string type, size;
    level_file >> level;
    type_file >> type;
    size_file >> size;  // "32768K"
    if (type == "Instruction" || size.empty()) continue;
    size_t bytes = 0;
    try {
      bytes = std::stoull(size);
    } catch (const std::exception&) {
      continue;
    }
    const char unit = size.back();
    bytes <<= unit == 'K' ? 10 : unit == 'M' ? 20 : unit == 'G' ? 30 : 0;
    if (level > best_level) best_level = level, best = bytes;
  }
  return best;
}

}  // namespace fastformer::engine
