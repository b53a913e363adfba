#include "server/engine/cuda/cuda_ops.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#if !defined(FF_EMULATION)
#include <cuda_runtime.h>
#endif

#include "kernels/kernels.h"
#include "server/engine/cuda/gemm.h"
#include "server/engine/error.h"
#include "server/engine/ops_report.h"

namespace fastformer::engine::cuda {
namespace FF_KERNELS_ABI {
namespace {

namespace k = ::fastformer::kernels;

// Device memory, streams and copies are kernels/runtime.h's ff_* calls: the CUDA runtime, or
// the emulator's exact-size, NaN-filled, range-checked host allocations. They throw
// std::runtime_error; ForwardEngine reports it as EngineError.

struct DeviceInfo {
  bool usable = false;  ///< a device exists and a context could be made on it (now current)
  std::string name;     ///< e.g. "NVIDIA H200" or "host emulation"
  std::string why;      ///< why not usable (no driver, no device, ...)
  size_t total_bytes = 0;
  int major = 0, minor = 0;  ///< compute capability (the emulation's: sm_90's limits)
};

// Asks the driver about device `ordinal` without failing when there is no GPU or driver,
// and makes it the calling thread's device.
#if defined(FF_EMULATION)
DeviceInfo probe_device(int) { return DeviceInfo{true, "host emulation", "", 0, 9, 0}; }
#else
DeviceInfo probe_device(int ordinal) {
  DeviceInfo info;
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    info.why = std::string("no usable CUDA driver or device (") + cudaGetErrorString(err) + ")";
    cudaGetLastError();  // clear the sticky error
    return info;
  }
  if (ordinal >= count) {
    info.why =
        "device " + std::to_string(ordinal) + " requested, " + std::to_string(count) + " present";
    return info;
  }
  cudaDeviceProp prop{};
  size_t free_bytes = 0;
  if (cudaGetDeviceProperties(&prop, ordinal) != cudaSuccess ||
      cudaSetDevice(ordinal) != cudaSuccess ||
      cudaMemGetInfo(&free_bytes, &info.total_bytes) != cudaSuccess) {
    info.why = "device " + std::to_string(ordinal) + " present but no context could be created";
    cudaGetLastError();
    return info;
  }
  info.usable = true;
  info.name = prop.name;
  info.major = prop.major;
  info.minor = prop.minor;
  return info;
}
#endif

k::Act to_kernel(Activation act) {
  switch (act) {
    case Activation::kGeluErf:
      return k::Act::kGeluErf;
    case Activation::kGeluTanh:
      return k::Act::kGeluTanh;
    case Activation::kRelu:
      return k::Act::kRelu;
    case Activation::kSilu:
      return k::Act::kSilu;
  }
  return k::Act::kGeluErf;
}

// The epilogue computing bias + `act`, kStore where the GEMM has none (`gelu_erf`: the Gemm's
// has_gelu_erf()).
GemmEpilogue gemm_activation(Activation act, bool gelu_erf) {
  switch (act) {
    case Activation::kRelu:
      return GemmEpilogue::kBiasRelu;
    case Activation::kGeluTanh:
      return GemmEpilogue::kBiasGeluTanh;  // cuBLASLt's GELU is the tanh form
    case Activation::kGeluErf:
      return gelu_erf ? GemmEpilogue::kBiasGeluErf : GemmEpilogue::kStore;
    case Activation::kSilu:
      return GemmEpilogue::kStore;
  }
  return GemmEpilogue::kStore;
}

// Copies `count` floats and says whether all are finite: one pass over bytes the copy reads
// anyway, so every output is checked for the cost of the copy.
bool copy_finite(const float* src, float* dst, size_t count) {
  uint32_t non_finite = 0;
  for (size_t i = 0; i < count; ++i) {
    const uint32_t bits = std::bit_cast<uint32_t>(src[i]);
    dst[i] = src[i];
    non_finite |= uint32_t((bits & 0x7f800000u) == 0x7f800000u);  // exponent all ones: inf or NaN
  }
  return non_finite == 0;
}

// A batch whose outputs are not finite fails (its requests get this error, the server keeps
// serving): in float16 it is an activation past 65504, which bfloat16 and float32 hold; in
// any dtype NaN or infinity is never returned as if it were an embedding.
template <class T>
std::string non_finite_outputs() {
  if constexpr (std::is_same_v<T, ff_half>) {
    return "the batch's outputs are not finite: the model overflows float16 (an activation beyond "
           "65504); "
           "serve it in bfloat16 or float32 (--dtype)";
  } else {
    return std::string("the batch's outputs are not finite (NaN or infinity) in ") +
           (std::is_same_v<T, float> ? "float32" : "bfloat16") +
           ": the model's activations overflow or its weights are not finite";
  }
}

template <class T>
StorageType storage_type();
template <>
StorageType storage_type<float>() {
  return StorageType::kF32;
}
template <>
StorageType storage_type<ff_half>() {
  return StorageType::kF16;
}
template <>
StorageType storage_type<ff_bfloat16>() {
  return StorageType::kBF16;
}

// The profile's timestamps (Ops::reserve_timers), made as the profile needs more: CUDA
// events recorded on the stream, read after the batch's synchronize. The emulation runs each
// launch as it is issued, so there the host clock stands in for the events.
class Timers {
 public:
  Timers() = default;
  Timers(const Timers&) = delete;
  Timers& operator=(const Timers&) = delete;
  ~Timers() { clear(); }

#if defined(FF_EMULATION)
  void reserve(int count) {
    if (times_.size() < size_t(count)) times_.resize(size_t(count));
  }
  void record(int index, ff_stream_t) {
    times_.at(size_t(index)) = std::chrono::steady_clock::now();
  }
  double elapsed_ms(int from, int to) const {
    return std::chrono::duration<double, std::milli>(times_.at(size_t(to)) -
                                                     times_.at(size_t(from)))
        .count();
  }

 private:
  void clear() { times_.clear(); }
  std::vector<std::chrono::steady_clock::time_point> times_;
#else
  void reserve(int count) {  // keeps the events already recorded
    events_.reserve(size_t(count));
    for (int i = int(events_.size()); i < count; ++i) {
      cudaEvent_t event = nullptr;
      ff_check(cudaEventCreate(&event), "cudaEventCreate");
      events_.push_back(event);
    }
  }
  void record(int index, ff_stream_t stream) {
    ff_check(cudaEventRecord(events_.at(size_t(index)), stream), "cudaEventRecord");
  }
  double elapsed_ms(int from, int to) const {
    float ms = 0;
    ff_check(cudaEventElapsedTime(&ms, events_.at(size_t(from)), events_.at(size_t(to))),
             "cudaEventElapsedTime");
    return ms;
  }

 private:
  void clear() {
    for (cudaEvent_t event : events_) (void)cudaEventDestroy(event);
    events_.clear();
  }
  std::vector<cudaEvent_t> events_;
#endif
};

// A copy's completion, for a stream to wait on: a CUDA event without timing; nothing in the
// emulation, whose copies are done when issued.
class CopyEvent {
 public:
#if defined(FF_EMULATION)
  CopyEvent() = default;
  void record(ff_stream_t) {}
  void wait(ff_stream_t) {}
  void synchronize() {}
#else
  CopyEvent() {
    ff_check(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreate");
  }
  ~CopyEvent() { (void)cudaEventDestroy(event_); }
  void record(ff_stream_t stream) { ff_check(cudaEventRecord(event_, stream), "cudaEventRecord"); }
  void wait(ff_stream_t stream) {
    ff_check(cudaStreamWaitEvent(stream, event_, 0), "cudaStreamWaitEvent");
  }
  void synchronize() { ff_check(cudaEventSynchronize(event_), "cudaEventSynchronize"); }

 private:
  cudaEvent_t event_ = nullptr;
#endif
  CopyEvent(const CopyEvent&) = delete;
  CopyEvent& operator=(const CopyEvent&) = delete;
};

// Where a batch's inputs lie in an input slot, 16-byte aligned, in the order they are packed:
// the sizes are the batch's (T tokens, B sequences, C chunks), so one copy moves only them.
struct InputLayout {
  size_t token_seq = 0, token_ids = 0, embedding_index = 0, position_ids = 0, cu_seqlens = 0,
         chunk_begin = 0, chunk_end = 0, seq_first_chunk = 0, mask = 0, bytes = 0;
};
InputLayout input_layout(size_t T, size_t B, size_t C) {
  InputLayout l;
  size_t at = 0;
  auto take = [&](size_t& offset, size_t bytes) {
    offset = at;
    at += (bytes + 15) / 16 * 16;
  };
  take(l.token_seq, T * 4);
  take(l.token_ids, T * 4);
  take(l.embedding_index, T * 4);
  take(l.position_ids, T * 4);
  take(l.cu_seqlens, (B + 1) * 4);
  take(l.chunk_begin, C * 4);
  take(l.chunk_end, C * 4);
  take(l.seq_first_chunk, (B + 1) * 4);
  take(l.mask, T);
  l.bytes = at;
  return l;
}

template <class T>
class CudaOps final : public Ops, public OpsReport {
 public:
  CudaOps(const ModelConfig& config, const CudaOpsOptions& options, const CudaOptIn& opt_in,
          size_t device_total)
      : config_(config),
        device_(options.device),
        device_total_(device_total),
        opt_in_(opt_in),
        stream_(ff_stream_create()),
        gemm_(GemmOptions{storage_type<T>(), options.allow_tf32, opt_in.cutlass_gelu,
                          opt_in.gemm_timing},
              stream_),
        gelu_erf_epilogue_(gemm_.has_gelu_erf()) {}

  // The opt-in kernels that run, and of those asked for, why any does not (CudaOpsChoice).
  std::string opt_in_note() const {
    std::string note;
    auto add = [&](const std::string& part) { note += (note.empty() ? "" : ", ") + part; };
    if (opt_in_.cutlass_gelu) {
      std::string why;
      add(gemm_.has_gelu_erf(&why) ? "cutlass-gelu" : "cutlass-gelu off: " + why);
    }
    if (opt_in_.fused_key_pool) add("fused-key-pool");
    if (opt_in_.gemm_timing) add("gemm-timing");
    if (opt_in_.cuda_graphs) add("cuda-graphs");
    return note;
  }

  OpsReport* report() override { return this; }
  SpeedCheck speed_check() override { return {}; }
  size_t packed_weight_bytes() const override { return 0; }
  // The plan of the GEMM over `w` (recorded at its first run): the kernel and how it was chosen.
  std::string gemm_kernel(const WeightRef& w) const override {
    const auto it = gemm_shapes_.find(w.weight);
    return it == gemm_shapes_.end() ? std::string() : gemm_.describe(it->second);
  }

  ~CudaOps() override {
    ff_stream_synchronize(stream_);
#if !defined(FF_EMULATION)
    for (auto& [key, graph] : graphs_)
      if (graph.exec != nullptr) (void)cudaGraphExecDestroy(graph.exec);
#endif
    ff_stream_synchronize(copy_stream_);
    for (InputSlot& slot : slots_) {
      ff_free(slot.device);
      ff_free_host(slot.host);
    }
    ff_stream_destroy(copy_stream_);
    for (void* p : uploads_) ff_free(p);
    for (SpanMemory& m : span_memory_) ff_free(m.memory);
    ff_free(memory_);
    ff_free_host(host_staging_);
    ff_stream_destroy(stream_);
  }

  size_t element_size() const override { return sizeof(T); }

  const void* upload(std::span<const float> host) override {
    // float32 goes up through the staging buffer and is converted on the device, once.
    T* dst = static_cast<T*>(ff_malloc(std::max<size_t>(host.size(), 1) * sizeof(T)));
    uploads_.push_back(dst);
    weight_bytes_ += std::max<size_t>(host.size(), 1) * sizeof(T);
    float* staging =
        static_cast<float*>(ff_malloc(std::max<size_t>(host.size(), 1) * sizeof(float)));
    ff_memcpy_async(staging, host.data(), host.size() * sizeof(float), ff_host_to_device, stream_);
    k::launch_from_float<T>(staging, int64_t(host.size()), dst, stream_);
    ff_check_launch("from_float");
    ff_stream_synchronize(stream_);
    ff_free(staging);
    return dst;
  }

  // One device allocation, sized here once: the workspace at offset 0, then the batch
  // metadata the kernels read and the download staging, for batches up to `largest`.
  void reserve(const WorkspacePlan& largest) override {
    const size_t T_max = size_t(largest.tokens), B_max = size_t(largest.sequences);
    const size_t chunks = size_t(largest.chunks), D = size_t(config_.hidden_size);
    const size_t staging = size_t(
        std::max(largest.x.rows * largest.x.cols, largest.logits.rows * largest.logits.cols));
    // The same list places the pieces twice: first from address 0 to learn the size, then
    // in the allocation.
    size_t used = 0;
    auto place = [&](char* base) {
      used = largest.bytes;
      auto take = [&]<class U>(U*& piece, size_t count) {
        piece = reinterpret_cast<U*>(reinterpret_cast<uintptr_t>(base) + used);  // base may be null
        used += (std::max<size_t>(count, 1) * sizeof(U) + kWorkspaceAlignment - 1) /
                kWorkspaceAlignment * kWorkspaceAlignment;
      };
      take(input_embeddings_, T_max * D);
      take(download_staging_, staging);
      take(zero_score_, 1);
    };
    place(nullptr);
    memory_ = static_cast<char*>(ff_malloc(used));
    memory_bytes_ = used;
    place(memory_);
    ff_memset_async(zero_score_, 0, sizeof(float), stream_);  // span_pool's kMean scores
    host_staging_bytes_ = staging * sizeof(float);
    host_staging_ = static_cast<char*>(ff_malloc_host(host_staging_bytes_));
    slot_bytes_ = input_layout(T_max, B_max, chunks).bytes;
    for (InputSlot& slot : slots_) {
      slot.host = static_cast<char*>(ff_malloc_host(slot_bytes_));
      slot.device = static_cast<char*>(ff_malloc(slot_bytes_));
      slot_device_bytes_ += slot_bytes_;
    }
    largest_ = largest;
    gemm_.set_max_rows(largest.tokens);  // every GEMM has T or B <= T rows
  }

  uint64_t stage(const RaggedBatch& batch, const PoolingChunks& chunks) override {
    if (!batch.input_embeddings.empty() || !fits(batch, chunks)) return 0;  // begin_batch's path
    InputSlot* slot = nullptr;
    uint64_t ticket = 0;
    {
      std::lock_guard lock(slots_mu_);
      slot = free_slot();
      if (slot == nullptr) return 0;
      slot->state = InputSlot::kStaging;
      ticket = ++last_ticket_;
    }
    try {
      use_device();
      slot->copied.synchronize();  // its last copy has read the host buffer
      fill(*slot, batch, chunks);
      ff_memcpy_async(slot->device, slot->host, slot->layout.bytes, ff_host_to_device,
                      copy_stream_);
      slot->copied.record(copy_stream_);
    } catch (...) {
      std::lock_guard lock(slots_mu_);
      slot->state = InputSlot::kFree;
      throw;
    }
    std::lock_guard lock(slots_mu_);
    slot->state = InputSlot::kStaged;
    slot->ticket = ticket;
    return ticket;
  }
  void* workspace() override { return memory_; }

  BatchRef begin_batch(const RaggedBatch& batch, const WorkspacePlan& plan,
                       const PoolingChunks& chunks, uint64_t staged) override {
    use_device();
    const int32_t T_count = batch.num_tokens(), B = batch.num_sequences();
    if (!fits(batch, chunks)) {
      throw EngineError("batch of " + std::to_string(T_count) + " tokens, " + std::to_string(B) +
                        " sequences and " + std::to_string(chunks.count()) +
                        " pooling chunks exceeds what the engine reserved");
    }
    InputSlot* slot = nullptr;
    {
      std::lock_guard lock(slots_mu_);
      // The previous batch ended with its synchronize(): its slot is free again.
      if (current_ != nullptr) current_->state = InputSlot::kFree;
      current_ = nullptr;
      for (InputSlot& s : slots_) {
        if (staged != 0 && s.state == InputSlot::kStaged && s.ticket == staged) slot = &s;
      }
      if (slot == nullptr) {
        staged = 0;
        slot = free_slot();
      }
      if (slot == nullptr) throw EngineError("no free input slot (a bug: one is always free)");
      slot->state = InputSlot::kInUse;
      current_ = slot;
    }
    if (staged != 0) {
      slot->copied.wait(stream_);  // the compute stream waits for stage()'s copy
    } else {
      slot->copied.synchronize();
      fill(*slot, batch, chunks);
      ff_memcpy_async(slot->device, slot->host, slot->layout.bytes, ff_host_to_device, stream_);
      slot->copied.record(stream_);
    }
    if (!batch.input_embeddings.empty()) {
      ff_memcpy_async(input_embeddings_, batch.input_embeddings.data(),
                      batch.input_embeddings.size() * sizeof(float), ff_host_to_device, stream_);
    }
    const InputLayout& l = slot->layout;
    auto at = [&](size_t offset) { return reinterpret_cast<int32_t*>(slot->device + offset); };
    args_ = k::BatchArgs{T_count,
                         B,
                         at(l.cu_seqlens),
                         at(l.token_seq),
                         at(l.token_ids),
                         at(l.embedding_index),
                         at(l.position_ids),
                         reinterpret_cast<uint8_t*>(slot->device + l.mask),
                         input_embeddings_,
                         chunks.count(),
                         at(l.chunk_begin),
                         at(l.chunk_end),
                         at(l.seq_first_chunk),
                         slot->max_sequence_chunks};
    auto floats = [&](const WorkspacePlan::Buffer& buffer) {
      return reinterpret_cast<float*>(memory_ + buffer.offset);
    };
    partials_ = k::Partials{floats(plan.partial_max), floats(plan.partial_sum),
                            floats(plan.partial_values)};
    scores_ = floats(plan.token_scores);
    return BatchRef{B, T_count};
  }

  // cuda-graphs (opt-in): the region (embed .. attention_pool) of a batch whose sizes were seen
  // before is captured once into a CUDA graph, and replayed for every later batch of the same
  // key: the tokens, sequences, chunks and the most chunks a sequence has (the grids and the
  // workspace plan follow from them) and the input slot (the kernels' pointers into it). The
  // first batch of a key runs op by op: it plans the GEMMs (their timing allocates, which a
  // capture may not) and proves the key's ops run. At most kMaxGraphs are kept, the least
  // recently used dropped. The emulation has no graphs: it counts the keys and runs the region.
  void run_region(const std::function<void()>& region) override {
    if (!opt_in_.cuda_graphs) return region();
    const GraphKey key{args_.num_tokens, args_.num_sequences, args_.num_chunks,
                       args_.max_sequence_chunks, int32_t(current_ - slots_)};
    Graph& graph = graphs_[key];
    graph.last_used = ++graph_clock_;
    evict_graphs();  // never this key: it was used last
    if (graph.runs++ == 0) return region();
#if defined(FF_EMULATION)
    region();
#else
    if (graph.uncapturable) return region();
    if (graph.exec == nullptr && !capture(region, graph)) {
      // A region that cannot be captured (a call the capture refuses) runs op by op, for this
      // key from now on, and says so once: the graphs are an optimisation, never a failure.
      graph.uncapturable = true;
      if (!graph_warning_) {
        graph_warning_ = true;
        std::fprintf(stderr,
                     "fastformer: cuda-graphs: a batch could not be captured (%s); "
                     "its sizes run kernel by kernel\n",
                     graph_error_.c_str());
      }
      return region();
    }
    ff_check(cudaGraphLaunch(graph.exec, stream_), "cudaGraphLaunch");
#endif
  }

  void embed(const BatchRef&, const void* word_embedding, const void* position_embeddings,
             const void* ln_gamma, const void* ln_beta, double eps, Mat x) override {
    k::launch_embedding_layernorm<T>(args_, t(word_embedding), t(position_embeddings), t(ln_gamma),
                                     t(ln_beta), float(eps), D(), t(x.data), stream_);
    ff_check_launch("embedding_layernorm");
  }

  // ReLU and the tanh GELU ride on the GEMM as cuBLASLt epilogues, applied to the float32
  // accumulator; the exact-erf GELU (parity with the reference needs erf) and SiLU have
  // none, so the GEMM stores A W^T and one pass adds the bias and applies them.
  // The bias epilogues are asked of cuBLASLt only where every operand is 16-byte aligned
  // (gemm_aligned): with less its heuristic may offer no algorithm for them. Every GEMM site
  // of the presets and test models is (the plan pads Q|K|s and the logits, workspace.h;
  // GemmSites in tests/unit/cuda_gemm_test.cc checks); where padding cannot apply, a hidden or
  // intermediate size that is not a multiple of 8 (the weights' rows and the activations are
  // dense), the GEMM is a plain store and the same pass adds the bias (a second rounding in
  // 16-bit types).
  bool linear_has_pass(const Mat& a, const WeightRef& w, const Mat& c, Epilogue epilogue,
                       Activation act) const override {
    if (epilogue != Epilogue::kBias && epilogue != Epilogue::kBiasAct) return false;
    const bool aligned = gemm_aligned(a.data, a.ld) && gemm_aligned(w.weight, w.in) &&
                         gemm_aligned(c.data, c.ld) && gemm_aligned(w.bias, 0);
    return !aligned || (epilogue == Epilogue::kBiasAct &&
                        gemm_activation(act, gelu_erf_epilogue_) == GemmEpilogue::kStore);
  }

  // The two steps of a linear() with a pass (linear_has_pass) are these two calls, so that the
  // profile, which issues them one by one to time them apart, runs what the graph runs.
  void linear(const Mat& a, const WeightRef& w, Mat c, Epilogue epilogue, Activation act) override {
    if (linear_has_pass(a, w, c, epilogue, act)) {
      linear(a, w, c, Epilogue::kStore, act);
      bias_activation(c, w.bias, epilogue, act);
      return;
    }
    const GemmEpilogue fused = epilogue == Epilogue::kStore        ? GemmEpilogue::kStore
                               : epilogue == Epilogue::kAccumulate ? GemmEpilogue::kAccumulate
                               : epilogue == Epilogue::kBias
                                   ? GemmEpilogue::kBias
                                   : gemm_activation(act, gelu_erf_epilogue_);
    const GemmShape shape{w.out, w.in, a.ld, c.ld, fused};
    gemm_.run(shape, a.rows, a.data, w.weight, w.bias, c.data);
    gemm_shapes_.try_emplace(
        w.weight, shape);  // for gemm_kernel(): one lookup, no allocation after the first
  }

  void bias_activation(Mat c, const void* bias, Epilogue epilogue, Activation act) override {
    k::launch_bias_activation<T>(t(c.data), c.ld, t(bias), int32_t(c.rows), int32_t(c.cols),
                                 epilogue == Epilogue::kBiasAct, to_kernel(act), stream_);
    ff_check_launch("bias_activation");
  }

  void query_pool(const BatchRef&, const Mat& scores, const Mat& q, Mat pq) override {
    k::launch_pool_partials<T, T>(args_, t(scores.data), scores.ld, H(), t(q.data), q.ld, D(),
                                  partials_, stream_);
    k::launch_pool_combine<T>(args_, partials_, H(), D(), nullptr, 0.0f, t(pq.data), stream_);
    ff_check_launch("query pooling");
  }

  // fused-key-pool (opt-in): the scores and the partials in one pass over K (key_pool.cu), which
  // takes back the two launches below for the shapes it does not serve.
  void key_pool(const BatchRef&, const Mat& key, const Mat& pq, const WeightRef& key_att,
                Mat pk) override {
    if (opt_in_.fused_key_pool) {
      k::launch_key_pool_partials<T>(args_, t(key.data), key.ld, t(pq.data), t(key_att.weight),
                                     t(key_att.bias), H(), D(), scores_, partials_, stream_);
    } else {
      k::launch_key_scores<T>(args_, t(key.data), key.ld, t(pq.data), t(key_att.weight),
                              t(key_att.bias), H(), D(), scores_, stream_);
      k::launch_pool_partials<T, float>(args_, scores_, H(), H(), t(key.data), key.ld, D(),
                                        partials_, stream_);
    }
    k::launch_pool_combine<T>(args_, partials_, H(), D(), t(pq.data), 0.0f, t(pk.data), stream_);
    ff_check_launch("key pooling");
  }

  void mix(const BatchRef&, const Mat& q, const Mat& pk, Mat u) override {
    k::launch_mix<T>(args_, t(q.data), q.ld, t(pk.data), D(), t(u.data), u.ld, stream_);
    ff_check_launch("mix");
  }

  void bias_residual_layernorm(const Mat& c, const void* bias, const Mat& residual,
                               const void* gamma, const void* beta, double eps, Mat out) override {
    k::launch_bias_residual_layernorm<T>(t(c.data), c.ld, t(bias), t(residual.data), residual.ld,
                                         t(gamma), t(beta), float(eps), int32_t(c.rows),
                                         int32_t(c.cols), t(out.data), out.ld, stream_);
    ff_check_launch("bias_residual_layernorm");
  }

  void attention_pool(const BatchRef&, const Mat& e, const WeightRef& fc2, const Mat& x,
                      Mat pooled) override {
    k::launch_pooler_scores<T>(args_, t(e.data), e.ld, t(fc2.weight), t(fc2.bias), D(), scores_,
                               stream_);
    k::launch_pool_partials<T, float>(args_, scores_, 1, 1, t(x.data), x.ld, D(), partials_,
                                      stream_);
    k::launch_pool_combine<T>(args_, partials_, 1, D(), nullptr, 1e-8f, t(pooled.data), stream_);
    ff_check_launch("attention pooler");
  }

  // The spans' chunks go up as a sequence's do, with their own partials and result rows (device
  // memory per mode, grown when a batch needs more); the pooler's scores are attention_pool's.
  Mat span_pool(const BatchRef&, const PoolingChunks& spans, SpanPooling mode,
                const Mat& x) override {
    use_device();
    SpanMemory& m = span_memory_[mode == SpanPooling::kModel ? 0 : 1];
    const int32_t S = int32_t(spans.first.size()) - 1, C = spans.count();
    if (S == 0) return Mat{nullptr, 0, x.cols, x.cols};
    m.reserve(C, S, size_t(D()));
    // Host copies the asynchronous uploads read until the batch's synchronize.
    m.begin_host = spans.begin;
    m.end_host = spans.end;
    m.first_host = spans.first;
    ff_memcpy_async(m.begin, m.begin_host.data(), size_t(C) * 4, ff_host_to_device, stream_);
    ff_memcpy_async(m.end, m.end_host.data(), size_t(C) * 4, ff_host_to_device, stream_);
    ff_memcpy_async(m.first, m.first_host.data(), size_t(S + 1) * 4, ff_host_to_device, stream_);
    int32_t most = 0;
    for (int32_t i = 0; i < S; ++i)
      most = std::max(most, spans.first[size_t(i) + 1] - spans.first[size_t(i)]);
    k::BatchArgs a = args_;
    a.num_sequences = S;
    a.num_chunks = C;
    a.chunk_begin = m.begin;
    a.chunk_end = m.end;
    a.seq_first_chunk = m.first;
    a.max_sequence_chunks = most;
    const k::Partials partials{m.max, m.sum, m.values};
    const bool model = mode == SpanPooling::kModel;
    k::launch_pool_partials<T, float>(a, model ? scores_ : zero_score_, model ? 1 : 0, 1, t(x.data),
                                      x.ld, D(), partials, stream_);
    k::launch_pool_combine<T>(a, partials, 1, D(), nullptr, model ? 1e-8f : 0.0f, t(m.out),
                              stream_);
    ff_check_launch("span pooling");
    return Mat{m.out, S, x.cols, x.cols};
  }

  void l2_normalize(Mat rows) override {
    k::launch_l2_normalize<T>(t(rows.data), int32_t(rows.rows), int32_t(rows.cols), stream_);
    ff_check_launch("l2_normalize");
  }

  void download(const Mat& src, float* dst) override {
    const size_t bytes = size_t(src.rows * src.cols) * sizeof(float);
    if (bytes == 0) return;
    if (bytes > host_staging_bytes_) {  // reserve() sized it for the largest download a plan has
      throw std::runtime_error("download of " + std::to_string(bytes) + " bytes exceeds the " +
                               std::to_string(host_staging_bytes_) + "-byte staging buffer");
    }
    k::launch_to_float<T>(t(src.data), src.ld, int32_t(src.rows), int32_t(src.cols),
                          download_staging_, stream_);
    ff_check_launch("to_float");
    // Through pinned memory: a copy to pageable `dst` would be staged by the driver anyway.
    ff_memcpy_async(host_staging_, download_staging_, bytes, ff_device_to_host, stream_);
    ff_stream_synchronize(stream_);
    if (!copy_finite(reinterpret_cast<const float*>(host_staging_), dst, bytes / sizeof(float))) {
      throw EngineError(non_finite_outputs<T>());
    }
  }

  void synchronize() override { ff_stream_synchronize(stream_); }

  void reserve_timers(int count) override { timers_.reserve(count); }
  void timestamp(int index) override { timers_.record(index, stream_); }
  double elapsed_ms(int from, int to) override { return timers_.elapsed_ms(from, to); }

  std::pair<size_t, size_t> device_memory() const override {
    return {weight_bytes_ + memory_bytes_ + slot_device_bytes_ + kGemmWorkspaceBytes,
            device_total_};
  }

 private:
  // A GEMM operand at `p` with rows `ld` elements apart (0: a vector) is 16-byte aligned.
  static bool gemm_aligned(const void* p, int64_t ld) {
    return (uint64_t(reinterpret_cast<uintptr_t>(p)) | uint64_t(ld) * sizeof(T)) %
               kGemmOperandAlignment ==
           0;
  }
  static T* t(void* p) { return static_cast<T*>(p); }
  static const T* t(const void* p) { return static_cast<const T*>(p); }
  int32_t D() const { return int32_t(config_.hidden_size); }
  int32_t H() const { return int32_t(config_.num_attention_heads); }

  // Makes this engine's device current on the calling thread: batches run on the scheduler's
  // compute thread, not on the thread that probed the device (--device N on a multi-GPU node).
  void use_device() const {
#if !defined(FF_EMULATION)
    ff_check(cudaSetDevice(device_), "cudaSetDevice");
#endif
  }

  const ModelConfig config_;
  const int device_;
  const size_t device_total_;
  const CudaOptIn opt_in_;
  size_t weight_bytes_ = 0;
  ff_stream_t stream_;
  Gemm gemm_;
  const bool gelu_erf_epilogue_;  // the Gemm computes bias + exact-erf GELU (cutlass-gelu)
  std::map<const void*, GemmShape> gemm_shapes_;  // each weight's GEMM shape, for gemm_kernel()
  std::vector<void*> uploads_;
  char* memory_ = nullptr;  // the workspace, then the pieces reserve() places after it
  size_t memory_bytes_ = 0;
  char* host_staging_ = nullptr;
  size_t host_staging_bytes_ = 0;
  float *input_embeddings_, *scores_ = nullptr, *download_staging_, *zero_score_ = nullptr;

  // The batches' inputs (host off the critical path, issue 48): each slot a pinned host buffer
  // and a device region sized for the largest batch, filled for one batch (input_layout) and
  // copied in one piece; stage() fills one on the batch former's thread and copies it on
  // copy_stream_, while the batch before computes, begin_batch takes it (or fills one itself).
  // At most one slot is being staged and one in use, so with three one is always free;
  // slots_mu_ guards the states.
  struct InputSlot {
    enum State { kFree, kStaging, kStaged, kInUse };
    char* host = nullptr;    // pinned
    char* device = nullptr;  // ff_malloc
    State state = kFree;
    uint64_t ticket = 0;  // kStaged: the stage() that filled it
    InputLayout layout;
    int32_t max_sequence_chunks = 0;
    CopyEvent copied;  // its last copy from `host`
  };
  static constexpr int kInputSlots = 3;
  InputSlot slots_[kInputSlots];
  std::mutex slots_mu_;
  InputSlot* current_ = nullptr;  // the running batch's
  uint64_t last_ticket_ = 0;
  size_t slot_bytes_ = 0, slot_device_bytes_ = 0;
  WorkspacePlan largest_{};
  ff_stream_t copy_stream_ = ff_stream_create();

  // A slot stage() or begin_batch may fill: a free one, else the staged one filled first
  // (its batch was changed or dropped); null if none. Under slots_mu_.
  InputSlot* free_slot() {
    InputSlot* pick = nullptr;
    for (InputSlot& s : slots_) {
      if (s.state == InputSlot::kFree) return &s;
      if (s.state == InputSlot::kStaged && (pick == nullptr || s.ticket < pick->ticket)) pick = &s;
    }
    return pick;
  }
  bool fits(const RaggedBatch& batch, const PoolingChunks& chunks) const {
    return batch.num_tokens() <= largest_.tokens && batch.num_sequences() <= largest_.sequences &&
           chunks.count() <= largest_.chunks;
  }
  // Packs the batch's inputs into `slot`'s pinned buffer (its copy has read the last ones).
  void fill(InputSlot& slot, const RaggedBatch& batch, const PoolingChunks& chunks) {
    const int32_t T_count = batch.num_tokens(), B = batch.num_sequences();
    slot.layout = input_layout(size_t(T_count), size_t(B), size_t(chunks.count()));
    const InputLayout& l = slot.layout;
    int32_t* token_seq = reinterpret_cast<int32_t*>(slot.host + l.token_seq);
    for (int32_t b = 0; b < B; ++b) {
      std::fill(token_seq + batch.cu_seqlens[size_t(b)],
                token_seq + batch.cu_seqlens[size_t(b) + 1], b);
    }
    auto put = [&](size_t offset, const auto& values) {
      if (!values.empty())
        std::memcpy(slot.host + offset, values.data(), values.size() * sizeof(values[0]));
    };
    put(l.token_ids, batch.token_ids);
    put(l.embedding_index, batch.embedding_index);
    put(l.position_ids, batch.position_ids);
    put(l.cu_seqlens, batch.cu_seqlens);
    put(l.chunk_begin, chunks.begin);
    put(l.chunk_end, chunks.end);
    put(l.seq_first_chunk, chunks.first);
    put(l.mask, batch.mask);
    int32_t most = 0;  // sizes the combine's split of a sequence's chunks
    for (int32_t b = 0; b < B; ++b)
      most = std::max(most, chunks.first[size_t(b) + 1] - chunks.first[size_t(b)]);
    slot.max_sequence_chunks = most;
  }
  // span_pool's device memory (one allocation, grown on demand) and the host arrays it uploads.
  struct SpanMemory {
    char* memory = nullptr;
    size_t bytes = 0;
    int32_t *begin = nullptr, *end = nullptr, *first = nullptr;
    float *max = nullptr, *sum = nullptr, *values = nullptr;
    T* out = nullptr;
    std::vector<int32_t> begin_host, end_host, first_host;
    void reserve(int32_t chunks, int32_t spans, size_t D) {
      auto round = [](size_t n) {
        return (n + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment;
      };
      const size_t c = size_t(chunks), s = size_t(spans);
      const size_t need = 2 * round(c * 4) + round((s + 1) * 4) + 2 * round(c * 4) +
                          round(c * D * 4) + round(s * D * sizeof(T));
      if (need > bytes) {
        ff_free(memory);  // the last batch's use of it ended with its synchronize
        bytes = std::max(need, 2 * bytes);
        memory = static_cast<char*>(ff_malloc(bytes));
      }
      char* at = memory;
      auto take = [&](auto*& piece, size_t piece_bytes) {
        piece = reinterpret_cast<std::remove_reference_t<decltype(piece)>>(at);
        at += round(piece_bytes);
      };
      take(begin, c * 4);
      take(end, c * 4);
      take(first, (s + 1) * 4);
      take(max, c * 4);
      take(sum, c * 4);
      take(values, c * D * 4);
      take(out, s * D * sizeof(T));
    }
  };
  SpanMemory span_memory_[2];
  k::Partials partials_;
  k::BatchArgs args_;
  Timers timers_;

  // cuda-graphs: the graphs by batch sizes and input slot (run_region).
  struct GraphKey {
    int32_t tokens, sequences, chunks, most_chunks, slot;
    auto operator<=>(const GraphKey&) const = default;
  };
  struct Graph {
#if !defined(FF_EMULATION)
    cudaGraphExec_t exec = nullptr;
#endif
    uint64_t runs = 0, last_used = 0;
    bool uncapturable = false;  // a capture failed: op by op
  };
  static constexpr size_t kMaxGraphs = 64;
  std::map<GraphKey, Graph> graphs_;
  bool graph_warning_ = false;
  std::string graph_error_;  // the last capture's failure
#if !defined(FF_EMULATION)
  // Captures `region` into graph.exec; false (nothing left captured, the error cleared, the
  // region's kernels not run) where the capture or the instantiation fails.
  bool capture(const std::function<void()>& region, Graph& graph) {
    if (cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
      graph_error_ = cudaGetErrorString(cudaGetLastError());
      return false;
    }
    cudaGraph_t captured = nullptr;
    try {
      region();
    } catch (const std::exception& e) {
      graph_error_ = e.what();
      (void)cudaStreamEndCapture(stream_, &captured);
      if (captured != nullptr) (void)cudaGraphDestroy(captured);
      cudaGetLastError();
      return false;
    }
    const cudaError_t ended = cudaStreamEndCapture(stream_, &captured);
    const cudaError_t made =
        ended == cudaSuccess ? cudaGraphInstantiate(&graph.exec, captured, 0) : ended;
    if (captured != nullptr) (void)cudaGraphDestroy(captured);
    if (made != cudaSuccess) {
      graph_error_ = cudaGetErrorString(made);
      graph.exec = nullptr;
      cudaGetLastError();
      return false;
    }
    return true;
  }
#endif
  uint64_t graph_clock_ = 0;
  // Drops the least recently used graphs past kMaxGraphs (keys seen once hold no graph).
  void evict_graphs() {
    while (graphs_.size() > kMaxGraphs) {
      auto oldest = graphs_.begin();
      for (auto it = graphs_.begin(); it != graphs_.end(); ++it)
        if (it->second.last_used < oldest->second.last_used) oldest = it;
#if !defined(FF_EMULATION)
      if (oldest->second.exec != nullptr) (void)cudaGraphExecDestroy(oldest->second.exec);
#endif
      graphs_.erase(oldest);
    }
  }
};

}  // namespace

std::unique_ptr<Ops> make_cuda_ops(const Model& model, const CudaOpsOptions& options,
                                   CudaOpsChoice* chosen, std::string* why) {
  const DeviceInfo info = probe_device(options.device);
  if (!info.usable) {
    if (why) *why = info.why;
    return nullptr;
  }
  CudaOpsChoice choice{info.name, options.dtype, "", ""};
  if (options.dtype == "auto")
    choice.dtype = choose_cuda_dtype(info.name, info.major, info.minor, &choice.dtype_why);
  const CudaOptIn opt_in = parse_cuda_opt_in(options.opt_in);
  const ModelConfig& c = model.config();
  auto make = [&]<class T>() {
    auto ops = std::make_unique<CudaOps<T>>(c, options, opt_in, info.total_bytes);
    choice.opt_in = ops->opt_in_note();
    if (chosen) *chosen = choice;
    return std::unique_ptr<Ops>(std::move(ops));
  };
  if (choice.dtype == "float32") return make.template operator()<float>();
  if (choice.dtype == "float16") return make.template operator()<ff_half>();
  if (choice.dtype == "bfloat16") return make.template operator()<ff_bfloat16>();
  throw EngineError("dtype " + options.dtype + ": expected auto, float32, float16 or bfloat16");
}

}  // namespace FF_KERNELS_ABI
}  // namespace fastformer::engine::cuda
