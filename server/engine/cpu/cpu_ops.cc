#include "server/engine/cpu/cpu_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "common/half.h"
#include "server/engine/cpu/vector_math.h"
#include "server/engine/error.h"

namespace fastformer::engine {
namespace {

// Rows per piece of work in the row-wise passes.
constexpr int64_t kRowGrain = 16;
// Rows per GEMM piece: large enough for oneDNN to reach full speed, small enough that
// pieces balance over the pool.
constexpr int64_t kGemmRows = 128;

float* f(void* p) { return static_cast<float*>(p); }
const float* f(const void* p) { return static_cast<const float*>(p); }
float* row(const Mat& m, int64_t r) { return f(m.data) + r * m.ld; }

// The sequence that owns packed row t.
int32_t sequence_of(const RaggedBatch& batch, int64_t t) {
  const auto it = std::upper_bound(batch.cu_seqlens.begin(), batch.cu_seqlens.end(), t);
  return static_cast<int32_t>(it - batch.cu_seqlens.begin()) - 1;
}

// out = LN(in) over D values, statistics in float over two passes (mean, then variance).
FASTFORMER_VECTOR_CLONES
void layernorm_row(const float* in, float* out, const float* gamma, const float* beta, int64_t D,
                   float eps) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < D; ++j) sum += in[j];
  const float mean = sum / static_cast<float>(D);
  float sq = 0.0f;
#pragma omp simd reduction(+ : sq)
  for (int64_t j = 0; j < D; ++j) sq += (in[j] - mean) * (in[j] - mean);
  const float rstd = 1.0f / std::sqrt(sq / static_cast<float>(D) + eps);
  for (int64_t j = 0; j < D; ++j) out[j] = (in[j] - mean) * rstd * gamma[j] + beta[j];
}

FASTFORMER_VECTOR_CLONES
void multiply_rows(const float* a, const float* b, float* out, int64_t n) {
  for (int64_t j = 0; j < n; ++j) out[j] = a[j] * b[j];
}

FASTFORMER_VECTOR_CLONES
float dot(const float* a, const float* b, int64_t n) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < n; ++j) sum += a[j] * b[j];
  return sum;
}

// z = sum_j tanh(e_j) w_j, the pooler's score before its bias.
FASTFORMER_VECTOR_CLONES
float tanh_dot(const float* e, const float* w, int64_t D) {
  float z = 0.0f;
#pragma omp simd reduction(+ : z)
  for (int64_t j = 0; j < D; ++j) z += vmath::tanh(e[j]) * w[j];
  return z;
}

}  // namespace

CpuOps::CpuOps(int threads, const ModelConfig& config, bool bf16)
    : config_(config), bf16_(bf16), pool_(threads) {}

const CpuMatmul& CpuOps::matmul(const CpuMatmul::Shape& shape) {
  auto it = matmuls_.find(shape);
  if (it == matmuls_.end()) it = matmuls_.emplace(shape, std::make_unique<CpuMatmul>(shape)).first;
  return *it->second;
}

const void* CpuOps::gemm_weights(const WeightRef& w) {
  if (!bf16_) return w.weight;
  auto it = bf16_weights_.find(w.weight);
  if (it == bf16_weights_.end()) {
    std::vector<uint16_t> rounded(size_t(w.out * w.in));
    std::transform(f(w.weight), f(w.weight) + w.out * w.in, rounded.data(), float_to_bfloat16);
    it = bf16_weights_.emplace(w.weight, std::move(rounded)).first;
  }
  return it->second.data();
}

SpeedCheck CpuOps::speed_check() {
  const GemmSelfCheck check = gemm_self_check();
  return SpeedCheck{true, check.below_floor(), check.message()};
}

const void* CpuOps::upload(std::span<const float> host) {
  // The CPU engine serves float32: the host arrays (the model's and the prepared weights,
  // both owned by the engine) are used in place, with no copy.
  return host.data();
}

void CpuOps::reserve(const WorkspacePlan& largest) {
  // Left uninitialised: untouched pages cost no memory. Aligned as the plan's offsets are.
  arena_.reset(static_cast<std::byte*>(
      ::operator new(std::max<size_t>(largest.bytes, 1), std::align_val_t{kWorkspaceAlignment})));
}

BatchRef CpuOps::begin_batch(const RaggedBatch& batch, const WorkspacePlan& plan,
                             const PoolingChunks& chunks) {
  batch_ = &batch;
  chunks_ = &chunks;
  auto floats = [&](const WorkspacePlan::Buffer& buffer) {
    return reinterpret_cast<float*>(arena_.get() + buffer.offset);
  };
  partials_ = Partials{floats(plan.partial_max), floats(plan.partial_sum), floats(plan.partial_values)};
  token_scores_ = floats(plan.token_scores);
  return BatchRef{batch.num_sequences(), batch.num_tokens()};
}

void CpuOps::embed(const BatchRef& ref, const void* word_embedding, const void* position_embeddings,
                   const void* ln_gamma, const void* ln_beta, double eps, Mat x) {
  const RaggedBatch& batch = *batch_;
  const int64_t D = config_.hidden_size;
  pool_.parallel_for(ref.num_tokens, kRowGrain, [&](int64_t begin, int64_t end) {
    std::vector<float> sum(static_cast<size_t>(D));
    for (int64_t t = begin; t < end; ++t) {
      const int32_t id = batch.token_ids[size_t(t)];
      const float* src = id >= 0 ? f(word_embedding) + int64_t(id) * D
                                 : batch.input_embeddings.data() + int64_t(batch.embedding_index[size_t(t)]) * D;
      const float* pos = f(position_embeddings) + int64_t(batch.position_ids[size_t(t)]) * D;
      for (int64_t j = 0; j < D; ++j) sum[size_t(j)] = src[j] + pos[j];
      layernorm_row(sum.data(), row(x, t), f(ln_gamma), f(ln_beta), D, float(eps));
    }
  });
}

void CpuOps::linear(const Mat& a, const WeightRef& w, Mat c, Epilogue epilogue, Activation act) {
  // oneDNN runs single-threaded inside each piece, bias and activation fused as post-ops;
  // the pool splits the rows.
  const CpuMatmul& mm = matmul({w.out, w.in, a.ld, c.ld, epilogue, act, bf16_});
  const void* weight = gemm_weights(w);
  const float* bias = f(w.bias);
  const int64_t pieces = std::min<int64_t>(pool_.size() * 4, (a.rows + kGemmRows - 1) / kGemmRows);
  const int64_t rows_per_piece = (a.rows + pieces - 1) / std::max<int64_t>(pieces, 1);
  pool_.parallel_for(pieces, 1, [&](int64_t first, int64_t last) {
    for (int64_t piece = first; piece < last; ++piece) {
      const int64_t r0 = piece * rows_per_piece, r1 = std::min(a.rows, r0 + rows_per_piece);
      if (r0 < r1) mm.run(r1 - r0, row(a, r0), weight, bias, row(c, r0));
    }
  });
}

void CpuOps::pool_chunks(int64_t heads, const float* scores, int64_t score_ld, const Mat& values) {
  const RaggedBatch& batch = *batch_;
  const int64_t D = values.cols, d = D / heads;
  const int64_t chunks = chunks_->count();
  pool_.parallel_for(chunks, 1, [&](int64_t first, int64_t last) {
    for (int64_t c = first; c < last; ++c) {
      float* m = partials_.m + c * heads;
      float* l = partials_.l + c * heads;
      float* v = partials_.v + c * D;
      const int32_t begin = chunks_->begin[size_t(c)], end = chunks_->end[size_t(c)];
      // Pass 1: the chunk's max per head over real tokens (masked tokens weigh exactly 0:
      // the reference's -10000 underflows to 0 after exp in float32).
      for (int64_t h = 0; h < heads; ++h) m[h] = -std::numeric_limits<float>::infinity();
      for (int32_t t = begin; t < end; ++t) {
        if (!batch.mask[size_t(t)]) continue;
        const float* s = scores + int64_t(t) * score_ld;
        for (int64_t h = 0; h < heads; ++h) m[h] = std::max(m[h], s[h]);
      }
      // Pass 2: sum of weights and weighted values.
      std::fill(l, l + heads, 0.0f);
      std::fill(v, v + D, 0.0f);
      for (int32_t t = begin; t < end; ++t) {
        if (!batch.mask[size_t(t)]) continue;
        const float* s = scores + int64_t(t) * score_ld;
        const float* x = row(values, t);
        for (int64_t h = 0; h < heads; ++h) {
          const float weight = std::exp(s[h] - m[h]);
          l[h] += weight;
          float* vh = v + h * d;
          const float* xh = x + h * d;
          for (int64_t j = 0; j < d; ++j) vh[j] += weight * xh[j];
        }
      }
    }
  });
}

void CpuOps::combine(int64_t heads, Mat out, const float* scale_by, float denominator_extra) {
  const int64_t D = out.cols, d = D / heads;
  pool_.parallel_for(out.rows, 1, [&](int64_t first, int64_t last) {
    std::vector<double> acc(static_cast<size_t>(d));  // one per piece, not per head and sequence
    for (int64_t b = first; b < last; ++b) {
      const int32_t c0 = chunks_->first[size_t(b)], c1 = chunks_->first[size_t(b) + 1];
      float* o = row(out, b);
      for (int64_t h = 0; h < heads; ++h) {
        double M = -std::numeric_limits<double>::infinity();
        for (int32_t c = c0; c < c1; ++c) M = std::max(M, double(partials_.m[size_t(c * heads + h)]));
        double L = 0.0;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int32_t c = c0; c < c1; ++c) {
          const float mc = partials_.m[size_t(c * heads + h)];
          if (std::isinf(mc)) continue;  // chunk of padding only
          const double scale = std::exp(double(mc) - M);
          L += double(partials_.l[size_t(c * heads + h)]) * scale;
          const float* v = partials_.v + int64_t(c) * D + h * d;
          for (int64_t j = 0; j < d; ++j) acc[size_t(j)] += double(v[j]) * scale;
        }
        const double denom = L + double(denominator_extra) * std::exp(-M);
        for (int64_t j = 0; j < d; ++j) {
          double value = acc[size_t(j)] / denom;
          if (scale_by != nullptr) value *= scale_by[b * D + h * d + j];
          o[h * d + j] = static_cast<float>(value);
        }
      }
    }
  });
}

void CpuOps::query_pool(const BatchRef&, const Mat& scores, const Mat& q, Mat pq) {
  pool_chunks(config_.num_attention_heads, f(scores.data), scores.ld, q);
  combine(config_.num_attention_heads, pq, nullptr, 0.0f);
}

void CpuOps::key_pool(const BatchRef& ref, const Mat& k, const Mat& pq, const WeightRef& key_att,
                      Mat pk) {
  const RaggedBatch& batch = *batch_;
  const int64_t D = config_.hidden_size, H = config_.num_attention_heads;
  const float* wka = f(key_att.weight);
  const float* bka = f(key_att.bias);
  float* r = token_scores_;
  // r_t = (K_t * pq) Wka'^T + bka' for every token (padding too; it is masked below): the
  // product K_t * pq in a row buffer, then H dot products. H is small (a GEMM with so few
  // output columns runs far below its peak).
  pool_.parallel_for(ref.num_tokens, kRowGrain, [&](int64_t begin, int64_t end) {
    std::vector<float> p(static_cast<size_t>(D));
    int32_t b = sequence_of(batch, begin);
    for (int64_t t = begin; t < end; ++t) {
      while (batch.cu_seqlens[size_t(b) + 1] <= t) ++b;
      multiply_rows(row(k, t), row(pq, b), p.data(), D);
      for (int64_t h = 0; h < H; ++h) r[t * H + h] = dot(p.data(), wka + h * D, D) + bka[h];
    }
  });
  // pk_h = pq_h * sum_t b_{t,h} K_{t,h-slice}: P = K * pq is never stored.
  pool_chunks(H, r, H, k);
  combine(H, pk, f(pq.data), 0.0f);
}

void CpuOps::mix(const BatchRef& ref, const Mat& q, const Mat& pk, Mat u) {
  const RaggedBatch& batch = *batch_;
  const int64_t D = config_.hidden_size;
  pool_.parallel_for(ref.num_tokens, kRowGrain, [&](int64_t begin, int64_t end) {
    int32_t b = sequence_of(batch, begin);
    for (int64_t t = begin; t < end; ++t) {
      while (batch.cu_seqlens[size_t(b) + 1] <= t) ++b;
      multiply_rows(row(q, t), row(pk, b), row(u, t), D);
    }
  });
}

void CpuOps::bias_residual_layernorm(const Mat& c, const void* bias, const Mat& residual,
                                     const void* gamma, const void* beta, double eps, Mat out) {
  const int64_t D = c.cols;
  pool_.parallel_for(c.rows, kRowGrain, [&](int64_t begin, int64_t end) {
    std::vector<float> sum(static_cast<size_t>(D));
    for (int64_t r = begin; r < end; ++r) {
      const float* cr = row(c, r);
      const float* rr = row(residual, r);
      for (int64_t j = 0; j < D; ++j) sum[size_t(j)] = cr[j] + f(bias)[j] + rr[j];
      layernorm_row(sum.data(), row(out, r), f(gamma), f(beta), D, float(eps));
    }
  });
}

void CpuOps::attention_pool(const BatchRef& ref, const Mat& e, const WeightRef& fc2, const Mat& x,
                            Mat pooled) {
  const int64_t D = config_.hidden_size;
  const float* w2 = f(fc2.weight);
  const float b2 = f(fc2.bias)[0];
  float* z = token_scores_;
  pool_.parallel_for(ref.num_tokens, kRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) z[t] = tanh_dot(row(e, t), w2, D) + b2;
  });
  // w_t = m_t exp(z_t) / (sum_u m_u exp(z_u) + 1e-8), as a stable softmax: the 1e-8 term
  // becomes 1e-8 exp(-M) after subtracting the max M, so results equal the reference.
  pool_chunks(1, z, 1, x);
  combine(1, pooled, nullptr, 1e-8f);
}

void CpuOps::l2_normalize(Mat rows) {
  for (int64_t r = 0; r < rows.rows; ++r) {
    float* x = row(rows, r);
    double sq = 0.0;
    for (int64_t j = 0; j < rows.cols; ++j) sq += double(x[j]) * x[j];
    const double norm = std::max(std::sqrt(sq), 1e-12);
    for (int64_t j = 0; j < rows.cols; ++j) x[j] = static_cast<float>(x[j] / norm);
  }
}

void CpuOps::download(const Mat& src, float* dst) {
  for (int64_t r = 0; r < src.rows; ++r) {
    std::memcpy(dst + r * src.cols, row(src, r), size_t(src.cols) * sizeof(float));
  }
}

}  // namespace fastformer::engine
