// Number, size and time formatting shared by messages, the progress line and plots.
#pragma once

#include <cstdint>
#include <string>

namespace hcp {

// 16388 -> "16,388"; -1234 -> "-1,234".
std::string FormatCount(int64_t value);

// Bytes in binary units with two decimals above 1 KiB: 512 -> "512 B", 1536 -> "1.50 KiB",
// 3 << 30 -> "3.00 GiB".
std::string FormatBytes(uint64_t bytes);

// Always in GiB with two decimals, so that the figures of one message (what a plan needs, what
// the machine has) compare at a glance: 3 << 30 -> "3.00 GiB", 1 << 20 -> "0.00 GiB".
std::string FormatGiB(uint64_t bytes);

// Seconds as H:MM:SS, rounded to the nearest second: 83 -> "0:01:23", 90061 -> "25:01:01".
// Negative, NaN or infinite -> "-:--:--" (unknown).
std::string FormatDuration(double seconds);

}  // namespace hcp
