#include "runtime/plan/KernelTable.h"

namespace hcp::plan {

static_assert(sizeof(kKernelSignatures) / sizeof(kKernelSignatures[0]) == kNumKernels);

std::optional<KernelId> FindKernel(std::string_view name) {
  // A linear scan: a few dozen entries, once per step at load time.
  for (int i = 0; i < kNumKernels; ++i) {
    if (kKernelSignatures[i].name == name) return static_cast<KernelId>(i);
  }
  return std::nullopt;
}

}  // namespace hcp::plan
