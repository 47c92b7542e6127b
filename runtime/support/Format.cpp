#include "runtime/support/Format.h"

#include <cmath>

#include "absl/strings/str_format.h"

namespace hcp {

std::string FormatCount(int64_t value) {
  // Work on the magnitude as unsigned so INT64_MIN is fine too.
  uint64_t magnitude = value < 0 ? uint64_t{0} - static_cast<uint64_t>(value) : value;
  std::string digits = absl::StrFormat("%d", magnitude);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return value < 0 ? "-" + out : out;
}

std::string FormatBytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  return unit == 0 ? absl::StrFormat("%d B", bytes)
                   : absl::StrFormat("%.2f %s", value, units[unit]);
}

std::string FormatDuration(double seconds) {
  // 1e15 s is far beyond any run and keeps the conversion to int64 defined.
  if (!std::isfinite(seconds) || seconds < 0 || seconds > 1e15) return "-:--:--";
  int64_t total = std::llround(seconds);
  return absl::StrFormat("%d:%02d:%02d", total / 3600, total / 60 % 60, total % 60);
}

std::string FormatGiB(uint64_t bytes) {
  return absl::StrFormat("%.2f GiB", static_cast<double>(bytes) / (uint64_t{1} << 30));
}

}  // namespace hcp
