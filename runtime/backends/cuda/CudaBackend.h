// The CUDA backend: runs one plan step on one GPU with the kernels of runtime/kernels/cuda
// (bf16 tensors, fp32 math, cuBLASLt GEMMs).
//
// One wrapper per kernel of KernelTable.txt (CudaBackend.cpp, in table order; the Mamba and
// attention ones in CudaBackendSequence.cpp) takes the step's arguments by name, in its kernel's
// argument struct, and queues the kernel on the step's stream, as
// runtime/backends/cpu/CpuBackend.cpp does for the reference kernels. The plans it runs are "bf16
// plans" (hybridcp compile --dtype bf16): each kernel takes the dtypes its CUDA kernel takes (bf16
// activations and weights; fp32 for the Mamba dt/A/D chain, the SSD states, attention lse,
// routing gates and the loss; see CheckPlanRunsOnCuda), and the elementwise kernels run in
// whichever of f32 and bf16 their step's buffers have.
//
// Several GPUs: the collectives (halo exchange, state scan, ring attention, all-reduce) go
// through NCCL (CudaBackendCollectives.cpp), one GPU per rank, for context and data
// parallelism; the expert-parallel MoE kernels exchange token rows over the ep group with NCCL
// all-to-alls (CudaBackendExperts.cpp).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "runtime/comm/NcclCommunicator.h"
#include "runtime/kernels/cuda/Kernels.h"
#include "runtime/plan/CudaRules.h"  // CheckPlanRunsOnCuda
#include "runtime/plan/Plan.h"

namespace hcp::cuda_backend {

// Device base address of each arena, indexed by plan::Arena; each holds plan.arena_bytes[arena]
// bytes.
using DeviceArenas = std::array<std::byte*, plan::kNumArenas>;

// What a step runs with besides its buffers. One set per stream: the workspace and the GEMM
// context are reused by every step queued on it.
struct StepResources {
  cudaStream_t stream = nullptr;
  cuda::GemmContext* gemm = nullptr;
  cuda::Workspace workspace;  // at least WorkspaceBytes(plan), 256-byte aligned
  // For a MoE experts step (HostCopies.h): its expert ids on the host, copied there by the
  // executor before the step is queued. The wrappers count and route from them, so the experts'
  // GEMMs get their row counts without waiting for the device.
  const int32_t* host_expert_ids = nullptr;
  int32_t* bad_position = nullptr;  // device int32, set to INT32_MAX by the executor before a step
                                    // run; embedding.forward and cross_entropy.forward lower it
                                    // to the first bad token id / target position they see
  // For the collectives (null / unused in a one-rank plan): the ranks' NCCL communicator, a
  // second stream for ring attention's K/V transfers, and two events that order it against
  // `stream` (compute_done: recorded on `stream`; comm_done: on comm_stream).
  comm::NcclCommunicator* nccl = nullptr;
  cudaStream_t comm_stream = nullptr;
  cudaEvent_t compute_done = nullptr;
  cudaEvent_t comm_done = nullptr;
  // Packed documents (a plan with position_ids): false when the micro-batch holds one document
  // per row. The steps then pass no positions (Args::positions) and run the kernels of a plan
  // without --documents, which give the same values at no extra cost.
  bool packs_documents = true;
};

// The largest workspace any step of `plan` needs (the max over steps of its kernel's
// *_workspace_bytes, plus the scratch a wrapper keeps there: cross_entropy.backward's recomputed
// lse, the collectives' transfer buffers and ring attention's fp32 sums).
size_t WorkspaceBytes(const plan::Plan& plan);

// The scratch the steps that run beside the compute stream need (the `beside` kernels): their
// largest, to be given apart from the shared workspace.
size_t BesideComputeWorkspaceBytes(const plan::Plan& plan);

// Queues step `step_index` of `plan` (which has passed CheckPlanRunsOnCuda) on resources.stream
// and returns without waiting (the MoE experts steps take their routing from
// resources.host_expert_ids). A bad token id or
// target does not fail here: it lowers *resources.bad_position (see StepResources). Errors (a
// kernel's refusal, a launch failure) come back as Internal, starting with the step: "step 3
// (gemm): gemm: <cuBLASLt's message>".
absl::Status RunCudaStep(const plan::Plan& plan, size_t step_index, const DeviceArenas& arenas,
                         const StepResources& resources);

// A kernel's Status as an absl::Status: OK, or Internal "where: message".
absl::Status FromCuda(const cuda::Status& status);
// A CUDA runtime call's result as an absl::Status: OK, or Internal "what: <cudaGetErrorString>".
absl::Status FromCuda(cudaError_t error, const char* what);

}  // namespace hcp::cuda_backend
