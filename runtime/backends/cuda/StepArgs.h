// Internal to the CUDA backend: a step's arguments as the CUDA kernels take them, and the
// wrappers that live in CudaBackendSequence.cpp (declared here so that CudaBackend.cpp's switch
// over KernelTable.def sees every one).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/backends/cuda/CudaBackend.h"
#include "runtime/kernels/cuda/Kernels.h"
#include "runtime/kernels/cuda/SequenceKernels.h"
#include "runtime/plan/Plan.h"

namespace hcp::cuda_backend::detail {

using cuda::bf16;

// Typed device pointers into the arenas, the step's scalars, and the stream's resources.
// CheckPlanRunsOnCuda has checked every dtype, so in<T>/out<T> are only asked for the type the
// buffer has.
class Args {
 public:
  Args(const plan::Plan& plan, const plan::Step& step, const DeviceArenas& arenas,
       const StepResources& resources)
      : plan_(plan), step_(step), arenas_(arenas), resources_(resources) {}

  template <typename T>
  const T* in(int i) const {
    return reinterpret_cast<const T*>(Address(step_.ins[i]));
  }
  template <typename T>
  T* out(int i) const {
    return reinterpret_cast<T*>(Address(step_.outs[i]));
  }
  const int32_t* in_i32(int i) const { return in<int32_t>(i); }
  int32_t* out_i32(int i) const { return out<int32_t>(i); }
  plan::DType in_dtype(int i) const { return plan_.buffers[step_.ins[i]].dtype; }
  plan::DType out_dtype(int i) const { return plan_.buffers[step_.outs[i]].dtype; }
  int64_t i(int k) const { return step_.ints[k]; }
  float f(int k) const { return static_cast<float>(step_.floats[k]); }
  const plan::Step& step() const { return step_; }

  cudaStream_t stream() const { return resources_.stream; }
  const StepResources& resources() const { return resources_; }
  const plan::Mesh& mesh() const { return plan_.mesh; }
  // The collectives' communicator (CheckPlanRunsOnCuda and the executor make sure a plan with
  // collectives has one) and this rank's place in the cp group.
  comm::NcclCommunicator& nccl() const { return *resources_.nccl; }
  int64_t cp_index() const {
    return resources_.nccl == nullptr ? 0 : resources_.nccl->host().cp_index();
  }
  cuda::GemmContext* gemm() const { return resources_.gemm; }
  cuda::Workspace workspace() const { return resources_.workspace; }
  int32_t* bad_position() const { return resources_.bad_position; }
  // The MoE steps' expert ids on the host, `slots` of them: the executor's copy
  // (StepResources::host_expert_ids).
  absl::StatusOr<std::span<const int32_t>> host_expert_ids(int64_t slots) const {
    if (resources_.host_expert_ids == nullptr) {
      return absl::InternalError("no host copy of the expert ids (the executor makes one)");
    }
    return std::span<const int32_t>(resources_.host_expert_ids, static_cast<size_t>(slots));
  }

 private:
  std::byte* Address(uint32_t buffer) const {
    const plan::Buffer& b = plan_.buffers[buffer];
    return arenas_[static_cast<int>(b.arena)] + b.offset;
  }

  const plan::Plan& plan_;
  const plan::Step& step_;
  const DeviceArenas& arenas_;
  const StepResources& resources_;
};

// Pieces of the workspace, 256-byte aligned, in order. With a null base only the size counts.
class Carver {
 public:
  explicit Carver(cuda::Workspace ws) : base_(static_cast<std::byte*>(ws.ptr)), bytes_(ws.bytes) {}
  template <typename T>
  T* take(int64_t count) {
    std::byte* p = base_ == nullptr ? nullptr : base_ + used_;
    used_ += (sizeof(T) * static_cast<size_t>(std::max<int64_t>(count, 1)) + 255) / 256 * 256;
    return reinterpret_cast<T*>(p);
  }
  size_t used() const { return used_; }
  // What is left after the pieces taken so far (for a kernel's own workspace).
  cuda::Workspace rest() const {
    if (base_ == nullptr || used_ > bytes_) return cuda::Workspace{};
    return cuda::Workspace{base_ + used_, bytes_ - used_};
  }
  Carver(const Carver&) = delete;

 private:
  std::byte* base_;
  size_t bytes_;
  size_t used_ = 0;
};

// Runs fn(T{}) with T = bf16 for a bf16 buffer, float for an f32 one: the elementwise kernels
// compute in their step's type, which CheckPlanRunsOnCuda has checked is the same for every float
// buffer of the step.
template <typename F>
absl::Status WithType(plan::DType dtype, F&& fn) {
  if (dtype == plan::DType::BF16) return fn(bf16{});
  return fn(float{});
}

// A kernel's Status as an absl::Status (RunCudaStep prefixes the step).
inline absl::Status Done(const cuda::Status& status) { return FromCuda(status); }

// cross_entropy's scratch in the workspace, carved in this order (256-byte aligned pieces): the
// lse the plan does not keep (the backward recomputes it with the forward kernel), the loss_sum
// and valid_count of that recomputation (discarded), and the forward kernel's own workspace.
// With a null workspace only `bytes` is meaningful (for WorkspaceBytes).
struct CrossEntropyScratch {
  float* lse = nullptr;
  float* loss_sum = nullptr;
  float* valid_count = nullptr;
  cuda::Workspace forward;
  size_t bytes = 0;
};
CrossEntropyScratch CarveCrossEntropyScratch(cuda::Workspace workspace, int64_t tokens);

// The sequence-mixing wrappers (CudaBackendSequence.cpp), in KernelTable.def's order.
absl::Status RunCausalConv1dForward(const Args& a);
absl::Status RunCausalConv1dBackward(const Args& a);
absl::Status RunSsdScanForward(const Args& a);
absl::Status RunSsdScanBackward(const Args& a);
absl::Status RunSsdFinalStateForward(const Args& a);
absl::Status RunSsdFinalStateBackward(const Args& a);
absl::Status RunSsdLogDecayForward(const Args& a);
absl::Status RunSsdLogDecayBackward(const Args& a);
absl::Status RunSsdAddInitialStateForward(const Args& a);
absl::Status RunSsdAddInitialStateBackward(const Args& a);
absl::Status RunAttentionForward(const Args& a);
absl::Status RunAttentionBackward(const Args& a);

// The collectives (CudaBackendCollectives.cpp), in KernelTable.def's order, and the workspace
// they carve their scratch from.
absl::Status RunHaloExchangeForward(const Args& a);
absl::Status RunHaloExchangeBackward(const Args& a);
absl::Status RunStateScanForward(const Args& a);
absl::Status RunStateScanBackward(const Args& a);
absl::Status RunRingAttentionForward(const Args& a);
absl::Status RunRingAttentionBackward(const Args& a);
absl::Status RunAllReduce(const Args& a);
size_t CollectiveWorkspaceBytes(const plan::Plan& plan, const plan::Step& step);

// Expert parallelism (CudaBackendExperts.cpp), and its workspace.
absl::Status RunMoeExpertsEpForward(const Args& a);
absl::Status RunMoeExpertsEpBackward(const Args& a);
size_t ExpertsEpWorkspaceBytes(const plan::Step& step);

// The shapes the sequence wrappers pass, from a step's ints (also used by the plan checks and
// WorkspaceBytes). ssd_scan and ssd_final_state: batch, seq, heads, head_dim, groups, state,
// chunk. attention: batch, seq, q_heads, kv_heads, head_dim (queries and keys are the same
// positions).
cuda::SsdShape SsdShapeOf(const plan::Step& step);
cuda::AttentionShape AttentionShapeOf(const plan::Step& step);

}  // namespace hcp::cuda_backend::detail
