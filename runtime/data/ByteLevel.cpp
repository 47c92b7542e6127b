#include "runtime/data/ByteLevel.h"

#include <cstdint>

namespace hcp::data {
namespace {

// U+0000..U+07FF in UTF-8 (the alphabet ends at U+0143).
std::string Utf8(uint32_t code) {
  if (code < 0x80) return std::string(1, static_cast<char>(code));
  return {static_cast<char>(0xC0 | (code >> 6)), static_cast<char>(0x80 | (code & 0x3F))};
}

bool StandsForItself(int byte) {
  return (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) ||
         (byte >= 0xAE && byte <= 0xFF);
}

struct Alphabet {
  std::array<std::string, 256> chars;
  std::array<int, 0x200> byte_of;  // code point -> byte, -1 outside the alphabet

  Alphabet() {
    byte_of.fill(-1);
    uint32_t next = 0x100;
    for (int byte = 0; byte < 256; ++byte) {
      uint32_t code = StandsForItself(byte) ? byte : next++;
      chars[byte] = Utf8(code);
      byte_of[code] = byte;
    }
  }
};

const Alphabet& TheAlphabet() {
  static const Alphabet* alphabet = new Alphabet();
  return *alphabet;
}

}  // namespace

const std::array<std::string, 256>& ByteLevelChars() { return TheAlphabet().chars; }

std::string ByteLevelEncode(std::string_view bytes) {
  const auto& chars = TheAlphabet().chars;
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char byte : bytes) out += chars[byte];
  return out;
}

std::string ByteLevelDecode(std::string_view token) {
  const auto& byte_of = TheAlphabet().byte_of;
  std::string out;
  out.reserve(token.size());
  for (size_t i = 0; i < token.size();) {
    unsigned char c = static_cast<unsigned char>(token[i]);
    uint32_t code;
    size_t length;
    if (c < 0x80) {
      code = c, length = 1;
    } else if ((c & 0xE0) == 0xC0 && i + 1 < token.size()) {
      code = ((c & 0x1F) << 6) | (static_cast<unsigned char>(token[i + 1]) & 0x3F), length = 2;
    } else {
      return std::string(token);  // a character beyond U+07FF: not in the alphabet
    }
    if (code >= byte_of.size() || byte_of[code] < 0) return std::string(token);
    out += static_cast<char>(byte_of[code]);
    i += length;
  }
  return out;
}

}  // namespace hcp::data
