// The key scores of bfloat16 keys on AVX512_BF16's VDPBF16PS (vector_rows.h): the weight in
// bfloat16 pairs along D (key_weight_pairs, three builds as every family) and one kernel written
// once over its dot product, compiled for the instruction and for its portable model
// (key_scores_pairs).
#include <algorithm>

#include "server/engine/cpu/vector_rows.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "server/engine/cpu/vector_rows_common.h"

namespace fastformer::engine::rows {
namespace {

// The weight in bfloat16 pairs along D (vector_rows.h): rows 2p and 2p+1 of Wka^T scaled,
// rounded, and interleaved as the low and high halves of each word.
template <class V>
FF_INLINE void key_weight_pairs_impl(const float* wka_t, const float* pq, int64_t H, int64_t D,
                                     uint32_t* w) {
  using U = typename Lanes<V>::u32;
  constexpr int L = sizeof(V) / sizeof(float);
  const int64_t Hv = H - H % L;
  // bfloat16 bits in the low half of each lane, as st() rounds
  auto rounded = [](const V& v, U& out) {
    U x;
    std::memcpy(&x, &v, sizeof(V));
    const U nearest = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    const U nan = (x >> 16) | 0x40u;
    out = (x & 0x7fffffffu) > 0x7f800000u ? nan : nearest;
  };
  for (int64_t p = 0; p < (D + 1) / 2; ++p) {
    const float* lo = wka_t + 2 * p * H;
    const float* hi = lo + H;
    const bool has_hi = 2 * p + 1 < D;
    const float s_lo = pq[2 * p], s_hi = has_hi ? pq[2 * p + 1] : 0.0f;
    for (int64_t h = 0; h < Hv; h += L) {
      V a, b = V{};
      loadv(a, lo + h);
      if (has_hi) loadv(b, hi + h);
      U low, high;
      rounded(a * s_lo, low);
      rounded(b * s_hi, high);
      const U bits = low | (high << 16);
      std::memcpy(w + p * H + h, &bits, sizeof(U));
    }
    for (int64_t h = Hv; h < H; ++h) {
      uint16_t l, u = 0;
      st(&l, 0, lo[h] * s_lo);
      if (has_hi) st(&u, 0, hi[h] * s_hi);
      w[p * H + h] = uint32_t(l) | (uint32_t(u) << 16);
    }
  }
}

}  // namespace

FF_BUILDS(void, key_weight_pairs,
          (const float* wka_t, const float* pq, int64_t H, int64_t D, uint32_t* w),
          key_weight_pairs_impl, (wka_t, pq, H, D, w))

namespace {

using u32x16 = Lanes<v16f>::u32;

// The same blocking for the instruction and its model, over Dot::dot(acc, pair, w), which adds
// the products of one key pair (broadcast) and 16 weight pairs to the 16 lanes of acc. Per
// group of 16 heads, blocks of 16 tokens, one accumulator a token; per pair p of D one weight
// row of 16 head pairs, and each token's key pair broadcast.
template <class Dot>
FF_INLINE void key_scores_pairs_impl(const uint16_t* k, int64_t ldk, int64_t n, const uint32_t* w,
                                     const float* bias, int64_t H, int64_t D, float* r,
                                     int64_t ldr) {
  constexpr int TB = 16;
  const int64_t pairs = D / 2;
  for (int64_t g = 0; g < H; g += 16) {
    v16f b;
    loadv(b, bias + g);
    for (int64_t t0 = 0; t0 < n; t0 += TB) {
      const uint16_t* kp[TB];
      for (int i = 0; i < TB; ++i) kp[i] = k + std::min<int64_t>(t0 + i, n - 1) * ldk;
      // The next block's rows, fetched while this one is summed: a line of each row as this
      // block's loop enters the same line of its own rows (every 32 elements).
      const bool fetch = g == 0 && t0 + TB < n;
      const uint16_t* nk[TB];
      for (int i = 0; i < TB; ++i) nk[i] = k + std::min<int64_t>(t0 + TB + i, n - 1) * ldk;
      v16f acc[TB];
#pragma GCC unroll 16
      for (int i = 0; i < TB; ++i) acc[i] = b;
      for (int64_t p = 0; p < pairs; ++p) {
        if (fetch && p % 16 == 0) {
#pragma GCC unroll 16
          for (int i = 0; i < TB; ++i) __builtin_prefetch(nk[i] + 2 * p);
        }
        u32x16 wv;
        std::memcpy(&wv, w + p * H + g, sizeof(wv));
#pragma GCC unroll 16
        for (int i = 0; i < TB; ++i) {
          uint32_t pair;
          std::memcpy(&pair, kp[i] + 2 * p, sizeof(pair));
          Dot::dot(acc[i], pair, wv);
        }
      }
      if (D % 2 != 0) {  // the last element alone: its pair's high half is 0
        u32x16 wv;
        std::memcpy(&wv, w + pairs * H + g, sizeof(wv));
        for (int i = 0; i < TB; ++i) Dot::dot(acc[i], uint32_t(kp[i][D - 1]), wv);
      }
      for (int i = 0; i < TB && t0 + i < n; ++i) storev(r + (t0 + i) * ldr + g, acc[i]);
    }
  }
}

// Intel's definition: lane i += a.bf16[2i+1] * b.bf16[2i+1], then += a.bf16[2i] * b.bf16[2i]
// (bfloat16 products are exact in float32, so contraction changes nothing).
struct ModelDot {
  FF_INLINE static void dot(v16f& acc, uint32_t pair, const u32x16& wv) {
    const u32x16 a = u32x16{} + pair;
    const u32x16 a_lo = a << 16, a_hi = a & 0xffff0000u, w_lo = wv << 16, w_hi = wv & 0xffff0000u;
    v16f x_lo, x_hi, y_lo, y_hi;
    std::memcpy(&x_lo, &a_lo, sizeof(v16f));
    std::memcpy(&x_hi, &a_hi, sizeof(v16f));
    std::memcpy(&y_lo, &w_lo, sizeof(v16f));
    std::memcpy(&y_hi, &w_hi, sizeof(v16f));
    acc += x_hi * y_hi;
    acc += x_lo * y_lo;
  }
};
void key_scores_pairs_model(const uint16_t* k, int64_t ldk, int64_t n, const uint32_t* w,
                            const float* bias, int64_t H, int64_t D, float* r, int64_t ldr) {
  key_scores_pairs_impl<ModelDot>(k, ldk, n, w, bias, H, D, r, ldr);
}

#if defined(__x86_64__)
#define FF_TARGET_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
// The instruction's intrinsic builds only inside a function with the AVX512_BF16 target, and
// an always-inline function with that target cannot be inlined into the kernel template
// (which has none): dot() is a plain inline function with the target, and the kernel's
// hardware build, with the target and `flatten`, inlines the template and every dot() into
// one function, as the kernel written out in it would be.
struct HardwareDot {
  FF_TARGET_BF16 static inline void dot(v16f& acc, uint32_t pair, const u32x16& wv) {
    __m512 a;
    __m512i x;
    std::memcpy(&a, &acc, sizeof(a));
    std::memcpy(&x, &wv, sizeof(x));
    a = _mm512_dpbf16_ps(a, (__m512bh)_mm512_set1_epi32(int(pair)), (__m512bh)x);
    std::memcpy(&acc, &a, sizeof(a));
  }
};
[[gnu::flatten]] FF_TARGET_BF16 void key_scores_pairs_hardware(const uint16_t* k, int64_t ldk,
                                                               int64_t n, const uint32_t* w,
                                                               const float* bias, int64_t H,
                                                               int64_t D, float* r, int64_t ldr) {
  key_scores_pairs_impl<HardwareDot>(k, ldk, n, w, bias, H, D, r, ldr);
}
#endif

}  // namespace

bool dot_bf16_available() {
#if defined(__x86_64__)
  static const bool available = isa_supported(Isa::kAvx512) && __builtin_cpu_supports("avx512bf16");
  return available;
#else
  return false;
#endif
}

void key_scores_pairs(DotBf16 how, const uint16_t* k, int64_t ldk, int64_t n, const uint32_t* w,
                      const float* bias, int64_t H, int64_t D, float* r, int64_t ldr) {
#if defined(__x86_64__)
  if (how == DotBf16::kHardware) {
    key_scores_pairs_hardware(k, ldk, n, w, bias, H, D, r, ldr);
    return;
  }
#endif
  (void)how;
  key_scores_pairs_model(k, ldk, n, w, bias, H, D, r, ldr);
}

}  // namespace fastformer::engine::rows
