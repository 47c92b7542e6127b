#include "runtime/support/Bytes.h"

#include <limits>

#include "gtest/gtest.h"

namespace hcp {
namespace {

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
