// The CPU engine's oneDNN GEMMs (server/engine/cpu/onednn_gemm.h) against GEMMs computed here
// in double, for every epilogue and activation, with leading dimensions wider than the
// matrices; the bfloat16 rounding against common/half.h; the ISA report against
// /proc/cpuinfo; and the start-up self-check's verdict.
#include "server/engine/cpu/onednn_gemm.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/half.h"
#include "server/engine/error.h"
#include "tests/support/random_values.h"
#include "tests/support/reference_activation.h"

namespace fastformer::engine {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

using ::fastformer::test::random_values;

struct Case {
  int64_t m, n, k, lda, ldc;
  Epilogue epilogue;
  Activation act;
};

// C[i][j] in double from the inputs as `in` takes them (as they are, or rounded to bfloat16);
// for kAccumulate, C's old value as `c_in` takes it (CpuMatmul's C is float32 whatever A is).
template <class In, class CIn>
double expected(const Case& c, int64_t i, int64_t j, const std::vector<float>& a,
                const std::vector<float>& w, const std::vector<float>& bias,
                const std::vector<float>& c0, In in, CIn c_in) {
  double acc = 0;
  for (int64_t p = 0; p < c.k; ++p)
    acc += in(a[size_t(i * c.lda + p)]) * in(w[size_t(j * c.k + p)]);
  if (c.epilogue == Epilogue::kBias) return acc + bias[size_t(j)];
  if (c.epilogue == Epilogue::kBiasAct)
    return test::reference_activation(acc + bias[size_t(j)], c.act);
  if (c.epilogue == Epilogue::kAccumulate) return c_in(c0[size_t(i * c.ldc + j)]) + acc;
  return acc;
}

// C as oneDNN leaves it, and C computed in double from the same inputs (rounded to bfloat16
// first when `bf16`); compared with a tolerance for float32 accumulation.
void check(const Case& c, bool bf16) {
  const auto a = random_values(size_t(c.m * c.lda), 1 + uint32_t(c.m), 0.5f);
  const auto w = random_values(size_t(c.n * c.k), 2 + uint32_t(c.n), 0.1f);
  const auto bias = random_values(size_t(c.n), 3);
  const auto c0 = random_values(size_t(c.m * c.ldc), 4);
  std::vector<float> out = c0;

  std::vector<uint16_t> w16(w.size());
  for (size_t i = 0; i < w.size(); ++i) w16[i] = float_to_bfloat16(w[i]);
  auto in = [&](float x) {
    return bf16 ? double(bfloat16_to_float(float_to_bfloat16(x))) : double(x);
  };

  const CpuMatmul mm({c.n, c.k, c.lda, c.ldc, c.epilogue, c.act, bf16});
  mm.run(c.m, a.data(), bf16 ? static_cast<const void*>(w16.data()) : w.data(), bias.data(),
         out.data());

  double worst = 0;
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < c.n; ++j) {
      const double want = expected(c, i, j, a, w, bias, c0, in, [](float x) { return double(x); });
      const double got = out[size_t(i * c.ldc + j)];
      worst = std::max(worst, std::abs(got - want) / std::max(1.0, std::abs(want)));
    }
    // Columns beyond n (ldc > n) are not C's: left as they were.
    for (int64_t j = c.n; j < c.ldc; ++j)
      ASSERT_EQ(out[size_t(i * c.ldc + j)], c0[size_t(i * c.ldc + j)]);
  }
  EXPECT_LE(worst, 2e-5) << "m " << c.m << " n " << c.n << " k " << c.k << " epilogue "
                         << int(c.epilogue) << " act " << int(c.act)
                         << (bf16 ? " bfloat16" : " float32");
}

const Case kCases[] = {
    {1, 16, 32, 32, 16, Epilogue::kStore, Activation::kGeluErf},
    {7, 48, 64, 80, 50, Epilogue::kBias, Activation::kGeluErf},
    {130, 96, 64, 64, 200, Epilogue::kBiasAct, Activation::kGeluErf},
    {33, 96, 64, 64, 96, Epilogue::kBiasAct, Activation::kGeluTanh},
    {33, 96, 64, 64, 96, Epilogue::kBiasAct, Activation::kRelu},
    {33, 96, 64, 64, 96, Epilogue::kBiasAct, Activation::kSilu},
    {300, 64, 160, 160, 64, Epilogue::kAccumulate, Activation::kGeluErf},
};

TEST(OneDnnGemm, Float32MatchesDoubleForEveryEpilogue) {
  for (const Case& c : kCases) check(c, false);
}

TEST(OneDnnGemm, Bfloat16MatchesDoubleOnRoundedInputs) {
  if (!cpu_gemm_info().has_bf16) {
    GTEST_SKIP() << "oneDNN finds " << cpu_gemm_info().isa
                 << " here: no AVX512_BF16 or AMX for bfloat16 GEMMs";
  }
  for (const Case& c : kCases) check(c, true);
}

TEST(OneDnnGemm, OnePrimitiveServesEveryRowCount) {
  // The same primitive (created once) for m = 1 .. 300 rows, as the engine's pieces vary.
  const int64_t n = 40, k = 24;
  const auto w = random_values(size_t(n * k), 9);
  const CpuMatmul mm({n, k, k, n, Epilogue::kStore, Activation::kGeluErf, false});
  for (int64_t m : {1, 2, 31, 300}) {
    const auto a = random_values(size_t(m * k), uint32_t(m));
    std::vector<float> out(size_t(m * n));
    mm.run(m, a.data(), w.data(), nullptr, out.data());
    for (int64_t i = 0; i < m; i += 7) {
      for (int64_t j = 0; j < n; ++j) {
        double want = 0;
        for (int64_t p = 0; p < k; ++p) want += double(a[size_t(i * k + p)]) * w[size_t(j * k + p)];
        EXPECT_NEAR(out[size_t(i * n + j)], want, 1e-4) << m << " rows";
      }
    }
  }
}

std::string cpuinfo_flags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) == 0) return line + " ";
  }
  return "";
}

TEST(OneDnnGemm, ReportsTheInstructionSetOfThisCpu) {
  const CpuGemmInfo& info = cpu_gemm_info();
  EXPECT_THAT(info.version, ::testing::MatchesRegex("[23]\\.[0-9]+\\.[0-9]+"));
  const std::string flags = cpuinfo_flags();
  if (flags.empty() || std::getenv("ONEDNN_MAX_CPU_ISA") != nullptr) {
    GTEST_SKIP() << "no /proc/cpuinfo flags, or ONEDNN_MAX_CPU_ISA set: oneDNN reports "
                 << info.isa;
  }
  const bool avx512 = flags.find(" avx512f ") != std::string::npos &&
                      flags.find(" avx512bw ") != std::string::npos &&
                      flags.find(" avx512vl ") != std::string::npos &&
                      flags.find(" avx512dq ") != std::string::npos;
  const bool bf16 = avx512 && flags.find(" avx512_bf16 ") != std::string::npos;
  const bool amx = flags.find(" amx_bf16 ") != std::string::npos;
  if (avx512) {
    EXPECT_THAT(info.isa, HasSubstr("avx512_core"));
  } else if (flags.find(" avx2 ") != std::string::npos) {
    EXPECT_THAT(info.isa, HasSubstr("avx2"));
  }
  EXPECT_EQ(info.has_bf16, bf16 || amx) << "flags say avx512_bf16 " << bf16 << ", amx_bf16 " << amx;
}

TEST(OneDnnGemm, SelfCheckVerdict) {
  EXPECT_EQ(gemm_floor_gflops("avx512_core_bf16"), 40.0);
  EXPECT_EQ(gemm_floor_gflops("avx512_core"), 40.0);
  EXPECT_EQ(gemm_floor_gflops("avx2"), 25.0);
  EXPECT_EQ(gemm_floor_gflops("sse41"), 4.0);

  GemmSelfCheck slow;
  slow.gflops = 17.4;  // OpenBLAS's Prescott kernels on an AVX-512 Xeon, as measured
  slow.isa = "avx512_core";
  slow.floor_gflops = gemm_floor_gflops(slow.isa);
  slow.implementation = "gemm:jit";
  EXPECT_TRUE(slow.below_floor());
  EXPECT_THAT(slow.message(), HasSubstr("17.4 GFLOP/s"));
  EXPECT_THAT(slow.message(), HasSubstr("below the floor"));
  EXPECT_THAT(slow.message(), HasSubstr("ONEDNN_MAX_CPU_ISA"));

  GemmSelfCheck fine = slow;
  fine.gflops = 95.0;
  EXPECT_FALSE(fine.below_floor());
  EXPECT_THAT(fine.message(), Not(HasSubstr("below the floor")));
}

TEST(OneDnnGemm, SelfCheckRunsOnThisCpu) {
  const GemmSelfCheck check = gemm_self_check();
  EXPECT_GT(check.gflops, 0.0);
  EXPECT_EQ(check.isa, cpu_gemm_info().isa);
  EXPECT_EQ(check.floor_gflops, gemm_floor_gflops(check.isa));
  EXPECT_FALSE(check.implementation.empty());
  EXPECT_THAT(check.message(), HasSubstr("GEMM self-check"));
}

// The bfloat16 path (PackedMatmul): packed weights, one fixed-M primitive per power-of-two
// row count, bfloat16 A and C. Checked against double over the bfloat16-rounded inputs, with
// C rounded to bfloat16 at the end; every row count through split(). float32 shapes and the
// emulated bfloat16 (float32 primitives) run on every CPU; hardware bfloat16 where oneDNN
// has it.
enum class PackedKind { kFloat32, kBfloat16Emulated, kBfloat16 };

void check_packed(const Case& c, PackedKind kind) {
  const bool bf16 = kind != PackedKind::kFloat32;
  const auto a = random_values(size_t(c.m * c.lda), 11 + uint32_t(c.m), 0.5f);
  const auto w = random_values(size_t(c.n * c.k), 12 + uint32_t(c.n), 0.1f);
  const auto bias = random_values(size_t(c.n), 13);
  const auto c0 = random_values(size_t(c.m * c.ldc), 14);
  auto in = [&](float x) {
    return bf16 ? double(bfloat16_to_float(float_to_bfloat16(x))) : double(x);
  };

  const PackedMatmul mm(
      {c.n, c.k, c.lda, c.ldc, c.epilogue, c.act, bf16, kind == PackedKind::kBfloat16Emulated});
  const PackedMatmul::Weights packed = mm.pack(w.data());
  EXPECT_GE(packed.bytes(), size_t(c.n * c.k) * (bf16 ? 2 : 4));
  std::vector<std::pair<int64_t, int64_t>> pieces;
  PackedMatmul::split(c.m, 64, pieces);
  std::vector<float> out;  // C as float, read back from its dtype
  if (bf16) {
    std::vector<uint16_t> a16(a.size()), c16(c0.size());
    for (size_t i = 0; i < a.size(); ++i) a16[i] = float_to_bfloat16(a[i]);
    for (size_t i = 0; i < c0.size(); ++i) c16[i] = float_to_bfloat16(c0[i]);
    for (const auto& [r0, m] : pieces)
      mm.run(m, a16.data() + r0 * c.lda, packed, bias.data(), c16.data() + r0 * c.ldc);
    for (uint16_t v : c16) out.push_back(bfloat16_to_float(v));
  } else {
    out = c0;
    for (const auto& [r0, m] : pieces)
      mm.run(m, a.data() + r0 * c.lda, packed, bias.data(), out.data() + r0 * c.ldc);
  }
  double worst = 0;
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < c.n; ++j) {
      const double want = expected(c, i, j, a, w, bias, c0, in, in);
      const double got = out[size_t(i * c.ldc + j)];
      worst = std::max(worst, std::abs(got - want) / std::max(1.0, std::abs(want)));
    }
    for (int64_t j = c.n; j < c.ldc; ++j) {
      ASSERT_EQ(out[size_t(i * c.ldc + j)], float(in(c0[size_t(i * c.ldc + j)])))
          << "column " << j << " past n";
    }
  }
  // bfloat16 C: one rounding of the result (2^-8 relative) on top of float32 accumulation.
  EXPECT_LE(worst, bf16 ? 4.5e-3 : 2e-5)
      << "m " << c.m << " n " << c.n << " k " << c.k << " epilogue " << int(c.epilogue) << " act "
      << int(c.act) << " kind " << int(kind);
  if (kind != PackedKind::kBfloat16Emulated) {
    EXPECT_FALSE(mm.implementation().empty());
  }
}

TEST(PackedMatmul, Float32MatchesDoubleForEveryEpilogueAndRowCount) {
  for (const Case& c : kCases) check_packed(c, PackedKind::kFloat32);
}

TEST(PackedMatmul, EmulatedBfloat16MatchesDoubleOnRoundedInputs) {
  for (const Case& c : kCases) check_packed(c, PackedKind::kBfloat16Emulated);
}

TEST(PackedMatmul, Bfloat16MatchesDoubleOnRoundedInputs) {
  if (!cpu_gemm_info().has_bf16) {
    GTEST_SKIP() << "oneDNN finds " << cpu_gemm_info().isa
                 << " here: no AVX512_BF16 or AMX for bfloat16 GEMMs "
                 << "(the emulated bfloat16 test ran the same storage and rounding)";
  }
  for (const Case& c : kCases) check_packed(c, PackedKind::kBfloat16);
  // base-long's sites, strided views included: the 256-row kernel is oneDNN's brgemm (AMX
  // where the CPU has it), and no row count falls to a reference kernel.
  const int64_t qks = 1552;
  const PackedMatmul::Shape sites[] = {
      {qks, 768, 768, qks, Epilogue::kBias, Activation::kGeluErf, true, false},        // Q|K|s
      {768, 768, qks, qks, Epilogue::kAccumulate, Activation::kGeluErf, true, false},  // transform
      {768, 768, qks, 768, Epilogue::kStore, Activation::kGeluErf, true,
       false},  // attention output
      {3072, 768, 768, 3072, Epilogue::kBiasAct, Activation::kGeluErf, true, false},  // ffn in
      {768, 3072, 3072, 768, Epilogue::kStore, Activation::kGeluErf, true, false},    // ffn out
  };
  for (const auto& shape : sites) {
    const PackedMatmul mm(shape);
    const std::string kernel = mm.implementation();
    const std::string main = kernel.substr(0, kernel.find(';'));
    EXPECT_THAT(main, HasSubstr(cpu_gemm_info().has_amx ? "amx" : "brg"))
        << shape.n << " x " << shape.k;
    EXPECT_THAT(kernel, Not(HasSubstr("ref"))) << shape.n << " x " << shape.k << ": " << kernel;
  }
}

// Pool threads share a primitive (each call brings its own scratchpad): four threads run the
// same row count at once, over and over, and every result equals the one-thread result.
TEST(PackedMatmul, ThreadsShareAPrimitive) {
  for (const bool bf16 : {false, true}) {
    if (bf16 && !cpu_gemm_info().has_bf16) continue;
    const int64_t n = 96, k = 128, m = 64;
    const PackedMatmul mm({n, k, k, n, Epilogue::kBiasAct, Activation::kGeluErf, bf16, false});
    const auto w = random_values(size_t(n * k), 21, 0.1f), bias = random_values(size_t(n), 22);
    const auto packed = mm.pack(w.data());
    const size_t element = bf16 ? 2 : 4;
    std::vector<std::vector<std::byte>> a(4), c(4);
    for (int t = 0; t < 4; ++t) {
      const auto values = random_values(size_t(m * k), 30 + uint32_t(t), 0.5f);
      a[size_t(t)].resize(values.size() * element);
      for (size_t i = 0; i < values.size(); ++i) {
        if (bf16) {
          const uint16_t v = float_to_bfloat16(values[i]);
          std::memcpy(&a[size_t(t)][i * 2], &v, 2);
        } else {
          std::memcpy(&a[size_t(t)][i * 4], &values[i], 4);
        }
      }
      c[size_t(t)].resize(size_t(m * n) * element);
    }
    std::vector<std::vector<std::byte>> want = c;
    for (int t = 0; t < 4; ++t)
      mm.run(m, a[size_t(t)].data(), packed, bias.data(), want[size_t(t)].data());
    std::vector<std::thread> threads;
    std::atomic<int> mismatches{0};
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        std::vector<std::byte> out(size_t(m * n) * element);
        for (int rep = 0; rep < 50; ++rep) {
          mm.run(m, a[size_t(t)].data(), packed, bias.data(), out.data());
          if (out != want[size_t(t)]) mismatches.fetch_add(1);
        }
      });
    }
    for (auto& thread : threads) thread.join();
    EXPECT_EQ(mismatches.load(), 0) << (bf16 ? "bfloat16" : "float32");
  }
}

TEST(PackedMatmul, SplitCoversEveryRowOnceInPrimitiveSizes) {
  std::vector<std::pair<int64_t, int64_t>> pieces;
  PackedMatmul::split(0, 256, pieces);
  EXPECT_TRUE(pieces.empty());
  PackedMatmul::split(600, 256, pieces);  // 256 + 256 + 64 + 16 + 8
  const std::vector<std::pair<int64_t, int64_t>> want{
      {0, 256}, {256, 256}, {512, 64}, {576, 16}, {592, 8}};
  EXPECT_EQ(pieces, want);
  for (int64_t rows : {1, 2, 15, 16, 17, 255, 256, 257, 1000, 4097}) {
    for (int64_t block : {16, 64, 256}) {
      PackedMatmul::split(rows, block, pieces);
      int64_t next = 0;
      for (const auto& [r0, m] : pieces) {
        EXPECT_EQ(r0, next);
        EXPECT_TRUE(m > 0 && m <= block && (m & (m - 1)) == 0) << m;
        next += m;
      }
      EXPECT_EQ(next, rows);
    }
  }
}

TEST(PackedMatmul, RefusesRowCountsWithoutAPrimitive) {
  const PackedMatmul mm({16, 16, 16, 16, Epilogue::kStore, Activation::kGeluErf, false, false});
  const std::vector<float> w(256, 0.5f), a(16 * 300, 1.0f);
  std::vector<float> c(16 * 300);
  const auto packed = mm.pack(w.data());
  EXPECT_THROW(mm.run(3, a.data(), packed, nullptr, c.data()), EngineError);
  EXPECT_THROW(mm.run(512, a.data(), packed, nullptr, c.data()), EngineError);
  mm.run(4, a.data(), packed, nullptr, c.data());
  EXPECT_FLOAT_EQ(c[0], 8.0f);  // 16 products of 1 x 0.5
}

TEST(Bfloat16Rows, MatchTheScalarRoundingBitForBit) {
  std::vector<float> values = {0.0f,
                               -0.0f,
                               1.0f,
                               1.00390625f,
                               1.01171875f,
                               3.14159f,
                               -2.5e-39f,
                               1e-45f,
                               3.4e38f,
                               -3.4e38f,
                               std::numeric_limits<float>::infinity(),
                               -std::numeric_limits<float>::infinity(),
                               std::numeric_limits<float>::quiet_NaN()};
  for (uint32_t bits = 0x3f800000u; bits < 0x3f800000u + 70000u; bits += 7)
    values.push_back(std::bit_cast<float>(bits));
  std::vector<uint16_t> rounded(values.size());
  float_to_bfloat16_row(values.data(), rounded.data(), int64_t(values.size()));
  std::vector<float> widened(values.size());
  bfloat16_to_float_row(rounded.data(), widened.data(), int64_t(values.size()));
  for (size_t i = 0; i < values.size(); ++i) {
    ASSERT_EQ(rounded[i], float_to_bfloat16(values[i])) << values[i];
    ASSERT_EQ(std::bit_cast<uint32_t>(widened[i]),
              std::bit_cast<uint32_t>(bfloat16_to_float(rounded[i])));
  }
}

TEST(OneDnnGemm, Bfloat16SelfCheckSaysWhatItRanOn) {
  const Bf16SelfCheck check = bf16_self_check();
  EXPECT_EQ(check.ran, cpu_gemm_info().has_bf16);
  EXPECT_THAT(check.message(), HasSubstr(bf16_hardware(cpu_gemm_info().isa)));
  if (!check.ran) {
    EXPECT_THAT(check.message(), HasSubstr("not run"));
    EXPECT_THAT(bf16_hardware("avx2"), HasSubstr("no AVX512_BF16 or AMX"));
    return;
  }
  EXPECT_GT(check.gflops, 0.0);
  EXPECT_EQ(check.floor_gflops, bf16_floor_gflops(cpu_gemm_info().isa));
  EXPECT_THAT(check.message(), HasSubstr("M fixed, packed weights"));
}

TEST(OneDnnGemm, ProbeTimesAFixedShape) {
  std::string kernel;
  const double gflops =
      probe_gflops({256, 256, 256, 256, Epilogue::kBias, Activation::kGeluErf, false, false}, 512,
                   1, 0.05, &kernel);
  EXPECT_GT(gflops, 1.0);
  EXPECT_FALSE(kernel.empty());
}

}  // namespace
}  // namespace fastformer::engine
