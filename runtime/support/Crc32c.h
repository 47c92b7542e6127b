// CRC32C (Castagnoli): the polynomial 0x1EDC6F41, bits reflected, initial value and final XOR
// 0xFFFFFFFF, as iSCSI (RFC 3720), ext4 and Abseil's absl/crc compute it. (Debian 12's Abseil,
// 20220623, predates absl/crc.)
//
// Why a CRC rather than a 64-bit hash for file integrity: its guarantees are certainties, not
// probabilities. The polynomial is (x + 1) times a primitive polynomial of degree 31, so over
// bytes followed by their CRC (little-endian) it detects every error of an odd number of bits at
// any length, every 2-bit error up to 2^31 - 1 bits (256 MiB), hence every error of 1, 2 or 3
// bits there, and every burst of up to 32 bits. A hash such as xxHash64 misses any given change
// with probability 2^-64, but no change is guaranteed to be caught. x86-64 computes it in hardware
// (SSE4.2) at several GB/s, so checking a checkpoint costs about what reading it does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace hcp {

// The CRC32C of `size` bytes at `data`, continuing from `crc` (the value returned for the bytes
// before them; 0 to start): Crc32c(Crc32c(0, a), b) == Crc32c(0, a + b).
uint32_t Crc32c(uint32_t crc, const void* data, size_t size);
// The same over `bytes`: Crc32c(b, Crc32c(a)) == Crc32c(a + b).
inline uint32_t Crc32c(std::string_view bytes, uint32_t crc = 0) {
  return Crc32c(crc, bytes.data(), bytes.size());
}

// The portable (table) implementation, which Crc32c uses where the CPU has no CRC32C instruction;
// declared so that the tests can check both give the same values.
uint32_t Crc32cPortable(uint32_t crc, const void* data, size_t size);

// Eight lowercase hex digits: how a CRC is written into a file's metadata.
std::string Crc32cHex(uint32_t crc);

}  // namespace hcp
