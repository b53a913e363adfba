// The CPU engine's GEMMs: oneDNN matmul primitives, created once per shape class (weight
// shape, leading dimensions, epilogue, dtype) and run with the row count given per call, so
// nothing is created on the hot path once the warm-up batch has passed through every layer.
//
// oneDNN picks its kernels by the CPU's instruction-set features (AVX2, AVX-512, AVX512_BF16,
// AMX), not by CPU model, so a CPU newer than the library still gets its fast kernels; the
// effective ISA is reported (cpu_gemm_info) and the speed checked at start-up
// (gemm_self_check).
//
// Both oneDNN 2.x (Debian 12) and 3.x (Ubuntu 24.04) build this file.
#pragma once

#include <compare>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "server/engine/ops.h"

namespace fastformer::engine {

// What oneDNN runs on this machine (honours ONEDNN_MAX_CPU_ISA).
struct CpuGemmInfo {
  std::string version;    ///< e.g. "2.6.3"
  std::string isa;        ///< the effective instruction set, e.g. "avx512_core_bf16"
  bool has_bf16 = false;  ///< AVX512_BF16 or AMX: bfloat16 matrix products in hardware
  bool has_amx = false;   ///< AMX tiles (Sapphire Rapids and later)
};
const CpuGemmInfo& cpu_gemm_info();

// A short single-threaded float32 GEMM timed against the floor expected for the ISA.
struct GemmSelfCheck {
  double gflops = 0;  ///< best of a few runs, one thread
  double floor_gflops = 0;
  std::string isa;
  std::string implementation;  ///< oneDNN's name for the kernel it chose
  bool below_floor() const { return gflops < floor_gflops; }
  // One line for the log: the figures, and when below the floor, the likely causes.
  std::string message() const;
};
GemmSelfCheck gemm_self_check();
// The single-threaded float32 GFLOP/s below which a CPU with `isa` is misbehaving (a
// fallback to generic kernels, a throttled or oversubscribed core): about a third of what
// such a core reaches.
double gemm_floor_gflops(const std::string& isa);

// C[m, n] (=|+=) A[m, k] W[n, k]^T (+ bias, activation), one primitive for every m.
class CpuMatmul {
 public:
  struct Shape {
    int64_t n = 0, k = 0;
    int64_t lda = 0, ldc = 0;  ///< leading dimensions of A and C, in elements
    Epilogue epilogue = Epilogue::kStore;
    Activation act = Activation::kGeluErf;  ///< for kBiasAct
    bool bf16 = false;  ///< W in bfloat16, A rounded to bfloat16; float32 accumulation and C
    auto operator<=>(const Shape&) const = default;
  };
  explicit CpuMatmul(const Shape& shape);  // throws EngineError if oneDNN has no kernel
  ~CpuMatmul();
  CpuMatmul(const CpuMatmul&) = delete;
  CpuMatmul& operator=(const CpuMatmul&) = delete;

  // Runs on the calling thread alone (the engine's pool splits the rows); safe to call from
  // several threads at once on disjoint rows. `w` is float32 or bfloat16 as the shape says.
  void run(int64_t m, const float* a, const void* w, const float* bias, float* c) const;

  const Shape& shape() const { return shape_; }
  std::string implementation() const;  ///< oneDNN's kernel name, e.g. "brg:avx512_core"

 private:
  struct Impl;
  Shape shape_;
  std::unique_ptr<Impl> impl_;
};

// The bfloat16 path: C[m, n] (=|+=) A[m, k] W[n, k]^T (+ bias, activation) with A and C in
// bfloat16 (or float32), W packed once into the layout oneDNN picks for the kernel
// (format_tag::any), and one primitive per row count, each with M fixed at creation: a fixed
// M is what lets oneDNN pick its brgemm kernels (AMX, AVX512_BF16) over the runtime-M gemm:jit.
// The row counts are the powers of two up to kMaxRows; split() cuts any row range into them.
// The primitives take dense rows (brgemm's only layout in oneDNN 2.6): a strided A or C (a
// column view, lda > k or ldc > n) is copied through a dense per-thread buffer around the
// call. Each call brings its own scratchpad, so pool threads may share a primitive.
//
// `emulate` (bfloat16 only) runs the same storage and rounding on a CPU without bfloat16
// GEMMs: A and C are widened to float32 around a float32 primitive over the bfloat16-rounded
// weights. The results are what hardware bfloat16 gives, up to float32 summation order; it
// exists so the bfloat16 engine is tested on every CPU, and is never served (slower than
// float32).
class PackedMatmul {
 public:
  static constexpr int64_t kMaxRows = 256;
  struct Shape {
    int64_t n = 0, k = 0;
    int64_t lda = 0, ldc = 0;  ///< leading dimensions of A and C, in elements
    Epilogue epilogue = Epilogue::kStore;
    Activation act = Activation::kGeluErf;  ///< for kBiasAct
    bool bf16 = true;      ///< A, W and C in bfloat16 (float32 accumulation); else float32
    bool emulate = false;  ///< bfloat16 storage over float32 primitives (tests)
    auto operator<=>(const Shape&) const = default;
  };
  // W [n, k] float32 in the layout the primitives chose, rounded to bfloat16 where they take it.
  class Weights {
   public:
    size_t bytes() const;  ///< every packed copy (one per layout the kernels chose)

   private:
    friend class PackedMatmul;
    struct Impl;
    std::shared_ptr<Impl> impl_;
  };

  explicit PackedMatmul(const Shape& shape);  // every row count's primitive; EngineError if none
  ~PackedMatmul();
  PackedMatmul(const PackedMatmul&) = delete;
  PackedMatmul& operator=(const PackedMatmul&) = delete;

  Weights pack(const float* weight) const;  // one reorder, at load
  // m a power of two <= kMaxRows; a, c bfloat16 (uint16_t) or float per the shape. Runs on
  // the calling thread; several threads may run it at once on disjoint rows.
  void run(int64_t m, const void* a, const Weights& w, const float* bias, void* c) const;
  // [0, rows) as (first row, row count) pieces: blocks of `block` rows (a power of two <=
  // kMaxRows), then the tail in descending powers of two.
  static void split(int64_t rows, int64_t block, std::vector<std::pair<int64_t, int64_t>>& pieces);

  const Shape& shape() const { return shape_; }
  // oneDNN's kernel for kMaxRows rows, and any other it picked for fewer, e.g.
  // "brg:avx512_core_amx_bf16" or "brg:avx512_core_amx_bf16; M<=2: gemm:jit".
  std::string implementation() const;

 private:
  struct Impl;
  Shape shape_;
  std::unique_ptr<Impl> impl_;
};

// Widening and rounding of rows, vectorised (AVX-512, AVX2 or baseline, picked at start-up).
void bfloat16_to_float_row(const uint16_t* in, float* out, int64_t n);
void float_to_bfloat16_row(const float* in, uint16_t* out, int64_t n);

// A single-threaded bfloat16 GEMM (256x512x512, fixed M, packed weights) timed against the
// floor for the ISA; ran == false where oneDNN has no bfloat16 matmul.
struct Bf16SelfCheck {
  bool ran = false;
  double gflops = 0, floor_gflops = 0;
  std::string implementation;
  std::string message() const;
};
Bf16SelfCheck bf16_self_check();
double bf16_floor_gflops(const std::string& isa);
// "AMX" / "AVX512_BF16, no AMX" / "no AVX512_BF16 or AMX": what bfloat16 GEMMs run on here.
std::string bf16_hardware(const std::string& isa);

// The GEMM probe: oneDNN's packed fixed-M primitive alone on one shape, best of a few runs.
// threads > 1 lets oneDNN's own OpenMP team split the one call.
double probe_gflops(const PackedMatmul::Shape& shape, int64_t m, int threads, double seconds,
                    std::string* implementation);

}  // namespace fastformer::engine
