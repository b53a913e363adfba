// The bfloat16 GEMMs on the hand-written AMX kernel (gemm_backend.h, AmxGemm).
#include <algorithm>

#include "server/engine/cpu/gemm_backend.h"

namespace fastformer::engine {
namespace {

// Most rows per piece (A's rows stream through an L2 panel of W).
constexpr int64_t kAmxRows = AmxBlocking::kPieceRows;

}  // namespace

const AmxGemm::Site& AmxGemm::site(const WeightRef& w, const AmxMatmul::Shape& shape) {
  const auto key = std::make_pair(w.weight, shape);
  auto it = sites_.find(key);
  if (it == sites_.end()) {
    auto mm = std::make_unique<AmxMatmul>(shape, tiles_);
    AmxMatmul::Weights weights = mm->pack(static_cast<const float*>(w.weight));
    kernels_[w.weight] = mm->implementation();
    it = sites_.emplace(key, Site{std::move(mm), std::move(weights)}).first;
  }
  return it->second;
}

void AmxGemm::linear(const Mat& a, const WeightRef& w, Mat c, Epilogue epilogue, Activation act) {
  const AmxMatmul::Shape shape{w.out, w.in, a.ld, c.ld, epilogue, act};
  if (!AmxMatmul::supports(shape, nullptr)) {
    others_->linear(a, w, c, epilogue, act);
    return;
  }
  // The kernel takes any row count: pieces of a multiple of its 32-row blocks, four a worker
  // (for balance), at most kAmxRows rows.
  const Site& s = site(w, shape);
  const int64_t pieces =
      std::max<int64_t>(1, std::min<int64_t>(pool_.size() * 4, (a.rows + 31) / 32));
  const int64_t rows = std::min<int64_t>(kAmxRows, ((a.rows + pieces - 1) / pieces + 31) / 32 * 32);
  const float* bias = static_cast<const float*>(w.bias);
  pool_.parallel_for((a.rows + rows - 1) / rows, 1, [&](int64_t first, int64_t last) {
    for (int64_t i = first; i < last; ++i) {
      const int64_t r0 = i * rows, m = std::min(rows, a.rows - r0);
      s.matmul->run(m, static_cast<const uint16_t*>(a.data) + r0 * a.ld, s.weights, bias,
                    static_cast<uint16_t*>(c.data) + r0 * c.ld);
    }
  });
}

std::string AmxGemm::kernel(const WeightRef& w) const {
  const auto it = kernels_.find(w.weight);
  return it == kernels_.end() ? others_->kernel(w) : it->second;
}

size_t AmxGemm::packed_weight_bytes() const {
  size_t bytes = others_->packed_weight_bytes();
  for (const auto& [key, s] : sites_) bytes += s.weights.bytes();
  return bytes;
}

}  // namespace fastformer::engine
