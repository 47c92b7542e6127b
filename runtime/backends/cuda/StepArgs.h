// Internal to the CUDA backend: a step's arguments as the CUDA kernels take them, and the
// wrappers that live outside CudaBackend.cpp (declared here so that CudaBackend.cpp's dispatch
// over KernelTable.txt sees every one).
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

// A step's buffer on the device: its address in the arenas and its element type.
// CheckPlanRunsOnCuda has checked every dtype, so as<T> is only asked for the type the buffer
// has. An optional buffer the step does not have is null.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(std::byte* address, plan::DType dtype) : address_(address), dtype_(dtype) {}
  template <typename T>
  T* as() const {
    return reinterpret_cast<T*>(address_);
  }
  plan::DType dtype() const { return dtype_; }

 private:
  std::byte* address_ = nullptr;
  plan::DType dtype_ = plan::DType::F32;
};

// What a step runs with: its arguments by name (Get), and the stream's resources.
class Args {
 public:
  Args(const plan::Plan& plan, const plan::Step& step, const DeviceArenas& arenas,
       const StepResources& resources)
      : plan_(plan), step_(step), arenas_(arenas), resources_(resources) {}

  // The step's arguments in its kernel's struct (KernelArgs<>::kId is the step's kernel).
  template <template <typename> class KernelArgs>
  KernelArgs<DeviceBuffer> Get() const {
    return plan::DecodeStep<KernelArgs>(step_, [this](uint32_t buffer) {
      const plan::Buffer& b = plan_.buffers[buffer];
      return DeviceBuffer(arenas_[static_cast<int>(b.arena)] + b.offset, b.dtype);
    });
  }

  // Packed documents: the step's `positions` for its kernels, or null (the kernels of a plan
  // without --documents, the same values) for a micro-batch of one document per row.
  const int32_t* positions(const DeviceBuffer& positions) const {
    return resources_.packs_documents ? positions.as<int32_t>() : nullptr;
  }

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

// The wrappers outside CudaBackend.cpp, in KernelTable.txt's order: each takes its kernel's
// arguments by name, and the kernels that need a workspace have their WorkspaceBytes beside the
// wrapper (the collectives' also see the mesh). RunCudaStep and WorkspaceBytes (CudaBackend.cpp)
// dispatch over the table to them.
//
// The sequence-mixing wrappers (CudaBackendSequence.cpp).
absl::Status RunCausalConv1dForward(const Args& a,
                                    const plan::CausalConv1dForwardArgs<DeviceBuffer>& k);
absl::Status RunCausalConv1dBackward(const Args& a,
                                     const plan::CausalConv1dBackwardArgs<DeviceBuffer>& k);
size_t WorkspaceBytes(const plan::CausalConv1dBackwardArgs<DeviceBuffer>& k);
absl::Status RunSsdScanForward(const Args& a, const plan::SsdScanForwardArgs<DeviceBuffer>& k);
size_t WorkspaceBytes(const plan::SsdScanForwardArgs<DeviceBuffer>& k);
absl::Status RunSsdScanBackward(const Args& a, const plan::SsdScanBackwardArgs<DeviceBuffer>& k);
size_t WorkspaceBytes(const plan::SsdScanBackwardArgs<DeviceBuffer>& k);
absl::Status RunSsdLogDecayForward(const Args& a,
                                   const plan::SsdLogDecayForwardArgs<DeviceBuffer>& k);
size_t WorkspaceBytes(const plan::SsdLogDecayForwardArgs<DeviceBuffer>& k);
absl::Status RunSsdLogDecayBackward(const Args& a,
                                    const plan::SsdLogDecayBackwardArgs<DeviceBuffer>& k);
size_t WorkspaceBytes(const plan::SsdLogDecayBackwardArgs<DeviceBuffer>& k);
absl::Status RunSsdFinalStateForward(const Args& a,
                                     const plan::SsdFinalStateForwardArgs<DeviceBuffer>& k);
size_t WorkspaceBytes(const plan::SsdFinalStateForwardArgs<DeviceBuffer>& k);
absl::Status RunSsdFinalStateBackward(const Args& a,
                                      const plan::SsdFinalStateBackwardArgs<DeviceBuffer>& k);
size_t WorkspaceBytes(const plan::SsdFinalStateBackwardArgs<DeviceBuffer>& k);
absl::Status RunSsdAddInitialStateForward(
    const Args& a, const plan::SsdAddInitialStateForwardArgs<DeviceBuffer>& k);
size_t WorkspaceBytes(const plan::SsdAddInitialStateForwardArgs<DeviceBuffer>& k);
absl::Status RunSsdAddInitialStateBackward(
    const Args& a, const plan::SsdAddInitialStateBackwardArgs<DeviceBuffer>& k);
size_t WorkspaceBytes(const plan::SsdAddInitialStateBackwardArgs<DeviceBuffer>& k);
absl::Status RunAttentionForward(const Args& a, const plan::AttentionForwardArgs<DeviceBuffer>& k);
absl::Status RunAttentionBackward(const Args& a,
                                  const plan::AttentionBackwardArgs<DeviceBuffer>& k);
size_t WorkspaceBytes(const plan::AttentionBackwardArgs<DeviceBuffer>& k);

// The collectives (CudaBackendCollectives.cpp); their workspace holds their scratch.
absl::Status RunHaloExchangeForward(const Args& a,
                                    const plan::HaloExchangeForwardArgs<DeviceBuffer>& k);
size_t WorkspaceBytes(const plan::HaloExchangeForwardArgs<DeviceBuffer>& k);
absl::Status RunHaloExchangeBackward(const Args& a,
                                     const plan::HaloExchangeBackwardArgs<DeviceBuffer>& k);
size_t WorkspaceBytes(const plan::HaloExchangeBackwardArgs<DeviceBuffer>& k);
absl::Status RunStateScanForward(const Args& a, const plan::StateScanForwardArgs<DeviceBuffer>& k);
size_t WorkspaceBytes(const plan::StateScanForwardArgs<DeviceBuffer>& k, const plan::Mesh& mesh);
absl::Status RunStateScanBackward(const Args& a,
                                  const plan::StateScanBackwardArgs<DeviceBuffer>& k);
size_t WorkspaceBytes(const plan::StateScanBackwardArgs<DeviceBuffer>& k, const plan::Mesh& mesh);
absl::Status RunRingAttentionForward(const Args& a,
                                     const plan::RingAttentionForwardArgs<DeviceBuffer>& k);
size_t WorkspaceBytes(const plan::RingAttentionForwardArgs<DeviceBuffer>& k,
                      const plan::Mesh& mesh);
absl::Status RunRingAttentionBackward(const Args& a,
                                      const plan::RingAttentionBackwardArgs<DeviceBuffer>& k);
size_t WorkspaceBytes(const plan::RingAttentionBackwardArgs<DeviceBuffer>& k,
                      const plan::Mesh& mesh);
absl::Status RunAllReduce(const Args& a, const plan::AllReduceArgs<DeviceBuffer>& k);

// Expert parallelism (CudaBackendExperts.cpp).
absl::Status RunMoeExpertsEpForward(const Args& a,
                                    const plan::MoeExpertsEpForwardArgs<DeviceBuffer>& k);
size_t WorkspaceBytes(const plan::MoeExpertsEpForwardArgs<DeviceBuffer>& k);
absl::Status RunMoeExpertsEpBackward(const Args& a,
                                     const plan::MoeExpertsEpBackwardArgs<DeviceBuffer>& k);
size_t WorkspaceBytes(const plan::MoeExpertsEpBackwardArgs<DeviceBuffer>& k);

// The shapes the sequence kernels take, from a step's arguments (ssd_scan, ssd_final_state,
// ssd_add_initial_state; attention). The plan's chunk as it is (CheckPlanRunsOnCuda requires the
// kernels' 256): the CUDA kernels pad a partial last chunk themselves, so unlike the CPU wrapper
// there is no capping at seq. ssd_add_initial_state is not chunked (it has no chunk); its
// kernels take the scan's shapes, chunk 256 among them.
template <typename SsdArgs>
cuda::SsdShape SsdShapeOf(const SsdArgs& k) {
  int64_t chunk = 256;
  if constexpr (requires { k.chunk; }) chunk = k.chunk;
  return cuda::SsdShape{.batch = k.batch,
                        .seq = k.seq,
                        .heads = k.heads,
                        .head_dim = k.head_dim,
                        .groups = k.groups,
                        .state = k.state,
                        .chunk = chunk};
}
// Queries and keys are the same positions.
template <typename AttentionArgs>
cuda::AttentionShape AttentionShapeOf(const AttentionArgs& k) {
  return cuda::AttentionShape{.batch = k.batch,
                              .q_len = k.seq,
                              .kv_len = k.seq,
                              .q_heads = k.q_heads,
                              .kv_heads = k.kv_heads,
                              .head_dim = k.head_dim};
}

}  // namespace hcp::cuda_backend::detail
