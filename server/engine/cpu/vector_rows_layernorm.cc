// The LayerNorm passes (vector_rows.h): the embedding, out = LN(word + pos), and the bias +
// residual LayerNorm, out = LN(c + bias + residual), each over one row of D values.
#include <cmath>
#include <cstddef>
#include <type_traits>

#include "server/engine/cpu/vector_rows.h"
#include "server/engine/cpu/vector_rows_common.h"

namespace fastformer::engine::rows {
namespace {

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

}  // namespace

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

}  // namespace fastformer::engine::rows
