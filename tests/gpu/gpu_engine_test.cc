// Real-GPU tests of the CUDA engine (ctest label `gpu`): parity with the CPU engine in all
// three dtypes, a long sequence, a small batch for compute-sanitizer (*Small*), parity on
// base-long's layer shape (*BaseLong*: gpu-check.sh runs these apart, right after ctest),
// and the profile's CUDA events. Where no usable GPU exists every test reports itself
// skipped, with the reason; none passes silently.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <iostream>
#include <string>
#include <string_view>

#include "server/engine/cuda/cuda_ops.h"
#include "server/engine/engine.h"
#include "server/engine/model.h"
#include "tests/support/engine_parity.h"
#include "tests/support/test_models.h"

namespace fastformer {
namespace {

std::shared_ptr<const engine::Model> tiny_model(test::TempDir& dir, int64_t positions) {
  test::TinyModelSpec spec;
  spec.hidden = 64;
  spec.heads = 4;
  spec.layers = 2;
  spec.intermediate = 96;
  spec.max_positions = positions;
  spec.vocab = 300;
  spec.num_labels = 5;
  return engine::Model::load(test::write_tiny_model(dir.path(), "m", spec));
}

// The CUDA engine on device 0, or a skip naming why there is none. Only "no usable device"
// (create_engine's "backend cuda: ..." refusal: no GPU, no driver, no plugin) skips; an
// engine that finds a GPU and then fails (the plugin's "CUDA engine: ...", an allocation or
// a kernel) is a failure, never a skip.
std::unique_ptr<engine::Engine> gpu_engine(std::shared_ptr<const engine::Model> model,
                                           const std::string& dtype, int64_t tokens,
                                           std::string* skip_reason,
                                           const std::string& opt_in = "") {
  engine::EngineOptions options;
  options.backend = engine::Backend::kCuda;
  options.dtype = engine::dtype_from_name(dtype);
  options.max_batch_tokens = tokens;
  options.cuda_opt_in = opt_in;
  try {
    return engine::create_engine(std::move(model), options);
  } catch (const engine::EngineError& e) {
    if (!std::string_view(e.what()).starts_with("backend cuda: ")) throw;
    *skip_reason = e.what();
    return nullptr;
  }
}

std::vector<EncodedSequence> cpu_reference(std::shared_ptr<const engine::Model> model,
                                           const test::ParityInputs& in, int64_t tokens) {
  engine::EngineOptions options;
  options.backend = engine::Backend::kCpu;
  options.max_batch_tokens = tokens;
  auto cpu = engine::create_engine(std::move(model), options);
  return test::encode_all(*cpu, in);
}

class GpuEngineTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuEngineTest, SmallBatchMatchesTheCpuEngine) {
  test::TempDir dir;
  auto model = tiny_model(dir, 1024);
  std::string why;
  auto gpu = gpu_engine(model, GetParam(), 2048, &why);
  if (!gpu) GTEST_SKIP() << "no usable GPU: " << why;
  const auto in = test::make_parity_inputs(model->config());
  test::expect_parity(test::encode_all(*gpu, in), cpu_reference(model, in, 2048), GetParam());
}

TEST_P(GpuEngineTest, LongSequenceMatchesTheCpuEngine) {
  test::TempDir dir;
  auto model = tiny_model(dir, 16384);
  std::string why;
  auto gpu = gpu_engine(model, GetParam(), 20000, &why);
  if (!gpu) GTEST_SKIP() << "no usable GPU: " << why;
  const auto in = test::make_parity_inputs(model->config(), {16384, 3, 1000});
  test::expect_parity(test::encode_all(*gpu, in), cpu_reference(model, in, 20000), GetParam());
}

// Two layers of base-long's shape (hidden 768, 12 heads, intermediate 3,072), with a sequence
// over two 256-token chunks beside short ones: the launch configurations and vector widths of
// the real model's sizes (tests/unit/cuda_emulated_base_long_test.cc runs the same emulated).
TEST_P(GpuEngineTest, BaseLongShapeMatchesTheCpuEngine) {
  test::TempDir dir;
  auto model =
      engine::Model::load(test::write_tiny_model(dir.path(), "m", test::base_long_two_layers()));
  std::string why;
  auto gpu = gpu_engine(model, GetParam(), 1024, &why);
  if (!gpu) GTEST_SKIP() << "no usable GPU: " << why;
  const auto in = test::make_parity_inputs(model->config(), {600, 9});
  test::expect_parity(test::encode_all(*gpu, in), cpu_reference(model, in, 1024), GetParam());
}

// Every opt-in kernel of issue 48 (--cuda-opt-in all: the CUTLASS bias + erf-GELU GEMM, the
// one-pass key pool, timed GEMM algorithms, CUDA graphs) on base-long's shape, against the CPU
// engine, then the same batch again and again: captured, then replayed. On
// compute capability 9.0 in 16 bits the CUTLASS GEMM must be what runs (the device line says
// "opt-in cutlass-gelu," not "cutlass-gelu off: ..."), so this test checks the kernel itself.
TEST_P(GpuEngineTest, OptInKernelsOnBaseLongShapeMatchTheCpuEngine) {
  test::TempDir dir;
  auto model =
      engine::Model::load(test::write_tiny_model(dir.path(), "m", test::base_long_two_layers()));
  std::string why;
  auto gpu = gpu_engine(model, GetParam(), 1024, &why, "all");
  if (!gpu) GTEST_SKIP() << "no usable GPU: " << why;
  const std::string device = gpu->device_name();
  std::cout << "[ device   ] " << device << "\n";
  const bool hopper = device.find("H100") != std::string::npos ||
                      device.find("H200") != std::string::npos;  // compute capability 9.0
  if (GetParam() != "float32" && hopper) {
    EXPECT_THAT(device, ::testing::HasSubstr("opt-in cutlass-gelu,"));
  }
  const auto in = test::make_parity_inputs(model->config(), {600, 9, 257, 1});
  const auto first = test::encode_all(*gpu, in);
  test::expect_parity(first, cpu_reference(model, in, 1024), GetParam());
  // cuda-graphs: the second batch of these sizes is captured, the later ones replay the graph
  // (in each input slot the batches rotate through): the same outputs, bit for bit.
  for (int round = 0; round < 5; ++round) {
    const auto again = test::encode_all(*gpu, in);
    ASSERT_EQ(again.size(), first.size());
    for (size_t s = 0; s < first.size(); ++s) {
      EXPECT_EQ(again[s].embedding, first[s].embedding) << "round " << round << ", sequence " << s;
      EXPECT_EQ(again[s].token_embeddings, first[s].token_embeddings) << round << ", " << s;
    }
  }
}

// --dtype auto on the device: the plugin picks for its compute capability (bfloat16 from 8.0,
// float32 before: cuda::choose_cuda_dtype), says why, and serves it within that dtype's parity.
TEST(GpuEngineAutoDtype, IsTheDevicesPick) {
  test::TempDir dir;
  auto model = tiny_model(dir, 1024);
  std::string why;
  auto gpu = gpu_engine(model, "auto", 2048, &why);
  if (!gpu) GTEST_SKIP() << "no usable GPU: " << why;
  const std::string& reason = gpu->dtype().why;
  const size_t at = reason.find(", compute capability ");
  ASSERT_NE(at, std::string::npos) << reason;
  const int major = std::stoi(reason.substr(at + std::string(", compute capability ").size()));
  const std::string want = major >= 8 ? "bfloat16" : "float32";
  EXPECT_EQ(engine::dtype_name(gpu->dtype().dtype), want) << reason;
  EXPECT_THAT(gpu->device_name(), ::testing::HasSubstr(", " + want + ")"));
  const auto in = test::make_parity_inputs(model->config());
  test::expect_parity(test::encode_all(*gpu, in), cpu_reference(model, in, 2048), want);
}

// The profile's CUDA-event path (the emulation times with the host clock instead): every op of
// the forward timed, the times adding up to no more than the batch's, outputs unchanged. The
// opt-in kernels stay off whatever FASTFORMER_CUDA_OPT_IN says (the rows are counted below).
TEST_P(GpuEngineTest, ProfileTimesEveryOpWithEvents) {
  test::TempDir dir;
  auto model = tiny_model(dir, 1024);
  std::string why;
  auto gpu = gpu_engine(model, GetParam(), 2048, &why, "none");
  if (!gpu) GTEST_SKIP() << "no usable GPU: " << why;
  const auto in = test::make_parity_inputs(model->config());
  const auto plain = test::encode_all(*gpu, in);
  gpu->set_profiling(true);
  const auto t0 = std::chrono::steady_clock::now();
  const auto profiled = test::encode_all(*gpu, in);
  const double wall_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const auto rows = gpu->profile();
  ASSERT_EQ(profiled.size(), plain.size());
  for (size_t s = 0; s < plain.size(); ++s)
    EXPECT_EQ(profiled[s].embedding, plain[s].embedding) << s;
  // begin_batch, embed, 11 a layer (ffn_in_gemm and its exact-erf GELU pass, ffn_in_bias_gelu,
  // are two rows: cuBLASLt's GELU epilogue is the tanh form), the pooler's 2, the head and its
  // download, the pooled and token downloads (encode_all asks for logits and tokens, not
  // normalisation); and a bias pass of its own (<x>_bias) after each GEMM whose operands are not
  // 16-byte aligned for cuBLASLt's bias epilogue (the 5-label head; Q|K|s's 132 columns in 16
  // bits).
  size_t bias_passes = 0, gelu_passes = 0;
  for (const auto& row : rows) {
    const std::string& n = row.name;
    bias_passes += n.size() > 5 && n.compare(n.size() - 5, 5, "_bias") == 0;
    gelu_passes += n == "ffn_in_bias_gelu";
  }
  EXPECT_EQ(gelu_passes, 2u);
  EXPECT_EQ(rows.size(), size_t(2 + 11 * 2 + 2 + 2 + 2) + bias_passes);
  double total_ms = 0;
  for (const auto& row : rows) {
    EXPECT_EQ(row.calls, 1.0) << row.name;
    EXPECT_GT(row.bytes, 0.0) << row.name;
    EXPECT_GE(row.ms, 0.0) << row.name;
    total_ms += row.ms;
  }
  EXPECT_GT(total_ms, 0.0);
  EXPECT_LE(total_ms, wall_ms);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GpuEngineTest,
                         ::testing::Values("float32", "float16", "bfloat16"));

}  // namespace
}  // namespace fastformer
