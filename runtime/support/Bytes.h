// Memory sizes in messages.
#pragma once

#include <cstdint>
#include <string>

#include "absl/strings/str_format.h"

namespace hcp {

// Always in GiB with two decimals, so that the figures of one message (what a plan needs, what
// the machine has) compare at a glance: 3 << 30 -> "3.00 GiB", 1 << 20 -> "0.00 GiB".
inline std::string FormatGiB(uint64_t bytes) {
  return absl::StrFormat("%.2f GiB", static_cast<double>(bytes) / (uint64_t{1} << 30));
}

}  // namespace hcp
