// float16 / bfloat16 conversions against hand-computed bit patterns, exhaustive round trips,
// and independent round-to-nearest-even oracles.
#include "common/half.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

namespace fastformer {
namespace {

float from_bits(uint32_t bits) { return std::bit_cast<float>(bits); }
uint32_t bits_of(float f) { return std::bit_cast<uint32_t>(f); }

bool half_is_nan(uint16_t h) { return (h & 0x7C00u) == 0x7C00u && (h & 0x03FFu) != 0; }
bool bf16_is_nan(uint16_t b) { return (b & 0x7F80u) == 0x7F80u && (b & 0x007Fu) != 0; }

TEST(HalfTest, FloatToHalfBitPatterns) {
  EXPECT_EQ(float_to_half(1.0f), 0x3C00);
  EXPECT_EQ(float_to_half(-2.0f), 0xC000);
  EXPECT_EQ(float_to_half(0.5f), 0x3800);
  EXPECT_EQ(float_to_half(0.0f), 0x0000);
  EXPECT_EQ(float_to_half(-0.0f), 0x8000);
  EXPECT_EQ(float_to_half(65504.0f), 0x7BFF);  // largest finite half
  EXPECT_EQ(float_to_half(-65504.0f), 0xFBFF);
  EXPECT_EQ(float_to_half(65520.0f), 0x7C00);  // halfway to 65536: ties to even = Inf
  EXPECT_EQ(float_to_half(-65520.0f), 0xFC00);
  EXPECT_EQ(float_to_half(std::nextafter(65520.0f, 0.0f)), 0x7BFF);  // just below the tie
  EXPECT_EQ(float_to_half(1e10f), 0x7C00);
  EXPECT_EQ(float_to_half(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(float_to_half(-std::numeric_limits<float>::infinity()), 0xFC00);
  EXPECT_EQ(float_to_half(0.1f), 0x2E66);
  EXPECT_EQ(float_to_half(1.0f / 3.0f), 0x3555);
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -14)), 0x0400);            // smallest normal
  EXPECT_EQ(float_to_half(1023.0f * std::ldexp(1.0f, -24)), 0x03FF);  // largest subnormal
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -24)), 0x0001);            // smallest subnormal
  EXPECT_EQ(float_to_half(-std::ldexp(1.0f, -24)), 0x8001);
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -25)), 0x0000);  // tie between 0 and 2^-24: even
  EXPECT_EQ(float_to_half(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(float_to_half(3.0f * std::ldexp(1.0f, -25)), 0x0002);  // tie between 1 and 2: even
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -30)), 0x0000);         // underflows to zero
  EXPECT_EQ(float_to_half(from_bits(0x00000001)), 0x0000);         // float subnormal
  // Normal-range ties: 1 + 2^-11 lies between 0x3C00 and 0x3C01 (even: 0x3C00);
  // 1 + 3*2^-11 between 0x3C01 and 0x3C02 (even: 0x3C02).
  EXPECT_EQ(float_to_half(1.0f + std::ldexp(1.0f, -11)), 0x3C00);
  EXPECT_EQ(float_to_half(1.0f + 3.0f * std::ldexp(1.0f, -11)), 0x3C02);
  EXPECT_EQ(float_to_half(std::nextafter(1.0f + std::ldexp(1.0f, -11), 2.0f)), 0x3C01);
  // Rounding that carries into the exponent: 2 - 2^-11 is the tie between 0x3FFF (odd) and
  // 0x4000 = 2.0 (even).
  EXPECT_EQ(float_to_half(2.0f - std::ldexp(1.0f, -11)), 0x4000);
  EXPECT_EQ(float_to_half(std::nextafter(2.0f - std::ldexp(1.0f, -11), 0.0f)), 0x3FFF);
  // Subnormal rounding that carries into the smallest normal.
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -14) - std::ldexp(1.0f, -26)), 0x0400);
}

TEST(HalfTest, HalfToFloatBitPatterns) {
  EXPECT_EQ(half_to_float(0x3C00), 1.0f);
  EXPECT_EQ(half_to_float(0xC000), -2.0f);
  EXPECT_EQ(half_to_float(0x7BFF), 65504.0f);
  EXPECT_EQ(half_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(half_to_float(0x03FF), 1023.0f * std::ldexp(1.0f, -24));
  EXPECT_EQ(half_to_float(0x0400), std::ldexp(1.0f, -14));
  EXPECT_EQ(half_to_float(0x3555), 0.333251953125f);
  EXPECT_EQ(half_to_float(0x2E66), 0.0999755859375f);
  EXPECT_EQ(bits_of(half_to_float(0x0000)), 0x00000000u);
  EXPECT_EQ(bits_of(half_to_float(0x8000)), 0x80000000u);  // -0.0
  EXPECT_EQ(half_to_float(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(half_to_float(0xFC00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(half_to_float(0x7E00)));
  EXPECT_TRUE(std::isnan(half_to_float(0x7C01)));  // signalling NaN stays NaN
  EXPECT_TRUE(std::isnan(half_to_float(0xFFFF)));
}

TEST(HalfTest, NanStaysNan) {
  const float nans[] = {std::numeric_limits<float>::quiet_NaN(),
                        -std::numeric_limits<float>::quiet_NaN(),
                        from_bits(0x7F800001u),  // signalling, payload only in the low bits
                        from_bits(0xFF800001u),
                        from_bits(0x7FFFFFFFu),
                        from_bits(0x7F802000u)};
  for (float nan : nans) {
    EXPECT_TRUE(half_is_nan(float_to_half(nan))) << std::hex << bits_of(nan);
    EXPECT_TRUE(bf16_is_nan(float_to_bfloat16(nan))) << std::hex << bits_of(nan);
    EXPECT_TRUE(std::isnan(half_to_float(float_to_half(nan))));
    EXPECT_TRUE(std::isnan(bfloat16_to_float(float_to_bfloat16(nan))));
  }
}

TEST(HalfTest, EveryHalfRoundTrips) {
  int checked = 0;
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const auto bits = static_cast<uint16_t>(h);
    if (half_is_nan(bits)) continue;
    const float f = half_to_float(bits);
    ASSERT_EQ(float_to_half(f), bits) << std::hex << "half 0x" << h << " -> " << f;
    ++checked;
  }
  EXPECT_EQ(checked, 65536 - 2 * 1023);
}

TEST(HalfTest, EveryHalfIsExactInFloat) {
  // half_to_float agrees with the value the bit pattern denotes, computed in double.
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const int exponent = static_cast<int>((h >> 10) & 0x1F);
    const int mantissa = static_cast<int>(h & 0x3FF);
    if (exponent == 0x1F) continue;
    const double magnitude = exponent == 0 ? std::ldexp(double(mantissa), -24)
                                           : std::ldexp(1.0 + mantissa / 1024.0, exponent - 15);
    const double value = (h & 0x8000) ? -magnitude : magnitude;
    ASSERT_EQ(double(half_to_float(static_cast<uint16_t>(h))), value) << std::hex << h;
  }
}

#ifdef __FLT16_MAX__
TEST(HalfTest, FloatToHalfMatchesCompilerFloat16) {
  // The compiler's _Float16 conversion rounds to nearest even (IEEE 754): an oracle.
  auto check = [](uint32_t bits) {
    const float f = from_bits(bits);
    if (std::isnan(f)) return;
    const auto want = std::bit_cast<uint16_t>(static_cast<_Float16>(f));
    ASSERT_EQ(float_to_half(f), want) << std::hex << "float bits 0x" << bits;
  };
  std::mt19937 rng(7);
  for (int i = 0; i < 1'000'000; ++i) {
    uint32_t bits = rng();
    // Concentrate on the exponents that matter (subnormal to overflow), both signs.
    if (i % 2 == 0) bits = (bits & 0x807FFFFFu) | ((uint32_t(rng() % 40) + 100u) << 23);
    check(bits);
  }
  // Every float near each half tie point around 1.0 and the subnormal boundary.
  for (uint32_t base : {0x3F800000u, 0x38800000u, 0x33800000u, 0x477FE000u}) {
    for (uint32_t d = 0; d < 0x4000; ++d) {
      check(base + d);
      check(base - d);
    }
  }
}
#endif

TEST(HalfTest, Bfloat16BitPatterns) {
  EXPECT_EQ(float_to_bfloat16(1.0f), 0x3F80);
  EXPECT_EQ(float_to_bfloat16(-2.0f), 0xC000);
  EXPECT_EQ(float_to_bfloat16(0.0f), 0x0000);
  EXPECT_EQ(float_to_bfloat16(-0.0f), 0x8000);
  // Round to nearest even on the 16 dropped bits.
  EXPECT_EQ(float_to_bfloat16(from_bits(0x3F808000u)), 0x3F80);  // tie, 0x3F80 is even
  EXPECT_EQ(float_to_bfloat16(from_bits(0x3F818000u)), 0x3F82);  // tie, 0x3F81 is odd
  EXPECT_EQ(float_to_bfloat16(from_bits(0x3F808001u)), 0x3F81);  // just above the tie
  EXPECT_EQ(float_to_bfloat16(from_bits(0x3F807FFFu)), 0x3F80);  // just below
  EXPECT_EQ(float_to_bfloat16(from_bits(0xBF818000u)), 0xBF82);  // negative tie
  EXPECT_EQ(float_to_bfloat16(from_bits(0x3F80FFFFu)), 0x3F81);
  EXPECT_EQ(float_to_bfloat16(from_bits(0x3FFF8000u)), 0x4000);  // carries into the exponent
  EXPECT_EQ(float_to_bfloat16(std::numeric_limits<float>::max()), 0x7F80);  // rounds to Inf
  EXPECT_EQ(float_to_bfloat16(from_bits(0x7F7F7FFFu)), 0x7F7F);
  EXPECT_EQ(float_to_bfloat16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(float_to_bfloat16(-std::numeric_limits<float>::infinity()), 0xFF80);
  EXPECT_EQ(float_to_bfloat16(from_bits(0x00010000u)), 0x0001);  // subnormal kept
  EXPECT_EQ(float_to_bfloat16(from_bits(0x00008000u)), 0x0000);  // subnormal tie to even
  EXPECT_EQ(float_to_bfloat16(0.1f), 0x3DCD);
  EXPECT_EQ(float_to_bfloat16(1.0f / 3.0f), 0x3EAB);

  EXPECT_EQ(bfloat16_to_float(0x3F80), 1.0f);
  EXPECT_EQ(bfloat16_to_float(0xC000), -2.0f);
  EXPECT_EQ(bfloat16_to_float(0x3EAB), 0.333984375f);
  EXPECT_EQ(bfloat16_to_float(0x0001), std::ldexp(1.0f, -133));
  EXPECT_EQ(bits_of(bfloat16_to_float(0x8000)), 0x80000000u);
  EXPECT_EQ(bfloat16_to_float(0x7F80), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(bfloat16_to_float(0x7FC0)));
}

TEST(HalfTest, EveryBfloat16RoundTrips) {
  int checked = 0;
  for (uint32_t b = 0; b <= 0xFFFF; ++b) {
    const auto bits = static_cast<uint16_t>(b);
    if (bf16_is_nan(bits)) continue;
    ASSERT_EQ(float_to_bfloat16(bfloat16_to_float(bits)), bits) << std::hex << b;
    ++checked;
  }
  EXPECT_EQ(checked, 65536 - 2 * 127);
}

TEST(HalfTest, Bfloat16MatchesNearestEvenOracle) {
  // Oracle in double: the two bfloat16 neighbours of f and which is nearer (ties: even).
  auto oracle = [](uint32_t x) -> uint16_t {
    const uint32_t sign = x & 0x80000000u;
    const uint32_t abs = x & 0x7FFFFFFFu;
    const uint32_t lo = abs >> 16;
    const double v = double(from_bits(abs));
    const double lo_v = double(from_bits(lo << 16));
    const double hi_v = lo + 1 == 0x7F80 ? std::ldexp(1.0, 128) : double(from_bits((lo + 1) << 16));
    uint32_t r;
    if (v - lo_v < hi_v - v)
      r = lo;
    else if (v - lo_v > hi_v - v)
      r = lo + 1;
    else
      r = (lo & 1) ? lo + 1 : lo;
    return static_cast<uint16_t>((sign >> 16) | r);
  };
  std::mt19937 rng(11);
  for (int i = 0; i < 1'000'000; ++i) {
    uint32_t x = rng();
    if (i % 4 == 0) x = (x & 0xFFFF0000u) | 0x8000u;  // exact ties
    if ((x & 0x7FFFFFFFu) >= 0x7F800000u) continue;   // Inf / NaN covered above
    ASSERT_EQ(float_to_bfloat16(from_bits(x)), oracle(x)) << std::hex << "float bits 0x" << x;
  }
}

}  // namespace
}  // namespace fastformer
