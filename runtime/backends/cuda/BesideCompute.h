// Which steps of a plan the CUDA executor runs beside its compute stream, and when the compute
// stream waits for them. Host-only (tests/unit/kernels_cuda/BesideComputeTest.cpp, no GPU).
#pragma once

#include <cstddef>
#include <vector>

#include "runtime/plan/KernelTable.h"
#include "runtime/plan/Plan.h"

namespace hcp::cuda_backend {

// The collectives that may run on a stream of their own beside the compute stream: the halo
// exchanges and state scans (hcp-overlap-collectives orders the plan for it). Their backend
// functions queue everything on resources.stream, use no other stream or event, and keep their
// scratch in resources.workspace, which must then be apart from the compute steps' (of
// BesideComputeWorkspaceBytes, CudaBackend.h).
inline bool RunsBesideCompute(plan::KernelId kernel) {
  switch (kernel) {
    case plan::KernelId::HaloExchangeForward:
    case plan::KernelId::HaloExchangeBackward:
    case plan::KernelId::StateScanForward:
    case plan::KernelId::StateScanBackward:
      return true;
    default:
      return false;
  }
}

inline constexpr size_t kOnComputeStream = ~size_t{0};

// Per step of `plan` (validated): kOnComputeStream for a step that runs on the compute stream;
// for one that runs beside it, the step before which the compute stream waits for it
// (steps.size(): the end of the step list). That is the first later step that touches any byte
// of its buffers (in either direction: it may overwrite what the collective reads, or read
// what it writes) or that communicates (every rank must issue its collectives in the same
// order, and one in flight at a time keeps that plain).
inline std::vector<size_t> BesideComputeJoins(const plan::Plan& plan) {
  auto overlaps = [&](const plan::Step& a, const plan::Step& b) {
    for (const std::vector<uint32_t>* a_list : {&a.ins, &a.outs}) {
      for (uint32_t i : *a_list) {
        for (const std::vector<uint32_t>* b_list : {&b.ins, &b.outs}) {
          for (uint32_t j : *b_list) {
            if (plan.buffers[i].Overlaps(plan.buffers[j])) return true;
          }
        }
      }
    }
    return false;
  };
  const size_t steps = plan.steps.size();
  std::vector<size_t> joins(steps, kOnComputeStream);
  for (size_t i = 0; i < steps; ++i) {
    if (!RunsBesideCompute(plan.steps[i].kernel)) continue;
    size_t j = i + 1;
    while (j < steps && !plan::IsCollective(plan.steps[j].kernel) &&
           !overlaps(plan.steps[i], plan.steps[j])) {
      ++j;
    }
    joins[i] = j;
  }
  return joins;
}

}  // namespace hcp::cuda_backend
