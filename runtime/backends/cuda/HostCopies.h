// Which device buffers the CUDA executor copies to the host while the steps run, and when: the
// MoE steps route their tokens on the host (cuBLASLt takes the experts' row counts there, and
// expert parallelism exchanges them between ranks), so they need their expert ids there. Copied
// as soon as the step that writes the ids has run, on a stream of their own, the ids are on the
// host long before the MoE step: its forward waits only for the router (and the work between
// the two hides that wait), its backward not at all. Host-only
// (tests/unit/kernels_cuda/HostCopiesTest.cpp, no GPU).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "runtime/plan/KernelTable.h"
#include "runtime/plan/Plan.h"

namespace hcp::cuda_backend {

// Where the MoE experts steps' expert_ids input sits in their inputs (its place in the
// signature: no optional input precedes it), or -1 for a kernel that reads nothing on the host.
inline int HostReadInput(plan::KernelId kernel) {
  switch (kernel) {
    case plan::KernelId::MoeExpertsForward:
    case plan::KernelId::MoeExpertsEpForward:
    case plan::KernelId::MoeExpertsBackward:
    case plan::KernelId::MoeExpertsEpBackward: {
      const std::span<const plan::BufferSpec> ins = plan::GetKernelSignature(kernel).ins;
      for (size_t i = 0; i < ins.size(); ++i) {
        if (ins[i].name == "expert_ids") return static_cast<int>(i);
      }
      return -1;
    }
    default:
      return -1;
  }
}

inline constexpr size_t kBeforeTheSteps = ~size_t{0};

struct HostCopy {
  uint32_t buffer = 0;    // the plan buffer copied, whole
  size_t after_step = 0;  // queued once this step is queued (kBeforeTheSteps: first)
};

struct HostCopyPlan {
  std::vector<HostCopy> copies;
  std::vector<int> copy_of_step;  // per step: the copy it reads, or -1
};

// One copy per (buffer, last writer) pair that a host-reading step needs: the last step before
// the reader whose outputs overlap any byte of the buffer. A forward and a backward that read
// the same ids written by the same step share one copy. No step between the writer and the
// reader writes those bytes, so the copy, which runs beside the steps after the writer, reads
// what the reader would.
inline HostCopyPlan PlanHostCopies(const plan::Plan& plan) {
  HostCopyPlan result;
  result.copy_of_step.assign(plan.steps.size(), -1);
  for (size_t reader = 0; reader < plan.steps.size(); ++reader) {
    const int input = HostReadInput(plan.steps[reader].kernel);
    if (input < 0) continue;
    const uint32_t buffer = plan.steps[reader].ins[input];
    size_t writer = kBeforeTheSteps;
    for (size_t s = reader; s-- > 0 && writer == kBeforeTheSteps;) {
      for (uint32_t out : plan.steps[s].outs) {
        if (plan.buffers[out].Overlaps(plan.buffers[buffer])) writer = s;
      }
    }
    int copy = -1;
    for (size_t c = 0; c < result.copies.size(); ++c) {
      if (result.copies[c].buffer == buffer && result.copies[c].after_step == writer) {
        copy = static_cast<int>(c);
      }
    }
    if (copy < 0) {
      copy = static_cast<int>(result.copies.size());
      result.copies.push_back({buffer, writer});
    }
    result.copy_of_step[reader] = copy;
  }
  return result;
}

}  // namespace hcp::cuda_backend
