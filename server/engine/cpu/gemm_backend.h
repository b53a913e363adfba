// The CPU engine's GEMMs behind one interface: CpuOps::linear hands every GEMM to the back-end it
// chose at construction (cpu_ops.cc, make_gemm_backend), and asks it which kernel ran a weight
// and how many bytes its packed weight copies take. (Not engine.h's CpuGemm, the --cpu-gemm
// flag's value; engine.cc turns that flag into the Bf16Gemm that picks the back-end here.)
//
//   C[m, n] (=|+=) A[m, k] W[n, k]^T (+ bias, activation)
//
// A and C are rows of the back-end's element type (float32, or bfloat16 as uint16_t), with
// leading dimensions a.ld and c.ld; W [n, k] and the bias [n] are the engine's float32 arrays,
// used in place or packed once on a site's first run (the warm-up batch); m = a.rows, split by
// rows over the engine's pool, each piece on one thread.
//
// The back-ends, one a file:
//   OnednnGemm  float32: oneDNN primitives with a runtime row count over the weights in place
//               (CpuMatmul, onednn_gemm.h), one per shape class (gemm_backend_onednn.cc).
//   PackedGemm  bfloat16: oneDNN's fixed-M primitives over packed weights, rows cut into
//               powers of two (PackedMatmul, onednn_gemm.h), or their float32 emulation for the
//               tests (gemm_backend_packed.cc).
//   AmxGemm     bfloat16: the hand-written AMX kernel (AmxMatmul, amx_gemm.h) on the tiles or
//               on their portable model, for the shapes it supports (K a multiple of 32); a
//               PackedGemm runs the others (gemm_backend_amx.cc).
//   AutoGemm    bfloat16 (--cpu-gemm auto): per GEMM shape, the faster of a PackedGemm and an
//               AmxGemm as timed on the shape's first run (gemm_backend_auto.cc).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "server/engine/cpu/amx_gemm.h"
#include "server/engine/cpu/onednn_gemm.h"
#include "server/engine/cpu/thread_pool.h"
#include "server/engine/ops.h"

namespace fastformer::engine {

class GemmBackend {
 public:
  virtual ~GemmBackend() = default;
  // c = a w^T with the epilogue, over a.rows rows, on the pool; returns when every row is done.
  // Not reentrant: one call at a time (the forward graph's).
  virtual void linear(const Mat& a, const WeightRef& w, Mat c, Epilogue epilogue,
                      Activation act) = 0;
  // The kernel that runs w's GEMM (e.g. "brg:avx512_core_amx_bf16"), "" before its first run.
  virtual std::string kernel(const WeightRef& w) const = 0;
  // The bytes of the packed weight copies made so far (0 for weights used in place).
  virtual size_t packed_weight_bytes() const = 0;
};

class OnednnGemm final : public GemmBackend {
 public:
  explicit OnednnGemm(ThreadPool& pool) : pool_(pool) {}
  void linear(const Mat& a, const WeightRef& w, Mat c, Epilogue epilogue, Activation act) override;
  std::string kernel(const WeightRef& w) const override;
  size_t packed_weight_bytes() const override { return 0; }

 private:
  // The primitive for `shape`, created on first use (load and warm-up), then reused.
  const CpuMatmul& matmul(const CpuMatmul::Shape& shape);

  ThreadPool& pool_;
  std::map<CpuMatmul::Shape, std::unique_ptr<CpuMatmul>> matmuls_;
  std::map<const void*, std::string> kernels_;  // weight -> oneDNN's kernel
};

class PackedGemm final : public GemmBackend {
 public:
  // `emulate`: bfloat16 storage over float32 primitives (PackedMatmul::Shape::emulate, tests).
  PackedGemm(ThreadPool& pool, bool emulate) : pool_(pool), emulate_(emulate) {}
  void linear(const Mat& a, const WeightRef& w, Mat c, Epilogue epilogue, Activation act) override;
  std::string kernel(const WeightRef& w) const override;
  size_t packed_weight_bytes() const override;

 private:
  // The GEMM site of `w` (its primitives and packed weights), made on first use.
  struct Site {
    const PackedMatmul* matmul = nullptr;
    PackedMatmul::Weights weights;
  };
  const Site& site(const WeightRef& w, const PackedMatmul::Shape& shape);

  ThreadPool& pool_;
  const bool emulate_;
  std::map<PackedMatmul::Shape, std::unique_ptr<PackedMatmul>> matmuls_;
  std::map<std::pair<const void*, PackedMatmul::Shape>, Site> sites_;
  std::map<const void*, std::string> kernels_;       // weight -> oneDNN's kernel
  std::vector<std::pair<int64_t, int64_t>> pieces_;  // the current GEMM's row pieces
};

class AmxGemm final : public GemmBackend {
 public:
  // `others` runs the shapes the kernel does not support.
  AmxGemm(ThreadPool& pool, TileBackend tiles, std::unique_ptr<GemmBackend> others)
      : pool_(pool), tiles_(tiles), others_(std::move(others)) {}
  void linear(const Mat& a, const WeightRef& w, Mat c, Epilogue epilogue, Activation act) override;
  std::string kernel(const WeightRef& w) const override;
  size_t packed_weight_bytes() const override;

 private:
  // The site of `w`, made on first use.
  struct Site {
    std::unique_ptr<AmxMatmul> matmul;
    AmxMatmul::Weights weights;
  };
  const Site& site(const WeightRef& w, const AmxMatmul::Shape& shape);

  ThreadPool& pool_;
  const TileBackend tiles_;
  const std::unique_ptr<GemmBackend> others_;
  std::map<std::pair<const void*, AmxMatmul::Shape>, Site> sites_;
  std::map<const void*, std::string> kernels_;  // weight -> the kernel's description
};

// Times one GEMM of `m` rows on the back-end named `backend` ("onednn" or "amx") by calling
// `run`, which does it once: seconds. The default runs it once untimed (the site's first run
// packs its weights), then takes the best of three; the tests give a stub.
using GemmTimer =
    std::function<double(const char* backend, int64_t m, const std::function<void()>& run)>;

// --cpu-gemm auto. On a GEMM shape's first run (the load's warm-up batch), it times both
// back-ends on scratch rows of each bucket's size (kBuckets: 512 and 2,048 rows; A of small
// values, C zero) with the site's own weights, and keeps the faster per bucket (the AMX kernel
// only when strictly faster); every later call of that shape runs on the choice for its row
// count's bucket (up to 1,024 rows, the buckets' geometric mean: 512's). A shape the AMX kernel
// does not take (supports()) is oneDNN's, untimed. kernel(w) says the choice with both figures
// (the load's log, the model's info). A shape whose buckets pick different back-ends keeps
// both packed copies of its weights.
class AutoGemm final : public GemmBackend {
 public:
  static constexpr std::array<int64_t, 2> kBuckets = {512, 2048};
  AutoGemm(std::unique_ptr<GemmBackend> onednn, std::unique_ptr<GemmBackend> amx,
           GemmTimer timer = {});
  void linear(const Mat& a, const WeightRef& w, Mat c, Epilogue epilogue, Activation act) override;
  // "auto: M=512: amx (amx:hand bf16 (...)) 0.610 ms against onednn 0.720 ms; M=2048: ...".
  std::string kernel(const WeightRef& w) const override;
  size_t packed_weight_bytes() const override;
  // The bucket (index into kBuckets) a call of `rows` rows runs on.
  static size_t bucket(int64_t rows);

 private:
  struct Choice {
    std::array<GemmBackend*, 2> backend{};  ///< per bucket
    std::string note;
  };
  const Choice& choose(const Mat& a, const WeightRef& w, Mat c, Epilogue epilogue, Activation act);

  std::unique_ptr<GemmBackend> onednn_, amx_;
  GemmTimer timer_;
  std::map<AmxMatmul::Shape, Choice> choices_;
  std::map<const void*, std::string> notes_;  // weight -> its shape's choice
};

}  // namespace fastformer::engine
