// The float32 GEMMs on oneDNN (gemm_backend.h, OnednnGemm).
#include <algorithm>

#include "server/engine/cpu/gemm_backend.h"

namespace fastformer::engine {
namespace {

// Rows per GEMM piece: large enough for oneDNN to reach full speed, small enough that
// pieces balance over the pool.
constexpr int64_t kGemmRows = 128;

float* row(const Mat& m, int64_t r) { return static_cast<float*>(m.data) + r * m.ld; }

}  // namespace

const CpuMatmul& OnednnGemm::matmul(const CpuMatmul::Shape& shape) {
  auto it = matmuls_.find(shape);
  if (it == matmuls_.end()) it = matmuls_.emplace(shape, std::make_unique<CpuMatmul>(shape)).first;
  return *it->second;
}

void OnednnGemm::linear(const Mat& a, const WeightRef& w, Mat c, Epilogue epilogue,
                        Activation act) {
  // oneDNN runs single-threaded inside each piece, bias and activation fused as post-ops;
  // the pool splits the rows.
  const CpuMatmul& mm = matmul({w.out, w.in, a.ld, c.ld, epilogue, act, false});
  if (!kernels_.contains(w.weight)) kernels_[w.weight] = mm.implementation();
  const float* weight = static_cast<const float*>(w.weight);
  const float* bias = static_cast<const float*>(w.bias);
  const int64_t pieces = std::min<int64_t>(pool_.size() * 4, (a.rows + kGemmRows - 1) / kGemmRows);
  const int64_t rows_per_piece = (a.rows + pieces - 1) / std::max<int64_t>(pieces, 1);
  pool_.parallel_for(pieces, 1, [&](int64_t first, int64_t last) {
    for (int64_t piece = first; piece < last; ++piece) {
      const int64_t r0 = piece * rows_per_piece, r1 = std::min(a.rows, r0 + rows_per_piece);
      if (r0 < r1) mm.run(r1 - r0, row(a, r0), weight, bias, row(c, r0));
    }
  });
}

std::string OnednnGemm::kernel(const WeightRef& w) const {
  const auto it = kernels_.find(w.weight);
  return it == kernels_.end() ? std::string() : it->second;
}

}  // namespace fastformer::engine
