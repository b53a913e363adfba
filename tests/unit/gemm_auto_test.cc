// --cpu-gemm auto (server/engine/cpu/gemm_backend.h, AutoGemm): per GEMM shape it times oneDNN and
// the AMX kernel (here: a stub timer, and the kernel on the tile model) on 512 and 2,048 rows,
// keeps the faster per bucket, and runs each call on its rows' bucket, computing what that
// back-end alone computes, bit for bit; a shape the kernel does not take is oneDNN's, untimed.
// And the rule that turns the flag into a back-end: auto is oneDNN where the tiles are refused,
// saying why.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/half.h"
#include "server/engine/cpu/cpu_ops.h"
#include "server/engine/cpu/gemm_backend.h"
#include "server/engine/cpu/thread_pool.h"
#include "tests/support/random_values.h"

namespace fastformer::engine {
namespace {

using ::testing::HasSubstr;

// A back-end that counts the rows of each call it forwards.
class Counting final : public GemmBackend {
 public:
  explicit Counting(std::unique_ptr<GemmBackend> inner) : inner_(std::move(inner)) {}
  void linear(const Mat& a, const WeightRef& w, Mat c, Epilogue epilogue, Activation act) override {
    rows.push_back(a.rows);
    inner_->linear(a, w, c, epilogue, act);
  }
  std::string kernel(const WeightRef& w) const override { return inner_->kernel(w); }
  size_t packed_weight_bytes() const override { return inner_->packed_weight_bytes(); }
  std::vector<int64_t> rows;

 private:
  std::unique_ptr<GemmBackend> inner_;
};

struct Problem {
  int64_t m, n, k;
  std::vector<uint16_t> a, c;
  std::vector<float> weight, bias;
  WeightRef w;
  Problem(int64_t rows, int64_t n_, int64_t k_) : m(rows), n(n_), k(k_) {
    const auto values = test::random_values(size_t(m * k), 7, 0.5f);
    for (float v : values) a.push_back(float_to_bfloat16(v));
    c.assign(size_t(m * n), 0);
    weight = test::random_values(size_t(n * k), 8, 0.1f);
    bias = test::random_values(size_t(n), 9, 1.0f);
    w.out = n, w.in = k, w.weight = weight.data(), w.bias = bias.data();
  }
  Mat in() { return {a.data(), m, k, k}; }
  Mat out() { return {c.data(), m, n, n}; }
};

// What one back-end alone computes for `p`.
std::vector<uint16_t> alone(GemmBackend& backend, Problem p) {
  backend.linear(p.in(), p.w, p.out(), Epilogue::kBiasAct, Activation::kGeluErf);
  return p.c;
}

TEST(AutoGemm, PicksTheFasterPerBucketAndRunsEachCallOnItsBucket) {
  ThreadPool pool(2);
  auto onednn = std::make_unique<Counting>(std::make_unique<PackedGemm>(pool, /*emulate=*/true));
  auto amx = std::make_unique<Counting>(std::make_unique<AmxGemm>(
      pool, TileBackend::kModel, std::make_unique<PackedGemm>(pool, true)));
  Counting* const onednn_seen = onednn.get();
  Counting* const amx_seen = amx.get();
  // The stub runs each candidate once (as the real timer does) and says: the AMX kernel faster on
  // 512 rows, oneDNN on 2,048.
  const std::map<std::pair<std::string, int64_t>, double> seconds = {{{"onednn", 512}, 2e-3},
                                                                     {{"amx", 512}, 1e-3},
                                                                     {{"onednn", 2048}, 3e-3},
                                                                     {{"amx", 2048}, 5e-3}};
  std::vector<std::pair<std::string, int64_t>> timed;
  AutoGemm gemm(std::move(onednn), std::move(amx),
                [&](const char* backend, int64_t m, const std::function<void()>& run) {
                  run();
                  timed.emplace_back(backend, m);
                  return seconds.at({backend, m});
                });
  Problem small(100, 48, 64), large(1500, 48, 64);
  gemm.linear(small.in(), small.w, small.out(), Epilogue::kBiasAct, Activation::kGeluErf);
  EXPECT_EQ(timed.size(), 4u);  // both back-ends, both buckets, once for the shape
  // The timing runs on scratch rows (512, 2,048), then the call itself on its bucket's choice.
  EXPECT_EQ(amx_seen->rows, (std::vector<int64_t>{512, 2048, 100}));
  EXPECT_EQ(onednn_seen->rows, (std::vector<int64_t>{512, 2048}));
  gemm.linear(large.in(), large.w, large.out(), Epilogue::kBiasAct, Activation::kGeluErf);
  EXPECT_EQ(onednn_seen->rows, (std::vector<int64_t>{512, 2048, 1500}));
  EXPECT_EQ(amx_seen->rows.size(), 3u);
  EXPECT_EQ(timed.size(), 4u);  // not timed again
  // Each equals its back-end alone, bit for bit.
  PackedGemm packed(pool, true);
  AmxGemm kernel(pool, TileBackend::kModel, std::make_unique<PackedGemm>(pool, true));
  EXPECT_EQ(small.c, alone(kernel, Problem(100, 48, 64)));
  EXPECT_EQ(large.c, alone(packed, Problem(1500, 48, 64)));
  // The boundary is 1,024 rows (the buckets' geometric mean).
  EXPECT_EQ(AutoGemm::bucket(1024), 0u);
  EXPECT_EQ(AutoGemm::bucket(1025), 1u);
  // The choice, with both figures, is what the model's info and the load log show.
  const std::string note = gemm.kernel(small.w);
  EXPECT_THAT(note, HasSubstr("M=512: amx (amx:model bf16"));
  EXPECT_THAT(note, HasSubstr("1.000 ms against onednn 2.000 ms"));
  EXPECT_THAT(note, HasSubstr("M=2048: onednn ("));
  EXPECT_THAT(note, HasSubstr("3.000 ms against amx 5.000 ms"));
}

TEST(AutoGemm, AShapeTheKernelDoesNotTakeIsOnednnsUntimed) {
  ThreadPool pool(1);
  auto onednn = std::make_unique<Counting>(std::make_unique<PackedGemm>(pool, true));
  Counting* const onednn_seen = onednn.get();
  int timed = 0;
  AutoGemm gemm(
      std::move(onednn),
      std::make_unique<AmxGemm>(pool, TileBackend::kModel,
                                std::make_unique<PackedGemm>(pool, true)),
      [&](const char*, int64_t, const std::function<void()>&) { return double(++timed); });
  Problem p(20, 16, 48);  // k 48: not a multiple of 32
  gemm.linear(p.in(), p.w, p.out(), Epilogue::kBiasAct, Activation::kGeluErf);
  EXPECT_EQ(timed, 0);
  EXPECT_EQ(onednn_seen->rows, std::vector<int64_t>{20});
  EXPECT_THAT(gemm.kernel(p.w), HasSubstr("oneDNN (the AMX kernel does not take it: k 48"));
}

// A tie is oneDNN's (the kernel must be faster to be picked); the default timer really runs
// each candidate (the outputs of the timing runs land in scratch rows, not in C).
TEST(AutoGemm, ATieIsOnednnsAndTheDefaultTimerRunsBoth) {
  ThreadPool pool(1);
  AutoGemm tie(std::make_unique<PackedGemm>(pool, true),
               std::make_unique<AmxGemm>(pool, TileBackend::kModel,
                                         std::make_unique<PackedGemm>(pool, true)),
               [](const char*, int64_t, const std::function<void()>&) { return 1.0; });
  Problem p(8, 32, 32);
  tie.linear(p.in(), p.w, p.out(), Epilogue::kBiasAct, Activation::kGeluErf);
  EXPECT_THAT(tie.kernel(p.w), HasSubstr("M=512: onednn"));
  EXPECT_THAT(tie.kernel(p.w), HasSubstr("M=2048: onednn"));

  AutoGemm timed(std::make_unique<PackedGemm>(pool, true),
                 std::make_unique<AmxGemm>(pool, TileBackend::kModel,
                                           std::make_unique<PackedGemm>(pool, true)));
  Problem q(8, 32, 32);
  const std::vector<uint16_t> before = q.c;
  timed.linear(q.in(), q.w, q.out(), Epilogue::kBiasAct, Activation::kGeluErf);
  PackedGemm packed(pool, true);
  AmxGemm kernel(pool, TileBackend::kModel, std::make_unique<PackedGemm>(pool, true));
  const std::string note = timed.kernel(q.w);
  const bool amx_small = note.find("M=512: amx") != std::string::npos;
  EXPECT_EQ(q.c, amx_small ? alone(kernel, Problem(8, 32, 32)) : alone(packed, Problem(8, 32, 32)))
      << note;
  EXPECT_NE(q.c, before);
  EXPECT_THAT(note, HasSubstr(" ms against "));
}

// --cpu-gemm to a back-end: float32 is oneDNN's whatever was asked; auto is the measured choice
// where the AMX kernel may run and oneDNN, saying why, where the tiles are refused; amx likewise
// refused with its reason; onednn always oneDNN.
TEST(AutoGemm, TheFlagsRuleFallsBackWhereTheTilesAreRefused) {
  std::string note;
  EXPECT_EQ(pick_bf16_gemm("auto", CpuDtype::kBfloat16, "", false, &note), Bf16Gemm::kAuto);
  EXPECT_THAT(note, HasSubstr("picked per shape by measurement"));
  EXPECT_EQ(
      pick_bf16_gemm("auto", CpuDtype::kBfloat16, "the CPU has no AMX (amx_bf16)", false, &note),
      Bf16Gemm::kOnednn);
  EXPECT_THAT(note, HasSubstr("--cpu-gemm auto: oneDNN's GEMMs (the AMX kernel cannot run: the "
                              "CPU has no AMX (amx_bf16))"));
  EXPECT_EQ(pick_bf16_gemm("amx", CpuDtype::kBfloat16, "the OS refused the tiles", false, &note),
            Bf16Gemm::kOnednn);
  EXPECT_THAT(note, HasSubstr("--cpu-gemm amx refused (the OS refused the tiles)"));
  EXPECT_EQ(pick_bf16_gemm("amx", CpuDtype::kBfloat16, "", false, &note), Bf16Gemm::kAmx);
  EXPECT_EQ(pick_bf16_gemm("onednn", CpuDtype::kBfloat16, "", false, &note), Bf16Gemm::kOnednn);
  note.clear();
  EXPECT_EQ(pick_bf16_gemm("auto", CpuDtype::kFloat32, "", false, &note), Bf16Gemm::kOnednn);
  EXPECT_EQ(note, "");
  EXPECT_EQ(pick_bf16_gemm("auto", CpuDtype::kBfloat16, "no AMX", /*tile_model=*/true, &note),
            Bf16Gemm::kAmxModel);
}

}  // namespace
}  // namespace fastformer::engine
