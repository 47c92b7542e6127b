// Number, size and duration formatting.
#include "runtime/support/Format.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"

namespace hcp {
namespace {

TEST(Format, Count) {
  EXPECT_EQ(FormatCount(0), "0");
  EXPECT_EQ(FormatCount(999), "999");
  EXPECT_EQ(FormatCount(1000), "1,000");
  EXPECT_EQ(FormatCount(16388), "16,388");
  EXPECT_EQ(FormatCount(1234567), "1,234,567");
  EXPECT_EQ(FormatCount(-1234), "-1,234");
  EXPECT_EQ(FormatCount(std::numeric_limits<int64_t>::min()), "-9,223,372,036,854,775,808");
}

TEST(Format, Bytes) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(1023), "1023 B");
  EXPECT_EQ(FormatBytes(1536), "1.50 KiB");
  EXPECT_EQ(FormatBytes(uint64_t{3} << 30), "3.00 GiB");
  EXPECT_EQ(FormatBytes(uint64_t{5} << 50), "5120.00 TiB");  // TiB is the largest unit
}

TEST(Format, Duration) {
  EXPECT_EQ(FormatDuration(0), "0:00:00");
  EXPECT_EQ(FormatDuration(83), "0:01:23");
  EXPECT_EQ(FormatDuration(59.6), "0:01:00");
  EXPECT_EQ(FormatDuration(3600), "1:00:00");
  EXPECT_EQ(FormatDuration(90061), "25:01:01");
  EXPECT_EQ(FormatDuration(-1), "-:--:--");
  EXPECT_EQ(FormatDuration(std::nan("")), "-:--:--");
  EXPECT_EQ(FormatDuration(std::numeric_limits<double>::infinity()), "-:--:--");
}

TEST(FormatGiB, TwoDecimalsWhateverTheSize) {
  EXPECT_EQ(FormatGiB(0), "0.00 GiB");
  EXPECT_EQ(FormatGiB(uint64_t{1} << 20), "0.00 GiB");
  EXPECT_EQ(FormatGiB(uint64_t{3} << 30), "3.00 GiB");
  EXPECT_EQ(FormatGiB((uint64_t{3} << 30) + (uint64_t{1} << 29)), "3.50 GiB");
  EXPECT_EQ(FormatGiB(uint64_t{1} << 60), "1073741824.00 GiB");
  EXPECT_EQ(FormatGiB(std::numeric_limits<uint64_t>::max()), "17179869184.00 GiB");
}

}  // namespace
}  // namespace hcp
