// Number and time formatting shared by messages, the progress line and plots.
#pragma once

#include <cstdint>
#include <string>

namespace hcp::train {

// 16388 -> "16,388"; -1234 -> "-1,234".
std::string FormatCount(int64_t value);

// Seconds as H:MM:SS, rounded to the nearest second: 83 -> "0:01:23", 90061 -> "25:01:01".
// Negative, NaN or infinite -> "-:--:--" (unknown).
std::string FormatDuration(double seconds);

}  // namespace hcp::train
