#include "server/engine/cpu/onednn_gemm.h"

#include <omp.h>  // the OpenMP runtime oneDNN is built with: its threads per calling thread

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>
#include <vector>

#include "common/half.h"
#include "server/engine/cpu/vector_math.h"  // FASTFORMER_VECTOR_CLONES
#include "server/engine/error.h"

namespace fastformer::engine {
namespace {

using dnnl::memory;

std::string format_double(const char* format, double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, format, value);
  return buffer;
}

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// oneDNN kept to the calling thread: our pool splits the rows, and an OpenMP team per
// caller would only oversubscribe the cores (and spin on them between calls).
void single_threaded() {
  thread_local const bool once = [] {
    omp_set_num_threads(1);
    return true;
  }();
  (void)once;
}

// Each thread that runs GEMMs has its own stream.
dnnl::stream& thread_stream() {
  single_threaded();
  thread_local dnnl::stream stream(cpu_engine());
  return stream;
}

bool isa_has(dnnl_cpu_isa_t isa, dnnl_cpu_isa_t feature) {
  return (static_cast<unsigned>(isa) & static_cast<unsigned>(feature)) ==
         static_cast<unsigned>(feature);
}

std::string isa_name(dnnl_cpu_isa_t isa) {
  // Each ISA value is a superset mask of the ones below it, in both oneDNN 2.x and 3.x.
  if (isa_has(isa, dnnl_cpu_isa_avx512_core_amx)) return "avx512_core_amx";
  if (isa_has(isa, dnnl_cpu_isa_avx512_core_bf16)) return "avx512_core_bf16";
  if (isa_has(isa, dnnl_cpu_isa_avx512_core_vnni)) return "avx512_core_vnni";
  if (isa_has(isa, dnnl_cpu_isa_avx512_core)) return "avx512_core";
  if (isa_has(isa, dnnl_cpu_isa_avx2_vnni)) return "avx2_vnni";
  if (isa_has(isa, dnnl_cpu_isa_avx2)) return "avx2";
  if (isa_has(isa, dnnl_cpu_isa_avx)) return "avx";
  if (isa_has(isa, dnnl_cpu_isa_sse41)) return "sse41";
  return "generic";
}

dnnl::algorithm eltwise_of(Activation act, float* alpha) {
  *alpha = 0.0f;
  switch (act) {
    case Activation::kGeluErf:
      return dnnl::algorithm::eltwise_gelu_erf;
    case Activation::kGeluTanh:
      return dnnl::algorithm::eltwise_gelu_tanh;
    case Activation::kRelu:
      return dnnl::algorithm::eltwise_relu;
    case Activation::kSilu:
      *alpha = 1.0f;
      return dnnl::algorithm::eltwise_swish;  // x * sigmoid(1 x)
  }
  throw EngineError("unknown activation");
}

// C = A W^T as a matmul primitive descriptor: the epilogue as post-ops (the bias, an
// activation, a sum for kAccumulate), the scratchpad the caller's (user mode: each call
// brings its own, so pool threads may share a primitive). EngineError naming the shape and
// the ISA where oneDNN has no kernel; `rows` is M as the message gives it.
dnnl::matmul::primitive_desc make_matmul_pd(const memory::desc& src, const memory::desc& weights,
                                            const memory::desc& dst, memory::dim N, memory::dim K,
                                            bool bf16, Epilogue epilogue, Activation act,
                                            const std::string& rows) {
  const bool has_bias = epilogue == Epilogue::kBias || epilogue == Epilogue::kBiasAct;
  const memory::desc bias =
      has_bias ? memory::desc({1, N}, memory::data_type::f32, {N, 1}) : memory::desc();
  dnnl::post_ops post;
  if (epilogue == Epilogue::kBiasAct) {
    float alpha = 0;
    const dnnl::algorithm alg = eltwise_of(act, &alpha);
#if DNNL_VERSION_MAJOR >= 3
    post.append_eltwise(alg, alpha, 0.0f);
#else
    post.append_eltwise(1.0f, alg, alpha, 0.0f);
#endif
  } else if (epilogue == Epilogue::kAccumulate) {
    post.append_sum(1.0f);
  }
  dnnl::primitive_attr attr;
  attr.set_post_ops(post);
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  try {
#if DNNL_VERSION_MAJOR >= 3
    return dnnl::matmul::primitive_desc(cpu_engine(), src, weights, bias, dst, attr);
#else
    return dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, weights, bias, dst), attr,
                                        cpu_engine());
#endif
  } catch (const dnnl::error& e) {
    throw EngineError(std::string("oneDNN has no ") + (bf16 ? "bfloat16" : "float32") +
                      " matmul for [" + rows + ", " + std::to_string(K) + "] x [" +
                      std::to_string(N) + ", " + std::to_string(K) + "]^T on this CPU (" +
                      cpu_gemm_info().isa + "): " + e.what());
  }
}

}  // namespace

const CpuGemmInfo& cpu_gemm_info() {
  static const CpuGemmInfo info = [] {
    CpuGemmInfo i;
    single_threaded();
    const dnnl_version_t* v = dnnl_version();
    i.version =
        std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
    const dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    i.isa = isa_name(isa);
    i.has_bf16 = isa_has(isa, dnnl_cpu_isa_avx512_core_bf16);
    i.has_amx = isa_has(isa, dnnl_cpu_isa_avx512_core_amx);
    return i;
  }();
  return info;
}

struct CpuMatmul::Impl {
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul primitive;
};

CpuMatmul::CpuMatmul(const Shape& shape) : shape_(shape) {
  single_threaded();  // creation may run parallel loops too
  const memory::dim M = DNNL_RUNTIME_DIM_VAL, N = shape.n, K = shape.k;
  const auto in_type = shape.bf16 ? memory::data_type::bf16 : memory::data_type::f32;
  // A bfloat16 A is the rounded copy run() makes, packed (ld = K).
  const memory::desc src({M, K}, in_type, {shape.bf16 ? K : shape.lda, 1});
  const memory::desc weights({K, N}, in_type, {1, K});  // W [N, K] row-major is W^T [K, N]
  const memory::desc dst({M, N}, memory::data_type::f32, {shape.ldc, 1});
  const dnnl::matmul::primitive_desc pd =
      make_matmul_pd(src, weights, dst, N, K, shape.bf16, shape.epilogue, shape.act, "M");
  impl_ = std::make_unique<Impl>(Impl{pd, dnnl::matmul(pd)});
}

CpuMatmul::~CpuMatmul() = default;

std::string CpuMatmul::implementation() const { return impl_->pd.impl_info_str(); }

void CpuMatmul::run(int64_t m, const float* a, const void* w, const float* bias, float* c) const {
  if (m <= 0) return;
  const memory::dim N = shape_.n, K = shape_.k;
  dnnl::engine& engine = cpu_engine();
  dnnl::stream& stream = thread_stream();
  const void* src_data = a;
  memory::dim lda = shape_.lda;
  thread_local std::vector<uint16_t> rounded;
  if (shape_.bf16) {
    rounded.resize(size_t(m * K));
    for (int64_t r = 0; r < m; ++r)
      float_to_bfloat16_row(a + r * shape_.lda, rounded.data() + r * K, K);
    src_data = rounded.data();
    lda = K;
  }
  const auto in_type = shape_.bf16 ? memory::data_type::bf16 : memory::data_type::f32;
  memory src({{m, K}, in_type, {lda, 1}}, engine, const_cast<void*>(src_data));
  memory weights({{K, N}, in_type, {1, K}}, engine, const_cast<void*>(w));
  memory dst({{m, N}, memory::data_type::f32, {shape_.ldc, 1}}, engine, c);
  thread_local std::vector<std::byte> scratchpad;
  const memory::desc scratch_desc = impl_->pd.scratchpad_desc();
  if (scratchpad.size() < scratch_desc.get_size()) scratchpad.resize(scratch_desc.get_size());
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, src},
      {DNNL_ARG_WEIGHTS, weights},
      {DNNL_ARG_DST, dst},
      {DNNL_ARG_SCRATCHPAD, memory(scratch_desc, engine, scratchpad.data())}};
  if (shape_.epilogue == Epilogue::kBias || shape_.epilogue == Epilogue::kBiasAct) {
    args.emplace(DNNL_ARG_BIAS, memory({{1, N}, memory::data_type::f32, {N, 1}}, engine,
                                       const_cast<float*>(bias)));
  }
  impl_->primitive.execute(stream, args);
  stream.wait();
}

double gemm_floor_gflops(const std::string& isa) {
  // A core of each kind reaches roughly 3x these single-threaded on 256 x 512 x 512.
  if (isa.starts_with("avx512")) return 40.0;
  if (isa.starts_with("avx2")) return 25.0;
  if (isa == "avx") return 12.0;
  return 4.0;
}

std::string GemmSelfCheck::message() const {
  std::string line = "GEMM self-check: " + format_double("%.1f", gflops) +
                     " GFLOP/s on one thread (float32 256x512x512, oneDNN " +
                     cpu_gemm_info().version + ", kernel " + implementation +
                     "; expected at least " + format_double("%.0f", floor_gflops) + " for " + isa +
                     "; bfloat16 GEMMs here: " + bf16_hardware(isa) + ")";
  if (below_floor()) {
    line +=
        "; below the floor: this CPU runs slower than its instruction set allows. Likely causes: "
        "ONEDNN_MAX_CPU_ISA or a hypervisor hiding CPU features (oneDNN sees " +
        isa +
        "), other processes on these cores (set --threads to the cores this server owns), or a "
        "throttled CPU";
  }
  return line;
}

GemmSelfCheck gemm_self_check() {
  constexpr int64_t M = 256, N = 512, K = 512;
  CpuMatmul matmul({N, K, K, N, Epilogue::kStore, Activation::kGeluErf, false});
  std::vector<float> a(size_t(M * K)), w(size_t(N * K)), c(size_t(M * N));
  for (size_t i = 0; i < a.size(); ++i) a[i] = float(int(i % 17) - 8) * 0.0625f;
  for (size_t i = 0; i < w.size(); ++i) w[i] = float(int(i % 13) - 6) * 0.03125f;
  GemmSelfCheck check;
  double best = 1e30;
  for (int rep = 0; rep < 8; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    matmul.run(M, a.data(), w.data(), nullptr, c.data());
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rep >= 2) best = std::min(best, s);  // the first runs pay for first-touch and JIT
  }
  check.gflops = 2.0 * M * N * K / best / 1e9;
  check.isa = cpu_gemm_info().isa;
  check.floor_gflops = gemm_floor_gflops(check.isa);
  check.implementation = matmul.implementation();
  return check;
}

FASTFORMER_VECTOR_CLONES
void bfloat16_to_float_row(const uint16_t* in, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = std::bit_cast<float>(uint32_t(in[i]) << 16);
}

FASTFORMER_VECTOR_CLONES
void float_to_bfloat16_row(const float* in, uint16_t* out, int64_t n) {
  // common/half.h's float_to_bfloat16 (round to nearest even, NaN kept quiet), branch-free.
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t x = std::bit_cast<uint32_t>(in[i]);
    const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    const uint32_t nan = (x >> 16) | 0x40u;
    out[i] = static_cast<uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
  }
}

namespace {

// A primitive for `shape` with M = m over dense A and C (ld = k and n: oneDNN 2.6's brgemm
// matmul takes only dense rows; run() stages strided operands); `weights` is a packed layout
// or any (oneDNN picks). Emulated shapes are float32 throughout. The scratchpad is the
// caller's (user mode), so pool threads may run one primitive at once.
dnnl::matmul::primitive_desc packed_pd(const PackedMatmul::Shape& shape, int64_t m,
                                       const memory::desc& weights) {
  const bool bf16 = shape.bf16 && !shape.emulate;
  const auto type = bf16 ? memory::data_type::bf16 : memory::data_type::f32;
  const memory::dim M = m, N = shape.n, K = shape.k;
  const memory::desc src({M, K}, type, {K, 1});
  const memory::desc dst({M, N}, type, {N, 1});
  return make_matmul_pd(src, weights, dst, N, K, bf16, shape.epilogue, shape.act,
                        std::to_string(M));
}

memory::desc any_weights(const PackedMatmul::Shape& shape) {
  const bool bf16 = shape.bf16 && !shape.emulate;
  return memory::desc({shape.k, shape.n}, bf16 ? memory::data_type::bf16 : memory::data_type::f32,
                      memory::format_tag::any);
}

// W [n, k] float32, rounded as the shape takes it, reordered into `packed`'s layout.
dnnl::memory pack_weights(const PackedMatmul::Shape& shape, const memory::desc& packed,
                          const float* weight) {
  single_threaded();
  const memory::dim N = shape.n, K = shape.k;
  dnnl::engine& engine = cpu_engine();
  dnnl::stream& stream = thread_stream();
  dnnl::memory out(packed, engine);
  std::vector<uint16_t> rounded(size_t(N * K));
  float_to_bfloat16_row(weight, rounded.data(), N * K);
  if (shape.bf16 && !shape.emulate) {
    dnnl::memory plain({{K, N}, memory::data_type::bf16, {1, K}}, engine, rounded.data());
    dnnl::reorder(plain, out).execute(stream, plain, out);
  } else {
    std::vector<float> values(size_t(N * K));
    if (shape.bf16)
      bfloat16_to_float_row(rounded.data(), values.data(), N * K);
    else
      std::copy(weight, weight + N * K, values.begin());
    dnnl::memory plain({{K, N}, memory::data_type::f32, {1, K}}, engine, values.data());
    dnnl::reorder(plain, out).execute(stream, plain, out);
  }
  stream.wait();
  return out;
}

// Runs `primitive` on the calling thread with a scratchpad of its own.
void execute(const dnnl::matmul::primitive_desc& pd, const dnnl::matmul& primitive, const void* a,
             const dnnl::memory& w, const float* bias, void* c, bool has_bias) {
  dnnl::engine& engine = cpu_engine();
  dnnl::stream& stream = thread_stream();
  thread_local std::vector<std::byte> scratchpad;
  const memory::desc scratch_desc = pd.scratchpad_desc();
  if (scratchpad.size() < scratch_desc.get_size()) scratchpad.resize(scratch_desc.get_size());
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, memory(pd.src_desc(), engine, const_cast<void*>(a))},
      {DNNL_ARG_WEIGHTS, w},
      {DNNL_ARG_DST, memory(pd.dst_desc(), engine, c)},
      {DNNL_ARG_SCRATCHPAD, memory(scratch_desc, engine, scratchpad.data())}};
  if (has_bias)
    args.emplace(DNNL_ARG_BIAS, memory(pd.bias_desc(), engine, const_cast<float*>(bias)));
  primitive.execute(stream, args);
  stream.wait();
}

int log2_exact(int64_t m) {
  if (m <= 0 || m > PackedMatmul::kMaxRows || (m & (m - 1)) != 0) return -1;
  return std::countr_zero(static_cast<uint64_t>(m));
}

// oneDNN's OpenMP team for the calling thread, restored to 1 when it goes out of scope.
class OmpThreads {
 public:
  explicit OmpThreads(int threads) { omp_set_num_threads(std::max(1, threads)); }
  ~OmpThreads() { omp_set_num_threads(1); }
  OmpThreads(const OmpThreads&) = delete;
  OmpThreads& operator=(const OmpThreads&) = delete;
};

}  // namespace

struct PackedMatmul::Weights::Impl {
  std::vector<dnnl::memory> layouts;  // one copy per distinct layout the kernels take
};

size_t PackedMatmul::Weights::bytes() const {
  size_t bytes = 0;
  if (impl_) {
    for (const dnnl::memory& m : impl_->layouts) bytes += m.get_desc().get_size();
  }
  return bytes;
}

struct PackedMatmul::Impl {
  struct Kernel {
    dnnl::matmul::primitive_desc pd;
    dnnl::matmul primitive;
    size_t layout = 0;  // index into layouts
  };
  std::vector<memory::desc> layouts;  // the weights' layouts the kernels chose (usually one)
  std::vector<Kernel> kernels;        // [log2 m]
};

PackedMatmul::PackedMatmul(const Shape& shape) : shape_(shape), impl_(std::make_unique<Impl>()) {
  single_threaded();
  if (!shape.bf16 && shape.emulate)
    throw EngineError("PackedMatmul: emulate is for bfloat16 shapes");
  impl_->kernels.resize(size_t(log2_exact(kMaxRows) + 1));
  // Each row count lets oneDNN pick its weights' layout (brgemm's blocking may depend on M);
  // the weights are packed once per distinct layout, almost always one.
  for (int i = int(impl_->kernels.size()) - 1; i >= 0; --i) {
    dnnl::matmul::primitive_desc pd = packed_pd(shape, int64_t(1) << i, any_weights(shape));
    const memory::desc layout = pd.weights_desc();
    size_t index = 0;
    while (index < impl_->layouts.size() && !(impl_->layouts[index] == layout)) ++index;
    if (index == impl_->layouts.size()) impl_->layouts.push_back(layout);
    impl_->kernels[size_t(i)] = Impl::Kernel{pd, dnnl::matmul(pd), index};
  }
}

PackedMatmul::~PackedMatmul() = default;

PackedMatmul::Weights PackedMatmul::pack(const float* weight) const {
  Weights w;
  w.impl_ = std::make_shared<Weights::Impl>();
  for (const memory::desc& layout : impl_->layouts)
    w.impl_->layouts.push_back(pack_weights(shape_, layout, weight));
  return w;
}

void PackedMatmul::run(int64_t m, const void* a, const Weights& w, const float* bias,
                       void* c) const {
  const int index = log2_exact(m);
  if (index < 0)
    throw EngineError("PackedMatmul: " + std::to_string(m) +
                      " rows is not a power of two up to 256");
  const Impl::Kernel& kernel = impl_->kernels[size_t(index)];
  const dnnl::memory& weights = w.impl_->layouts.at(kernel.layout);
  const bool has_bias = shape_.epilogue == Epilogue::kBias || shape_.epilogue == Epilogue::kBiasAct;
  const bool accumulate = shape_.epilogue == Epilogue::kAccumulate;
  const int64_t N = shape_.n, K = shape_.k;
  if (shape_.emulate) {
    // bfloat16 rows widened into dense float32 scratch, the float32 primitive, rounded back.
    thread_local std::vector<float> a32, c32;
    a32.resize(size_t(m * K));
    c32.resize(size_t(m * N));
    const auto* a16 = static_cast<const uint16_t*>(a);
    auto* c16 = static_cast<uint16_t*>(c);
    for (int64_t r = 0; r < m; ++r)
      bfloat16_to_float_row(a16 + r * shape_.lda, a32.data() + r * K, K);
    if (accumulate) {
      for (int64_t r = 0; r < m; ++r)
        bfloat16_to_float_row(c16 + r * shape_.ldc, c32.data() + r * N, N);
    }
    execute(kernel.pd, kernel.primitive, a32.data(), weights, bias, c32.data(), has_bias);
    for (int64_t r = 0; r < m; ++r)
      float_to_bfloat16_row(c32.data() + r * N, c16 + r * shape_.ldc, N);
    return;
  }
  // Strided A or C (column views of a wider buffer) through dense per-thread copies.
  const size_t element = shape_.bf16 ? 2 : 4;
  const bool stage_a = shape_.lda != K, stage_c = shape_.ldc != N;
  thread_local std::vector<std::byte> a_dense, c_dense;
  const void* a_run = a;
  void* c_run = c;
  if (stage_a) {
    a_dense.resize(size_t(m * K) * element);
    for (int64_t r = 0; r < m; ++r) {
      std::memcpy(a_dense.data() + size_t(r * K) * element,
                  static_cast<const std::byte*>(a) + size_t(r * shape_.lda) * element,
                  size_t(K) * element);
    }
    a_run = a_dense.data();
  }
  if (stage_c) {
    c_dense.resize(size_t(m * N) * element);
    if (accumulate) {
      for (int64_t r = 0; r < m; ++r) {
        std::memcpy(c_dense.data() + size_t(r * N) * element,
                    static_cast<const std::byte*>(c) + size_t(r * shape_.ldc) * element,
                    size_t(N) * element);
      }
    }
    c_run = c_dense.data();
  }
  execute(kernel.pd, kernel.primitive, a_run, weights, bias, c_run, has_bias);
  if (stage_c) {
    for (int64_t r = 0; r < m; ++r) {
      std::memcpy(static_cast<std::byte*>(c) + size_t(r * shape_.ldc) * element,
                  c_dense.data() + size_t(r * N) * element, size_t(N) * element);
    }
  }
}

void PackedMatmul::split(int64_t rows, int64_t block,
                         std::vector<std::pair<int64_t, int64_t>>& pieces) {
  pieces.clear();
  int64_t r = 0;
  for (; rows - r >= block; r += block) pieces.emplace_back(r, block);
  for (int64_t b = block / 2; b >= 1; b /= 2) {
    if (rows - r >= b) {
      pieces.emplace_back(r, b);
      r += b;
    }
  }
}

std::string PackedMatmul::implementation() const {
  const auto& kernels = impl_->kernels;
  const std::string main = kernels.back().pd.impl_info_str();
  std::string out = main;
  // Row counts (ascending) whose kernel differs from the main one, grouped by kernel.
  std::map<std::string, int64_t> largest;
  for (size_t i = 0; i + 1 < kernels.size(); ++i) {
    const std::string name = kernels[i].pd.impl_info_str();
    if (name != main) largest[name] = std::max<int64_t>(largest[name], int64_t(1) << i);
  }
  for (const auto& [name, m] : largest) out += "; M<=" + std::to_string(m) + ": " + name;
  return out;
}

std::string bf16_hardware(const std::string& isa) {
  if (isa == "avx512_core_amx") return "AMX";
  if (isa == "avx512_core_bf16") return "AVX512_BF16, no AMX";
  return "no AVX512_BF16 or AMX";
}

double bf16_floor_gflops(const std::string& isa) {
  // About a third of what one core reaches on 256 x 512 x 512 with packed weights.
  if (isa == "avx512_core_amx") return 250.0;
  if (isa == "avx512_core_bf16") return 60.0;
  return 0.0;
}

std::string Bf16SelfCheck::message() const {
  const std::string& isa = cpu_gemm_info().isa;
  if (!ran)
    return "bfloat16 GEMM self-check: not run (" + bf16_hardware(isa) +
           " on this CPU, oneDNN sees " + isa + ")";
  std::string line = "bfloat16 GEMM self-check: " + format_double("%.1f", gflops) +
                     " GFLOP/s on one thread (256x512x512, M fixed, packed weights, kernel " +
                     implementation + ", " + bf16_hardware(isa) + "; expected at least " +
                     format_double("%.0f", floor_gflops) + ")";
  if (gflops < floor_gflops) line += "; below the floor: see the float32 check's causes";
  return line;
}

Bf16SelfCheck bf16_self_check() {
  Bf16SelfCheck check;
  if (!cpu_gemm_info().has_bf16) return check;
  constexpr int64_t M = 256, N = 512, K = 512;
  const PackedMatmul matmul({N, K, K, N, Epilogue::kStore, Activation::kGeluErf, true, false});
  std::vector<float> w(size_t(N * K));
  for (size_t i = 0; i < w.size(); ++i) w[i] = float(int(i % 13) - 6) * 0.03125f;
  const PackedMatmul::Weights packed = matmul.pack(w.data());
  std::vector<uint16_t> a(size_t(M * K)), c(size_t(M * N));
  for (size_t i = 0; i < a.size(); ++i) a[i] = float_to_bfloat16(float(int(i % 17) - 8) * 0.0625f);
  double best = 1e30;
  for (int rep = 0; rep < 10; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    matmul.run(M, a.data(), packed, nullptr, c.data());
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rep >= 2) best = std::min(best, s);
  }
  check.ran = true;
  check.gflops = 2.0 * M * N * K / best / 1e9;
  check.floor_gflops = bf16_floor_gflops(cpu_gemm_info().isa);
  check.implementation = matmul.implementation();
  return check;
}

double probe_gflops(const PackedMatmul::Shape& shape_in, int64_t m, int threads, double seconds,
                    std::string* implementation) {
  PackedMatmul::Shape shape = shape_in;
  shape.emulate = false;
  shape.lda = shape.k;  // the probe times the kernel alone, on dense rows
  shape.ldc = shape.n;
  single_threaded();
  // oneDNN fixes a primitive's thread count when it is created: the team first.
  const OmpThreads team(threads);
  const dnnl::matmul::primitive_desc pd = packed_pd(shape, m, any_weights(shape));
  const dnnl::matmul primitive(pd);
  if (implementation != nullptr) *implementation = pd.impl_info_str();
  std::vector<float> w(size_t(shape.n * shape.k));
  for (size_t i = 0; i < w.size(); ++i) w[i] = float(int(i % 13) - 6) * 0.03125f;
  const dnnl::memory packed = pack_weights(shape, pd.weights_desc(), w.data());
  const size_t element = shape.bf16 ? 2 : 4;
  std::vector<std::byte> a(size_t(m * shape.k) * element), c(size_t(m * shape.n) * element);
  // Small finite values in either dtype: 0x3f80 is bfloat16 1.0, and as float32 pairs about 1.0.
  for (size_t i = 0; i + 1 < a.size(); i += 2) {
    const uint16_t one = 0x3f80;
    std::memcpy(&a[i], &one, 2);
  }
  std::vector<float> bias(size_t(shape.n), 0.0f);
  const bool has_bias = shape.epilogue == Epilogue::kBias || shape.epilogue == Epilogue::kBiasAct;
  double best = 1e30, total = 0;
  for (int rep = 0; rep < 3 || (total < seconds && rep < 1000); ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    execute(pd, primitive, a.data(), packed, bias.data(), c.data(), has_bias);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    total += s;
    if (rep >= 1) best = std::min(best, s);  // the first run pays for first-touch
  }
  return 2.0 * double(m) * double(shape.n) * double(shape.k) / best / 1e9;
}

}  // namespace fastformer::engine
