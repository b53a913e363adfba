// Real-GPU tests of the CUDA engine (ctest label `gpu`): parity with the CPU engine in all
// three dtypes, a long sequence, and a small batch for compute-sanitizer. Where no usable
// GPU exists every test reports itself skipped, with the reason; none passes silently.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

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
std::unique_ptr<engine::Engine> gpu_engine(std::shared_ptr<const engine::Model> model, const std::string& dtype,
                                           int64_t tokens, std::string* skip_reason) {
  engine::EngineOptions options;
  options.backend = engine::Backend::kCuda;
  options.dtype = dtype;
  options.max_batch_tokens = tokens;
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

INSTANTIATE_TEST_SUITE_P(Dtypes, GpuEngineTest, ::testing::Values("float32", "float16", "bfloat16"));

}  // namespace
}  // namespace fastformer
