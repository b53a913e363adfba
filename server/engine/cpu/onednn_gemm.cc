#include "server/engine/cpu/onednn_gemm.h"

#include <omp.h>  // the OpenMP runtime oneDNN is built with: its threads per calling thread

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <unordered_map>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>

#include "common/half.h"
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
  return (static_cast<unsigned>(isa) & static_cast<unsigned>(feature)) == static_cast<unsigned>(feature);
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
    case Activation::kGeluErf: return dnnl::algorithm::eltwise_gelu_erf;
    case Activation::kGeluTanh: return dnnl::algorithm::eltwise_gelu_tanh;
    case Activation::kRelu: return dnnl::algorithm::eltwise_relu;
    case Activation::kSilu: *alpha = 1.0f; return dnnl::algorithm::eltwise_swish;  // x * sigmoid(1 x)
  }
  throw EngineError("unknown activation");
}

}  // namespace

const CpuGemmInfo& cpu_gemm_info() {
  static const CpuGemmInfo info = [] {
    CpuGemmInfo i;
    single_threaded();
    const dnnl_version_t* v = dnnl_version();
    i.version = std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
    const dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    i.isa = isa_name(isa);
    i.has_bf16 = isa_has(isa, dnnl_cpu_isa_avx512_core_bf16);
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
  const bool has_bias = shape.epilogue == Epilogue::kBias || shape.epilogue == Epilogue::kBiasAct;
  const memory::desc bias = has_bias ? memory::desc({1, N}, memory::data_type::f32, {N, 1}) : memory::desc();
  dnnl::post_ops post;
  if (shape.epilogue == Epilogue::kBiasAct) {
    float alpha = 0;
    const dnnl::algorithm alg = eltwise_of(shape.act, &alpha);
#if DNNL_VERSION_MAJOR >= 3
    post.append_eltwise(alg, alpha, 0.0f);
#else
    post.append_eltwise(1.0f, alg, alpha, 0.0f);
#endif
  } else if (shape.epilogue == Epilogue::kAccumulate) {
    post.append_sum(1.0f);
  }
  dnnl::primitive_attr attr;
  attr.set_post_ops(post);
  try {
#if DNNL_VERSION_MAJOR >= 3
    dnnl::matmul::primitive_desc pd(cpu_engine(), src, weights, bias, dst, attr);
#else
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src, weights, bias, dst), attr, cpu_engine());
#endif
    impl_ = std::make_unique<Impl>(Impl{pd, dnnl::matmul(pd)});
  } catch (const dnnl::error& e) {
    throw EngineError(std::string("oneDNN has no ") + (shape.bf16 ? "bfloat16" : "float32") + " matmul for [M, " +
                      std::to_string(K) + "] x [" + std::to_string(N) + ", " + std::to_string(K) +
                      "]^T on this CPU (" + cpu_gemm_info().isa + "): " + e.what());
  }
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
    for (int64_t r = 0; r < m; ++r) {
      std::transform(a + r * shape_.lda, a + r * shape_.lda + K, rounded.data() + r * K, float_to_bfloat16);
    }
    src_data = rounded.data();
    lda = K;
  }
  const auto in_type = shape_.bf16 ? memory::data_type::bf16 : memory::data_type::f32;
  memory src({{m, K}, in_type, {lda, 1}}, engine, const_cast<void*>(src_data));
  memory weights({{K, N}, in_type, {1, K}}, engine, const_cast<void*>(w));
  memory dst({{m, N}, memory::data_type::f32, {shape_.ldc, 1}}, engine, c);
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, weights}, {DNNL_ARG_DST, dst}};
  if (shape_.epilogue == Epilogue::kBias || shape_.epilogue == Epilogue::kBiasAct) {
    args.emplace(DNNL_ARG_BIAS, memory({{1, N}, memory::data_type::f32, {N, 1}}, engine, const_cast<float*>(bias)));
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
                     " GFLOP/s on one thread (float32 256x512x512, oneDNN " + cpu_gemm_info().version +
                     ", kernel " + implementation + "; expected at least " + format_double("%.0f", floor_gflops) +
                     " for " + isa + ")";
  if (below_floor()) {
    line += "; below the floor: this CPU runs slower than its instruction set allows. Likely causes: "
            "ONEDNN_MAX_CPU_ISA or a hypervisor hiding CPU features (oneDNN sees " + isa +
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

}  // namespace fastformer::engine
