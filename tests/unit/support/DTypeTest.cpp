// Element types and the exact 16-bit float conversions.
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "gtest/gtest.h"
#include "runtime/support/DType.h"

namespace hcp {
namespace {

float FromBits(uint32_t bits) { return std::bit_cast<float>(bits); }

TEST(DType, NamesSizesAndParsing) {
  for (DType dtype : {DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64}) {
    absl::StatusOr<DType> parsed = ParseSafetensorsDType(SafetensorsName(dtype));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, dtype);
  }
  EXPECT_EQ(DTypeSize(DType::BF16), 2);
  EXPECT_EQ(DTypeSize(DType::I64), 8);
  EXPECT_EQ(SafetensorsName(DType::BF16), "BF16");
  absl::StatusOr<DType> bad = ParseSafetensorsDType("F64");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("F64"), std::string_view::npos) << bad.status();
  EXPECT_FALSE(ParseSafetensorsDType("f32").ok());  // the format is case-sensitive
}

// Every bf16 value survives bf16 -> f32 -> bf16 bit for bit; NaNs stay NaN.
TEST(DType, Bf16RoundTripsEveryValue) {
  for (uint32_t bits = 0; bits <= 0xFFFF; ++bits) {
    float f = Bf16ToF32(static_cast<uint16_t>(bits));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(Bf16ToF32(F32ToBf16(f)))) << bits;
    } else {
      EXPECT_EQ(F32ToBf16(f), bits);
    }
  }
}

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(F32ToBf16(1.0f), 0x3F80);
  EXPECT_EQ(F32ToBf16(1.0f + 0x1p-8f), 0x3F80);             // tie, 0x3F80 even: down
  EXPECT_EQ(F32ToBf16(1.0f + 3 * 0x1p-8f), 0x3F82);         // tie, 0x3F81 odd: up
  EXPECT_EQ(F32ToBf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3F81);  // just above the tie: up
  EXPECT_EQ(F32ToBf16(-1.0f - 0x1p-8f), 0xBF80);            // sign symmetric
  EXPECT_EQ(F32ToBf16(-0.0f), 0x8000);
  EXPECT_EQ(F32ToBf16(std::numeric_limits<float>::max()), 0x7F80);  // overflows to inf
  EXPECT_EQ(F32ToBf16(-std::numeric_limits<float>::infinity()), 0xFF80);
  EXPECT_EQ(F32ToBf16(FromBits(0x00010000)), 0x0001);  // subnormals kept
  // A NaN whose payload is only in the low half must not turn into inf.
  EXPECT_TRUE(std::isnan(Bf16ToF32(F32ToBf16(FromBits(0x7F800001)))));
  EXPECT_EQ(F32ToBf16(FromBits(0xFFC00000)), 0xFFC0);
}

TEST(DType, F16KnownValues) {
  EXPECT_EQ(F32ToF16(1.0f), 0x3C00);
  EXPECT_EQ(F32ToF16(-2.0f), 0xC000);
  EXPECT_EQ(F32ToF16(65504.0f), 0x7BFF);  // largest half
  EXPECT_EQ(F32ToF16(65519.99f), 0x7BFF);
  EXPECT_EQ(F32ToF16(65520.0f), 0x7C00);  // tie between 65504 and 65536: inf
  EXPECT_EQ(F32ToF16(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(F32ToF16(0x1p-14f), 0x0400);  // smallest normal
  EXPECT_EQ(F32ToF16(0x1p-24f), 0x0001);  // smallest subnormal
  EXPECT_EQ(F32ToF16(0x1p-25f), 0x0000);  // tie with zero: even (zero)
  EXPECT_EQ(F32ToF16(-0x1p-25f), 0x8000);
  EXPECT_EQ(F32ToF16(FromBits(0x33000001)), 0x0001);  // just above that tie
  EXPECT_EQ(F32ToF16(3 * 0x1p-25f), 0x0002);          // 1.5 units: tie to even (2)
  EXPECT_EQ(F32ToF16(5 * 0x1p-25f), 0x0002);          // 2.5 units: tie to even (2)
  EXPECT_EQ(F32ToF16(1023 * 0x1p-24f), 0x03FF);       // largest subnormal
  EXPECT_EQ(F32ToF16(1.0f + 0x1p-11f), 0x3C00);       // tie: down to even
  EXPECT_EQ(F32ToF16(1.0f + 3 * 0x1p-11f), 0x3C02);   // tie: up to even
  EXPECT_EQ(F16ToF32(0x0001), 0x1p-24f);
  EXPECT_EQ(F16ToF32(0x03FF), 1023 * 0x1p-24f);
  EXPECT_EQ(F16ToF32(0x8000), 0.0f);
  EXPECT_TRUE(std::signbit(F16ToF32(0x8000)));
  EXPECT_EQ(F16ToF32(0xFC00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(F16ToF32(0x7E00)));
  EXPECT_TRUE(std::isnan(F16ToF32(F32ToF16(std::nanf("")))));
  EXPECT_TRUE(std::isnan(F16ToF32(F32ToF16(FromBits(0x7F800001)))));  // low-bit payload
}

TEST(DType, F16RoundTripsEveryValue) {
  for (uint32_t bits = 0; bits <= 0xFFFF; ++bits) {
    float f = F16ToF32(static_cast<uint16_t>(bits));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(F16ToF32(F32ToF16(f)))) << bits;
    } else {
      EXPECT_EQ(F32ToF16(f), bits);
    }
  }
}

#if defined(__FLT16_MAX__)
// Against the compiler's own _Float16 conversion (IEEE round to nearest even), over random
// bit patterns weighted towards the half range, and over every f32 between two halves' worth
// of exponents near the subnormal boundary.
TEST(DType, F16MatchesCompilerConversion) {
  auto check = [](uint32_t bits) {
    float f = FromBits(bits);
    if (std::isnan(f)) return;
    _Float16 h = static_cast<_Float16>(f);
    uint16_t expected;
    std::memcpy(&expected, &h, 2);
    ASSERT_EQ(F32ToF16(f), expected) << std::hexfloat << f;
  };
  std::mt19937_64 rng(7);
  for (int i = 0; i < 2'000'000; ++i) {
    uint32_t bits = static_cast<uint32_t>(rng());
    // Mostly exponents 100..145, where halves live; some anywhere.
    if (i % 4 != 0) bits = (bits & 0x807FFFFFu) | ((100u + (bits >> 23) % 46u) << 23);
    check(bits);
  }
  for (uint32_t bits = 0x33000000u; bits < 0x39000000u; bits += 97) check(bits);
}
#endif

}  // namespace
}  // namespace hcp
