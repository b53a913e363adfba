// The key scores in float32 weights (vector_rows.h): the per-sequence weight w = pq * Wka'
// (key_weight) and the register-blocked scores of a block of tokens against it (key_scores),
// vectorised over heads where H is a multiple of the lanes, over D otherwise.
#include <algorithm>
#include <type_traits>

#include "server/engine/cpu/vector_rows.h"
#include "server/engine/cpu/vector_rows_common.h"

namespace fastformer::engine::rows {
namespace {

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

}  // namespace

FF_BUILDS(void, key_weight,
          (const float* wka, const float* wka_t, const float* pq, int64_t H, int64_t D, float* w),
          key_weight_impl, (wka, wka_t, pq, H, D, w))

#define FF_KEY_SCORES(E)                                                                       \
  FF_BUILDS(void, key_scores,                                                                  \
            (const E* k, int64_t ldk, int64_t n, const float* w, const float* bias, int64_t H, \
             int64_t D, float* r, int64_t ldr),                                                \
            key_scores_impl, (k, ldk, n, w, bias, H, D, r, ldr))
FF_KEY_SCORES(float)
FF_KEY_SCORES(uint16_t)

void transpose_key_att(const float* wka, int64_t H, int64_t D, float* wka_t) {
  for (int64_t h = 0; h < H; ++h)
    for (int64_t j = 0; j < D; ++j) wka_t[j * H + h] = wka[h * D + j];
}

}  // namespace fastformer::engine::rows
