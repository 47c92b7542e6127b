#include "runtime/plan/Plan.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace hcp::plan {

std::string_view ArenaName(Arena arena) {
  switch (arena) {
    case Arena::Parameters:
      return "parameters";
    case Arena::Gradients:
      return "gradients";
    case Arena::Activations:
      return "activations";
    case Arena::Inputs:
      return "inputs";
  }
  return "?";
}

std::string_view ParamInitName(ParamInit init) {
  switch (init) {
    case ParamInit::Normal:
      return "normal";
    case ParamInit::Zeros:
      return "zeros";
    case ParamInit::Ones:
      return "ones";
    case ParamInit::LogArange:
      return "log_arange";
  }
  return "?";
}

std::string_view SequenceLayoutName(SequenceLayout layout) {
  switch (layout) {
    case SequenceLayout::Contiguous:
      return "contiguous";
    case SequenceLayout::Zigzag:
      return "zigzag";
  }
  return "?";
}

uint64_t Plan::total_arena_bytes() const {
  uint64_t total = 0;
  for (uint64_t bytes : arena_bytes) total += bytes;
  return total;
}

bool Plan::StoresBf16() const {
  return std::any_of(buffers.begin(), buffers.end(),
                     [](const Buffer& b) { return b.dtype == DType::BF16; });
}

uint64_t Plan::ShardedGradientsOffset() const {
  uint64_t offset = arena_size(Arena::Gradients);
  for (const Parameter& p : parameters) {
    if (p.sharded()) offset = std::min(offset, buffers[p.gradient].offset);
  }
  return offset;
}

std::string StepLabel(const Plan& plan, size_t step_index) {
  if (step_index >= plan.steps.size()) return absl::StrFormat("step %d", step_index);
  const KernelId kernel = plan.steps[step_index].kernel;
  if (static_cast<int>(kernel) >= kNumKernels) {  // only in a Plan assembled in memory
    return absl::StrFormat("step %d (kernel id %d)", step_index, static_cast<int>(kernel));
  }
  return absl::StrFormat("step %d (%s)", step_index, KernelName(kernel));
}

}  // namespace hcp::plan
