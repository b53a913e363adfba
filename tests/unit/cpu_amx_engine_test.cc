// The CPU engine with its bfloat16 GEMMs on the hand-written AMX kernel (--cpu-gemm amx,
// cpu/amx_gemm.h), on any CPU: FASTFORMER_AMX_TILES=model runs the same kernel (packing,
// blocking, row pieces, fused epilogues) over the portable model of the tile instructions, in
// the engine's own graph, against the float32 engine (the bfloat16 parity rule) and against the
// bfloat16 engine on oneDNN. Where the CPU has AMX the real tiles run too; elsewhere the
// request is refused with the reason and the engine keeps oneDNN.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "server/engine/cpu/amx_tiles.h"
#include "server/engine/cpu/onednn_gemm.h"
#include "server/engine/cpu/peak_probe.h"
#include "server/engine/engine.h"
#include "server/engine/model.h"
#include "tests/support/engine_parity.h"
#include "tests/support/test_models.h"

namespace fastformer::engine {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Sets an environment variable for the life of the object.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { ::setenv(name, value, 1); }
  ~ScopedEnv() { ::unsetenv(name_); }

 private:
  const char* name_;
};

// D 64 and I 96: every GEMM's K (64 or 96) a multiple of 32, so the AMX kernel takes them all.
std::shared_ptr<const Model> load_model(const test::TempDir& dir, int64_t hidden,
                                        int64_t intermediate) {
  test::TinyModelSpec s;
  s.hidden = hidden;
  s.heads = 4;
  s.layers = 2;
  s.intermediate = intermediate;
  s.max_positions = 600;
  s.vocab = 200;
  s.num_labels = 3;
  s.seed = 7;
  return Model::load(test::write_tiny_model(dir.path(), "amx" + std::to_string(hidden), s));
}

EngineOptions bf16_options() {
  EngineOptions options;
  options.backend = Backend::kCpu;
  options.threads = 2;
  options.dtype = Dtype::kBfloat16;
  return options;
}

std::unique_ptr<Engine> float32_engine(std::shared_ptr<const Model> model) {
  EngineOptions options = bf16_options();
  options.dtype = Dtype::kFloat32;
  return create_engine(std::move(model), options);
}

TEST(CpuAmxEngine, TileModelMatchesFloat32AndOnednnBfloat16) {
  const test::TempDir dir;
  const auto model = load_model(dir, 64, 96);
  const ScopedEnv emulate("FASTFORMER_CPU_BFLOAT16", "emulate");  // bf16 buffers on any CPU
  std::unique_ptr<Engine> amx, onednn;
  {
    const ScopedEnv tiles("FASTFORMER_AMX_TILES", "model");
    amx = create_engine(model, bf16_options());
  }
  onednn = create_engine(model, bf16_options());
  EXPECT_THAT(amx->device_name(), HasSubstr("AMX kernel over the tile model"));
  const test::ParityInputs inputs = test::make_parity_inputs(model->config());
  const auto got = test::encode_all(*amx, inputs);
  // Every GEMM site ran the AMX kernel (its K is a multiple of 32).
  ASSERT_FALSE(amx->gemm_report().empty());
  for (const std::string& line : amx->gemm_report()) EXPECT_THAT(line, HasSubstr("amx:model"));
  const auto f32 = float32_engine(model);
  test::expect_parity(got, test::encode_all(*f32, inputs), "bfloat16");
  // The same bfloat16 roundings as oneDNN's path: only the order of the float32 sums differs.
  const auto want = test::encode_all(*onednn, inputs);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_GT(test::cosine(got[i].embedding, want[i].embedding), 0.9999) << "sequence " << i;
    EXPECT_LT(test::worst_relative_error(got[i].logits, want[i].logits), 2e-2) << "sequence " << i;
  }
  EXPECT_GT(amx->packed_weight_bytes(), size_t(0));
}

// K not a multiple of 32 (D 36): those GEMMs stay on oneDNN, the results still hold.
TEST(CpuAmxEngine, ShapesTheKernelRefusesStayOnOnednn) {
  const test::TempDir dir;
  const auto model = load_model(dir, 36, 64);  // K 36 everywhere but ffn_out's 64
  const ScopedEnv emulate("FASTFORMER_CPU_BFLOAT16", "emulate");
  std::unique_ptr<Engine> amx;
  {
    const ScopedEnv tiles("FASTFORMER_AMX_TILES", "model");
    amx = create_engine(model, bf16_options());
  }
  const test::ParityInputs inputs = test::make_parity_inputs(model->config());
  const auto got = test::encode_all(*amx, inputs);
  int on_amx = 0, on_onednn = 0;
  for (const std::string& line : amx->gemm_report()) {
    if (line.find("amx:model") != std::string::npos)
      ++on_amx;
    else
      ++on_onednn;
  }
  EXPECT_EQ(on_amx, 1) << "ffn_out (K = 64) only";
  EXPECT_GT(on_onednn, 0);
  test::expect_parity(got, test::encode_all(*float32_engine(model), inputs), "bfloat16");
}

// --cpu-gemm amx: the real tiles where the CPU has AMX and the kernel grants them; elsewhere the
// engine keeps oneDNN and its device string says why. float32 never takes it.
TEST(CpuAmxEngine, CpuGemmAmxRunsTheTilesOrSaysWhyNot) {
  const test::TempDir dir;
  const auto model = load_model(dir, 64, 96);
  EngineOptions options = bf16_options();
  options.cpu_gemm = CpuGemm::kAmx;
  options.dtype = Dtype::kFloat32;
  EXPECT_THAT(create_engine(model, options)->device_name(),
              HasSubstr("--cpu-gemm amx is for bfloat16"));
  options.dtype = Dtype::kBfloat16;
  std::string why;
  const bool amx = amx_available(&why);
  if (!amx) {
    if (cpu_gemm_info().has_bf16) {
      const auto engine = create_engine(model, options);
      EXPECT_THAT(engine->device_name(), HasSubstr("--cpu-gemm amx refused (" + why + ")"));
      test::encode_all(*engine, test::make_parity_inputs(model->config()));
      ASSERT_FALSE(engine->gemm_report().empty());
      for (const std::string& line : engine->gemm_report())
        EXPECT_THAT(line, Not(HasSubstr("amx:")));
    }
    GTEST_SKIP() << "the real AMX path is not run here: " << why
                 << " (the refusal was checked where this CPU runs bfloat16)";
  }
  const auto engine = create_engine(model, options);
  EXPECT_THAT(engine->device_name(), HasSubstr("hand-written AMX kernel"));
  const test::ParityInputs inputs = test::make_parity_inputs(model->config());
  test::expect_parity(test::encode_all(*engine, inputs),
                      test::encode_all(*float32_engine(model), inputs), "bfloat16");
  ASSERT_FALSE(engine->gemm_report().empty());
  for (const std::string& line : engine->gemm_report()) EXPECT_THAT(line, HasSubstr("amx:hand"));
}

// The matrix units' peak loop (fastformer-bench's AMX peak) on the model: four C tiles, each
// element iterations x 32 products of 1.0 and 2^-20.
TEST(CpuAmxEngine, PeakLoopOnTheModel) {
  uint16_t a[16 * 32], b[16 * 32];
  std::fill(std::begin(a), std::end(a), uint16_t{0x3f80});
  std::fill(std::begin(b), std::end(b), uint16_t{0x3580});
  float c[4 * 16 * 16];
  std::fill(std::begin(c), std::end(c), -1.0f);
  amx::ModelTiles tiles;
  amx::peak_loop(tiles, a, b, 3, c);
  for (float x : c) ASSERT_EQ(x, 3 * 32 * 0x1p-20f);
  EXPECT_EQ(amx::kPeakLoopFlops, 65536.0);
  // The tiles were released: any tile instruction now faults, as on the CPU.
  EXPECT_THROW(tiles.zero<0>(), amx::TileFault);
}

// The fed tile loop (--gemm-probe's L1- and L2-fed ceilings) on the model: 2 x 2 accumulators,
// two A and two B tiles loaded from the working set at every step, cycling through its groups of
// four tiles: with B 2^-20 in the first group and 2^-19 in the second, three steps (groups 0, 1,
// 0) give every element 32 (2^-20 + 2^-19 + 2^-20) = 2^-13.
TEST(CpuAmxEngine, FedLoopOnTheModelCyclesThroughItsWorkingSet) {
  constexpr size_t kTile = 16 * 32;
  std::vector<uint16_t> buffer(8 * kTile);
  for (int g = 0; g < 2; ++g) {
    uint16_t* t = buffer.data() + g * 4 * kTile;
    std::fill(t, t + 2 * kTile, uint16_t{0x3f80});  // A: 1.0
    std::fill(t + 2 * kTile, t + 4 * kTile, g == 0 ? uint16_t{0x3580} : uint16_t{0x3600});  // B
  }
  float c[4 * 16 * 16];
  std::fill(std::begin(c), std::end(c), -1.0f);
  amx::ModelTiles tiles;
  amx::fed_loop(tiles, buffer.data(), 8, 3, c);
  for (float x : c) ASSERT_EQ(x, 0x1p-13f);
  EXPECT_THROW(tiles.zero<0>(), amx::TileFault);  // released
  // Where the CPU has no AMX the probe's ceilings are 0, each with the reason.
  std::string why;
  if (!amx_available(&why)) {
    const std::vector<TileCeiling> ceilings = amx_tile_ceilings();
    ASSERT_EQ(ceilings.size(), 3u);
    EXPECT_STREQ(ceilings[2].name, "L2-fed");
    EXPECT_EQ(ceilings[2].bytes, 256 << 10);
    for (const TileCeiling& c : ceilings) {
      EXPECT_EQ(c.peak.gflops, 0);
      EXPECT_EQ(c.peak.how, why);
    }
  }
}

TEST(CpuAmxEngine, CpuGemmNames) {
  CpuGemm g = CpuGemm::kAmx;
  EXPECT_TRUE(parse_cpu_gemm("onednn", &g));
  EXPECT_EQ(g, CpuGemm::kOnednn);
  EXPECT_TRUE(parse_cpu_gemm("amx", &g));
  EXPECT_EQ(g, CpuGemm::kAmx);
  EXPECT_TRUE(parse_cpu_gemm("auto", &g));
  EXPECT_EQ(g, CpuGemm::kAuto);
  EXPECT_FALSE(parse_cpu_gemm("AMX", &g));
  EXPECT_STREQ(cpu_gemm_name(CpuGemm::kOnednn), "onednn");
  EXPECT_STREQ(cpu_gemm_name(CpuGemm::kAuto), "auto");
  EXPECT_EQ(EngineOptions{}.cpu_gemm, CpuGemm::kAuto);  // the default
}

}  // namespace
}  // namespace fastformer::engine
