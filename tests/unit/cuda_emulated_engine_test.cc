// The CUDA engine (kernels/ + server/engine/cuda/) run on the host emulation, against the
// CPU engine on the same model and batch, in all three dtypes (tests/support/engine_parity.h).
// Sequences of 300 and 700 tokens span several 256-token chunks, so the split-and-combine
// path of the pooling kernels runs. The heads have 5 and 3 labels, so the logits come back
// from rows padded to 8 (server/engine/workspace.h, padded_ld). Each activation takes its own
// GEMM path (the bias, ReLU and tanh-GELU epilogues, the erf-GELU and SiLU pass), and a model
// whose hidden size is not a multiple of 8 the plain store plus bias pass; a float16 batch that
// overflows fails with an error, not NaN.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <thread>
#include <tuple>

#include "server/engine/cuda/cuda_ops.h"
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
  options.dtype = engine::dtype_from_name(GetParam());
  options.max_batch_tokens = 2048;
  auto cuda = engine::cuda::create_emulated_cuda_engine(*model_, options);
  EXPECT_EQ(cuda->backend_name(), "cuda");
  test::expect_parity(test::encode_all(*cuda, test::make_parity_inputs((*model_)->config())),
                      *reference_, GetParam());
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
  EXPECT_THAT(test::error_of<engine::EngineError>([&] {
                cuda->encode(batch, {&out, 1});
              }),
              ::testing::HasSubstr("exceeds max_batch_tokens 8"));
}

// Every opt-in kernel asked for (--cuda-opt-in all, issue 48): the same parity. In 16-bit
// dtypes the feed-forward's bias and exact-erf GELU ride on the GEMM (the CUTLASS epilogue on
// sm_90, modelled by the emulated GEMM), so its site has no pass; float32 keeps the pass. The
// device line says which run.
TEST_P(EmulatedCudaEngineTest, OptInKernelsMatchTheCpuEngine) {
  engine::EngineOptions options;
  options.dtype = engine::dtype_from_name(GetParam());
  options.max_batch_tokens = 2048;
  options.cuda_opt_in = "all";
  auto cuda = engine::cuda::create_emulated_cuda_engine(*model_, options);
  const bool fused = GetParam() != "float32";
  EXPECT_THAT(
      cuda->device_name(),
      ::testing::HasSubstr(fused ? "opt-in cutlass-gelu, fused-key-pool, gemm-timing, cuda-graphs"
                                 : "opt-in cutlass-gelu off: float32 keeps the separate "
                                   "pass, fused-key-pool, gemm-timing, cuda-graphs"));
  cuda->set_profiling(true);
  test::expect_parity(test::encode_all(*cuda, test::make_parity_inputs((*model_)->config())),
                      *reference_, GetParam());
  int gemm_rows = 0, pass_rows = 0;
  for (const engine::OpProfile& op : cuda->profile()) {
    gemm_rows += op.name == "ffn_in_gemm";
    pass_rows += op.name == "ffn_in_bias_gelu";
  }
  EXPECT_EQ(gemm_rows, 2);  // one a layer
  EXPECT_EQ(pass_rows, fused ? 0 : 2);
  // The GEMM report names the emulated GEMM and its epilogue for each site.
  bool reported = false;
  for (const std::string& line : cuda->gemm_report()) {
    if (line.starts_with("ffn_in_gemm")) {
      reported = true;
      EXPECT_THAT(line, ::testing::HasSubstr(fused ? "bias+gelu_erf" : "store")) << line;
    }
  }
  EXPECT_TRUE(reported);
  // The same batch again (cuda-graphs: the emulation counts the key and runs the region; on a
  // GPU the second is captured and the rest replay): the same outputs, bit for bit.
  cuda->set_profiling(false);
  const auto first = test::encode_all(*cuda, test::make_parity_inputs((*model_)->config()));
  for (int round = 0; round < 3; ++round) {
    const auto again = test::encode_all(*cuda, test::make_parity_inputs((*model_)->config()));
    ASSERT_EQ(again.size(), first.size());
    for (size_t s = 0; s < first.size(); ++s) EXPECT_EQ(again[s].embedding, first[s].embedding);
  }
}

// Staged batches (Engine::stage, encode_staged: the inputs copied ahead, issue 48) give the
// outputs of plain encode(), bit for bit; a stale or unknown ticket falls back to a copy of its
// own; several staged batches in a row reuse the input slots.
TEST_P(EmulatedCudaEngineTest, StagedBatchesEncodeAsUnstagedOnes) {
  engine::EngineOptions options;
  options.dtype = engine::dtype_from_name(GetParam());
  options.max_batch_tokens = 2048;
  auto cuda = engine::cuda::create_emulated_cuda_engine(*model_, options);
  const engine::ModelConfig& c = (*model_)->config();
  auto batch_of = [&](std::vector<int> lengths) {
    const test::ParityInputs inputs = test::make_parity_inputs(c, std::move(lengths));
    engine::RaggedBatch batch;
    for (const auto& ids : inputs.ids) batch.add({ids, {}}, c);
    return batch;
  };
  const engine::RaggedBatch a = batch_of({1, 7, 300}), b = batch_of({700, 5});
  OutputOptions out;
  out.token_embeddings = true;
  out.logits = true;
  const auto plain_a = cuda->encode(a, {&out, 1}), plain_b = cuda->encode(b, {&out, 1});
  auto same = [](const std::vector<EncodedSequence>& x, const std::vector<EncodedSequence>& y) {
    ASSERT_EQ(x.size(), y.size());
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_EQ(x[i].embedding, y[i].embedding) << i;
      EXPECT_EQ(x[i].token_embeddings, y[i].token_embeddings) << i;
      EXPECT_EQ(x[i].logits, y[i].logits) << i;
    }
  };
  for (int round = 0; round < 4; ++round) {  // more rounds than slots
    const uint64_t ticket_a = cuda->stage(a);
    ASSERT_NE(ticket_a, 0u);
    const uint64_t ticket_b = cuda->stage(b);  // staged while a's copy waits
    ASSERT_NE(ticket_b, ticket_a);
    same(cuda->encode_staged(a, {&out, 1}, ticket_a), plain_a);
    same(cuda->encode_staged(b, {&out, 1}, ticket_b), plain_b);
  }
  // b's ticket, spent, or one never issued: the batch goes up by itself.
  const uint64_t ticket = cuda->stage(b);
  same(cuda->encode_staged(a, {&out, 1}, 0), plain_a);
  same(cuda->encode_staged(a, {&out, 1}, ticket + 100), plain_a);
  same(cuda->encode_staged(b, {&out, 1}, ticket), plain_b);
  // A batch with input embeddings is not staged (its rows go up with the batch).
  engine::RaggedBatch with_rows;
  with_rows.add({{}, std::vector<float>(size_t(3 * c.hidden_size), 0.25f)}, c);
  EXPECT_EQ(cuda->stage(with_rows), 0u);
}

// One thread stages each next batch while another encodes the one before, as the scheduler's
// former and compute threads do: every result equals the unstaged one (ThreadSanitizer runs
// this in make test-tsan).
TEST_F(EmulatedCudaEngineTest, StagingOnAnotherThreadWhileEncoding) {
  engine::EngineOptions options;
  options.dtype = engine::Dtype::kBfloat16;
  options.max_batch_tokens = 2048;
  auto cuda = engine::cuda::create_emulated_cuda_engine(*model_, options);
  const engine::ModelConfig& c = (*model_)->config();
  std::vector<engine::RaggedBatch> batches;
  for (int i = 0; i < 6; ++i) {
    const test::ParityInputs inputs = test::make_parity_inputs(c, {1 + 37 * i, 260, 3 + i});
    engine::RaggedBatch batch;
    for (const auto& ids : inputs.ids) batch.add({ids, {}}, c);
    batches.push_back(std::move(batch));
  }
  OutputOptions out;
  std::vector<std::vector<EncodedSequence>> plain;
  for (const auto& batch : batches) plain.push_back(cuda->encode(batch, {&out, 1}));
  uint64_t ticket = cuda->stage(batches[0]);
  for (size_t i = 0; i < batches.size(); ++i) {
    uint64_t next = 0;
    std::thread former([&] {
      if (i + 1 < batches.size()) next = cuda->stage(batches[i + 1]);
    });
    const auto got = cuda->encode_staged(batches[i], {&out, 1}, ticket);
    former.join();
    ASSERT_EQ(got.size(), plain[i].size());
    for (size_t s = 0; s < got.size(); ++s) EXPECT_EQ(got[s].embedding, plain[i][s].embedding);
    ticket = next;
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, EmulatedCudaEngineTest,
                         ::testing::Values("float32", "float16", "bfloat16"));

// A misspelt opt-in is an error on the CPU backend too (create_engine checks the list first),
// never a setting silently ignored on a machine without a GPU.
TEST(CudaOptIn, AnUnknownNameFailsTheEngineOnTheCpuToo) {
  test::TempDir dir;
  test::TinyModelSpec spec;
  auto model = engine::Model::load(test::write_tiny_model(dir.path(), "m", spec));
  engine::EngineOptions options;
  options.backend = engine::Backend::kCpu;
  options.max_batch_tokens = 64;
  options.cuda_opt_in = "cutlass-gelu,fused-key-pools";
  EXPECT_THAT(test::error_of<engine::EngineError>([&] { engine::create_engine(model, options); }),
              ::testing::HasSubstr("unknown kernel \"fused-key-pools\""));
  options.cuda_opt_in = "all";
  EXPECT_NE(engine::create_engine(model, options), nullptr);
}

// The opt-in list (--cuda-opt-in, FASTFORMER_CUDA_OPT_IN): names, all, none, spaces; an unknown
// name is an error naming the field and the choices.
TEST(CudaOptIn, ParsesTheListAndRefusesUnknownNames) {
  using engine::cuda::parse_cuda_opt_in;
  const auto none = parse_cuda_opt_in("");
  EXPECT_FALSE(none.cutlass_gelu || none.fused_key_pool || none.gemm_timing);
  const auto two = parse_cuda_opt_in("cutlass-gelu, gemm-timing");
  EXPECT_TRUE(two.cutlass_gelu && two.gemm_timing);
  EXPECT_FALSE(two.fused_key_pool);
  const auto all = parse_cuda_opt_in("all");
  EXPECT_TRUE(all.cutlass_gelu && all.fused_key_pool && all.gemm_timing && all.cuda_graphs);
  EXPECT_FALSE(parse_cuda_opt_in("none").cutlass_gelu);
  EXPECT_THAT(test::error_of<engine::EngineError>([] { parse_cuda_opt_in("cutlass-gelu,turbo"); }),
              ::testing::HasSubstr("cuda_opt_in (--cuda-opt-in, FASTFORMER_CUDA_OPT_IN): unknown "
                                   "kernel \"turbo\"; expected cutlass-gelu, fused-key-pool, "
                                   "gemm-timing, cuda-graphs, all or none"));
}

// --dtype auto's rule for the CUDA engine, both branches on any machine: the compute
// capability is injected.
TEST(ChooseCudaDtype, AutoIsBfloat16FromComputeCapability8) {
  std::string why;
  EXPECT_EQ(engine::cuda::choose_cuda_dtype("Tesla T4", 7, 5, &why), "float32");
  EXPECT_EQ(why, "Tesla T4, compute capability 7.5: no bfloat16 tensor cores before 8.0");
  EXPECT_EQ(engine::cuda::choose_cuda_dtype("Tesla V100", 7, 0, &why), "float32");
  EXPECT_EQ(engine::cuda::choose_cuda_dtype("NVIDIA A100", 8, 0, &why), "bfloat16");
  EXPECT_EQ(why, "NVIDIA A100, compute capability 8.0: bfloat16 tensor cores");
  EXPECT_EQ(engine::cuda::choose_cuda_dtype("NVIDIA H200", 9, 0, &why), "bfloat16");
}

// The emulation is an sm_90 device: auto is bfloat16 there, and the engine says why.
TEST_F(EmulatedCudaEngineTest, AutoIsTheDevicesPick) {
  engine::EngineOptions options;
  options.dtype = engine::Dtype::kAuto;
  options.max_batch_tokens = 2048;
  auto cuda = engine::cuda::create_emulated_cuda_engine(*model_, options);
  EXPECT_EQ(cuda->dtype().dtype, engine::Dtype::kBfloat16);
  EXPECT_EQ(cuda->dtype().why, "host emulation, compute capability 9.0: bfloat16 tensor cores");
  EXPECT_EQ(cuda->device_name(), "cuda bfloat16 on host emulation");
  test::expect_parity(test::encode_all(*cuda, test::make_parity_inputs((*model_)->config())),
                      *reference_, "bfloat16");
  options.dtype = engine::Dtype::kFloat32;
  EXPECT_EQ(engine::cuda::create_emulated_cuda_engine(*model_, options)->dtype().why, "");
}

// The emulated CUDA engine in `dtype` against the CPU engine (float32, one thread) on three
// sequences of 1, 9 and 300 tokens (two pooling chunks).
void expect_emulated_matches_cpu(const std::shared_ptr<const engine::Model>& model,
                                 const std::string& dtype) {
  const test::ParityInputs inputs = test::make_parity_inputs(model->config(), {1, 9, 300});
  engine::EngineOptions cpu;
  cpu.backend = engine::Backend::kCpu;
  cpu.threads = 1;
  cpu.max_batch_tokens = 512;
  const auto reference = test::encode_all(*engine::create_engine(model, cpu), inputs);
  engine::EngineOptions options;
  options.dtype = engine::dtype_from_name(dtype);
  options.max_batch_tokens = 512;
  auto cuda = engine::cuda::create_emulated_cuda_engine(model, options);
  test::expect_parity(test::encode_all(*cuda, inputs), reference, dtype);
}

// The intermediate GEMM's epilogue per activation (cuda_ops.cc, linear): gelu_new and relu are
// fused into the GEMM (the tanh-GELU and ReLU epilogues), gelu and silu keep the bias +
// activation pass; every model also runs the plain bias epilogue (Q|K|s, the pooler, the
// head) and the accumulate one (the transform).
class EmulatedCudaActivationTest
    : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(EmulatedCudaActivationTest, MatchesTheCpuEngine) {
  const auto& [activation, dtype] = GetParam();
  test::TempDir dir;
  test::TinyModelSpec spec;
  spec.hidden = 32;
  spec.heads = 4;
  spec.intermediate = 48;
  spec.max_positions = 512;
  spec.num_labels = 3;
  spec.activation = activation;
  auto model = engine::Model::load(test::write_tiny_model(dir.path(), "m", spec));
  ASSERT_EQ(model->config().hidden_act_name, activation);
  expect_emulated_matches_cpu(model, dtype);
}

INSTANTIATE_TEST_SUITE_P(Activations, EmulatedCudaActivationTest,
                         ::testing::Combine(::testing::Values("gelu", "gelu_new", "relu", "silu"),
                                            ::testing::Values("float32", "bfloat16", "float16")),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::get<1>(info.param);
                         });

// A hidden and an intermediate size that are not multiples of 4 (D 34, I 42) leave rows that
// no padding of the plan makes 16 bytes in any dtype (the activations and the weights are
// dense), so the bias GEMMs run as a plain store and the bias pass adds the bias (cuda_ops.cc,
// linear); the head's 3 logits sit in padded rows. The engine still matches the CPU engine in every
// dtype.
class EmulatedCudaUnalignedTest : public ::testing::TestWithParam<std::string> {};

TEST_P(EmulatedCudaUnalignedTest, MatchesTheCpuEngine) {
  test::TempDir dir;
  test::TinyModelSpec spec;
  spec.hidden = 34;
  spec.heads = 2;
  spec.intermediate = 42;
  spec.max_positions = 512;
  spec.num_labels = 3;
  auto model = engine::Model::load(test::write_tiny_model(dir.path(), "m", spec));
  expect_emulated_matches_cpu(model, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Dtypes, EmulatedCudaUnalignedTest,
                         ::testing::Values("float32", "float16", "bfloat16"));

// The feed-forward weights scaled by 1e4 put the activations past float16's 65504 (and
// nowhere near float32's or bfloat16's range): the float16 batch fails with an EngineError
// that says so and what to do; the same model in float32 and bfloat16 encodes.
TEST(EmulatedCudaEngine, Float16OverflowFailsTheBatch) {
  test::TempDir dir;
  test::TinyModelSpec spec;
  spec.num_labels = 3;
  test::TinyModel tiny = test::make_tiny_model(spec);
  int scaled = 0;
  for (auto& [name, tensor] : tiny.tensors) {
    const bool feed_forward =
        name.ends_with("intermediate.dense.weight") ||
        (name.ends_with("output.dense.weight") && name.find("attention") == std::string::npos);
    if (!feed_forward) continue;
    for (float& v : tensor.values) v *= 1e4f;
    ++scaled;
  }
  ASSERT_EQ(scaled, 2 * spec.layers);
  test::write_model(dir / "m", tiny);
  auto model = engine::Model::load(dir / "m");
  const test::ParityInputs inputs = test::make_parity_inputs(model->config(), {5, 20});
  for (const std::string dtype : {"float16", "float32", "bfloat16"}) {
    engine::EngineOptions options;
    options.dtype = engine::dtype_from_name(dtype);
    options.max_batch_tokens = 128;
    auto cuda = engine::cuda::create_emulated_cuda_engine(model, options);
    const std::string error = test::error_of<engine::EngineError>([&] {
      for (const EncodedSequence& e : test::encode_all(*cuda, inputs)) {
        for (float v : e.embedding) ASSERT_TRUE(std::isfinite(v)) << dtype;
        for (float v : e.token_embeddings) ASSERT_TRUE(std::isfinite(v)) << dtype;
        for (float v : e.logits) ASSERT_TRUE(std::isfinite(v)) << dtype;
      }
    });
    if (dtype == "float16") {
      EXPECT_THAT(error, ::testing::HasSubstr("the model overflows float16"));
      EXPECT_THAT(error, ::testing::HasSubstr("serve it in bfloat16 or float32"));
    } else {
      EXPECT_EQ(error, "<no exception>") << dtype;
    }
  }
}

}  // namespace
}  // namespace fastformer
