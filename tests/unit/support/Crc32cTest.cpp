#include "runtime/support/Crc32c.h"

#include <string>

#include "gtest/gtest.h"

namespace hcp {
namespace {

std::string Bytes(std::initializer_list<int> values) {
  std::string out;
  for (int v : values) out.push_back(static_cast<char>(v));
  return out;
}

TEST(Crc32c, CheckValue) {
  // The catalogue's check value for CRC-32C (CRC-32/ISCSI).
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(Crc32c(""), 0u);
}

TEST(Crc32c, Rfc3720Vectors) {
  // RFC 3720, B.4: 32 bytes of zeros, of ones, ascending and descending.
  std::string ascending, descending;
  for (int i = 0; i < 32; ++i) {
    ascending.push_back(static_cast<char>(i));
    descending.push_back(static_cast<char>(31 - i));
  }
  EXPECT_EQ(Crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(std::string(32, '\xFF')), 0x62A8AB43u);
  EXPECT_EQ(Crc32c(ascending), 0x46DD794Eu);
  EXPECT_EQ(Crc32c(descending), 0x113FDB5Cu);
  // The iSCSI read command PDU of B.4.
  const std::string pdu =
      Bytes({0x01, 0xc0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
             0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00,
             0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x18, 0x28, 0x00, 0x00, 0x00,
             0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00});
  EXPECT_EQ(Crc32c(pdu), 0xD9963A56u);
}

TEST(Crc32c, Chains) {
  const std::string text = "the quick brown fox jumps over the lazy dog";
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    EXPECT_EQ(Crc32c(std::string_view(text).substr(cut), Crc32c(text.substr(0, cut))), Crc32c(text))
        << cut;
  }
}

TEST(Crc32c, BytesFollowedByTheirCrcLeaveTheResidue) {
  // What makes a plan file (bytes, then their CRC little-endian) one codeword, to which the
  // error-detection guarantees of Crc32c.h apply, the checksum's own bits included.
  for (std::string bytes : {std::string(), std::string("x"), std::string(1000, '\x5A')}) {
    const uint32_t crc = Crc32c(bytes);
    for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<char>(crc >> (8 * i)));
    EXPECT_EQ(Crc32c(bytes), 0x48674BC7u);
  }
}

}  // namespace
}  // namespace hcp
