// A target the loss ignores: Hugging Face's convention (-100), the compiler's ignore_index, what
// plans, data masks and the commands all mean by it.
#pragma once

#include <cstdint>

namespace hcp {

inline constexpr int32_t kIgnoredTarget = -100;

}  // namespace hcp
