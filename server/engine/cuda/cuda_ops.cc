#include "server/engine/cuda/cuda_ops.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/kernels.h"
#include "server/engine/cuda/device.h"
#include "server/engine/cuda/gemm.h"
#include "server/engine/error.h"

namespace fastformer::engine::cuda {
namespace FF_OPS_NAMESPACE {
namespace {

namespace k = ::fastformer::kernels;
namespace rt = ::fastformer::engine::cuda::FF_OPS_NAMESPACE;  // device memory, streams

k::Act to_kernel(Activation act) {
  switch (act) {
    case Activation::kGeluErf: return k::Act::kGeluErf;
    case Activation::kGeluTanh: return k::Act::kGeluTanh;
    case Activation::kRelu: return k::Act::kRelu;
    case Activation::kSilu: return k::Act::kSilu;
  }
  return k::Act::kGeluErf;
}

template <class T>
StorageType storage_type();
template <>
StorageType storage_type<float>() { return StorageType::kF32; }
template <>
StorageType storage_type<ff_half>() { return StorageType::kF16; }
template <>
StorageType storage_type<ff_bfloat16>() { return StorageType::kBF16; }

// One device allocation carved into pieces, sized at start-up: nothing is allocated on
// the hot path.
class Arena {
 public:
  explicit Arena(size_t bytes) : base_(static_cast<char*>(device_malloc(bytes))), size_(bytes) {}
  ~Arena() { device_free(base_); }
  void* take(size_t bytes) {
    const size_t aligned = (bytes + 255) / 256 * 256;
    if (used_ + aligned > size_) throw EngineError("CUDA engine workspace exhausted (batch over max_batch_tokens)");
    void* p = base_ + used_;
    used_ += aligned;
    return p;
  }
  void reset(size_t to = 0) { used_ = to; }
  size_t used() const { return used_; }
  size_t size() const { return size_; }

 private:
  char* base_;
  size_t size_, used_ = 0;
};

template <class T>
class CudaOps final : public Ops {
 public:
  CudaOps(const ModelConfig& config, int64_t num_labels, const CudaOpsOptions& options, size_t device_total)
      : config_(config),
        device_total_(device_total),
        max_tokens_(options.max_batch_tokens),
        stream_(create_stream()),
        gemm_(storage_type<T>(), options.allow_tf32, stream_),
        batch_buffers_(batch_bytes(config, options.max_batch_tokens)),
        workspace_(workspace_bytes(config, num_labels, options.max_batch_tokens)) {
    const size_t T_max = size_t(max_tokens_);
    token_seq_ = take<int32_t>(T_max);
    token_ids_ = take<int32_t>(T_max);
    embedding_index_ = take<int32_t>(T_max);
    position_ids_ = take<int32_t>(T_max);
    cu_seqlens_ = take<int32_t>(T_max + 1);
    chunk_begin_ = take<int32_t>(T_max);
    chunk_end_ = take<int32_t>(T_max);
    seq_first_chunk_ = take<int32_t>(T_max + 1);
    mask_ = take<uint8_t>(T_max);
    input_embeddings_ = take<float>(T_max * size_t(config.hidden_size));
    const size_t H = size_t(config.num_attention_heads), D = size_t(config.hidden_size);
    partials_.m = take<float>(T_max * H);
    partials_.l = take<float>(T_max * H);
    partials_.v = take<float>(T_max * D);
    scores_ = take<float>(T_max * H);
    download_staging_ = take<float>(T_max * D);
    host_staging_bytes_ = T_max * (D * sizeof(float) + 64);
    host_staging_ = static_cast<char*>(pinned_malloc(host_staging_bytes_));
  }

  ~CudaOps() override {
    rt::synchronize(stream_);
    for (void* p : uploads_) device_free(p);
    pinned_free(host_staging_);
    destroy_stream(stream_);
  }

  size_t element_size() const override { return sizeof(T); }

  const void* upload(std::span<const float> host) override {
    // float32 goes up through the staging buffer and is converted on the device, once.
    T* dst = static_cast<T*>(device_malloc(std::max<size_t>(host.size(), 1) * sizeof(T)));
    uploads_.push_back(dst);
    weight_bytes_ += std::max<size_t>(host.size(), 1) * sizeof(T);
    float* staging = static_cast<float*>(device_malloc(std::max<size_t>(host.size(), 1) * sizeof(float)));
    copy_to_device_async(staging, host.data(), host.size() * sizeof(float), stream_);
    k::launch_from_float<T>(staging, int64_t(host.size()), dst, stream_);
    check_launch("from_float");
    rt::synchronize(stream_);
    device_free(staging);
    return dst;
  }

  void* scratch(size_t elements) override { return workspace_.take(elements * sizeof(T)); }
  void reset_scratch() override { workspace_.reset(); }

  k::BatchArgs args() const { return args_; }

  BatchRef begin_batch(const RaggedBatch& batch) override {
    const int32_t T_count = batch.num_tokens(), B = batch.num_sequences();
    if (T_count > max_tokens_) {
      throw EngineError("batch of " + std::to_string(T_count) + " tokens exceeds the CUDA engine's buffers (" +
                        std::to_string(max_tokens_) + ")");
    }
    // Host-side metadata: sequence of each token and the pooling chunks.
    token_seq_host_.resize(size_t(T_count));
    chunk_begin_host_.clear();
    chunk_end_host_.clear();
    seq_first_chunk_host_.assign(1, 0);
    for (int32_t b = 0; b < B; ++b) {
      const int32_t begin = batch.cu_seqlens[size_t(b)], end = batch.cu_seqlens[size_t(b) + 1];
      std::fill(token_seq_host_.begin() + begin, token_seq_host_.begin() + end, b);
      for (int32_t t = begin; t < end; t += k::kChunkTokens) {
        chunk_begin_host_.push_back(t);
        chunk_end_host_.push_back(std::min(t + k::kChunkTokens, end));
      }
      seq_first_chunk_host_.push_back(int32_t(chunk_begin_host_.size()));
    }
    auto up = [&](void* dst, const void* src, size_t bytes) {
      if (bytes > 0) copy_to_device_async(dst, src, bytes, stream_);
    };
    up(token_seq_, token_seq_host_.data(), token_seq_host_.size() * 4);
    up(token_ids_, batch.token_ids.data(), batch.token_ids.size() * 4);
    up(embedding_index_, batch.embedding_index.data(), batch.embedding_index.size() * 4);
    up(position_ids_, batch.position_ids.data(), batch.position_ids.size() * 4);
    up(cu_seqlens_, batch.cu_seqlens.data(), batch.cu_seqlens.size() * 4);
    up(chunk_begin_, chunk_begin_host_.data(), chunk_begin_host_.size() * 4);
    up(chunk_end_, chunk_end_host_.data(), chunk_end_host_.size() * 4);
    up(seq_first_chunk_, seq_first_chunk_host_.data(), seq_first_chunk_host_.size() * 4);
    up(mask_, batch.mask.data(), batch.mask.size());
    up(input_embeddings_, batch.input_embeddings.data(), batch.input_embeddings.size() * sizeof(float));
    // The host vectors above stay untouched until the next begin_batch, which comes after
    // this batch's synchronize(), so the asynchronous copies read stable memory.
    args_ = k::BatchArgs{T_count,          B,           cu_seqlens_, token_seq_,
                         token_ids_,       embedding_index_, position_ids_, mask_,
                         input_embeddings_, int32_t(chunk_begin_host_.size()), chunk_begin_, chunk_end_,
                         seq_first_chunk_};
    return BatchRef{B, T_count, batch.max_seq_len};
  }

  void embed(const BatchRef&, const void* word_embedding, const void* position_embeddings, const void* ln_gamma,
             const void* ln_beta, double eps, Mat x) override {
    k::launch_embedding_layernorm<T>(args_, t(word_embedding), t(position_embeddings), t(ln_gamma), t(ln_beta),
                                     float(eps), D(), t(x.data), stream_);
    check_launch("embedding_layernorm");
  }

  void linear(const Mat& a, const WeightRef& w, Mat c, Epilogue epilogue, Activation act) override {
    gemm_.run(a.data, a.ld, w.weight, a.rows, w.out, w.in, c.data, c.ld, epilogue == Epilogue::kAccumulate);
    if (epilogue == Epilogue::kBias || epilogue == Epilogue::kBiasAct) {
      k::launch_bias_activation<T>(t(c.data), c.ld, t(w.bias), int32_t(c.rows), int32_t(w.out),
                                   epilogue == Epilogue::kBiasAct, to_kernel(act), stream_);
      check_launch("bias_activation");
    }
  }

  void query_pool(const BatchRef&, const Mat& scores, const Mat& q, Mat pq) override {
    k::launch_pool_partials<T, T>(args_, t(scores.data), scores.ld, H(), t(q.data), q.ld, D(), partials_, stream_);
    k::launch_pool_combine<T>(args_, partials_, H(), D(), nullptr, 0.0f, t(pq.data), stream_);
    check_launch("query pooling");
  }

  void key_pool(const BatchRef&, const Mat& key, const Mat& pq, const WeightRef& key_att, Mat pk) override {
    k::launch_key_scores<T>(args_, t(key.data), key.ld, t(pq.data), t(key_att.weight), t(key_att.bias), H(), D(),
                            scores_, stream_);
    k::launch_pool_partials<T, float>(args_, scores_, H(), H(), t(key.data), key.ld, D(), partials_, stream_);
    k::launch_pool_combine<T>(args_, partials_, H(), D(), t(pq.data), 0.0f, t(pk.data), stream_);
    check_launch("key pooling");
  }

  void mix(const BatchRef&, const Mat& q, const Mat& pk, Mat u) override {
    k::launch_mix<T>(args_, t(q.data), q.ld, t(pk.data), D(), t(u.data), u.ld, stream_);
    check_launch("mix");
  }

  void bias_residual_layernorm(const Mat& c, const void* bias, const Mat& residual, const void* gamma,
                               const void* beta, double eps, Mat out) override {
    k::launch_bias_residual_layernorm<T>(t(c.data), c.ld, t(bias), t(residual.data), residual.ld, t(gamma), t(beta),
                                         float(eps), int32_t(c.rows), int32_t(c.cols), t(out.data), out.ld, stream_);
    check_launch("bias_residual_layernorm");
  }

  void attention_pool(const BatchRef&, const Mat& e, const WeightRef& fc2, const Mat& x, Mat pooled) override {
    k::launch_pooler_scores<T>(args_, t(e.data), e.ld, t(fc2.weight), t(fc2.bias), D(), scores_, stream_);
    k::launch_pool_partials<T, float>(args_, scores_, 1, 1, t(x.data), x.ld, D(), partials_, stream_);
    k::launch_pool_combine<T>(args_, partials_, 1, D(), nullptr, 1e-8f, t(pooled.data), stream_);
    check_launch("attention pooler");
  }

  void l2_normalize(Mat rows) override {
    k::launch_l2_normalize<T>(t(rows.data), int32_t(rows.rows), int32_t(rows.cols), stream_);
    check_launch("l2_normalize");
  }

  void download(const Mat& src, float* dst) override {
    const size_t bytes = size_t(src.rows * src.cols) * sizeof(float);
    if (bytes == 0) return;
    k::launch_to_float<T>(t(src.data), src.ld, int32_t(src.rows), int32_t(src.cols), download_staging_, stream_);
    check_launch("to_float");
    if (bytes <= host_staging_bytes_) {
      copy_to_host_async(host_staging_, download_staging_, bytes, stream_);
      rt::synchronize(stream_);
      std::memcpy(dst, host_staging_, bytes);
    } else {
      copy_to_host_async(dst, download_staging_, bytes, stream_);
      rt::synchronize(stream_);
    }
  }

  void synchronize() override { rt::synchronize(stream_); }

  std::pair<size_t, size_t> device_memory() const override {
    return {weight_bytes_ + batch_buffers_.size() + workspace_.size() + kGemmWorkspaceBytes, device_total_};
  }

 private:
  static size_t batch_bytes(const ModelConfig& c, int64_t tokens) {
    const size_t T_max = size_t(tokens), H = size_t(c.num_attention_heads), D = size_t(c.hidden_size);
    return T_max * (8 * 4 + 1) + 3 * 4 + T_max * D * 4 * 3 + T_max * H * 4 * 3 + 16 * 256;
  }
  static size_t workspace_bytes(const ModelConfig& c, int64_t labels, int64_t tokens) {
    const int64_t D = c.hidden_size, H = c.num_attention_heads, I = c.intermediate_size;
    const int64_t per_token = D + (2 * D + H) + D + I + 3 * D + std::max({D, labels, int64_t{64}});
    return size_t(tokens * per_token) * sizeof(T) + 16 * 256;
  }
  template <class U>
  U* take(size_t count) {
    return static_cast<U*>(batch_buffers_.take(std::max<size_t>(count, 1) * sizeof(U)));
  }
  static T* t(void* p) { return static_cast<T*>(p); }
  static const T* t(const void* p) { return static_cast<const T*>(p); }
  int32_t D() const { return int32_t(config_.hidden_size); }
  int32_t H() const { return int32_t(config_.num_attention_heads); }

  static constexpr size_t kGemmWorkspaceBytes = 32u << 20;  // cuBLASLt's, see gemm_cublaslt.cc
  const ModelConfig config_;
  const size_t device_total_;
  size_t weight_bytes_ = 0;
  const int64_t max_tokens_;
  ff_stream_t stream_;
  Gemm gemm_;
  Arena batch_buffers_;  // batch metadata, partials, scores, staging: fixed pieces
  Arena workspace_;      // per-batch activations, reset every batch
  std::vector<void*> uploads_;
  char* host_staging_ = nullptr;
  size_t host_staging_bytes_ = 0;
  int32_t *token_seq_, *token_ids_, *embedding_index_, *position_ids_, *cu_seqlens_, *chunk_begin_, *chunk_end_,
      *seq_first_chunk_;
  uint8_t* mask_;
  float *input_embeddings_, *scores_, *download_staging_;
  k::Partials partials_;
  k::BatchArgs args_;
  std::vector<int32_t> token_seq_host_, chunk_begin_host_, chunk_end_host_, seq_first_chunk_host_;
};

}  // namespace

std::unique_ptr<Ops> make_cuda_ops(const Model& model, const CudaOpsOptions& options, std::string* device_name,
                                   std::string* why) {
  const DeviceInfo info = probe_device(options.device);
  if (!info.usable) {
    if (why) *why = info.why;
    return nullptr;
  }
  set_device(options.device);
  if (device_name) *device_name = info.name;
  const ModelConfig& c = model.config();
  if (options.dtype == "float32") return std::make_unique<CudaOps<float>>(c, model.num_labels(), options, info.total_bytes);
  if (options.dtype == "float16") return std::make_unique<CudaOps<ff_half>>(c, model.num_labels(), options, info.total_bytes);
  if (options.dtype == "bfloat16") return std::make_unique<CudaOps<ff_bfloat16>>(c, model.num_labels(), options, info.total_bytes);
  throw EngineError("dtype " + options.dtype + ": expected float32, float16 or bfloat16");
}

}  // namespace FF_OPS_NAMESPACE
}  // namespace fastformer::engine::cuda
