#include "runtime/plan/KernelTable.h"

namespace hcp::plan {
namespace {

constexpr KernelInfo kKernels[] = {
#define HCP_KERNEL(Id, name, ins, outs, ints, floats) {KernelId::Id, name, ins, outs, ints, floats},
#include "runtime/plan/KernelTable.def"
#undef HCP_KERNEL
};
static_assert(sizeof(kKernels) / sizeof(kKernels[0]) == kNumKernels);

}  // namespace

const KernelInfo& GetKernelInfo(KernelId id) { return kKernels[static_cast<int>(id)]; }

std::optional<KernelId> FindKernel(std::string_view name) {
  // A linear scan: a few dozen entries, once per step at load time.
  for (const KernelInfo& kernel : kKernels) {
    if (kernel.name == name) return kernel.id;
  }
  return std::nullopt;
}

bool IsCollective(KernelId id) {
  switch (id) {
    case KernelId::HaloExchangeForward:
    case KernelId::HaloExchangeBackward:
    case KernelId::StateScanForward:
    case KernelId::StateScanBackward:
    case KernelId::RingAttentionForward:
    case KernelId::RingAttentionBackward:
    case KernelId::AllReduce:
    case KernelId::MoeExpertsEpForward:
    case KernelId::MoeExpertsEpBackward:
      return true;
    default:
      return false;
  }
}

}  // namespace hcp::plan
