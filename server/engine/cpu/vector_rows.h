// The CPU engine's passes between the GEMMs, a row (or a block of rows) at a time: the
// embedding and the bias + residual LayerNorm, the pooling passes (masked softmax weights and
// weighted sums over a chunk), the key scores, the mix and the pooler's tanh scores. CpuOps
// (cpu_ops.cc) splits the rows over its pool and calls these.
//
// Each function is compiled three times from one template, one file per kernel family
// (vector_rows_*.cc; the dispatch in vector_rows.cc): for AVX-512 (16 float lanes), for AVX2
// with FMA (8 lanes) and for baseline x86-64 (4 lanes), and takes the Isa to run;
// detected_isa() is the best this CPU has. (Explicit target attributes and a
// switch, not ifunc clones: the same code runs under the sanitizers.) Rows hold float32 or
// bfloat16 (uint16_t) elements; statistics, softmax weights and sums are float32, and a
// bfloat16 store rounds to nearest even (common/half.h).
//
// The key scores are the one compute-bound pass (2 H D FLOPs a token against D elements
// read): a register-blocked kernel, a block of tokens by a block of heads, every K vector
// loaded once per head block and every weight vector once per token block.
#pragma once

#include <cstdint>

namespace fastformer::engine::rows {

enum class Isa { kBaseline, kAvx2, kAvx512 };

// The widest of the three this CPU runs (AVX-512 needs F, BW, DQ and VL; AVX2 needs FMA).
Isa detected_isa();
bool isa_supported(Isa isa);
const char* isa_name(Isa isa);  // "avx512", "avx2", "baseline"

// out = LN(word + pos) over D values. `scratch` holds D floats.
void embed_row(Isa isa, const float* word, const float* pos, const float* gamma, const float* beta,
               int64_t D, float eps, float* scratch, float* out);
void embed_row(Isa isa, const float* word, const float* pos, const float* gamma, const float* beta,
               int64_t D, float eps, float* scratch, uint16_t* out);

// out = LN(c + bias + residual) over D values; `out` may be `residual`. `scratch`: D floats.
void residual_layernorm_row(Isa isa, const float* c, const float* bias, const float* residual,
                            const float* gamma, const float* beta, int64_t D, float eps,
                            float* scratch, float* out);
void residual_layernorm_row(Isa isa, const uint16_t* c, const float* bias, const uint16_t* residual,
                            const float* gamma, const float* beta, int64_t D, float eps,
                            float* scratch, uint16_t* out);

// out_j = x_j * scale_j (the mix: U_t = pk * Q_t); `out` may be `x`.
void scale_row(Isa isa, const float* x, const float* scale, int64_t n, float* out);
void scale_row(Isa isa, const uint16_t* x, const float* scale, int64_t n, uint16_t* out);

// Wka^T [D, H] from Wka [H, D]: once per weight, for the per-sequence weights below.
void transpose_key_att(const float* wka, int64_t H, int64_t D, float* wka_t);

// The key-score weight of one sequence, w = pq_b * Wka' (Wka [H, D] and its transpose, pq
// [D]), H * D floats in the layout key_scores takes for this build: [D, H] where H is a
// multiple of its lanes (the scores are then vectorised over heads), [H, D] otherwise.
void key_weight(Isa isa, const float* wka, const float* wka_t, const float* pq, int64_t H,
                int64_t D, float* w);

// r[t * ldr + h] = sum_j k[t * ldk + j] w[h, j] + bias[h], for t < n and h < H: the key
// scores of n tokens of one sequence against its weight w (from key_weight, the same isa).
void key_scores(Isa isa, const float* k, int64_t ldk, int64_t n, const float* w, const float* bias,
                int64_t H, int64_t D, float* r, int64_t ldr);
void key_scores(Isa isa, const uint16_t* k, int64_t ldk, int64_t n, const float* w,
                const float* bias, int64_t H, int64_t D, float* r, int64_t ldr);

// The key scores of bfloat16 keys on AVX512_BF16's VDPBF16PS, two products an instruction: the
// weight rounded to bfloat16 (nearest even) and laid out in pairs along D, [ceil(D/2), H]
// 32-bit words (element 2p in the low half, 2p+1 in the high); the key pairs are broadcast
// straight from the bfloat16 rows. H must be a multiple of 16. `kHardware` needs
// dot_bf16_available(); `kModel` is a portable model of the instruction as Intel's reference
// defines it (lane += a_hi b_hi, then += a_lo b_lo, each product exact in float32; denormals
// aside), running the same blocking on any CPU for the tests.
enum class DotBf16 { kHardware, kModel };
bool dot_bf16_available();
void key_weight_pairs(Isa isa, const float* wka_t, const float* pq, int64_t H, int64_t D,
                      uint32_t* w);
void key_scores_pairs(DotBf16 how, const uint16_t* k, int64_t ldk, int64_t n, const uint32_t* w,
                      const float* bias, int64_t H, int64_t D, float* r, int64_t ldr);

// One pooling chunk of `len` tokens: per head h (columns h*d .. h*d+d-1, d = D / heads) the
// masked softmax partials m[h] (max score), l[h] (sum of exp(score - m)) and v[D] (the
// exp-weighted sum of the value rows). Masked tokens (mask 0) weigh exactly 0; a chunk with no
// real token gives m = -inf, l = 0, v = 0. Scores are [len, heads] with row stride score_ld,
// values [len, D] with stride values_ld. `scratch` holds pool_scratch_floats(heads, len, D).
// `values_cached`: the caller has just read the rows (the key pool's scores pass), so the
// head-major pass does not fetch the next block's rows ahead.
inline constexpr int64_t kPoolBlock = 16;  ///< value rows summed at a time
constexpr int64_t pool_scratch_floats(int64_t heads, int64_t len, int64_t /*D*/) {
  return heads * len;
}
void pool_chunk(Isa isa, const float* scores, int64_t score_ld, int64_t heads, const float* values,
                int64_t values_ld, int64_t D, const uint8_t* mask, int64_t len, float* m, float* l,
                float* v, float* scratch, bool values_cached = false);
void pool_chunk(Isa isa, const float* scores, int64_t score_ld, int64_t heads,
                const uint16_t* values, int64_t values_ld, int64_t D, const uint8_t* mask,
                int64_t len, float* m, float* l, float* v, float* scratch,
                bool values_cached = false);
void pool_chunk(Isa isa, const uint16_t* scores, int64_t score_ld, int64_t heads,
                const uint16_t* values, int64_t values_ld, int64_t D, const uint8_t* mask,
                int64_t len, float* m, float* l, float* v, float* scratch,
                bool values_cached = false);

// The pooler's scores of n rows, z_t = sum_j tanh(e_tj) w_j + bias (e's row stride lde), with the
// rows of x (stride ldx, D values each) that the pooling reads next fetched into the cache as
// they go: the tanh's arithmetic hides their memory time.
void tanh_scores(Isa isa, const float* e, int64_t lde, int64_t n, const float* w, float bias,
                 int64_t D, float* z, const float* x, int64_t ldx);
void tanh_scores(Isa isa, const uint16_t* e, int64_t lde, int64_t n, const float* w, float bias,
                 int64_t D, float* z, const uint16_t* x, int64_t ldx);

}  // namespace fastformer::engine::rows
