// Element types, one enum for all: a plan's buffers are F32, BF16 or I32 (the values plan.fbs
// stores), checkpoint tensors also F16 or I64 (spelled as safetensors spells them); and exact
// conversions between the 16-bit float formats and fp32.
#pragma once

#include <bit>
#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"

namespace hcp {

// The subset of safetensors dtypes that Granite checkpoints and our own files use; the first
// three are a plan's (plan::kNumDTypes).
enum class DType : uint8_t { F32 = 0, BF16 = 1, I32 = 2, F16 = 3, I64 = 4 };

// "f32", "bf16", "i32", "f16", "i64": as plans and messages about them spell them.
std::string_view DTypeName(DType dtype);
// "F32", "BF16", "I32", "F16", "I64": as safetensors headers spell them.
std::string_view SafetensorsName(DType dtype);
// Bytes per element.
uint64_t DTypeSize(DType dtype);
bool IsFloatDType(DType dtype);
// Parses a safetensors dtype name; anything else is InvalidArgument naming the string.
absl::StatusOr<DType> ParseSafetensorsDType(std::string_view name);

// The conversions are inline because they run once per element of every tensor read or written.

// bf16 is the top half of an fp32, so widening is exact.
inline float Bf16ToF32(uint16_t bits) { return std::bit_cast<float>(uint32_t{bits} << 16); }

// Round to nearest, ties to even; overflow rounds to inf; NaN stays NaN (made quiet, sign kept):
// plain truncation would turn a NaN whose payload lives in the low bits into inf.
inline uint16_t F32ToBf16(float value) {
  uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  uint32_t lsb = (bits >> 16) & 1u;
  return static_cast<uint16_t>((bits + 0x7FFFu + lsb) >> 16);
}

// IEEE binary16 -> fp32, exact (subnormals, inf and NaN included).
inline float F16ToF32(uint16_t h) {
  uint32_t sign = uint32_t{h & 0x8000u} << 16;
  uint32_t exponent = (h >> 10) & 0x1Fu;
  uint32_t mantissa = h & 0x3FFu;
  if (exponent == 0x1F) return std::bit_cast<float>(sign | 0x7F800000u | (mantissa << 13));
  if (exponent != 0)
    return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
  // Zero or subnormal: mantissa * 2^-24 is exact in fp32.
  float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
  return sign ? -magnitude : magnitude;
}

// fp32 -> IEEE binary16, round to nearest, ties to even, with subnormals; values from 65520 up
// round to inf; NaN stays NaN (quiet, sign kept).
inline uint16_t F32ToF16(float value) {
  uint32_t bits = std::bit_cast<uint32_t>(value);
  uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  uint32_t abs = bits & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return sign | 0x7E00u | static_cast<uint16_t>((abs >> 13) & 0x3FFu);
  if (abs >= 0x477FF000u) return sign | 0x7C00u;  // 65520 and up (inf included)
  if (abs >= 0x38800000u) {                       // normal half: 2^-14 and up
    // Rebias the exponent (127 -> 15) and round away the low 13 mantissa bits; a carry out of
    // the mantissa correctly bumps the exponent.
    uint32_t lsb = (abs >> 13) & 1u;
    return sign | static_cast<uint16_t>((abs - 0x38000000u + 0xFFFu + lsb) >> 13);
  }
  if (abs <= 0x33000000u) return sign;  // at most 2^-25: half the smallest subnormal ties to 0
  // Subnormal half: the value in units of 2^-24 is mantissa >> shift, rounded to even.
  uint32_t exponent = abs >> 23;  // 102..112 here
  uint32_t mantissa = (abs & 0x7FFFFFu) | 0x800000u;
  uint32_t shift = 126 - exponent;  // 14..24
  uint32_t result = mantissa >> shift;
  uint32_t rest = mantissa & ((1u << shift) - 1);
  uint32_t half = 1u << (shift - 1);
  if (rest > half || (rest == half && (result & 1u))) ++result;
  return sign | static_cast<uint16_t>(result);
}

}  // namespace hcp
