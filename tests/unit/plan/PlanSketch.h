// A plan of a few steps over F32 buffers at chosen (arena, offset) places, for the tests of
// decisions made from where buffers lie (ScheduleTest, the CUDA executor's HostCopiesTest).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "runtime/plan/Plan.h"

namespace hcp::plan::testing {

class PlanSketch {
 public:
  // An F32 buffer of `elements` (64 by default: 256 bytes) at `offset` bytes into `arena`.
  uint32_t Buffer(plan::Arena arena, uint64_t offset, int64_t elements = 64) {
    plan::Buffer b;
    b.arena = arena;
    b.offset = offset;
    b.elements = elements;
    b.shape = {elements};
    plan_.buffers.push_back(b);
    return static_cast<uint32_t>(plan_.buffers.size() - 1);
  }
  void Step(plan::KernelId kernel, std::vector<uint32_t> ins, std::vector<uint32_t> outs) {
    plan_.steps.push_back(plan::Step{kernel, std::move(ins), std::move(outs), {}, {}});
  }
  // Schedules step `step` beside the compute stream, joined before step `join_before`.
  void Beside(size_t step, uint32_t join_before) {
    plan_.steps.at(step).stream = plan::Stream::kBeside;
    plan_.steps.at(step).join_before = join_before;
  }
  const plan::Plan& plan() const { return plan_; }

 private:
  plan::Plan plan_;
};

}  // namespace hcp::plan::testing
