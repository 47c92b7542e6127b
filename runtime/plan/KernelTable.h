// The kernels a plan step can name. Their signatures live in KernelTable.txt, from which
// gen_kernel_table.py writes KernelTable.gen.h: the KernelId enum, the signature table and one
// typed argument struct per kernel (`SsdScanBackwardArgs<Buffer>`: ints, floats and buffers by
// name). The compiler, the validator and every backend read that one description.
#pragma once

#include <optional>
#include <string_view>

#include "runtime/plan/KernelTable.gen.h"

namespace hcp::plan {

inline const KernelSignature& GetKernelSignature(KernelId id) {
  return kKernelSignatures[static_cast<int>(id)];
}
inline std::string_view KernelName(KernelId id) { return GetKernelSignature(id).name; }
// True for the kernels that communicate (`collective` in the table): every rank of their group
// must run them, in the same order.
inline bool IsCollective(KernelId id) { return GetKernelSignature(id).collective; }
// True for the collectives that may run beside the compute stream (`beside` in the table): a
// plan's schedule may start one on a stream of its own and join it later (Plan.h's Step::stream).
inline bool RunsBesideCompute(KernelId id) { return GetKernelSignature(id).beside; }
// nullopt for a name the table does not list.
std::optional<KernelId> FindKernel(std::string_view name);

}  // namespace hcp::plan
