// The bfloat16 GEMMs on oneDNN's packed fixed-M primitives (gemm_backend.h, PackedGemm).
#include "server/engine/cpu/gemm_backend.h"

namespace fastformer::engine {

const PackedGemm::Site& PackedGemm::site(const WeightRef& w, const PackedMatmul::Shape& shape) {
  const auto key = std::make_pair(w.weight, shape);
  auto it = sites_.find(key);
  if (it == sites_.end()) {
    std::unique_ptr<PackedMatmul>& mm = matmuls_[shape];
    if (!mm) mm = std::make_unique<PackedMatmul>(shape);  // every row count's primitive, once
    it = sites_.emplace(key, Site{mm.get(), mm->pack(static_cast<const float*>(w.weight))}).first;
    kernels_[w.weight] = mm->implementation();
  }
  return it->second;
}

void PackedGemm::linear(const Mat& a, const WeightRef& w, Mat c, Epilogue epilogue,
                        Activation act) {
  const Site& s = site(w, {w.out, w.in, a.ld, c.ld, epilogue, act, true, emulate_});
  // Blocks of the largest power of two that still gives every worker two pieces, then the
  // tail in powers of two: every piece has a primitive made for its row count.
  int64_t block = PackedMatmul::kMaxRows;
  while (block > 16 && a.rows < block * 2 * pool_.size()) block /= 2;
  PackedMatmul::split(a.rows, block, pieces_);
  const float* bias = static_cast<const float*>(w.bias);
  pool_.parallel_for(int64_t(pieces_.size()), 1, [&](int64_t first, int64_t last) {
    for (int64_t i = first; i < last; ++i) {
      const auto [r0, m] = pieces_[size_t(i)];
      s.matmul->run(m, static_cast<uint16_t*>(a.data) + r0 * a.ld, s.weights, bias,
                    static_cast<uint16_t*>(c.data) + r0 * c.ld);
    }
  });
}

std::string PackedGemm::kernel(const WeightRef& w) const {
  const auto it = kernels_.find(w.weight);
  return it == kernels_.end() ? std::string() : it->second;
}

size_t PackedGemm::packed_weight_bytes() const {
  size_t bytes = 0;
  for (const auto& [key, s] : sites_) bytes += s.weights.bytes();
  return bytes;
}

}  // namespace fastformer::engine
