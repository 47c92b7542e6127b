// The byte-level alphabet of GPT-2-style BPE tokenizers: every byte is written as one visible
// Unicode character, so that a vocabulary of strings covers any input. The printable bytes
// '!'..'~', U+00A1..U+00AC and U+00AE..U+00FF stand for themselves; the other 68 bytes (controls,
// space, ...) take U+0100, U+0101, ... in byte order (the space is U+0120, 'Ġ').
#pragma once

#include <array>
#include <string>
#include <string_view>

namespace hcp::data {

// The UTF-8 text of the character that stands for each byte.
const std::array<std::string, 256>& ByteLevelChars();

// `bytes` written in the byte-level alphabet (each byte becomes its character).
std::string ByteLevelEncode(std::string_view bytes);

// A token's bytes, the way Hugging Face's ByteLevel decoder reads it: when every character of
// `token` is in the alphabet, the bytes they stand for; otherwise (an added token such as
// "<|end of text|>" with a real space) the token's own UTF-8 bytes.
std::string ByteLevelDecode(std::string_view token);

}  // namespace hcp::data
