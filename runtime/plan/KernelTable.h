// The kernels a plan step can name, as a C++ enum and a lookup table, both generated from
// KernelTable.def so the compiler, the validator and every backend agree on one list.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace hcp::plan {

enum class KernelId : uint8_t {
#define HCP_KERNEL(Id, name, ins, outs, ints, floats) Id,
#include "runtime/plan/KernelTable.def"
#undef HCP_KERNEL
};

inline constexpr int kNumKernels = 0
#define HCP_KERNEL(Id, name, ins, outs, ints, floats) +1
#include "runtime/plan/KernelTable.def"
#undef HCP_KERNEL
    ;

// One line of KernelTable.def. A count of -1 depends on the step's flags (causal_conv1d's
// has_halo, ssd_scan's has_init and has_dfinal); ExpectedArity in Plan.h resolves it for a step.
struct KernelInfo {
  KernelId id;
  std::string_view name;
  int ins, outs, ints, floats;
};

const KernelInfo& GetKernelInfo(KernelId id);
inline std::string_view KernelName(KernelId id) { return GetKernelInfo(id).name; }
// nullopt for a name the table does not list.
std::optional<KernelId> FindKernel(std::string_view name);
// True for the kernels that communicate (the collectives at the end of KernelTable.def): every
// rank of their group must run them, in the same order.
bool IsCollective(KernelId id);

}  // namespace hcp::plan
