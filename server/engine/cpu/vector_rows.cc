#include "server/engine/cpu/vector_rows.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "server/engine/cpu/vector_math.h"

namespace fastformer::engine::rows {
namespace {

// The vector types of the three builds (GCC and Clang vector extensions): the key-score kernel
// is written over them; the other passes are plain loops the compiler vectorises for each
// build's target.
using v16f = float __attribute__((vector_size(64)));
using v8f = float __attribute__((vector_size(32)));
using v4f = float __attribute__((vector_size(16)));

#define FF_INLINE [[gnu::always_inline]] inline

FF_INLINE float ld(const float* p, int64_t j) { return p[j]; }
FF_INLINE float ld(const uint16_t* p, int64_t j) {
  return std::bit_cast<float>(uint32_t(p[j]) << 16);
}
FF_INLINE void st(float* p, int64_t j, float v) { p[j] = v; }
// common/half.h's float_to_bfloat16 (round to nearest even, NaN kept quiet), branch-free.
FF_INLINE void st(uint16_t* p, int64_t j, float v) {
  const uint32_t x = std::bit_cast<uint32_t>(v);
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  const uint32_t nan = (x >> 16) | 0x40u;
  p[j] = static_cast<uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

// The integer vectors of the same lane count: bfloat16 lanes are widened to float32 in
// registers (zero-extend to 32 bits, shift left by 16).
template <class V>
struct Lanes;
template <>
struct Lanes<v16f> {
  using u16 = uint16_t __attribute__((vector_size(32)));
  using u32 = uint32_t __attribute__((vector_size(64)));
  using i32 = int32_t __attribute__((vector_size(64)));
};
template <>
struct Lanes<v8f> {
  using u16 = uint16_t __attribute__((vector_size(16)));
  using u32 = uint32_t __attribute__((vector_size(32)));
  using i32 = int32_t __attribute__((vector_size(32)));
};
template <>
struct Lanes<v4f> {
  using u16 = uint16_t __attribute__((vector_size(8)));
  using u32 = uint32_t __attribute__((vector_size(16)));
  using i32 = int32_t __attribute__((vector_size(16)));
};

// (By reference, not returned: a vector return value changes the ABI between the builds.)
template <class V>
FF_INLINE void loadv(V& v, const float* p) {
  std::memcpy(&v, p, sizeof(V));
}
// Each bfloat16 lane paired with a zero below it: (0, h[i]) as 16-bit halves is h[i] << 16 as
// a little-endian 32-bit lane, the float32 it denotes (one interleave; a zero-extend and a
// shift come out as four instructions for 16 lanes in GCC).
template <class U16, size_t... I>
FF_INLINE void interleave_zero(const U16& half, void* out, std::index_sequence<I...>) {
  constexpr int L = sizeof(U16) / sizeof(uint16_t);
  const U16 zero = {};
  const auto wide = __builtin_shufflevector(zero, half, (I % 2 ? L + int(I / 2) : int(I / 2))...);
  std::memcpy(out, &wide, sizeof(wide));
}
template <class V>
FF_INLINE void loadv(V& v, const uint16_t* p) {
  typename Lanes<V>::u16 half;
  std::memcpy(&half, p, sizeof(half));
  interleave_zero(half, &v, std::make_index_sequence<2 * sizeof(V) / sizeof(float)>{});
}
template <class V>
FF_INLINE void storev(float* p, const V& v) {
  std::memcpy(p, &v, sizeof(V));
}

// The sum of a vector's lanes, by halves.
FF_INLINE float hsum(const v4f& v) { return (v[0] + v[2]) + (v[1] + v[3]); }
FF_INLINE float hsum(const v8f& v) {
  const v4f half =
      __builtin_shufflevector(v, v, 0, 1, 2, 3) + __builtin_shufflevector(v, v, 4, 5, 6, 7);
  return hsum(half);
}
FF_INLINE float hsum(const v16f& v) {
  const v8f half = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                   __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  return hsum(half);
}

// Stores a float vector as bfloat16, rounded to nearest even (NaN kept quiet), as st() does.
template <class V>
FF_INLINE void storev(uint16_t* p, const V& v) {
  using U = typename Lanes<V>::u32;
  U x;
  std::memcpy(&x, &v, sizeof(V));
  const U rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  const U nan = (x >> 16) | 0x40u;
  const U bits = (x & 0x7fffffffu) > 0x7f800000u ? nan : rounded;
  const typename Lanes<V>::u16 half = __builtin_convertvector(bits, typename Lanes<V>::u16);
  std::memcpy(p, &half, sizeof(half));
}

// out = LN(x) over D values of x (float, in cache), statistics over two passes, each summed in
// four independent chains (one chain leaves a row's passes waiting on the add's latency, and
// D = 256 is only sixteen AVX-512 vectors: the rows' latency, not their bytes, bounded the op).
template <class V>
FF_INLINE float squares_about(const float* x, int64_t Dv, float mean) {
  constexpr int L = sizeof(V) / sizeof(float);
  V acc[4] = {};
  int64_t j = 0;
  for (; j + 4 * L <= Dv; j += 4 * L) {
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q) {
      V xv;
      loadv(xv, x + j + q * L);
      xv -= mean;
      acc[q] += xv * xv;
    }
  }
  for (; j < Dv; j += L) {
    V xv;
    loadv(xv, x + j);
    xv -= mean;
    acc[0] += xv * xv;
  }
  return hsum((acc[0] + acc[1]) + (acc[2] + acc[3]));
}

// x = a + b (+ c, unless nullptr), stored to `x` and summed in four chains; returns the sum
// over its D values.
template <class V, class A, class C>
FF_INLINE float form_row(const A* a, const float* b, C c, int64_t D, float* x) {
  constexpr int L = sizeof(V) / sizeof(float);
  const int64_t Dv = D - D % L;
  V acc[4] = {};
  int64_t j = 0;
  auto one = [&](int64_t at, V& into) {
    V av, bv;
    loadv(av, a + at);
    loadv(bv, b + at);
    av += bv;
    if constexpr (!std::is_same_v<C, std::nullptr_t>) {
      V cv;
      loadv(cv, c + at);
      av += cv;
    }
    storev(x + at, av);
    into += av;
  };
  for (; j + 4 * L <= Dv; j += 4 * L) {
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q) one(j + q * L, acc[q]);
  }
  for (; j < Dv; j += L) one(j, acc[0]);
  float sum = hsum((acc[0] + acc[1]) + (acc[2] + acc[3]));
  for (j = Dv; j < D; ++j) {
    float v = ld(a, j) + b[j];
    if constexpr (!std::is_same_v<C, std::nullptr_t>) v += ld(c, j);
    x[j] = v;
    sum += v;
  }
  return sum;
}

// `sum`: of x's D values, summed by the caller's pass that formed x.
template <class V, class O>
FF_INLINE void layernorm_impl(const float* x, float sum, const float* gamma, const float* beta,
                              int64_t D, float eps, O* out) {
  constexpr int L = sizeof(V) / sizeof(float);
  const int64_t Dv = D - D % L;
  const float mean = sum / static_cast<float>(D);
  float sq = squares_about<V>(x, Dv, mean);
  for (int64_t j = Dv; j < D; ++j) sq += (x[j] - mean) * (x[j] - mean);
  const float rstd = 1.0f / std::sqrt(sq / static_cast<float>(D) + eps);
  for (int64_t j = 0; j < Dv; j += L) {
    V xv, g, b;
    loadv(xv, x + j);
    loadv(g, gamma + j);
    loadv(b, beta + j);
    storev(out + j, (xv - mean) * rstd * g + b);
  }
  for (int64_t j = Dv; j < D; ++j) st(out, j, (x[j] - mean) * rstd * gamma[j] + beta[j]);
}

template <class V, class O>
FF_INLINE void embed_impl(const float* word, const float* pos, const float* gamma,
                          const float* beta, int64_t D, float eps, float* x, O* out) {
  const float sum = form_row<V>(word, pos, nullptr, D, x);
  layernorm_impl<V>(x, sum, gamma, beta, D, eps, out);
}

template <class V, class E>
FF_INLINE void residual_layernorm_impl(const E* c, const float* bias, const E* residual,
                                       const float* gamma, const float* beta, int64_t D, float eps,
                                       float* x, E* out) {
  const float sum = form_row<V>(c, bias, residual, D, x);
  layernorm_impl<V>(x, sum, gamma, beta, D, eps, out);
}

template <class V, class E>
FF_INLINE void scale_impl(const E* x, const float* scale, int64_t n, E* out) {
  constexpr int L = sizeof(V) / sizeof(float);
  const int64_t nv = n - n % L;
  for (int64_t j = 0; j < nv; j += L) {
    V a, b;
    loadv(a, x + j);
    loadv(b, scale + j);
    storev(out + j, a * b);
  }
  for (int64_t j = nv; j < n; ++j) st(out, j, ld(x, j) * scale[j]);
}

// Tokens per block and heads per block of the key-score kernel: TB x HB accumulators, and
// TB + HB loads for TB x HB multiply-adds; within the registers of each build (32 zmm: 6 x 4
// accumulators, 6 key vectors and a weight vector; 16 ymm or xmm: 2 x 4, the weight vectors
// taken from memory by the multiply-add).
template <class V>
struct KeyBlock;
template <>
struct KeyBlock<v16f> {
  static constexpr int kTokens = 6, kHeads = 4;
};
template <>
struct KeyBlock<v8f> {
  static constexpr int kTokens = 2, kHeads = 4;
};
template <>
struct KeyBlock<v4f> {
  static constexpr int kTokens = 2, kHeads = 4;
};

// Whether the key scores run vectorised over heads ([D, H] weight) for this build and H.
template <class V>
constexpr bool key_scores_by_head(int64_t H) {
  return H % int64_t(sizeof(V) / sizeof(float)) == 0;
}

// out[0 .. n) = x[0 .. n) * s (a row times one scalar).
template <class V>
FF_INLINE void scale_by(const float* x, float s, int64_t n, float* out) {
  constexpr int L = sizeof(V) / sizeof(float);
  const int64_t nv = n - n % L;
  for (int64_t j = 0; j < nv; j += L) {
    V v;
    loadv(v, x + j);
    storev(out + j, v * s);
  }
  for (int64_t j = nv; j < n; ++j) out[j] = x[j] * s;
}

// w = pq * Wka' in key_scores_impl's layout: [D, H] (rows of Wka^T scaled) where H is a
// multiple of the lanes, else [H, D] (Wka's rows times pq).
template <class V>
FF_INLINE void key_weight_impl(const float* wka, const float* wka_t, const float* pq, int64_t H,
                               int64_t D, float* w) {
  if (key_scores_by_head<V>(H)) {
    for (int64_t j = 0; j < D; ++j) scale_by<V>(wka_t + j * H, pq[j], H, w + j * H);
    return;
  }
  for (int64_t h = 0; h < H; ++h) scale_impl<V>(wka + h * D, pq, D, w + h * D);
}

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

// The next block's `rows` rows (`row_bytes` each, `stride` apart) fetched a cache line at a
// time over the `steps` steps of this block's loop: step(j) fetches `per_step` lines every
// `every` steps (a power of two that spreads them over the block), finish() what is left. All
// at once, they would fill the load queue and hold the block's arithmetic back until the rows
// came. For the pooling's passes, whose steps are few and long; the key-score kernels, whose
// steps are single elements of D, fetch a line of each row every 64 bytes instead (the
// countdown here cost them 16% in cache).
struct SpreadFetch {
  const char* row;
  int64_t rows, row_bytes, stride, every = 1, per_step = 1, at = 0, done = 0;
  FF_INLINE SpreadFetch(const void* first, int64_t rows_, int64_t row_bytes_, int64_t stride_,
                        int64_t steps)
      : row(static_cast<const char*>(first)), rows(rows_), row_bytes(row_bytes_), stride(stride_) {
    const int64_t lines = rows * ((row_bytes + 63) / 64);
    while (lines > 0 && every * 2 * lines <= steps) every *= 2;
    if (steps > 0) per_step = std::max<int64_t>(1, (lines + steps - 1) / steps);
  }
  FF_INLINE void next() {
    if (done >= rows) return;
    __builtin_prefetch(row + at);
    at += 64;
    if (at >= row_bytes) {
      at = 0;
      ++done;
      row += stride;
    }
  }
  FF_INLINE void step(int64_t j) {
    if ((j & (every - 1)) == 0)
      for (int64_t i = 0; i < per_step; ++i) next();
  }
  FF_INLINE void finish() {
    while (done < rows) next();
  }
};

// The scores vectorised over heads: for each group of L heads, blocks of TB tokens, one
// accumulator a token; per element j of D, the weight row w[j, g .. g+L) is loaded once and
// multiplied by each token's k[j] broadcast from memory (no horizontal sums).
template <class V, class E>
FF_INLINE void key_scores_heads(const E* k, int64_t ldk, int64_t n, const float* w,
                                const float* bias, int64_t H, int64_t D, float* r, int64_t ldr) {
  constexpr int L = sizeof(V) / sizeof(float);
  constexpr int TB = sizeof(V) == 64 ? 16 : 6;
  constexpr int64_t kPiece = 256;  // bfloat16 K: widened a piece of D at a time
  [[maybe_unused]] float widened[TB][kPiece];
  for (int64_t g = 0; g < H; g += L) {
    V b;
    loadv(b, bias + g);
    for (int64_t t0 = 0; t0 < n; t0 += TB) {
      // A partial block repeats its last token: computed, not stored.
      const E* kp[TB];
#pragma GCC unroll 16
      for (int i = 0; i < TB; ++i) kp[i] = k + std::min<int64_t>(t0 + i, n - 1) * ldk;
      // The next block's rows, fetched while this one is summed: a line of each row as this
      // block's loop enters the same line of its own rows (every 64 bytes of D, TB lines).
      const bool fetch = g == 0 && t0 + TB < n;
      const E* nk[TB];
#pragma GCC unroll 16
      for (int i = 0; i < TB; ++i) nk[i] = k + std::min<int64_t>(t0 + TB + i, n - 1) * ldk;
      constexpr int64_t kLine = 64 / int64_t(sizeof(E));
      V acc[TB];
#pragma GCC unroll 16
      for (int i = 0; i < TB; ++i) acc[i] = b;
      for (int64_t j0 = 0; j0 < D; j0 += kPiece) {
        const int64_t pn = std::min(kPiece, D - j0);
        const float* kr[TB];
        if constexpr (std::is_same_v<E, float>) {
#pragma GCC unroll 16
          for (int i = 0; i < TB; ++i) kr[i] = kp[i] + j0;
        } else {  // bfloat16 rows widened once, so each k[j] is one broadcast from memory
          const int64_t pv = pn - pn % L;
          for (int i = 0; i < TB; ++i) {
            for (int64_t j = 0; j < pv; j += L) {
              V x;
              loadv(x, kp[i] + j0 + j);
              storev(widened[i] + j, x);
            }
            for (int64_t j = pv; j < pn; ++j) widened[i][j] = ld(kp[i], j0 + j);
            kr[i] = widened[i];
          }
        }
        for (int64_t j = 0; j < pn; ++j) {
          if (fetch && (j0 + j) % kLine == 0) {
#pragma GCC unroll 16
            for (int i = 0; i < TB; ++i) __builtin_prefetch(nk[i] + j0 + j);
          }
          V wv;
          loadv(wv, w + (j0 + j) * H + g);
#pragma GCC unroll 16
          for (int i = 0; i < TB; ++i) acc[i] += wv * kr[i][j];  // (V{} + x would add a zero first)
        }
      }
      for (int i = 0; i < TB && t0 + i < n; ++i) storev(r + (t0 + i) * ldr + g, acc[i]);
    }
  }
}

// K rows of E (float32, or bfloat16 widened in registers).
template <class V, class E>
FF_INLINE void key_scores_impl(const E* k, int64_t ldk, int64_t n, const float* w,
                               const float* bias, int64_t H, int64_t D, float* r, int64_t ldr) {
  constexpr int L = sizeof(V) / sizeof(float);
  constexpr int TB = KeyBlock<V>::kTokens, HB = KeyBlock<V>::kHeads;
  if (key_scores_by_head<V>(H)) {
    key_scores_heads<V>(k, ldk, n, w, bias, H, D, r, ldr);
    return;
  }
  // Otherwise [H, D]: register blocks of TB tokens x HB heads along D, then a sum of lanes each.
  const int64_t Dv = D - D % L;
  for (int64_t t0 = 0; t0 < n; t0 += TB) {
    // A partial block repeats its last token (and below its last head): computed, not stored.
    const E* kp[TB];
#pragma GCC unroll 8
    for (int i = 0; i < TB; ++i) kp[i] = k + std::min<int64_t>(t0 + i, n - 1) * ldk;
    for (int64_t h0 = 0; h0 < H; h0 += HB) {
      const float* wp[HB];
#pragma GCC unroll 8
      for (int j = 0; j < HB; ++j) wp[j] = w + std::min<int64_t>(h0 + j, H - 1) * D;
      V acc[TB][HB];
#pragma GCC unroll 8
      for (int i = 0; i < TB; ++i) {
#pragma GCC unroll 8
        for (int j = 0; j < HB; ++j) acc[i][j] = V{};
      }
      // The first head block reads the block's key rows from memory: the next block's rows are
      // fetched meanwhile (the later head blocks find these rows in L1).
      const bool fetch = h0 == 0 && t0 + TB < n;
      for (int64_t x = 0; x < Dv; x += L) {
        V kv[TB];
#pragma GCC unroll 8
        for (int i = 0; i < TB; ++i) loadv(kv[i], kp[i] + x);
        if (fetch) {
#pragma GCC unroll 8
          for (int i = 0; i < TB; ++i) __builtin_prefetch(kp[i] + TB * ldk + x);
        }
#pragma GCC unroll 8
        for (int j = 0; j < HB; ++j) {
          V wv;
          loadv(wv, wp[j] + x);
#pragma GCC unroll 8
          for (int i = 0; i < TB; ++i) acc[i][j] += kv[i] * wv;
        }
      }
      for (int i = 0; i < TB && t0 + i < n; ++i) {
        for (int j = 0; j < HB && h0 + j < H; ++j) {
          float s = hsum(acc[i][j]);
          for (int64_t x = Dv; x < D; ++x) s += ld(kp[i], x) * wp[j][x];
          r[(t0 + i) * ldr + h0 + j] = s + bias[h0 + j];
        }
      }
    }
  }
}

// v[0 .. d) += sum over t < n of w[t] x_t[0 .. d), rows x_t = x + t * stride: one head's slice
// of the weighted sum through memory, for any d (weighted_sum_heads holds it in registers where
// d is 1, 2, 4 or 8 vectors).
template <class E>
FF_INLINE void weighted_sum(const float* w, const E* x, int64_t stride, int64_t n, int64_t d,
                            float* v) {
  for (int64_t t = 0; t < n; ++t) {
    if (w[t] == 0.0f) continue;  // a masked token (its row is never read)
    const float wt = w[t];
    const E* row = x + t * stride;
#pragma omp simd
    for (int64_t j = 0; j < d; ++j) v[j] += wt * ld(row, j);
  }
}

// The weighted sums of G heads at once (DV vectors a head, G * DV accumulators held over the
// block): v[h d .. (h + 1) d) += sum over real tokens t < n of w[h, t] x_t[h d ...] for the heads
// h0 .. h0 + G, head-major weights w [heads, wld] from the block's first token. Each row's G
// slices are read together, so a block reads its rows' bytes in long runs, and the G * DV chains
// are independent (one head's DV alone leave the multiply-adds waiting on each other). G 1: one
// head.
template <class V, int DV, int G, class E>
FF_INLINE void weighted_sum_heads(const float* w, int64_t wld, const E* x, int64_t stride,
                                  const uint8_t* mask, int64_t n, int64_t d, float* v,
                                  int64_t ahead) {
  constexpr int L = sizeof(V) / sizeof(float);
  // The next block's rows (`ahead` of them, kPoolBlock rows on), the group's slice of row t
  // fetched as row t is summed.
  constexpr int64_t kBytes = int64_t(G) * DV * L * int64_t(sizeof(E));
  V acc[G][DV];
#pragma GCC unroll 16
  for (int g = 0; g < G; ++g)
#pragma GCC unroll 8
    for (int q = 0; q < DV; ++q) loadv(acc[g][q], v + g * d + q * L);
  for (int64_t t = 0; t < n; ++t) {
    if (t < ahead) {
      const char* next = reinterpret_cast<const char*>(x + (t + kPoolBlock) * stride);
#pragma GCC unroll 16
      for (int64_t b = 0; b < kBytes; b += 64) __builtin_prefetch(next + b);
    }
    if (!mask[t]) continue;  // a masked token (its row is never read)
    const E* row = x + t * stride;
#pragma GCC unroll 16
    for (int g = 0; g < G; ++g) {
      const float wt = w[g * wld + t];
#pragma GCC unroll 8
      for (int q = 0; q < DV; ++q) {
        V xv;
        loadv(xv, row + g * d + q * L);
        acc[g][q] += xv * wt;
      }
    }
  }
#pragma GCC unroll 16
  for (int g = 0; g < G; ++g)
#pragma GCC unroll 8
    for (int q = 0; q < DV; ++q) storev(v + g * d + q * L, acc[g][q]);
}

// exp(y) in every lane, y <= 0: vmath::exp's range reduction and polynomial on the vector type
// (GCC vectorises the scalar form only 256 bits wide for AVX-512).
template <class V>
FF_INLINE void exp_nonpositive(V& y) {
  using I = typename Lanes<V>::i32;
  y = y < -87.0f ? V{} - 87.0f : y;
  const I n = __builtin_convertvector(y * 1.44269504088896341f - 0.5f, I);  // round, as y <= 0
  const V nf = __builtin_convertvector(n, V);
  const V r = (y - nf * vmath::kLn2High) - nf * vmath::kLn2Low;  // y - n ln 2, in two parts
  const I scale = (n + 127) << 23;                               // 2^n
  V two_n;
  std::memcpy(&two_n, &scale, sizeof(V));
  vmath::exp_polynomial(r, y);
  y *= two_n;
}

// Head-major softmax weights w[h, t] (the exp along contiguous tokens), m and l per head: for
// any head count.
template <class V, class S>
FF_INLINE void weights_by_head(const S* scores, int64_t score_ld, int64_t heads,
                               const uint8_t* mask, int64_t len, float* m, float* l, float* w,
                               SpreadFetch* fetch = nullptr) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  constexpr int L = sizeof(V) / sizeof(float);
  constexpr int64_t kAhead = 8;  // score rows fetched ahead (each its own cache line)
  for (int64_t h = 0; h < heads; ++h) m[h] = kNegInf;
  for (int64_t t = 0; t < len; ++t) {
    const S* s = scores + t * score_ld;
    if (t + kAhead < len) __builtin_prefetch(s + kAhead * score_ld);
    if (fetch != nullptr) fetch->step(t);
    for (int64_t h = 0; h < heads; ++h) {
      const float value = mask[t] ? ld(s, h) : kNegInf;
      w[h * len + t] = value;
      m[h] = std::max(m[h], value);
    }
  }
  for (int64_t h = 0; h < heads; ++h) {
    float* wh = w + h * len;
    const float mh = m[h] == kNegInf ? 0.0f : m[h];  // no real token: every weight is 0
    // A masked token weighs exactly 0 (the reference's -10000 underflows to 0 in float32).
    const int64_t lv = len - len % L;
    V acc{};
    for (int64_t t = 0; t < lv; t += L) {
      V x;
      loadv(x, wh + t);
      V e = x - mh;  // <= 0
      exp_nonpositive(e);
      e = x == kNegInf ? V{} : e;
      storev(wh + t, e);
      acc += e;
    }
    float sum = hsum(acc);
    for (int64_t t = lv; t < len; ++t) {
      const float weight = wh[t] == kNegInf ? 0.0f : vmath::exp(wh[t] - mh);
      wh[t] = weight;
      sum += weight;
    }
    l[h] = sum;
  }
}

// Token-major softmax weights, vectorised over heads (heads a multiple of the lanes): w[t, h] =
// exp(s[t, h] - m[h]) for real tokens, 0 for masked ones; m and l (the sums) per head. One
// vector load a token per L heads, where the head-major form gathers heads scalars a token.
template <class V, class S>
FF_INLINE void weights_by_token(const S* scores, int64_t score_ld, int64_t heads,
                                const uint8_t* mask, int64_t len, float* m, float* l, float* w) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  constexpr int L = sizeof(V) / sizeof(float);
  for (int64_t g = 0; g < heads; g += L) {
    V mx = V{} + kNegInf;
    for (int64_t t = 0; t < len; ++t) {
      if (!mask[t]) continue;
      V x;
      loadv(x, scores + t * score_ld + g);
      mx = x > mx ? x : mx;
    }
    storev(m + g, mx);
    const V mh = mx == kNegInf ? V{} : mx;  // no real token: every weight is 0
    V sum{};
    for (int64_t t = 0; t < len; ++t) {
      float* wt = w + t * heads + g;
      if (!mask[t]) {
        storev(wt, V{});  // a masked token weighs exactly 0
        continue;
      }
      V e;
      loadv(e, scores + t * score_ld + g);
      e -= mh;  // <= 0
      exp_nonpositive(e);
      storev(wt, e);
      sum += e;
    }
    storev(l + g, sum);
  }
}

// v[q0 L .. (q0 + NB) L) = sum over real tokens t of w[t, head] x_t[...], token-major weights
// w [len, heads]: NB accumulators held over the whole chunk (independent chains, where the
// head-major form chains one head's FMAs), rows read in order. VPH: vectors per head within the
// block (NB: the whole block is one head); h0 the block's first head.
template <class V, int NB, int VPH, class E>
FF_INLINE void weighted_sum_by_token(const float* w, int64_t heads, int64_t h0, const E* x,
                                     int64_t stride, const uint8_t* mask, int64_t len, float* v) {
  constexpr int L = sizeof(V) / sizeof(float);
  V acc[NB];
#pragma GCC unroll 16
  for (int q = 0; q < NB; ++q) acc[q] = V{};
  for (int64_t t = 0; t < len; ++t) {
    if (!mask[t]) continue;
    const float* wt = w + t * heads + h0;
    const E* row = x + t * stride;
#pragma GCC unroll 16
    for (int q = 0; q < NB; ++q) {
      V xv;
      loadv(xv, row + q * L);
      acc[q] += xv * wt[q / VPH];
    }
  }
#pragma GCC unroll 16
  for (int q = 0; q < NB; ++q) storev(v + q * L, acc[q]);
}

// The token-major pooling of a chunk, where its shape allows: each vector within one head
// (d a multiple of the lanes), blocks of NB vectors tiling the row, heads a multiple of the
// lanes (or one head: the pooler's). Returns false where it does not apply.
template <class V, int NB, class S, class E>
FF_INLINE bool pool_by_token(const S* scores, int64_t score_ld, int64_t heads, const E* values,
                             int64_t values_ld, int64_t D, const uint8_t* mask, int64_t len,
                             float* m, float* l, float* v, float* w) {
  constexpr int L = sizeof(V) / sizeof(float);
  const int64_t d = D / heads;
  if (d % L != 0 || (D / L) % NB != 0 || (heads % L != 0 && heads != 1)) return false;
  const int64_t vph = d / L;
  int layout = 0;  // VPH as a template argument
  if (vph % NB == 0)
    layout = NB;
  else if (NB % vph == 0)
    layout = int(vph);
  else
    return false;
  if (heads == 1)  // one head: the two layouts are the same
    weights_by_head<V>(scores, score_ld, heads, mask, len, m, l, w);
  else
    weights_by_token<V>(scores, score_ld, heads, mask, len, m, l, w);
  for (int64_t q0 = 0; q0 < D / L; q0 += NB) {
    const int64_t h0 = q0 / vph;
    const E* x = values + q0 * L;
    float* out = v + q0 * L;
    switch (layout) {
      case 1:
        weighted_sum_by_token<V, NB, 1>(w, heads, h0, x, values_ld, mask, len, out);
        break;
      case 2:
        weighted_sum_by_token<V, NB, 2>(w, heads, h0, x, values_ld, mask, len, out);
        break;
      case 4:
        weighted_sum_by_token<V, NB, 4>(w, heads, h0, x, values_ld, mask, len, out);
        break;
      case 8:
        weighted_sum_by_token<V, NB, 8>(w, heads, h0, x, values_ld, mask, len, out);
        break;
      default:
        weighted_sum_by_token<V, NB, NB>(w, heads, h0, x, values_ld, mask, len, out);
        break;
    }
  }
  return true;
}

template <class V, class S, class E>
FF_INLINE void pool_chunk_impl(const S* scores, int64_t score_ld, int64_t heads, const E* values,
                               int64_t values_ld, int64_t D, const uint8_t* mask, int64_t len,
                               float* m, float* l, float* v, float* scratch, bool values_cached) {
  constexpr int L = sizeof(V) / sizeof(float);
  const int64_t d = D / heads;
  // 32 vector registers on AVX-512 hold 16 accumulators, 16 on AVX2 and SSE hold 8.
  constexpr int kBlock = sizeof(V) == 64 ? 16 : 8;
  if (pool_by_token<V, kBlock>(scores, score_ld, heads, values, values_ld, D, mask, len, m, l, v,
                               scratch) ||
      pool_by_token<V, kBlock / 2>(scores, score_ld, heads, values, values_ld, D, mask, len, m, l,
                                   v, scratch))
    return;
  float* w = scratch;  // [heads, len]: head-major, so the exp runs along contiguous tokens
  // The first block's rows are fetched over the scores' pass.
  SpreadFetch first(values, values_cached ? 0 : std::min(kPoolBlock, len), D * int64_t(sizeof(E)),
                    values_ld * int64_t(sizeof(E)), len);
  weights_by_head<V>(scores, score_ld, heads, mask, len, m, l, w, &first);
  first.finish();
  std::fill(v, v + D, 0.0f);
  // Blocks of kPoolBlock tokens, the slices of v of a group of G heads held in registers over
  // the block where d is 1, 2, 4 or 8 vectors (G * d / L accumulators: 16 on AVX-512, 8 below,
  // where G divides the heads; one head at a time otherwise), the value rows widened in
  // registers; any other d one head at a time through memory. The slices read each row in
  // pieces, which no hardware prefetcher follows: unless the caller has the rows in cache, the
  // next block's are fetched while this one is summed.
  const int64_t dv = d % L == 0 ? d / L : 0;
  const bool in_registers = dv == 1 || dv == 2 || dv == 4 || dv == 8;
  const bool grouped = in_registers && heads % (kBlock / dv) == 0;  // kBlock / dv >= 1
  const int64_t G = grouped ? kBlock / dv : 1;
  for (int64_t t0 = 0; t0 < len; t0 += kPoolBlock) {
    const int64_t n = std::min(kPoolBlock, len - t0);
    const int64_t ahead =
        values_cached ? 0 : std::clamp<int64_t>(len - t0 - kPoolBlock, 0, kPoolBlock);
    // Through memory: the next block's rows spread over the heads (the register forms fetch
    // their own slices as they go).
    SpreadFetch fetch(values + std::min(t0 + kPoolBlock, len - 1) * values_ld,
                      in_registers ? 0 : ahead, D * int64_t(sizeof(E)),
                      values_ld * int64_t(sizeof(E)), heads);
    for (int64_t h = 0; h < heads; h += G) {
      fetch.step(h);
      const float* wh = w + h * len + t0;
      const E* xh = values + t0 * values_ld + h * d;
      float* vh = v + h * d;
      const uint8_t* mh = mask + t0;
      auto sum = [&]<int DV>() {
        if (grouped)
          weighted_sum_heads<V, DV, kBlock / DV>(wh, len, xh, values_ld, mh, n, d, vh, ahead);
        else
          weighted_sum_heads<V, DV, 1>(wh, len, xh, values_ld, mh, n, d, vh, ahead);
      };
      switch (in_registers ? dv : 0) {
        case 1:
          sum.template operator()<1>();
          break;
        case 2:
          sum.template operator()<2>();
          break;
        case 4:
          sum.template operator()<4>();
          break;
        case 8:
          sum.template operator()<8>();
          break;
        default:
          weighted_sum(wh, xh, values_ld, n, d, vh);
          break;
      }
    }
    fetch.finish();
  }
}

// tanh in every lane of N vectors: vmath::tanh_rational on the clamped lanes, each step over
// the N vectors in turn: N independent chains in flight (one tanh is a chain of some fifteen
// dependent operations, which one vector at a time leaves waiting).
template <int N, class V>
FF_INLINE void tanh_vectors(V* x) {
  constexpr float c = vmath::kTanhClamp;
#pragma GCC unroll 8
  for (int q = 0; q < N; ++q) {
    x[q] = x[q] < -c ? V{} - c : x[q];
    x[q] = x[q] > c ? V{} + c : x[q];
  }
  V y[N];
#pragma GCC unroll 8
  for (int q = 0; q < N; ++q) vmath::tanh_rational(x[q], y[q]);
#pragma GCC unroll 8
  for (int q = 0; q < N; ++q) x[q] = y[q];
}

// `fetch_lines` lines from `fetch` brought into the cache over the row's steps (the tanh is
// arithmetic enough to hide them; the rest after the last step).
template <class V, class E>
FF_INLINE float tanh_dot_impl(const E* e, const float* w, int64_t D, const char* fetch,
                              int64_t fetch_lines) {
  constexpr int L = sizeof(V) / sizeof(float);
  constexpr int N = 4;  // vectors a step
  const int64_t Dn = D - D % (N * L), Dv = D - D % L;
  const int64_t steps = Dn / (N * L);
  const int64_t per_step = steps > 0 ? (fetch_lines + steps - 1) / steps : 0;
  int64_t fetched = 0;
  V acc[N] = {};
  for (int64_t j = 0; j < Dn; j += N * L) {
    for (int64_t i = 0; i < per_step && fetched < fetch_lines; ++i, ++fetched)
      __builtin_prefetch(fetch + 64 * fetched);
    V x[N];
#pragma GCC unroll 8
    for (int q = 0; q < N; ++q) loadv(x[q], e + j + q * L);
    tanh_vectors<N>(x);
#pragma GCC unroll 8
    for (int q = 0; q < N; ++q) {
      V wv;
      loadv(wv, w + j + q * L);
      acc[q] += x[q] * wv;
    }
  }
  for (int64_t j = Dn; j < Dv; j += L) {
    V x[1], wv;
    loadv(x[0], e + j);
    loadv(wv, w + j);
    tanh_vectors<1>(x);
    acc[0] += x[0] * wv;
  }
#pragma GCC unroll 8
  for (int q = 1; q < N; ++q) acc[0] += acc[q];
  float z = hsum(acc[0]);
  for (int64_t j = Dv; j < D; ++j) z += vmath::tanh(ld(e, j)) * w[j];
  for (; fetched < fetch_lines; ++fetched) __builtin_prefetch(fetch + 64 * fetched);
  return z;
}

template <class V, class E, class X>
FF_INLINE void tanh_scores_impl(const E* e, int64_t lde, int64_t n, const float* w, float bias,
                                int64_t D, float* z, const X* x, int64_t ldx) {
  // Row t's lines of x, from its first whole line (the line its start shares with the row
  // before was fetched with that row, or is its own first).
  const int64_t bytes = D * int64_t(sizeof(X));
  for (int64_t t = 0; t < n; ++t) {
    const char* row = reinterpret_cast<const char*>(x + t * ldx);
    const char* first =
        reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(row) & ~uintptr_t(63));
    const int64_t lines = (row + bytes - first + 63) / 64;
    z[t] = tanh_dot_impl<V>(e + t * lde, w, D, first, lines) + bias;
  }
}

}  // namespace

// Three builds of each function: NAME_avx512, NAME_avx2 and NAME_baseline, each IMPL<vector>.
#if defined(__x86_64__)
// GCC vectorises AVX-512 loops 256 bits wide unless told (its tuning for the first AVX-512
// CPUs, which clocked down on 512-bit instructions): these passes want the full width.
#if defined(__clang__)
#define FF_TARGET_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,bmi,bmi2,f16c")))
#else
#define FF_TARGET_AVX512                                                  \
  __attribute__((                                                         \
      target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,bmi,bmi2,f16c," \
             "prefer-vector-width=512")))
#endif
#define FF_TARGET_AVX2 __attribute__((target("avx2,fma,bmi,bmi2,f16c")))
#else
#define FF_TARGET_AVX512
#define FF_TARGET_AVX2
#endif
#define FF_BUILDS(RET, NAME, PARAMS, IMPL, ARGS)                        \
  namespace {                                                           \
  FF_TARGET_AVX512 RET NAME##_avx512 PARAMS { return IMPL<v16f> ARGS; } \
  FF_TARGET_AVX2 RET NAME##_avx2 PARAMS { return IMPL<v8f> ARGS; }      \
  RET NAME##_baseline PARAMS { return IMPL<v4f> ARGS; }                 \
  }                                                                     \
  RET NAME(Isa isa, FF_UNPAREN PARAMS) {                                \
    switch (isa) {                                                      \
      case Isa::kAvx512:                                                \
        return NAME##_avx512 ARGS;                                      \
      case Isa::kAvx2:                                                  \
        return NAME##_avx2 ARGS;                                        \
      case Isa::kBaseline:                                              \
        break;                                                          \
    }                                                                   \
    return NAME##_baseline ARGS;                                        \
  }
#define FF_UNPAREN(...) __VA_ARGS__

#define FF_EMBED(O)                                                                      \
  FF_BUILDS(void, embed_row,                                                             \
            (const float* word, const float* pos, const float* gamma, const float* beta, \
             int64_t D, float eps, float* scratch, O* out),                              \
            embed_impl, (word, pos, gamma, beta, D, eps, scratch, out))
FF_EMBED(float)
FF_EMBED(uint16_t)

#define FF_RESIDUAL_LN(E)                                                          \
  FF_BUILDS(void, residual_layernorm_row,                                          \
            (const E* c, const float* bias, const E* residual, const float* gamma, \
             const float* beta, int64_t D, float eps, float* scratch, E* out),     \
            residual_layernorm_impl, (c, bias, residual, gamma, beta, D, eps, scratch, out))
FF_RESIDUAL_LN(float)
FF_RESIDUAL_LN(uint16_t)

#define FF_SCALE(E)                                                                           \
  FF_BUILDS(void, scale_row, (const E* x, const float* scale, int64_t n, E* out), scale_impl, \
            (x, scale, n, out))
FF_SCALE(float)
FF_SCALE(uint16_t)

FF_BUILDS(void, key_weight,
          (const float* wka, const float* wka_t, const float* pq, int64_t H, int64_t D, float* w),
          key_weight_impl, (wka, wka_t, pq, H, D, w))
FF_BUILDS(void, key_weight_pairs,
          (const float* wka_t, const float* pq, int64_t H, int64_t D, uint32_t* w),
          key_weight_pairs_impl, (wka_t, pq, H, D, w))

#define FF_KEY_SCORES(E)                                                                       \
  FF_BUILDS(void, key_scores,                                                                  \
            (const E* k, int64_t ldk, int64_t n, const float* w, const float* bias, int64_t H, \
             int64_t D, float* r, int64_t ldr),                                                \
            key_scores_impl, (k, ldk, n, w, bias, H, D, r, ldr))
FF_KEY_SCORES(float)
FF_KEY_SCORES(uint16_t)

#define FF_POOL(S, E)                                                                             \
  FF_BUILDS(                                                                                      \
      void, pool_chunk,                                                                           \
      (const S* scores, int64_t score_ld, int64_t heads, const E* values, int64_t values_ld,      \
       int64_t D, const uint8_t* mask, int64_t len, float* m, float* l, float* v, float* scratch, \
       bool values_cached),                                                                       \
      pool_chunk_impl,                                                                            \
      (scores, score_ld, heads, values, values_ld, D, mask, len, m, l, v, scratch, values_cached))
FF_POOL(float, float)
FF_POOL(float, uint16_t)
FF_POOL(uint16_t, uint16_t)

#define FF_TANH_SCORES(E)                                                                         \
  FF_BUILDS(void, tanh_scores,                                                                    \
            (const E* e, int64_t lde, int64_t n, const float* w, float bias, int64_t D, float* z, \
             const E* x, int64_t ldx),                                                            \
            tanh_scores_impl, (e, lde, n, w, bias, D, z, x, ldx))
FF_TANH_SCORES(float)
FF_TANH_SCORES(uint16_t)

// ---- The key scores on VDPBF16PS (vector_rows.h) ----

namespace {

// The same blocking for the instruction and its model (a macro: the hardware build must be one
// function with the AVX512_BF16 target, whose intrinsics GCC inlines only into such a function).
// Per group of 16 heads, blocks of 16 tokens, one accumulator a token; per pair p of D one
// weight row of 16 head pairs, and each token's key pair broadcast.
#define FF_KEY_PAIRS_KERNEL(NAME, ATTRIBUTES, DOT)                                            \
  ATTRIBUTES void NAME(const uint16_t* k, int64_t ldk, int64_t n, const uint32_t* w,          \
                       const float* bias, int64_t H, int64_t D, float* r, int64_t ldr) {      \
    constexpr int TB = 16;                                                                    \
    const int64_t pairs = D / 2;                                                              \
    for (int64_t g = 0; g < H; g += 16) {                                                     \
      v16f b;                                                                                 \
      loadv(b, bias + g);                                                                     \
      for (int64_t t0 = 0; t0 < n; t0 += TB) {                                                \
        const uint16_t* kp[TB];                                                               \
        for (int i = 0; i < TB; ++i) kp[i] = k + std::min<int64_t>(t0 + i, n - 1) * ldk;      \
        /* the next block's rows, fetched while this one is summed: a line of each row as */  \
        /* this block's loop enters the same line of its own rows (every 32 elements) */      \
        const bool fetch = g == 0 && t0 + TB < n;                                             \
        const uint16_t* nk[TB];                                                               \
        for (int i = 0; i < TB; ++i) nk[i] = k + std::min<int64_t>(t0 + TB + i, n - 1) * ldk; \
        v16f acc[TB];                                                                         \
        _Pragma("GCC unroll 16") for (int i = 0; i < TB; ++i) acc[i] = b;                     \
        for (int64_t p = 0; p < pairs; ++p) {                                                 \
          if (fetch && p % 16 == 0) {                                                         \
            _Pragma("GCC unroll 16") for (int i = 0; i < TB; ++i)                             \
                __builtin_prefetch(nk[i] + 2 * p);                                            \
          }                                                                                   \
          u32x16 wv;                                                                          \
          std::memcpy(&wv, w + p * H + g, sizeof(wv));                                        \
          _Pragma("GCC unroll 16") for (int i = 0; i < TB; ++i) {                             \
            uint32_t pair;                                                                    \
            std::memcpy(&pair, kp[i] + 2 * p, sizeof(pair));                                  \
            DOT(acc[i], pair, wv);                                                            \
          }                                                                                   \
        }                                                                                     \
        if (D % 2 != 0) { /* the last element alone: its pair's high half is 0 */             \
          u32x16 wv;                                                                          \
          std::memcpy(&wv, w + pairs * H + g, sizeof(wv));                                    \
          for (int i = 0; i < TB; ++i) DOT(acc[i], uint32_t(kp[i][D - 1]), wv);               \
        }                                                                                     \
        for (int i = 0; i < TB && t0 + i < n; ++i) storev(r + (t0 + i) * ldr + g, acc[i]);    \
      }                                                                                       \
    }                                                                                         \
  }

using u32x16 = Lanes<v16f>::u32;

// Intel's definition: lane i += a.bf16[2i+1] * b.bf16[2i+1], then += a.bf16[2i] * b.bf16[2i]
// (bfloat16 products are exact in float32, so contraction changes nothing).
FF_INLINE void model_dot(v16f& acc, uint32_t pair, const u32x16& wv) {
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
FF_KEY_PAIRS_KERNEL(key_scores_pairs_model, , model_dot)

#if defined(__x86_64__)
#define FF_TARGET_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
[[gnu::always_inline]] FF_TARGET_BF16 inline void hardware_dot(v16f& acc, uint32_t pair,
                                                               const u32x16& wv) {
  __m512 a;
  __m512i x;
  std::memcpy(&a, &acc, sizeof(a));
  std::memcpy(&x, &wv, sizeof(x));
  a = _mm512_dpbf16_ps(a, (__m512bh)_mm512_set1_epi32(int(pair)), (__m512bh)x);
  std::memcpy(&acc, &a, sizeof(a));
}
FF_KEY_PAIRS_KERNEL(key_scores_pairs_hardware, FF_TARGET_BF16, hardware_dot)
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

void transpose_key_att(const float* wka, int64_t H, int64_t D, float* wka_t) {
  for (int64_t h = 0; h < H; ++h)
    for (int64_t j = 0; j < D; ++j) wka_t[j * H + h] = wka[h * D + j];
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

bool isa_supported(Isa isa) {
#if defined(__x86_64__)
  switch (isa) {
    case Isa::kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("fma");
    case Isa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case Isa::kBaseline:
      return true;
  }
  return false;
#else
  return isa == Isa::kBaseline;
#endif
}

Isa detected_isa() {
  static const Isa isa = isa_supported(Isa::kAvx512) ? Isa::kAvx512
                         : isa_supported(Isa::kAvx2) ? Isa::kAvx2
                                                     : Isa::kBaseline;
  return isa;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kBaseline:
      break;
  }
  return "baseline";
}

}  // namespace fastformer::engine::rows
