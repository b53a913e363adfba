// The pooler's tanh scores (vector_rows.h, tanh_scores): z_t = sum_j tanh(e_tj) w_j + bias, the
// rows the pooling reads next fetched into the cache as they go.
#include "server/engine/cpu/vector_math.h"
#include "server/engine/cpu/vector_rows.h"
#include "server/engine/cpu/vector_rows_common.h"

namespace fastformer::engine::rows {
namespace {

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

#define FF_TANH_SCORES(E)                                                                         \
  FF_BUILDS(void, tanh_scores,                                                                    \
            (const E* e, int64_t lde, int64_t n, const float* w, float bias, int64_t D, float* z, \
             const E* x, int64_t ldx),                                                            \
            tanh_scores_impl, (e, lde, n, w, bias, D, z, x, ldx))
FF_TANH_SCORES(float)
FF_TANH_SCORES(uint16_t)

}  // namespace fastformer::engine::rows
