#include "server/engine/cpu/peak_probe.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "server/engine/cpu/amx_tiles.h"
#include "server/engine/cpu/vector_rows.h"

namespace fastformer::engine {
namespace {

using Clock = std::chrono::steady_clock;

// Runs body(thread) on `threads` threads at once; the wall time from the first start to the
// last end, best of `runs`.
double best_seconds(int threads, int runs, const std::function<void(int)>& body) {
  double best = 1e30;
  for (int run = 0; run < runs; ++run) {
    std::vector<std::thread> pool;
    const auto t0 = Clock::now();
    for (int i = 1; i < threads; ++i) pool.emplace_back(body, i);
    body(0);
    for (auto& t : pool) t.join();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

using v16f = float __attribute__((vector_size(64)));
using v8f = float __attribute__((vector_size(32)));
using v4f = float __attribute__((vector_size(16)));

// `Chains` independent multiply-add chains of V, `iterations` times; returns a value the
// compiler cannot drop.
template <class V, int Chains>
[[gnu::always_inline]] inline float fma_chains(int64_t iterations) {
  V acc[Chains];
  V m, a;
  for (size_t lane = 0; lane < sizeof(V) / sizeof(float); ++lane) {
    m[lane] = 0.9999999f;
    a[lane] = 1e-7f;
  }
  for (int i = 0; i < Chains; ++i) acc[i] = a * float(i);
  for (int64_t it = 0; it < iterations; ++it) {
#pragma GCC unroll 16
    for (int i = 0; i < Chains; ++i) acc[i] = acc[i] * m + a;
  }
  float sum = 0;
  for (int i = 0; i < Chains; ++i) sum += acc[i][0];
  return sum;
}

#if defined(__x86_64__)
__attribute__((target("avx512f,avx512vl,fma"))) float fma_avx512(int64_t n) {
  return fma_chains<v16f, 16>(n);
}
__attribute__((target("avx2,fma"))) float fma_avx2(int64_t n) { return fma_chains<v8f, 12>(n); }
__attribute__((target("avx512f,avx512bf16"))) float dpbf16_avx512(int64_t n) {
  __m512 acc[16];
  const __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80);  // pairs of bfloat16 1.0
  const __m512bh b = (__m512bh)_mm512_set1_epi32(0x33d633d6);  // pairs of about 1e-7
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t it = 0; it < n; ++it) {
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  }
  float sum = 0;
  for (int i = 0; i < 16; ++i) {
    float lanes[16];
    _mm512_storeu_ps(lanes, acc[i]);
    sum += lanes[0];
  }
  return sum;
}
#endif
float fma_baseline(int64_t n) { return fma_chains<v4f, 8>(n); }
// Each thread asks for its tiles itself (the permission is per process, the tile state per
// thread: peak_loop configures and releases them).
float amx_loop(int64_t n) { return amx::hardware_peak_loop(n / 8); }

// FLOP/s of `kernel` (flops_per_iteration per call iteration) on `threads` threads.
HardwarePeak time_peak(int threads, double flops_per_iteration, float (*kernel)(int64_t),
                       std::string how) {
  const int64_t iterations = 2'000'000;
  std::vector<float> sink(static_cast<size_t>(threads));
  kernel(iterations / 10);  // warm: clocks up, the wide units powered
  const double seconds =
      best_seconds(threads, 3, [&](int i) { sink[size_t(i)] = kernel(iterations); });
  volatile float keep = sink[0];
  (void)keep;
  return {double(threads) * double(iterations) * flops_per_iteration / seconds / 1e9,
          std::move(how)};
}

}  // namespace

double copy_gbps(int threads, size_t bytes) {
  threads = std::max(threads, 1);
  const size_t slice = bytes / size_t(threads) / 64 * 64;
  std::unique_ptr<char[]> src(new char[slice * size_t(threads)]);
  std::unique_ptr<char[]> dst(new char[slice * size_t(threads)]);
  std::memset(src.get(), 1, slice * size_t(threads));
  std::memset(dst.get(), 2, slice * size_t(threads));
  const double seconds = best_seconds(threads, 5, [&](int i) {
    std::memcpy(dst.get() + size_t(i) * slice, src.get() + size_t(i) * slice, slice);
  });
  return double(slice) * threads / seconds / 1e9;
}

HardwarePeak fma_peak(int threads) {
  threads = std::max(threads, 1);
#if defined(__x86_64__)
  switch (rows::detected_isa()) {
    case rows::Isa::kAvx512:
      return time_peak(threads, 16 * 16 * 2, fma_avx512, "VFMADD231PS zmm, 16 chains a thread");
    case rows::Isa::kAvx2:
      return time_peak(threads, 12 * 8 * 2, fma_avx2, "VFMADD231PS ymm, 12 chains a thread");
    case rows::Isa::kBaseline:
      break;
  }
#endif
  return time_peak(threads, 8 * 4 * 2, fma_baseline, "MULPS + ADDPS xmm, 8 chains a thread");
}

HardwarePeak avx512_bf16_peak(int threads) {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512bf16"))
    return time_peak(std::max(threads, 1), 16 * 16 * 4, dpbf16_avx512,
                     "VDPBF16PS zmm, 16 chains a thread");
#endif
  (void)threads;
  return {0, "no AVX512_BF16 on this CPU"};
}

std::vector<TileCeiling> amx_tile_ceilings() {
  std::vector<TileCeiling> out = {{"no loads", 0, amx_bf16_peak(1)}};
  std::string why;
  const bool amx = amx_available(&why);
  // Captureless, so each is a kernel for time_peak (iterations / 8, as amx_loop).
  const std::pair<const char*, float (*)(int64_t)> fed[] = {
      {"L1-fed", [](int64_t n) { return amx::hardware_fed_loop(int64_t(16) << 10, n / 8); }},
      {"L2-fed", [](int64_t n) { return amx::hardware_fed_loop(int64_t(256) << 10, n / 8); }}};
  const int64_t bytes[] = {int64_t(16) << 10, int64_t(256) << 10};
  for (size_t i = 0; i < 2; ++i) {
    out.push_back({fed[i].first, bytes[i],
                   amx ? time_peak(1, amx::kPeakLoopFlops / 8, fed[i].second,
                                   "2 x 2 tiles, 2 A + 2 B tiles loaded a step from " +
                                       std::to_string(bytes[i] >> 10) + " KiB")
                       : HardwarePeak{0, why}});
  }
  return out;
}

HardwarePeak amx_bf16_peak(int threads) {
  std::string why;
  if (!amx_available(&why)) return {0, why};
  return time_peak(std::max(threads, 1), amx::kPeakLoopFlops / 8, amx_loop,
                   "TDPBF16PS on 4 independent tiles a thread");
}

}  // namespace fastformer::engine
