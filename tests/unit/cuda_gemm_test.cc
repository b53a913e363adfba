// The CUDA engine's GEMM interface (server/engine/cuda/gemm.h) as the host emulation runs it:
// every epilogue against the same GEMM computed here in double and rounded once to the
// storage type, with leading dimensions wider than the matrices; the row buckets of the
// cuBLASLt plans; and the Q|K|s padding (server/engine/prepared_weights.h): zero rows, a
// 16-byte row in every dtype, and CPU GEMM columns bit-identical to the unpadded weight's.
#include "server/engine/cuda/gemm.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/half.h"
#include "server/engine/config.h"
#include "server/engine/cpu/onednn_gemm.h"
#include "server/engine/error.h"
#include "server/engine/model.h"
#include "server/engine/prepared_weights.h"
#include "tests/support/reference_activation.h"
#include "tests/support/test_models.h"

namespace fastformer {
namespace {

namespace cuda = engine::cuda::emulated;
using cuda::GemmEpilogue;
using cuda::StorageType;

std::vector<float> random_values(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = normal(rng);
  return v;
}

// Host arrays in a storage type (the emulation's device memory is host memory).
struct Stored {
  StorageType type;
  std::vector<char> bytes;

  Stored(StorageType t, const std::vector<float>& values) : type(t), bytes(values.size() * size()) {
    for (size_t i = 0; i < values.size(); ++i) {
      if (type == StorageType::kF32) {
        std::memcpy(bytes.data() + 4 * i, &values[i], 4);
      } else {
        const uint16_t bits = type == StorageType::kF16 ? float_to_half(values[i]) : float_to_bfloat16(values[i]);
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

  cuda::Gemm gemm(type, false, nullptr);
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
      if (epilogue == GemmEpilogue::kBiasRelu) v = test::reference_activation(v, engine::Activation::kRelu);
      if (epilogue == GemmEpilogue::kBiasGeluTanh) v = test::reference_activation(v, engine::Activation::kGeluTanh);
      const float expected = Stored(type, {float(v)})[0];
      worst = std::max(worst, std::abs(double(c[at]) - expected) / std::max(1.0, std::abs(double(expected))));
    }
  }
  // float32: accumulation order only. 16-bit types: one rounding, so at most one unit in the
  // last place where float32 accumulation lands on the other side of a rounding boundary.
  const double tolerance = type == StorageType::kF32 ? 1e-5 : type == StorageType::kF16 ? 1.0 / 1024 : 1.0 / 128;
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
                      EpilogueCase{GemmEpilogue::kBiasGeluTanh, StorageType::kF16}),
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
  cuda::Gemm gemm(StorageType::kF32, false, nullptr);
  gemm.set_max_rows(1);
  gemm.run({N, K, K, N, GemmEpilogue::kBiasGeluTanh}, M, a.data(), w.data(), bias.data(), c.data());
  for (size_t j = 0; j < 4; ++j) {
    EXPECT_NEAR(c[j], test::reference_activation(w[j], engine::Activation::kGeluTanh), 1e-6);
    EXPECT_GT(std::abs(c[j] - test::reference_activation(w[j], engine::Activation::kGeluErf)), 1e-5);
  }
}

TEST(EmulatedGemm, MoreRowsThanPlannedIsAnEngineError) {
  std::vector<float> a(8), w(4), c(8);
  cuda::Gemm gemm(StorageType::kF32, false, nullptr);
  gemm.set_max_rows(4);
  EXPECT_THAT(test::error_of<engine::EngineError>(
                  [&] { gemm.run({1, 1, 1, 1, GemmEpilogue::kStore}, 8, a.data(), w.data(), nullptr, c.data()); }),
              ::testing::HasSubstr("GEMM of 8 rows over the 4 it was planned for (N 1, K 1, lda 1, ldc 1, store)"));
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
  EXPECT_EQ(engine::qks_width(config_of(768, 12)), 1552);  // base-long: 1,548 -> 3,104 bytes in 16 bits
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
    for (const auto& [D, H] : {std::pair<int64_t, int64_t>{32, 4}, {64, 4}, {768, 12}}) {
      const int64_t used = 2 * D + H, padded = engine::qks_width(config_of(D, H)), M = 96;
      ASSERT_GT(padded, used);
      const auto x = random_values(size_t(M * D), 5, 1.0f);
      std::vector<float> w = random_values(size_t(used * D), 6, 0.05f), bias = random_values(size_t(used), 7, 0.1f);
      std::vector<float> w_padded = w, bias_padded = bias;
      w_padded.resize(size_t(padded * D), 0.0f);
      bias_padded.resize(size_t(padded), 0.0f);
      auto run = [&](int64_t N, const std::vector<float>& weight, const std::vector<float>& b) {
        std::vector<uint16_t> rounded(weight.size());
        for (size_t i = 0; i < weight.size(); ++i) rounded[i] = float_to_bfloat16(weight[i]);
        std::vector<float> c(size_t(M * N));
        engine::CpuMatmul({N, D, D, N, engine::Epilogue::kBias, engine::Activation::kGeluErf, bf16})
            .run(M, x.data(), bf16 ? static_cast<const void*>(rounded.data()) : weight.data(), b.data(), c.data());
        return c;
      };
      const std::vector<float> c = run(used, w, bias), c_padded = run(padded, w_padded, bias_padded);
      int64_t differing = 0;
      for (int64_t i = 0; i < M; ++i) {
        for (int64_t j = 0; j < padded; ++j) {
          const float expected = j < used ? c[size_t(i * used + j)] : 0.0f;
          differing += std::memcmp(&c_padded[size_t(i * padded + j)], &expected, sizeof(float)) != 0;
        }
      }
      EXPECT_EQ(differing, 0) << "D " << D << ", H " << H << (bf16 ? ", bfloat16" : ", float32");
    }
  }
}

}  // namespace
}  // namespace fastformer
