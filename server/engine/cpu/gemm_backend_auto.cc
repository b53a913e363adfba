// The bfloat16 GEMMs picked by measurement (gemm_backend.h, AutoGemm; --cpu-gemm auto).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <vector>

#include "common/half.h"
#include "server/engine/cpu/gemm_backend.h"

namespace fastformer::engine {
namespace {

// Times `run` (one GEMM): one untimed run (it packs the weights on a site's first use), then the
// best of three.
double time_best(const std::function<void()>& run) {
  run();
  double best = 0;
  for (int i = 0; i < 3; ++i) {
    const auto start = std::chrono::steady_clock::now();
    run();
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = i == 0 ? s : std::min(best, s);
  }
  return best;
}

std::string milliseconds(double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3f ms", seconds * 1e3);
  return text;
}

}  // namespace

AutoGemm::AutoGemm(std::unique_ptr<GemmBackend> onednn, std::unique_ptr<GemmBackend> amx,
                   GemmTimer timer)
    : onednn_(std::move(onednn)), amx_(std::move(amx)), timer_(std::move(timer)) {
  if (!timer_) {
    timer_ = [](const char*, int64_t, const std::function<void()>& run) { return time_best(run); };
  }
}

const AutoGemm::Choice& AutoGemm::choose(const Mat& a, const WeightRef& w, Mat c, Epilogue epilogue,
                                         Activation act) {
  const AmxMatmul::Shape shape{w.out, w.in, a.ld, c.ld, epilogue, act};
  const auto found = choices_.find(shape);
  if (found != choices_.end()) return found->second;
  Choice choice;
  std::string why;
  if (!AmxMatmul::supports(shape, &why)) {
    choice.backend = {onednn_.get(), onednn_.get()};
    choice.note = "oneDNN (the AMX kernel does not take it: " + why + ")";
    return choices_.emplace(shape, std::move(choice)).first->second;
  }
  // Each candidate on scratch rows of the bucket's size: A of small values, C zero (an
  // accumulating epilogue reads it), the site's own weights (each back-end packs its copy).
  for (size_t b = 0; b < kBuckets.size(); ++b) {
    const int64_t m = kBuckets[b];
    std::vector<uint16_t> a_rows(size_t(m * a.ld));
    for (size_t i = 0; i < a_rows.size(); ++i)
      a_rows[i] = float_to_bfloat16(float(int(i % 17) - 8) * 0.0625f);
    std::vector<uint16_t> c_rows(size_t(m * c.ld), 0);
    const Mat scratch_a{a_rows.data(), m, a.cols, a.ld};
    const Mat scratch_c{c_rows.data(), m, c.cols, c.ld};
    double seconds[2] = {};
    GemmBackend* const candidates[2] = {onednn_.get(), amx_.get()};
    const char* names[2] = {"onednn", "amx"};
    for (int i = 0; i < 2; ++i) {
      seconds[i] = timer_(names[i], m, [&, i] {
        std::fill(c_rows.begin(), c_rows.end(), uint16_t(0));
        candidates[i]->linear(scratch_a, w, scratch_c, epilogue, act);
      });
    }
    const int pick = seconds[1] < seconds[0] ? 1 : 0;
    choice.backend[b] = candidates[pick];
    const std::string kernel = candidates[pick]->kernel(w);
    choice.note += std::string(choice.note.empty() ? "" : "; ") + "M=" + std::to_string(m) + ": " +
                   names[pick] + (kernel.empty() ? "" : " (" + kernel + ")") + " " +
                   milliseconds(seconds[pick]) + " against " + names[1 - pick] + " " +
                   milliseconds(seconds[1 - pick]);
  }
  return choices_.emplace(shape, std::move(choice)).first->second;
}

void AutoGemm::linear(const Mat& a, const WeightRef& w, Mat c, Epilogue epilogue, Activation act) {
  const Choice& choice = choose(a, w, c, epilogue, act);
  // Written on a weight's first run only (the warm-up), so kernel() reads a map nothing changes.
  if (notes_.find(w.weight) == notes_.end()) notes_.emplace(w.weight, choice.note);
  choice.backend[bucket(a.rows)]->linear(a, w, c, epilogue, act);
}

size_t AutoGemm::bucket(int64_t rows) {
  // The nearest bucket on a log scale: the geometric mean of the two sizes is the boundary.
  return double(rows) <= std::sqrt(double(kBuckets[0]) * double(kBuckets[1])) ? 0 : 1;
}

std::string AutoGemm::kernel(const WeightRef& w) const {
  const auto it = notes_.find(w.weight);
  return it == notes_.end() ? std::string() : "auto: " + it->second;
}

size_t AutoGemm::packed_weight_bytes() const {
  return onednn_->packed_weight_bytes() + amx_->packed_weight_bytes();
}

}  // namespace fastformer::engine
