// The CUDA engine's GEMM interface (server/engine/cuda/gemm.h) as the host emulation runs it:
// every epilogue against the same GEMM computed here in double and rounded once to the
// storage type, with leading dimensions wider than the matrices; the row buckets of the
// cuBLASLt plans; and the Q|K|s padding (server/engine/prepared_weights.h): zero rows, a
// 16-byte row in every dtype, and CPU GEMM columns bit-identical to the unpadded weight's;
// the logits' padded leading dimension (server/engine/workspace.h, padded_ld); and every
// GEMM site of the forward graph, recorded as the engine runs it, 16-byte aligned.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "common/half.h"
#include "server/engine/config.h"
#include "server/engine/cpu/cpu_ops.h"
#include "server/engine/cpu/onednn_gemm.h"
#include "server/engine/cuda/cuda_ops.h"
#include "server/engine/cuda/gemm.h"
#include "server/engine/error.h"
#include "server/engine/forward.h"
#include "server/engine/forwarding_ops.h"
#include "server/engine/model.h"
#include "server/engine/ops.h"
#include "server/engine/prepared_weights.h"
#include "server/engine/workspace.h"
#include "tests/support/random_values.h"
#include "tests/support/reference_activation.h"
#include "tests/support/test_models.h"

namespace fastformer {
namespace {

namespace cuda = engine::cuda::emulated;
using cuda::GemmEpilogue;
using cuda::StorageType;

using ::fastformer::test::random_values;

// Host arrays in a storage type (the emulation's device memory is host memory).
struct Stored {
  StorageType type;
  std::vector<char> bytes;

  Stored(StorageType t, const std::vector<float>& values) : type(t), bytes(values.size() * size()) {
    for (size_t i = 0; i < values.size(); ++i) {
      if (type == StorageType::kF32) {
        std::memcpy(bytes.data() + 4 * i, &values[i], 4);
      } else {
        const uint16_t bits =
            type == StorageType::kF16 ? float_to_half(values[i]) : float_to_bfloat16(values[i]);
        std::memcpy(bytes.data() + 2 * i, &bits, 2);
      }
    }
  }
  size_t size() const { return type == StorageType::kF32 ? 4 : 2; }
  float operator[](size_t i) const {
    if (type == StorageType::kF32) {
      float v;
      std::memcpy(&v, bytes.data() + 4 * i, 4);
      return v;
    }
    uint16_t bits;
    std::memcpy(&bits, bytes.data() + 2 * i, 2);
    return type == StorageType::kF16 ? half_to_float(bits) : bfloat16_to_float(bits);
  }
  void* data() { return bytes.data(); }
  const void* data() const { return bytes.data(); }
};

struct EpilogueCase {
  GemmEpilogue epilogue;
  StorageType type;
};

class EmulatedGemmTest : public ::testing::TestWithParam<EpilogueCase> {};

// c = epilogue(a w^T) with M 7, N 12, K 24, lda 30, ldc 16: the expected value is computed
// in double from the stored (rounded) inputs, then rounded once to the storage type, as
// cuBLASLt applies the epilogue to the float32 accumulator. The columns past N keep their
// values (the row stride is honoured).
TEST_P(EmulatedGemmTest, EpilogueMatchesDoubleReference) {
  const auto [epilogue, type] = GetParam();
  const int64_t M = 7, N = 12, K = 24, lda = 30, ldc = 16;
  const Stored a(type, random_values(size_t(M * lda), 1, 1.0f));
  const Stored w(type, random_values(size_t(N * K), 2, 0.3f));
  const Stored bias(type, random_values(size_t(N), 3, 1.0f));
  const Stored c0(type, random_values(size_t(M * ldc), 4, 1.0f));
  Stored c = c0;

  // The erf GELU is the CUTLASS epilogue, asked for (cutlass-gelu) and 16-bit only.
  cuda::Gemm gemm(cuda::GemmOptions{type, false, epilogue == GemmEpilogue::kBiasGeluErf}, nullptr);
  gemm.set_max_rows(64);
  gemm.run({N, K, lda, ldc, epilogue}, M, a.data(), w.data(), bias.data(), c.data());

  const bool has_bias = epilogue != GemmEpilogue::kStore && epilogue != GemmEpilogue::kAccumulate;
  double worst = 0;
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < ldc; ++j) {
      const size_t at = size_t(i * ldc + j);
      if (j >= N) {
        EXPECT_EQ(c[at], c0[at]) << "column " << j << " past N was written";
        continue;
      }
      double v = 0;
      for (int64_t k = 0; k < K; ++k) v += double(a[size_t(i * lda + k)]) * w[size_t(j * K + k)];
      if (has_bias) v += bias[size_t(j)];
      if (epilogue == GemmEpilogue::kAccumulate) v += c0[at];
      if (epilogue == GemmEpilogue::kBiasRelu)
        v = test::reference_activation(v, engine::Activation::kRelu);
      if (epilogue == GemmEpilogue::kBiasGeluTanh)
        v = test::reference_activation(v, engine::Activation::kGeluTanh);
      if (epilogue == GemmEpilogue::kBiasGeluErf)
        v = test::reference_activation(v, engine::Activation::kGeluErf);
      const float expected = Stored(type, {float(v)})[0];
      worst = std::max(
          worst, std::abs(double(c[at]) - expected) / std::max(1.0, std::abs(double(expected))));
    }
  }
  // float32: accumulation order only. 16-bit types: one rounding, so at most one unit in the
  // last place where float32 accumulation lands on the other side of a rounding boundary.
  const double tolerance = type == StorageType::kF32   ? 1e-5
                           : type == StorageType::kF16 ? 1.0 / 1024
                                                       : 1.0 / 128;
  EXPECT_LE(worst, tolerance) << cuda::gemm_epilogue_name(epilogue);
}

INSTANTIATE_TEST_SUITE_P(
    Epilogues, EmulatedGemmTest,
    ::testing::Values(EpilogueCase{GemmEpilogue::kStore, StorageType::kF32},
                      EpilogueCase{GemmEpilogue::kAccumulate, StorageType::kF32},
                      EpilogueCase{GemmEpilogue::kBias, StorageType::kF32},
                      EpilogueCase{GemmEpilogue::kBiasRelu, StorageType::kF32},
                      EpilogueCase{GemmEpilogue::kBiasGeluTanh, StorageType::kF32},
                      EpilogueCase{GemmEpilogue::kAccumulate, StorageType::kBF16},
                      EpilogueCase{GemmEpilogue::kBias, StorageType::kBF16},
                      EpilogueCase{GemmEpilogue::kBiasGeluTanh, StorageType::kBF16},
                      EpilogueCase{GemmEpilogue::kBiasRelu, StorageType::kF16},
                      EpilogueCase{GemmEpilogue::kBiasGeluTanh, StorageType::kF16},
                      EpilogueCase{GemmEpilogue::kBiasGeluErf, StorageType::kBF16},
                      EpilogueCase{GemmEpilogue::kBiasGeluErf, StorageType::kF16}),
    [](const auto& info) {
      std::string name = cuda::gemm_epilogue_name(info.param.epilogue);
      for (char& ch : name) ch = std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
      const StorageType t = info.param.type;
      return name + (t == StorageType::kF32 ? "_f32" : t == StorageType::kF16 ? "_f16" : "_bf16");
    });

// The tanh GELU epilogue is the tanh form, not erf: at these inputs they differ by ~1e-4,
// far above float32 accumulation error.
TEST(EmulatedGemm, GeluEpilogueIsTheTanhForm) {
  const int64_t M = 1, N = 4, K = 1;
  const std::vector<float> a = {1.0f}, w = {-2.5f, -1.0f, 0.7f, 2.0f}, bias = {0, 0, 0, 0};
  std::vector<float> c(4, 0.0f);
  cuda::Gemm gemm(cuda::GemmOptions{StorageType::kF32}, nullptr);
  gemm.set_max_rows(1);
  gemm.run({N, K, K, N, GemmEpilogue::kBiasGeluTanh}, M, a.data(), w.data(), bias.data(), c.data());
  for (size_t j = 0; j < 4; ++j) {
    EXPECT_NEAR(c[j], test::reference_activation(w[j], engine::Activation::kGeluTanh), 1e-6);
    EXPECT_GT(std::abs(c[j] - test::reference_activation(w[j], engine::Activation::kGeluErf)),
              1e-5);
  }
}

// The erf-GELU epilogue exists only where asked for (cutlass-gelu) in a 16-bit type, as on the
// device (compute capability 9.0 with the CUTLASS kernels built); asked of a Gemm without it,
// run() is an error naming why, never a silent store.
TEST(EmulatedGemm, ErfGeluEpilogueOnlyWhereAskedForIn16Bits) {
  std::string why;
  EXPECT_TRUE(
      cuda::Gemm(cuda::GemmOptions{StorageType::kBF16, false, true}, nullptr).has_gelu_erf());
  EXPECT_FALSE(
      cuda::Gemm(cuda::GemmOptions{StorageType::kF32, false, true}, nullptr).has_gelu_erf(&why));
  EXPECT_EQ(why, "float32 keeps the separate pass");
  cuda::Gemm plain(cuda::GemmOptions{StorageType::kBF16}, nullptr);
  EXPECT_FALSE(plain.has_gelu_erf(&why));
  EXPECT_THAT(why, ::testing::HasSubstr("--cuda-opt-in cutlass-gelu"));
  plain.set_max_rows(1);
  std::vector<uint16_t> a(1), w(1), bias(1), c(1);
  EXPECT_THAT(test::error_of<engine::EngineError>([&] {
                plain.run({1, 1, 1, 1, GemmEpilogue::kBiasGeluErf}, 1, a.data(), w.data(),
                          bias.data(), c.data());
              }),
              ::testing::HasSubstr("bias+gelu_erf asked of a Gemm without it"));
}

TEST(EmulatedGemm, MoreRowsThanPlannedIsAnEngineError) {
  std::vector<float> a(8), w(4), c(8);
  cuda::Gemm gemm(cuda::GemmOptions{StorageType::kF32}, nullptr);
  gemm.set_max_rows(4);
  EXPECT_THAT(
      test::error_of<engine::EngineError>([&] {
        gemm.run({1, 1, 1, 1, GemmEpilogue::kStore}, 8, a.data(), w.data(), nullptr, c.data());
      }),
      ::testing::HasSubstr(
          "GEMM of 8 rows over the 4 it was planned for (N 1, K 1, lda 1, ldc 1, store)"));
}

TEST(GemmRowsBucket, IsTheSmallestPowerOfTwoAtLeastM) {
  EXPECT_EQ(cuda::gemm_rows_bucket(1), 1);
  EXPECT_EQ(cuda::gemm_rows_bucket(2), 2);
  EXPECT_EQ(cuda::gemm_rows_bucket(3), 4);
  EXPECT_EQ(cuda::gemm_rows_bucket(512), 512);
  EXPECT_EQ(cuda::gemm_rows_bucket(513), 1024);
  EXPECT_EQ(cuda::gemm_rows_bucket(65536), 65536);
}

// ---- the Q|K|s padding ----------------------------------------------------------------------

engine::ModelConfig config_of(int64_t D, int64_t H) {
  engine::ModelConfig c;
  c.hidden_size = D;
  c.num_attention_heads = H;
  return c;
}

TEST(QksPadding, WidthIsTwoDPlusHRoundedUpToEight) {
  EXPECT_EQ(engine::qks_width(config_of(768, 12)),
            1552);  // base-long: 1,548 -> 3,104 bytes in 16 bits
  EXPECT_EQ(engine::qks_width(config_of(32, 4)), 72);
  EXPECT_EQ(engine::qks_width(config_of(64, 8)), 136);  // already a multiple of 8
  for (int64_t D : {32, 64, 96, 768, 1024}) {
    for (int64_t H : {1, 4, 6, 12, 16}) {
      const int64_t width = engine::qks_width(config_of(D, H));
      EXPECT_EQ(width * 2 % 16, 0);
      EXPECT_GE(width, 2 * D + H);
      EXPECT_LT(width, 2 * D + H + 8);
    }
  }
}

TEST(QksPadding, PreparedWeightHasZeroRowsAndBias) {
  test::TempDir dir;
  test::TinyModelSpec spec;  // D 32, H 4: 68 rows padded to 72
  const auto model = engine::Model::load(test::write_tiny_model(dir.path(), "m", spec));
  const engine::PreparedWeights prepared = engine::prepare_weights(*model);
  const engine::PreparedLinear& qks = prepared.layers.at(0)->query_key_scores;
  const int64_t D = 32, used = 2 * D + 4;
  ASSERT_EQ(qks.out, 72);
  ASSERT_EQ(qks.weight.size(), size_t(72 * D));
  ASSERT_EQ(qks.bias.size(), size_t(72));
  for (int64_t r = 0; r < qks.out; ++r) {
    bool zero_row = qks.bias[size_t(r)] == 0.0f;
    for (int64_t j = 0; j < D; ++j) zero_row &= qks.weight[size_t(r * D + j)] == 0.0f;
    EXPECT_EQ(zero_row, r >= used) << "row " << r;
  }
}

// The CPU engine's GEMM (oneDNN, as CpuOps::linear runs it) gives the same bits in Q, K and s
// from the padded weight as from the unpadded one: padding changes no CPU result. Shapes of
// the test models and of base-long (1,548 -> 1,552 columns), float32 and (where the CPU has
// it) bfloat16.
TEST(QksPadding, CpuGemmColumnsAreBitIdentical) {
  for (const bool bf16 : {false, true}) {
    if (bf16 && !engine::cpu_gemm_info().has_bf16) continue;
    for (const auto& shape : {std::pair<int64_t, int64_t>{32, 4}, {64, 4}, {768, 12}}) {
      // Plain variables, not a structured binding: clang 14 (the sanitizer build's) cannot
      // capture a binding in the lambda below.
      const int64_t D = shape.first, H = shape.second;
      const int64_t used = 2 * D + H, padded = engine::qks_width(config_of(D, H)), M = 96;
      ASSERT_GT(padded, used);
      const auto x = random_values(size_t(M * D), 5, 1.0f);
      std::vector<float> w = random_values(size_t(used * D), 6, 0.05f),
                         bias = random_values(size_t(used), 7, 0.1f);
      std::vector<float> w_padded = w, bias_padded = bias;
      w_padded.resize(size_t(padded * D), 0.0f);
      bias_padded.resize(size_t(padded), 0.0f);
      auto run = [&](int64_t N, const std::vector<float>& weight, const std::vector<float>& b) {
        std::vector<uint16_t> rounded(weight.size());
        for (size_t i = 0; i < weight.size(); ++i) rounded[i] = float_to_bfloat16(weight[i]);
        std::vector<float> c(size_t(M * N));
        engine::CpuMatmul({N, D, D, N, engine::Epilogue::kBias, engine::Activation::kGeluErf, bf16})
            .run(M, x.data(), bf16 ? static_cast<const void*>(rounded.data()) : weight.data(),
                 b.data(), c.data());
        return c;
      };
      const std::vector<float> c = run(used, w, bias),
                               c_padded = run(padded, w_padded, bias_padded);
      int64_t differing = 0;
      for (int64_t i = 0; i < M; ++i) {
        for (int64_t j = 0; j < padded; ++j) {
          const float expected = j < used ? c[size_t(i * used + j)] : 0.0f;
          differing +=
              std::memcmp(&c_padded[size_t(i * padded + j)], &expected, sizeof(float)) != 0;
        }
      }
      EXPECT_EQ(differing, 0) << "D " << D << ", H " << H << (bf16 ? ", bfloat16" : ", float32");
    }
  }
}

// ---- the logits' leading dimension -----------------------------------------------------------

TEST(PaddedLd, IsColsRoundedUpToEight) {
  EXPECT_EQ(engine::padded_ld(1), 8);
  EXPECT_EQ(engine::padded_ld(5), 8);
  EXPECT_EQ(engine::padded_ld(8), 8);
  EXPECT_EQ(engine::padded_ld(9), 16);
  EXPECT_EQ(engine::padded_ld(300), 304);
  EXPECT_EQ(engine::padded_ld(1548), 1552);
}

// The plan gives the logits num_labels columns in rows of padded_ld(num_labels) (16 bytes in
// 16-bit types for a 5-label head, not 10) and sizes the buffer by the padded rows.
TEST(LogitsPadding, PlanPadsTheRowsNotTheColumns) {
  engine::ModelConfig c = config_of(64, 4);
  c.intermediate_size = 96;
  for (const size_t element : {size_t(4), size_t(2)}) {
    for (const int64_t labels : {int64_t(1), int64_t(3), int64_t(5), int64_t(8), int64_t(300)}) {
      const engine::WorkspacePlan plan = engine::plan_workspace(c, labels, 100, 7, element);
      EXPECT_EQ(plan.logits.rows, 7);
      EXPECT_EQ(plan.logits.cols, labels);
      EXPECT_EQ(plan.logits.ld, engine::padded_ld(labels));
      EXPECT_EQ(plan.logits.ld * int64_t(element) % 16, 0);
      EXPECT_GE(plan.partial_max.offset - plan.logits.offset, size_t(7 * plan.logits.ld) * element);
      EXPECT_EQ(plan.x.ld, plan.x.cols);  // D = 64: dense
    }
  }
}

// The CPU engine's GEMM writes the same bits into a row of padded_ld(N) as into a dense one,
// and nothing past N: the padded logits change no CPU result.
TEST(LogitsPadding, CpuGemmColumnsAreBitIdentical) {
  for (const bool bf16 : {false, true}) {
    if (bf16 && !engine::cpu_gemm_info().has_bf16) continue;
    for (const int64_t N : {int64_t(3), int64_t(4), int64_t(5), int64_t(7), int64_t(300)}) {
      for (const int64_t D : {int64_t(32), int64_t(64), int64_t(768)}) {
        const int64_t M = 40, ldc = engine::padded_ld(N);
        const auto x = random_values(size_t(M * D), 8, 1.0f);
        const auto w = random_values(size_t(N * D), 9, 0.05f),
                   bias = random_values(size_t(N), 10, 0.1f);
        std::vector<uint16_t> rounded(w.size());
        for (size_t i = 0; i < w.size(); ++i) rounded[i] = float_to_bfloat16(w[i]);
        const void* weight = bf16 ? static_cast<const void*>(rounded.data()) : w.data();
        std::vector<float> dense(size_t(M * N)), padded(size_t(M * ldc), -7.0f);
        engine::CpuMatmul({N, D, D, N, engine::Epilogue::kBias, engine::Activation::kGeluErf, bf16})
            .run(M, x.data(), weight, bias.data(), dense.data());
        engine::CpuMatmul(
            {N, D, D, ldc, engine::Epilogue::kBias, engine::Activation::kGeluErf, bf16})
            .run(M, x.data(), weight, bias.data(), padded.data());
        int64_t differing = 0, written_past_n = 0;
        for (int64_t i = 0; i < M; ++i) {
          for (int64_t j = 0; j < ldc; ++j) {
            const float got = padded[size_t(i * ldc + j)];
            if (j >= N) {
              written_past_n += got != -7.0f;
            } else {
              differing += std::memcmp(&got, &dense[size_t(i * N + j)], sizeof(float)) != 0;
            }
          }
        }
        EXPECT_EQ(differing, 0) << "N " << N << ", D " << D << (bf16 ? ", bfloat16" : ", float32");
        EXPECT_EQ(written_past_n, 0) << "N " << N << ", D " << D;
      }
    }
  }
}

// ---- every GEMM site of the forward graph --------------------------------------------------

// One Ops::linear call as the forward graph issued it.
struct GemmSite {
  engine::Mat a, c;
  engine::WeightRef w;
  engine::Epilogue epilogue;
  const char* workspace;  // the ops' workspace at the call
};

// The ops of an engine with every linear() recorded on its way through: the sites are those
// the forward graph (server/engine/forward.cc) really issues, with the operands it really
// passes (plan offsets, column views, uploaded weights), so this list cannot drift from it.
class RecordingOps final : public engine::ForwardingOps {
 public:
  RecordingOps(std::unique_ptr<engine::Ops> inner, std::vector<GemmSite>* sites)
      : ForwardingOps(*inner), owned_(std::move(inner)), sites_(sites) {}

  void linear(const engine::Mat& a, const engine::WeightRef& w, engine::Mat c,
              engine::Epilogue epilogue, engine::Activation act) override {
    sites_->push_back({a, c, w, epilogue, static_cast<const char*>(inner_.workspace())});
    inner_.linear(a, w, c, epilogue, act);
  }

 private:
  std::unique_ptr<engine::Ops> owned_;  // what inner_ refers to
  std::vector<GemmSite>* sites_;
};

struct SiteModel {
  std::string name;
  test::TinyModelSpec spec;
};

// The model shapes the project serves and tests: the presets of tools/make_demo_model.py and
// the C++ test models. A GEMM site depends on D, H, I and the label count only (every layer
// repeats the same sites; positions and vocabulary size no GEMM), so each is built with one
// layer and a small vocabulary and position table.
std::vector<SiteModel> site_models() {
  auto spec = [](int64_t D, int64_t H, int64_t I, int64_t labels) {
    test::TinyModelSpec s;
    s.hidden = D;
    s.heads = H;
    s.intermediate = I;
    s.num_labels = labels;
    s.layers = 1;
    s.max_positions = 32;
    s.vocab = 50;
    return s;
  };
  const test::TinyModelSpec base_long_2l = test::base_long_two_layers();
  return {
      {"preset tiny", spec(32, 4, 64, 3)},
      {"preset official", spec(256, 16, 256, 4)},
      {"preset base-long", spec(768, 12, 3072, 0)},
      {"TinyModelSpec default", spec(32, 4, 48, 0)},
      {"engine and activation tests (3 labels)", spec(32, 4, 48, 3)},
      {"engine_test wide head (300 labels)", spec(32, 4, 48, 300)},
      {"model_test (7 labels)", spec(32, 4, 48, 7)},
      {"emulated and GPU engine tests (5 labels)", spec(64, 4, 96, 5)},
      {"client_test", spec(128, 4, 512, 3)},
      {"fuzz models", spec(8, 2, 8, 3)},
      {"base_long_two_layers", spec(base_long_2l.hidden, base_long_2l.heads,
                                    base_long_2l.intermediate, base_long_2l.num_labels)},
  };
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Every GEMM site of every model, in the CPU engine (float32) and the CUDA engine on the host
// emulation in float32, float16 and bfloat16: the leading dimensions of A and C and the
// weight's (K, its rows being dense) are multiples of 16 bytes, and so are the addresses of
// A, C, W and the bias and A's and C's offsets in the workspace, as cuBLASLt's bias
// epilogues need (server/engine/workspace.h, padded_ld). The sites are counted against the
// profile's GEMM rows, so a site the batch did not reach (the head: logits are asked for)
// fails too.
TEST(GemmSites, EveryLeadingDimensionAndPointerIs16ByteAligned) {
  test::TempDir dir;
  const std::vector<SiteModel> models = site_models();
  for (size_t index = 0; index < models.size(); ++index) {
    const SiteModel& m = models[index];
    const auto model = engine::Model::load(
        test::write_tiny_model(dir.path(), "m" + std::to_string(index), m.spec));
    for (const std::string backend :
         {"cpu float32", "cuda float32", "cuda float16", "cuda bfloat16"}) {
      SCOPED_TRACE(m.name + ", " + backend);
      std::vector<GemmSite> sites;
      std::unique_ptr<engine::Ops> inner;
      if (backend == "cpu float32") {
        inner = std::make_unique<engine::CpuOps>(1, model->config());
      } else {
        engine::cuda::CudaOpsOptions options;
        options.dtype = backend.substr(5);
        std::string why;
        inner = engine::cuda::emulated::make_cuda_ops(*model, options, nullptr, &why);
        ASSERT_TRUE(inner) << why;
      }
      const size_t e = inner->element_size();
      engine::ForwardEngine eng(model, std::make_unique<RecordingOps>(std::move(inner), &sites), 32,
                                "test", backend, {});
      eng.set_profiling(true);
      engine::RaggedBatch batch;
      for (const int n : {1, 5, 11})
        batch.add({std::vector<int32_t>(size_t(n), 3), {}}, model->config());
      OutputOptions options;
      options.logits = true;
      const auto out = eng.encode(batch, {&options, 1});
      ASSERT_EQ(out.size(), 3u);
      EXPECT_EQ(out[0].logits.size(), size_t(m.spec.num_labels));

      std::vector<std::string>
          names;  // the graph's GEMM ops, in issue order (one batch: one call each)
      for (const engine::OpProfile& row : eng.profile()) {
        if (!row.name.ends_with("_gemm")) continue;
        EXPECT_EQ(row.calls, 1.0) << row.name;
        names.push_back(row.name +
                        (row.layer >= 0 ? " of layer " + std::to_string(row.layer) : ""));
      }
      ASSERT_EQ(sites.size(), names.size());
      EXPECT_EQ(std::count(names.begin(), names.end(), std::string("classifier_gemm")),
                m.spec.num_labels > 0);
      for (size_t i = 0; i < sites.size(); ++i) {
        const GemmSite& s = sites[i];
        const int64_t E = int64_t(e);
        SCOPED_TRACE(names[i] + ": N " + std::to_string(s.w.out) + ", K " + std::to_string(s.w.in) +
                     ", lda " + std::to_string(s.a.ld) + ", ldc " + std::to_string(s.c.ld) + ", " +
                     std::to_string(e) + "-byte elements");
        EXPECT_EQ(s.a.ld * E % 16, 0) << "lda";
        EXPECT_EQ(s.c.ld * E % 16, 0) << "ldc";
        EXPECT_EQ(s.w.in * E % 16, 0) << "the weight's ld (K)";
        EXPECT_GE(s.a.ld, s.w.in);
        EXPECT_GE(s.c.ld, s.w.out);
        EXPECT_EQ(s.a.cols, s.w.in);
        EXPECT_EQ(s.c.cols, s.w.out);
        EXPECT_EQ((static_cast<const char*>(s.a.data) - s.workspace) % 16, 0)
            << "A's offset in the workspace";
        EXPECT_EQ((static_cast<const char*>(s.c.data) - s.workspace) % 16, 0)
            << "C's offset in the workspace";
        EXPECT_TRUE(aligned16(s.a.data)) << "A";
        EXPECT_TRUE(aligned16(s.c.data)) << "C";
        EXPECT_TRUE(aligned16(s.w.weight)) << "W";
        EXPECT_TRUE(aligned16(s.w.bias)) << "bias";  // null (no bias) is aligned
      }
    }
  }
}

}  // namespace
}  // namespace fastformer
