// The workspace the CUDA backend needs (WorkspaceBytes), kernel by kernel. What it can run
// (CheckPlanRunsOnCuda) is in runtime/plan/CudaRules.cpp, where the compiler checks it too.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "runtime/backends/cuda/BesideCompute.h"
#include "runtime/backends/cuda/CudaBackend.h"
#include "runtime/backends/cuda/StepArgs.h"
#include "runtime/kernels/cuda/Kernels.h"
#include "runtime/kernels/cuda/SequenceKernels.h"

namespace hcp::cuda_backend {
namespace {

using plan::KernelId;

// The workspace one step needs (0 for the kernels that take none).
size_t StepWorkspaceBytes(const plan::Step& step) {
  const std::vector<int64_t>& v = step.ints;
  switch (step.kernel) {
    case KernelId::EmbeddingBackward:
      return cuda::embedding_backward_workspace_bytes(v[0], v[1]);
    case KernelId::RmsNormBackward:
      return cuda::rms_norm_backward_workspace_bytes(v[0], v[1]);
    case KernelId::GatedRmsNormBackward:
      return cuda::gated_rms_norm_backward_workspace_bytes(v[0], v[1]);
    case KernelId::SumLeading:
      return cuda::column_sum_workspace_bytes(v[0], v[1]);
    case KernelId::CausalConv1dBackward:
      return cuda::causal_conv1d_backward_workspace_bytes(v[0], v[1], v[2], v[3]);
    case KernelId::SsdScanForward:
      return cuda::ssd_scan_forward_workspace_bytes(detail::SsdShapeOf(step));
    case KernelId::SsdScanBackward:
      return cuda::ssd_scan_backward_workspace_bytes(detail::SsdShapeOf(step));
    case KernelId::SsdFinalStateForward:
      return cuda::ssd_final_state_forward_workspace_bytes(detail::SsdShapeOf(step));
    case KernelId::SsdFinalStateBackward:
      return cuda::ssd_final_state_backward_workspace_bytes(detail::SsdShapeOf(step));
    case KernelId::SsdLogDecayForward:
    case KernelId::SsdLogDecayBackward:
      return cuda::ssd_log_decay_workspace_bytes(v[0], v[1], v[2]);
    case KernelId::SsdAddInitialStateForward:
      return cuda::ssd_add_initial_state_forward_workspace_bytes(detail::SsdShapeOf(step));
    case KernelId::SsdAddInitialStateBackward:
      return cuda::ssd_add_initial_state_backward_workspace_bytes(detail::SsdShapeOf(step));
    case KernelId::AttentionBackward:
      return cuda::attention_backward_workspace_bytes(detail::AttentionShapeOf(step));
    case KernelId::MoeExpertsForward:
      return cuda::moe_experts_forward_workspace_bytes(v[0], v[1], v[2], v[3], v[4]);
    case KernelId::MoeExpertsBackward:
      return cuda::moe_experts_backward_workspace_bytes(v[0], v[1], v[2], v[3], v[4]);
    case KernelId::MoeExpertsEpForward:
    case KernelId::MoeExpertsEpBackward:
      return detail::ExpertsEpWorkspaceBytes(step);
    case KernelId::CrossEntropyForward:
    case KernelId::CrossEntropyBackward:
      return detail::CarveCrossEntropyScratch(cuda::Workspace{}, v[0]).bytes;
    default:
      return 0;
  }
}

}  // namespace

size_t WorkspaceBytes(const plan::Plan& plan) {
  size_t bytes = 0;
  for (const plan::Step& step : plan.steps) {
    bytes =
        std::max({bytes, StepWorkspaceBytes(step), detail::CollectiveWorkspaceBytes(plan, step)});
  }
  return bytes;
}

size_t BesideComputeWorkspaceBytes(const plan::Plan& plan) {
  size_t bytes = 0;
  for (const plan::Step& step : plan.steps) {
    if (RunsBesideCompute(step.kernel)) {
      bytes = std::max(bytes, detail::CollectiveWorkspaceBytes(plan, step));
    }
  }
  return bytes;
}

}  // namespace hcp::cuda_backend
