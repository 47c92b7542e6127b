#include "runtime/weights/Init.h"

#include <cmath>
#include <numbers>

namespace hcp {
namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

uint64_t Draw(uint64_t key, uint64_t counter) { return Mix64(key + (counter + 1) * kGolden); }

// [0, 1) with 53 random bits.
double Uniform(uint64_t bits) { return static_cast<double>(bits >> 11) * 0x1p-53; }

}  // namespace

uint64_t Fnv1a64(std::string_view bytes) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) {
    hash ^= c;
    hash *= 0x100000001b3ull;
  }
  return hash;
}

uint64_t Mix64(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t InitStreamKey(uint64_t seed, std::string_view name) {
  return Mix64(Mix64(seed) ^ Fnv1a64(name));
}

void FillNormal(float* out, int64_t begin, int64_t count, uint64_t seed, std::string_view name,
                float stddev) {
  const uint64_t key = InitStreamKey(seed, name);
  // A pair at a time (both of its elements share the radius and angle), but for an element
  // whose partner lies outside [begin, begin + count).
  for (int64_t j = 0; j < count;) {
    const uint64_t i = static_cast<uint64_t>(begin + j);
    const uint64_t pair = i >> 1;
    // 1 - u lies in (0, 1], so the log is finite. Computed in double: a float log and sqrt
    // would bias the tails.
    const double u1 = 1.0 - Uniform(Draw(key, 2 * pair));
    const double u2 = Uniform(Draw(key, 2 * pair + 1));
    const double radius = std::sqrt(-2.0 * std::log(u1));
    const double angle = 2.0 * std::numbers::pi * u2;
    if ((i & 1) == 0) {
      out[j++] = static_cast<float>(radius * std::cos(angle) * stddev);
      if (j == count) break;
    }
    out[j++] = static_cast<float>(radius * std::sin(angle) * stddev);
  }
}

void FillUniform(float* out, int64_t begin, int64_t count, uint64_t seed, std::string_view name,
                 float low, float high) {
  const uint64_t key = InitStreamKey(seed, name);
  for (int64_t j = 0; j < count; ++j) {
    const double u = Uniform(Draw(key, static_cast<uint64_t>(begin + j)));
    float value = static_cast<float>(low + (static_cast<double>(high) - low) * u);
    // Rounding to float can land on `high` itself; keep the interval half-open.
    out[j] = value < high ? value : std::nextafter(high, low);
  }
}

void FillConstant(float* out, int64_t count, float value) {
  for (int64_t j = 0; j < count; ++j) out[j] = value;
}

}  // namespace hcp
