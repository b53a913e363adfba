// The CUDA engine on the host emulation against the CPU engine on layers of base-long's shape
// (hidden 768, 12 heads of 64, intermediate 3,072; two layers, where base-long has twelve), in
// bfloat16 and float16. The kernels' launch configurations, shared-memory layouts and vector
// widths depend on these sizes, which the tiny models of cuda_emulated_engine_test.cc do not
// reach. One ragged batch: a 600-token sequence (three 256-token pooling chunks, the last one
// partial) beside a short one and an input-embeddings sequence. The emulation runs every GPU
// thread on the CPU, so the batch is kept to a few hundred tokens.
#include <gtest/gtest.h>

#include "server/engine/cuda/emulated_engine.h"
#include "server/engine/engine.h"
#include "server/engine/model.h"
#include "tests/support/engine_parity.h"
#include "tests/support/test_models.h"

namespace fastformer {
namespace {

class EmulatedCudaBaseLongTest : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir();
    model_ = new std::shared_ptr<const engine::Model>(engine::Model::load(
        test::write_tiny_model(dir_->path(), "base_long_2l", test::base_long_two_layers())));
    engine::EngineOptions cpu;
    cpu.backend = engine::Backend::kCpu;
    cpu.threads = 2;
    cpu.max_batch_tokens = kBatchTokens;
    auto cpu_engine = engine::create_engine(*model_, cpu);
    reference_ = new std::vector<EncodedSequence>(test::encode_all(*cpu_engine, inputs()));
  }
  static void TearDownTestSuite() {
    delete reference_;
    delete model_;
    delete dir_;
  }
  static test::ParityInputs inputs() {
    return test::make_parity_inputs((*model_)->config(), {600, 9});
  }

  static constexpr int64_t kBatchTokens = 1024;
  static test::TempDir* dir_;
  static std::shared_ptr<const engine::Model>* model_;
  static std::vector<EncodedSequence>* reference_;
};
test::TempDir* EmulatedCudaBaseLongTest::dir_ = nullptr;
std::shared_ptr<const engine::Model>* EmulatedCudaBaseLongTest::model_ = nullptr;
std::vector<EncodedSequence>* EmulatedCudaBaseLongTest::reference_ = nullptr;

TEST_P(EmulatedCudaBaseLongTest, MatchesTheCpuEngine) {
  engine::EngineOptions options;
  options.dtype = engine::dtype_from_name(GetParam());
  options.max_batch_tokens = kBatchTokens;
  auto cuda = engine::cuda::create_emulated_cuda_engine(*model_, options);
  const std::vector<EncodedSequence> ours = test::encode_all(*cuda, inputs());
  ASSERT_EQ(ours.size(), 3u);
  EXPECT_EQ(ours[0].num_tokens, 600);
  test::expect_parity(ours, *reference_, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Dtypes, EmulatedCudaBaseLongTest,
                         ::testing::Values("bfloat16", "float16"));

}  // namespace
}  // namespace fastformer
