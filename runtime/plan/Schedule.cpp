#include "runtime/plan/Schedule.h"

#include <string>

#include "absl/strings/str_format.h"
#include "runtime/plan/KernelTable.h"

namespace hcp::plan {
namespace {

bool Touches(const Plan& plan, const std::vector<uint32_t>& buffers, const Buffer& other) {
  for (uint32_t b : buffers) {
    if (plan.buffers[b].Overlaps(other)) return true;
  }
  return false;
}

// What `later` does that keeps it from running beside `beside`, or nullptr.
const char* Hazard(const Plan& plan, const Step& beside, const Step& later) {
  if (IsCollective(later.kernel)) return "communicates";
  for (uint32_t out : later.outs) {
    const Buffer& written = plan.buffers[out];
    if (Touches(plan, beside.ins, written)) return "writes bytes it reads";
    if (Touches(plan, beside.outs, written)) return "writes bytes it writes";
  }
  for (uint32_t in : later.ins) {
    if (Touches(plan, beside.outs, plan.buffers[in])) return "reads bytes it writes";
  }
  return nullptr;
}

// The first step after `step` with a hazard for it (steps.size(): none).
size_t FirstHazard(const Plan& plan, size_t step) {
  size_t j = step + 1;
  while (j < plan.steps.size() && Hazard(plan, plan.steps[step], plan.steps[j]) == nullptr) ++j;
  return j;
}

}  // namespace

std::vector<size_t> LatestJoins(const Plan& plan) {
  std::vector<size_t> joins(plan.steps.size(), kNotBeside);
  for (size_t i = 0; i < plan.steps.size(); ++i) {
    if (RunsBesideCompute(plan.steps[i].kernel)) joins[i] = FirstHazard(plan, i);
  }
  return joins;
}

absl::Status CheckSchedule(const Plan& plan) {
  const size_t steps = plan.steps.size();
  for (size_t i = 0; i < steps; ++i) {
    const Step& step = plan.steps[i];
    if (step.stream == Stream::kCompute) {
      if (step.join_before != 0) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s runs on the compute stream but names a join (before step %d), which only a step "
            "beside it has",
            StepLabel(plan, i), step.join_before));
      }
      continue;
    }
    if (!RunsBesideCompute(step.kernel)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s is scheduled beside the compute stream, but its kernel may not run there (only "
          "the `beside` kernels of KernelTable.txt may)",
          StepLabel(plan, i)));
    }
    if (step.join_before <= i || step.join_before > steps) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s runs beside the compute stream and is joined before step %d, which is not a later "
          "step (%d..%d, %d: the end)",
          StepLabel(plan, i), step.join_before, i + 1, steps, steps));
    }
    if (const size_t j = FirstHazard(plan, i); j < step.join_before) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s runs beside the compute stream until step %d, but %s before then %s: the "
          "schedule is unsafe (compile the plan again)",
          StepLabel(plan, i), step.join_before, StepLabel(plan, j),
          Hazard(plan, step, plan.steps[j])));
    }
  }
  return absl::OkStatus();
}

}  // namespace hcp::plan
