// The CPU implementation of Ops: GEMMs on a GemmBackend (gemm_backend.h: oneDNN, or the
// hand-written AMX kernel), element-wise and reduction passes fused per row (vector_rows.h) and
// spread over a thread pool. In float32 it is also the oracle every CUDA
// kernel is tested against.
//
// float32: float32 buffers, oneDNN primitives with a runtime row count over the weights in
// place. bfloat16: every buffer of the plan in bfloat16 (the ops that feed a GEMM write its
// input in bfloat16, so no rounding pass remains), statistics (LayerNorm, softmax, pooling
// sums) in float32; GEMMs on PackedMatmul (packed weights, fixed-M primitives for AMX or
// AVX512_BF16), float32 accumulation, bfloat16 results. The parameters that are not GEMM
// weights (embeddings, LayerNorm, biases, the key-attention and pooler-score vectors) stay
// float32.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "server/engine/cpu/amx_gemm.h"
#include "server/engine/cpu/gemm_backend.h"
#include "server/engine/cpu/onednn_gemm.h"
#include "server/engine/cpu/thread_pool.h"
#include "server/engine/cpu/vector_rows.h"
#include "server/engine/ops.h"
#include "server/engine/ops_report.h"

namespace fastformer::engine {

enum class CpuDtype {
  kFloat32,
  kBfloat16,          ///< the caller checks cpu_gemm_info().has_bf16 first
  kBfloat16Emulated,  ///< bfloat16 buffers over float32 GEMMs (PackedMatmul::Shape::emulate): tests
};

// Who runs the bfloat16 GEMMs: oneDNN (PackedGemm), the hand-written AMX kernel (AmxGemm,
// gemm_backend.h) on the tiles or on their portable model (tests, any CPU), or the faster of
// the two per shape, by measurement at load (AutoGemm, on the tiles). The AMX kernel takes the
// shapes it supports (K a multiple of 32); oneDNN keeps the others.
enum class Bf16Gemm { kOnednn, kAmx, kAmxModel, kAuto };

// The rule that turns --cpu-gemm (`requested`: "auto", "onednn" or "amx") into a Bf16Gemm for a
// CPU engine of `dtype`: float32 is always oneDNN; `amx_why` is empty where the AMX kernel may
// run on the tiles, else why not (amx_available's reason): then auto is oneDNN and amx is
// refused, both saying why in `note` (the device string's tail, and so the load's log);
// `tile_model` (FASTFORMER_AMX_TILES=model, tests) runs the kernel on the tile model. The one
// place the rule is written (engine.cc calls it).
Bf16Gemm pick_bf16_gemm(std::string_view requested, CpuDtype dtype, const std::string& amx_why,
                        bool tile_model, std::string* note);

// The last-level cache the CPU's first core shares with others (Linux's sysfs: the size of
// its highest-level data or unified cache), which sizes the CPU engine's passes
// (pass_tokens, workspace.h); 0 where sysfs does not say. Not sysconf(_SC_LEVEL3_CACHE_SIZE):
// on AMD glibc reports the whole package's L3 there (384 MiB on a Zen 5 guest whose cores
// share 32).
size_t last_level_cache_bytes(const std::string& sysfs_cpu = "/sys/devices/system/cpu/cpu0");

// Whether the CPU engine's attention (Ops::attention) runs sequence by sequence for a batch of
// these sequences (offsets [B+1]) on `threads` workers: where whole sequences balance over them,
// the longest at most a quarter of a worker's share of the tokens (the last to finish then waits
// at most about that long); else the three ops in turn, each over every pooling chunk.
bool attention_by_sequence(std::span<const int32_t> cu_seqlens, int threads);

class CpuOps final : public Ops, public OpsReport {
 public:
  // `threads` workers share every pass.
  CpuOps(int threads, const ModelConfig& config, CpuDtype dtype = CpuDtype::kFloat32,
         Bf16Gemm bf16_gemm = Bf16Gemm::kOnednn);

  size_t element_size() const override { return bf16_ ? sizeof(uint16_t) : sizeof(float); }
  size_t uploaded_element_size() const override { return sizeof(float); }  // used in place
  const void* upload(std::span<const float> host) override;
  void reserve(const WorkspacePlan& largest) override;
  void prefault(size_t bytes) override;  // touches the pages (the arena is left untouched)
  void* workspace() override { return arena_.get(); }
  BatchRef begin_batch(const RaggedBatch& batch, const WorkspacePlan& plan,
                       const PoolingChunks& chunks, uint64_t staged) override;
  void embed(const BatchRef& batch, const void* word_embedding, const void* position_embeddings,
             const void* ln_gamma, const void* ln_beta, double eps, Mat x) override;
  void linear(const Mat& a, const WeightRef& w, Mat c, Epilogue epilogue, Activation act) override;
  void query_pool(const BatchRef& batch, const Mat& scores, const Mat& q, Mat pq) override;
  void key_pool(const BatchRef& batch, const Mat& k, const Mat& pq, const WeightRef& key_att,
                Mat pk) override;
  void mix(const BatchRef& batch, const Mat& q, const Mat& pk, Mat u) override;
  // Sequence by sequence where the batch's sequences balance over the pool (query pool, key
  // pool and mix of one sequence in turn, its Q and K read again from the caches); else the
  // three ops in turn.
  void attention(const BatchRef& batch, const Mat& scores, const Mat& q, const Mat& k,
                 const WeightRef& key_att, Mat pq, Mat pk, Mat u) override;
  bool attention_in_one_pass() const override { return true; }
  void bias_residual_layernorm(const Mat& c, const void* bias, const Mat& residual,
                               const void* gamma, const void* beta, double eps, Mat out) override;
  void attention_pool(const BatchRef& batch, const Mat& e, const WeightRef& fc2, const Mat& x,
                      Mat pooled) override;
  Mat span_pool(const BatchRef& batch, const PoolingChunks& spans, SpanPooling mode,
                const Mat& x) override;
  void l2_normalize(Mat rows) override;
  void download(const Mat& src, float* dst) override;
  void synchronize() override {}
  // The wall clock: every op has finished when its call returns.
  void reserve_timers(int count) override {
    if (timers_.size() < size_t(count)) timers_.resize(size_t(count));
  }
  void timestamp(int index) override {
    timers_.at(size_t(index)) = std::chrono::steady_clock::now();
  }
  double elapsed_ms(int from, int to) override {
    return std::chrono::duration<double, std::milli>(timers_.at(size_t(to)) -
                                                     timers_.at(size_t(from)))
        .count();
  }
  SpeedCheck speed_check() override;
  std::string gemm_kernel(const WeightRef& w) const override;
  size_t packed_weight_bytes() const override;

 private:
  // Online-softmax partials of every chunk, per head: running max m [chunks, H], sum l
  // [chunks, H], and the weighted value vector v [chunks, D] (head h owns columns
  // h*d .. h*d+d-1), at the plan's offsets in the workspace.
  struct Partials {
    float *m = nullptr, *l = nullptr, *v = nullptr;
  };
  // The ops in the buffers' element type E (float, or uint16_t holding bfloat16).
  template <class E>
  void embed_rows(const BatchRef& batch, const float* word, const float* pos, const float* gamma,
                  const float* beta, float eps, Mat x);
  template <class E>
  void key_pool_rows(const BatchRef& batch, const Mat& k, const Mat& pq, const WeightRef& key_att,
                     Mat pk);
  template <class E>
  void mix_rows(const BatchRef& batch, const Mat& q, const Mat& pk, Mat u);
  template <class E>
  void attention_rows(const Mat& scores, const Mat& q, const Mat& k, const WeightRef& key_att,
                      Mat pq, Mat pk, Mat u);
  template <class E>
  void layernorm_rows(const Mat& c, const float* bias, const Mat& residual, const float* gamma,
                      const float* beta, float eps, Mat out);
  template <class E>
  void attention_pool_rows(const BatchRef& batch, const Mat& e, const WeightRef& fc2, const Mat& x,
                           Mat pooled);
  template <class E>
  void l2_normalize_rows(Mat rows);
  template <class E>
  void download_rows(const Mat& src, float* dst);
  // How chunk partials become one row per sequence (or span): out_b = v / (L + extra *
  // exp(-M)), times scale_by's row b where given ([B, D] dense, in E).
  template <class E>
  struct Combine {
    int64_t heads;
    Mat out;
    const E* scale_by = nullptr;
    float denominator_extra = 0.0f;
  };
  // Scores (S: float, or E) are per (token, head) in `scores` ([T, heads], ld score_ld);
  // values [T, D] in E.
  // `chunks` and `partials`: the batch's (chunks_, partials_) or a span plan's. A sequence of
  // one chunk is combined by the worker that pooled it (finish_single); combine() then does
  // the sequences of several chunks, in a pass of its own only when there are any.
  // `score_chunk(begin, len)`, where given, writes the chunk's scores just before it is pooled
  // and leaves its value rows in cache (the pooler's tanh scores), so they are not fetched ahead.
  template <class S, class E>
  void pool_chunks(const S* scores, int64_t score_ld, const Mat& values,
                   const PoolingChunks& chunks, const Partials& partials, const Combine<E>& how,
                   const std::function<void(int32_t, int64_t)>& score_chunk = {});
  // Chunk c of `chunks` pooled into its partials: its scores [len, heads] at `chunk_scores`
  // (row stride score_ld), its value rows those of `values` (vector_rows.h, pool_chunk).
  template <class E, class S>
  void pool_one_chunk(const S* chunk_scores, int64_t score_ld, const Mat& values,
                      const PoolingChunks& chunks, const Partials& partials, int64_t heads,
                      int64_t c, std::vector<float>& scratch, bool values_cached) const;
  template <class E>
  void combine(const Combine<E>& how, const PoolingChunks& chunks, const Partials& partials);
  template <class E>
  void combine_sequence(const Combine<E>& how, int64_t b, const PoolingChunks& chunks,
                        const Partials& partials, double* acc) const;
  template <class E>
  void finish_single(const Combine<E>& how, int64_t chunk, const PoolingChunks& chunks,
                     const Partials& partials) const;
  template <class E>
  void span_pool_rows(const PoolingChunks& spans, SpanPooling mode, const Mat& x, Mat out,
                      const Partials& partials);

  const ModelConfig config_;
  const CpuDtype dtype_;
  const bool bf16_;      // bfloat16 buffers (kBfloat16 or kBfloat16Emulated)
  const rows::Isa isa_;  // the row passes' build (vector_rows.h)
  // bfloat16 key scores on VDPBF16PS (rows::key_scores_pairs): the instruction where the CPU
  // has it, its model in the tests' emulated bfloat16 elsewhere; none for float32 or a head
  // count that its padding (key_heads) does not bring to a multiple of 16.
  const std::optional<rows::DotBf16> key_dot_;
  ThreadPool pool_;
  // Every GEMM (linear): float32 on OnednnGemm, bfloat16 on PackedGemm or AmxGemm per the
  // constructor's Bf16Gemm (cpu_ops.cc, make_gemm_backend). After pool_, which it runs on.
  const std::unique_ptr<GemmBackend> gemm_;
  // The key scores' weight, made on first use: Wka, Wka^T and the bias, padded with zero heads
  // to the kernels' head count (key_heads in cpu_ops.cc: base-long's 12 heads run as 16).
  struct KeyAtt {
    std::vector<float> wka, wka_t, bias;
  };
  std::map<const void*, KeyAtt> key_att_;
  const KeyAtt& key_att(const WeightRef& key_att);  // made on first use
  // A worker's key pool buffers: its sequence's weight (float32, or bfloat16 pairs with
  // key_dot_), the sequence it was formed for, and the chunk's scores.
  struct KeyPoolWorker {
    std::vector<float> weight, pq_row, scratch, scores;
    std::vector<uint32_t> pairs;
    int32_t formed = -1;
  };
  template <class E>
  void key_pool_chunk(const KeyAtt& att, const Mat& k, const Mat& pq, int64_t chunk,
                      KeyPoolWorker& worker) const;
  // The workspace, sized at start-up, kWorkspaceAlignment-aligned.
  struct AlignedDelete {
    void operator()(std::byte* p) const {
      ::operator delete (p, std::align_val_t{kWorkspaceAlignment});
    }
  };
  std::unique_ptr<std::byte, AlignedDelete> arena_;
  size_t reserved_bytes_ = 0;  // the arena's size

  // The current batch, as begin_batch received it.
  const RaggedBatch* batch_ = nullptr;
  const PoolingChunks* chunks_ = nullptr;
  Partials partials_;
  std::vector<int32_t> several_chunks_;  // combine()'s sequences of several chunks
  // span_pool's memory, per mode: the chunks' partials and the [spans, D] result.
  struct SpanMemory {
    std::vector<float> m, l, v;
    std::vector<uint8_t> out;
  };
  SpanMemory span_memory_[2];
  bool attention_by_sequence_ = false;  // attention_by_sequence() of the current batch
  float* token_scores_ = nullptr;       // [T, H] key scores r, or [T] pooler scores z
  std::vector<std::chrono::steady_clock::time_point> timers_;  // the profile's timestamps
};

}  // namespace fastformer::engine
