// CRC32C (Castagnoli): the polynomial 0x1EDC6F41, bits reflected, initial value and final XOR
// 0xFFFFFFFF, as iSCSI (RFC 3720), ext4 and Abseil's absl/crc compute it. (Debian 12's Abseil,
// 20220623, predates absl/crc.)
//
// Why a CRC rather than a 64-bit hash for file integrity: its guarantees are certainties, not
// probabilities. The polynomial is (x + 1) times a primitive polynomial of degree 31, so over
// bytes followed by their CRC (little-endian) it detects every error of an odd number of bits at
// any length, every 2-bit error up to 2^31 - 1 bits (256 MiB), hence every error of 1, 2 or 3
// bits there, and every burst of up to 32 bits. A hash such as xxHash64 misses any given change
// with probability 2^-64, but no change is guaranteed to be caught.
#pragma once

#include <cstdint>
#include <string_view>

namespace hcp {

// The CRC32C of `bytes`. Chained, `crc` is the CRC of what came before:
// Crc32c(b, Crc32c(a)) == Crc32c(a + b).
uint32_t Crc32c(std::string_view bytes, uint32_t crc = 0);

}  // namespace hcp
