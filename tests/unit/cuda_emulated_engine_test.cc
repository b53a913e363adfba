// The CUDA engine (kernels/ + server/engine/cuda/) run on the host emulation, against the
// CPU engine on the same model and batch, in all three dtypes (tests/support/engine_parity.h).
// Sequences of 300 and 700 tokens span several 256-token chunks, so the split-and-combine
// path of the pooling kernels runs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/engine/cuda/emulated_engine.h"
#include "server/engine/engine.h"
#include "server/engine/model.h"
#include "tests/support/engine_parity.h"
#include "tests/support/test_models.h"

namespace fastformer {
namespace {

class EmulatedCudaEngineTest : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir();
    test::TinyModelSpec spec;
    spec.hidden = 64;
    spec.heads = 4;
    spec.layers = 2;
    spec.intermediate = 96;
    spec.max_positions = 1024;
    spec.vocab = 300;
    spec.num_labels = 5;
    model_ = new std::shared_ptr<const engine::Model>(
        engine::Model::load(test::write_tiny_model(dir_->path(), "m", spec)));
    engine::EngineOptions cpu;
    cpu.backend = engine::Backend::kCpu;
    cpu.threads = 2;
    cpu.max_batch_tokens = 2048;
    auto cpu_engine = engine::create_engine(*model_, cpu);
    reference_ = new std::vector<EncodedSequence>(
        test::encode_all(*cpu_engine, test::make_parity_inputs((*model_)->config())));
  }
  static void TearDownTestSuite() {
    delete reference_;
    delete model_;
    delete dir_;
  }
  static test::TempDir* dir_;
  static std::shared_ptr<const engine::Model>* model_;
  static std::vector<EncodedSequence>* reference_;
};
test::TempDir* EmulatedCudaEngineTest::dir_ = nullptr;
std::shared_ptr<const engine::Model>* EmulatedCudaEngineTest::model_ = nullptr;
std::vector<EncodedSequence>* EmulatedCudaEngineTest::reference_ = nullptr;

TEST_P(EmulatedCudaEngineTest, MatchesTheCpuEngine) {
  engine::EngineOptions options;
  options.dtype = GetParam();
  options.max_batch_tokens = 2048;
  auto cuda = engine::cuda::create_emulated_cuda_engine(*model_, options);
  EXPECT_EQ(cuda->backend_name(), "cuda");
  test::expect_parity(test::encode_all(*cuda, test::make_parity_inputs((*model_)->config())), *reference_,
                      GetParam());
}

TEST(EmulatedCudaEngine, BatchOverItsBuffersIsAClearError) {
  test::TempDir dir;
  test::TinyModelSpec spec;
  auto model = engine::Model::load(test::write_tiny_model(dir.path(), "m", spec));
  engine::EngineOptions options;
  options.max_batch_tokens = 8;
  auto cuda = engine::cuda::create_emulated_cuda_engine(model, options);
  engine::RaggedBatch batch;
  const std::vector<int32_t> ids(20, 1);
  batch.add({ids, {}}, model->config());
  const OutputOptions out;
  EXPECT_THAT(test::error_of<engine::EngineError>([&] { cuda->encode(batch, {&out, 1}); }),
              ::testing::HasSubstr("exceeds max_batch_tokens 8"));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, EmulatedCudaEngineTest, ::testing::Values("float32", "float16", "bfloat16"));

}  // namespace
}  // namespace fastformer
