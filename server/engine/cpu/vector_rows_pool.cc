// The pooling of one chunk (vector_rows.h, pool_chunk): masked softmax weights per head and
// the weighted sums of the value rows, token-major where the chunk's shape allows, head-major
// otherwise, the next rows fetched as the current ones are summed.
#include <algorithm>
#include <limits>

#include "server/engine/cpu/vector_math.h"
#include "server/engine/cpu/vector_rows.h"
#include "server/engine/cpu/vector_rows_common.h"

namespace fastformer::engine::rows {
namespace {

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

}  // namespace

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

}  // namespace fastformer::engine::rows
