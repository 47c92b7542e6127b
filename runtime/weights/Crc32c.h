// CRC32C (Castagnoli), the checksum of every tensor in the safetensors files hybridcp writes.
//
// Why CRC32C rather than xxHash64: the checksums guard against corruption (a flipped bit, a torn
// or partly overwritten file), not against forgery, and a CRC promises there what a hash does
// not: every single-bit error and every burst of up to 32 wrong bits is detected, in a tensor of
// any length (any other corruption escapes with probability 2^-32). It is also what the plan file
// checksum uses, and x86-64 computes it in hardware (SSE4.2) at several GB/s, so checking a
// checkpoint costs about what reading it does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace hcp {

// The CRC32C of `size` bytes at `data`, continuing from `crc` (the value returned for the bytes
// before them; 0 to start). Crc32c(Crc32c(0, a), b) == Crc32c(0, a + b).
uint32_t Crc32c(uint32_t crc, const void* data, size_t size);

// The portable (table) implementation, which Crc32c uses where the CPU has no CRC32C instruction;
// declared so that the tests can check both give the same values.
uint32_t Crc32cPortable(uint32_t crc, const void* data, size_t size);

// Eight lowercase hex digits: how a CRC is written into a file's metadata.
std::string Crc32cHex(uint32_t crc);

}  // namespace hcp
