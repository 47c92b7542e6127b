#include "runtime/support/Crc32c.h"

#include <array>

namespace hcp {
namespace {

// The reflected polynomial: bit i of 0x82F63B78 is the coefficient of x^(31-i) of 0x1EDC6F41.
constexpr uint32_t kReflectedPolynomial = 0x82F63B78;

// The CRC of each byte value, so the loop takes a byte at a time rather than a bit.
constexpr std::array<uint32_t, 256> MakeTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t byte = 0; byte < 256; ++byte) {
    uint32_t crc = byte;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (crc & 1 ? kReflectedPolynomial : 0);
    table[byte] = crc;
  }
  return table;
}
constexpr std::array<uint32_t, 256> kTable = MakeTable();

}  // namespace

uint32_t Crc32c(std::string_view bytes, uint32_t crc) {
  crc = ~crc;
  for (const char c : bytes) crc = kTable[(crc ^ static_cast<uint8_t>(c)) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

}  // namespace hcp
