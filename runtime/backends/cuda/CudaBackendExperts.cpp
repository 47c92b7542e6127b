// Expert parallelism on the GPUs: moe_experts_ep forward and backward over the ranks of an ep
// group (Communicator.h's kEp), each holding E/ep consecutive experts of every MoE layer.
//
// Who sends what is the CPU reference's (runtime/backends/cpu/DistKernels.cpp): every (token,
// slot) pair travels to the rank owning its expert, in send order "by owner rank, then slot";
// the owner runs its experts on the rows that arrived (moe_experts_forward/backward with k = 1)
// and sends the results back in the order they came. The gate multiply and the sum over a
// token's slots happen at home with the single-GPU kernel's combine (fp32, slot order), so a
// row's numbers are the ones one GPU would compute; only the experts' GEMMs see other row counts.
//
// The routing is decided on the host: the expert ids come over (one device-to-host copy and a
// wait through the NCCL communicator, so a failed peer ends the job instead of hanging), the
// per-peer counts go through the host communicator, and the orders go back up. NCCL moves the
// rows (grouped sends and receives, AllToAllV). Scratch is sized for the worst case, every slot
// of every rank of the group routed to this one: ep * tokens * k rows.
#include <cstdint>
#include <span>
#include <vector>

#include "absl/strings/str_format.h"
#include "runtime/backends/cuda/StepArgs.h"
#include "runtime/comm/ExpertRoutes.h"
#include "runtime/kernels/cuda/Kernels.h"
#include "runtime/support/Status.h"

namespace hcp::cuda_backend::detail {
namespace {

using comm::Group;

// ints: tokens, hidden, inner, experts (E, global), k, ep.
struct EpShape {
  int64_t tokens, hidden, inner, experts, k, ep;
  int64_t slots() const { return tokens * k; }
  int64_t max_received() const { return ep * tokens * k; }
  int64_t local_experts() const { return experts / ep; }
};

EpShape EpShapeOf(const plan::Step& step) {
  const std::vector<int64_t>& v = step.ints;
  return EpShape{v[0], v[1], v[2], v[3], v[4], v[5]};
}

// The workspace pieces, in order; `experts` is the rest, for moe_experts_forward/backward.
struct EpScratch {
  int32_t* order = nullptr;     // [slots] slot indices in send order
  int32_t* position = nullptr;  // [slots] slot -> its place in send order (-1: not sent)
  int32_t* send_ids = nullptr;  // [slots] the expert each sent row is for, local to its owner
  int32_t* recv_ids = nullptr;  // [max received]
  bf16* send_x = nullptr;       // [slots, hidden]; later the rows that come back
  bf16* recv_x = nullptr;       // [max received, hidden]
  bf16* rows = nullptr;         // [max received, hidden] the experts' outputs / dx shares
  // Backward only.
  float* send_gates = nullptr;  // [slots]; later the dgates that come back
  float* recv_gates = nullptr;  // [max received]
  float* row_dgates = nullptr;  // [max received]
  bf16* send_dout = nullptr;    // [slots, hidden]
  bf16* recv_dout = nullptr;    // [max received, hidden]
  cuda::Workspace experts;
  size_t bytes = 0;

  static EpScratch Carve(cuda::Workspace workspace, const EpShape& s, bool backward) {
    Carver carver(workspace);
    EpScratch w;
    const int64_t S = s.slots(), R = s.max_received(), H = s.hidden;
    w.order = carver.take<int32_t>(S);
    w.position = carver.take<int32_t>(S);
    w.send_ids = carver.take<int32_t>(S);
    w.recv_ids = carver.take<int32_t>(R);
    w.send_x = carver.take<bf16>(S * H);
    w.recv_x = carver.take<bf16>(R * H);
    w.rows = carver.take<bf16>(R * H);
    if (backward) {
      w.send_gates = carver.take<float>(S);
      w.recv_gates = carver.take<float>(R);
      w.row_dgates = carver.take<float>(R);
      w.send_dout = carver.take<bf16>(S * H);
      w.recv_dout = carver.take<bf16>(R * H);
    }
    w.experts = carver.rest();
    const size_t experts_bytes =
        backward ? cuda::moe_experts_backward_workspace_bytes(R, H, s.inner, s.local_experts(), 1)
                 : cuda::moe_experts_forward_workspace_bytes(R, H, s.inner, s.local_experts(), 1);
    w.bytes = carver.used() + experts_bytes;
    return w;
  }
};

// Reads the expert ids (waiting for the step's stream), routes the slots to their owners
// (comm/ExpertRoutes.h: the CPU backend's routes; the counts go over the host communicator) and
// uploads the orders into the scratch. A slot whose expert is outside [0, E) stays home and
// contributes nothing, as on one GPU (the ids come from moe_route.forward, in range by
// construction). Collective over kEp.
absl::StatusOr<comm::ExpertRoutes> RouteSlots(const Args& a, const int32_t* device_experts,
                                              const EpShape& s, const EpScratch& w) {
  std::vector<int32_t> experts(s.slots());
  // The peers are about to exchange counts with this rank: one that cannot read its ids ends the
  // job rather than leave them waiting in that collective.
  comm::Communicator& host = a.nccl().host();
  if (absl::Status copied =
          FromCuda(cudaMemcpyAsync(experts.data(), device_experts, sizeof(int32_t) * experts.size(),
                                   cudaMemcpyDeviceToHost, a.stream()),
                   "copying the expert ids to the host");
      !copied.ok()) {
    host.Abort(copied);
  }
  a.nccl().Wait(a.stream(), absl::StrFormat("%s's expert ids", plan::KernelName(a.step().kernel)));
  comm::ExpertRoutes r = comm::RouteToExpertOwners(host, experts, s.experts, s.ep);
  // Pageable host memory: each copy returns once its source has been staged.
  for (auto [to, from] : {std::pair{w.order, &r.order}, std::pair{w.send_ids, &r.local_expert},
                          std::pair{w.position, &r.position}}) {
    if (from->empty()) continue;
    HCP_RETURN_IF_ERROR(FromCuda(cudaMemcpyAsync(to, from->data(), sizeof(int32_t) * from->size(),
                                                 cudaMemcpyHostToDevice, a.stream()),
                                 "uploading the expert routing"));
  }
  return r;
}

}  // namespace

size_t ExpertsEpWorkspaceBytes(const plan::Step& step) {
  const bool backward = step.kernel == plan::KernelId::MoeExpertsEpBackward;
  return EpScratch::Carve(cuda::Workspace{}, EpShapeOf(step), backward).bytes;
}

// ins: x, gates, experts (i32, global ids), w_in, w_out (this rank's experts). outs: out.
absl::Status RunMoeExpertsEpForward(const Args& a) {
  const EpShape s = EpShapeOf(a.step());
  const EpScratch w = EpScratch::Carve(a.workspace(), s, /*backward=*/false);
  if (a.workspace().bytes < w.bytes) return absl::InternalError("workspace too small (a bug)");
  HCP_ASSIGN_OR_RETURN(comm::ExpertRoutes route, RouteSlots(a, a.in_i32(2), s, w));
  const int64_t H = s.hidden, sent = static_cast<int64_t>(route.order.size());
  cudaStream_t stream = a.stream();
  comm::NcclCommunicator& nccl = a.nccl();

  // Out: each sent slot's x row and its expert.
  HCP_RETURN_IF_ERROR(
      Done(cuda::moe_gather_rows(stream, w.send_x, a.in<bf16>(0), w.order, sent, H, s.k)));
  nccl.GroupStart();
  nccl.AllToAllV(w.send_x, route.SendCounts(H), w.recv_x, route.RecvCounts(H), ncclBfloat16,
                 Group::kEp, stream);
  nccl.AllToAllV(w.send_ids, route.SendCounts(1), w.recv_ids, route.RecvCounts(1), ncclInt32,
                 Group::kEp, stream);
  nccl.GroupEnd();
  // The experts wait for their row counts on the host: wait for the exchange here, where a
  // failed peer ends the job, not inside them.
  nccl.Wait(stream, "moe_experts_ep.forward's all-to-all");

  // This rank's experts on every row that arrived, gate 1: rows = the experts' outputs.
  HCP_RETURN_IF_ERROR(Done(cuda::moe_experts_forward(
      a.gemm(), stream, w.rows, w.recv_x, /*gates=*/nullptr, w.recv_ids, a.in<bf16>(3),
      a.in<bf16>(4), route.received(), H, s.inner, s.local_experts(), /*k=*/1, w.experts)));

  // Back in the order they came, into send_x; then the gated sum over each token's slots.
  nccl.AllToAllV(w.rows, route.RecvCounts(H), w.send_x, route.SendCounts(H), ncclBfloat16,
                 Group::kEp, stream);
  return Done(cuda::moe_combine_rows(stream, a.out<bf16>(0), w.send_x, a.in<float>(1), w.position,
                                     s.tokens, H, s.k));
}

// ins: dout, x, gates, experts (i32), w_in, w_out. outs: dx, dgates, dw_in, dw_out (this rank's
// experts, summed over every row of the ep group that reached them).
absl::Status RunMoeExpertsEpBackward(const Args& a) {
  const EpShape s = EpShapeOf(a.step());
  const EpScratch w = EpScratch::Carve(a.workspace(), s, /*backward=*/true);
  if (a.workspace().bytes < w.bytes) return absl::InternalError("workspace too small (a bug)");
  HCP_ASSIGN_OR_RETURN(comm::ExpertRoutes route, RouteSlots(a, a.in_i32(3), s, w));
  const int64_t H = s.hidden, sent = static_cast<int64_t>(route.order.size());
  cudaStream_t stream = a.stream();
  comm::NcclCommunicator& nccl = a.nccl();

  // Out: each sent slot's x and dout rows, gate and expert (x again rather than kept from the
  // forward: no buffer of data-dependent size lives between the two).
  HCP_RETURN_IF_ERROR(
      Done(cuda::moe_gather_rows(stream, w.send_x, a.in<bf16>(1), w.order, sent, H, s.k)));
  HCP_RETURN_IF_ERROR(
      Done(cuda::moe_gather_rows(stream, w.send_dout, a.in<bf16>(0), w.order, sent, H, s.k)));
  HCP_RETURN_IF_ERROR(
      Done(cuda::moe_gather_values(stream, w.send_gates, a.in<float>(2), w.order, sent)));
  nccl.GroupStart();
  nccl.AllToAllV(w.send_x, route.SendCounts(H), w.recv_x, route.RecvCounts(H), ncclBfloat16,
                 Group::kEp, stream);
  nccl.AllToAllV(w.send_dout, route.SendCounts(H), w.recv_dout, route.RecvCounts(H), ncclBfloat16,
                 Group::kEp, stream);
  nccl.AllToAllV(w.send_gates, route.SendCounts(1), w.recv_gates, route.RecvCounts(1), ncclFloat32,
                 Group::kEp, stream);
  nccl.AllToAllV(w.send_ids, route.SendCounts(1), w.recv_ids, route.RecvCounts(1), ncclInt32,
                 Group::kEp, stream);
  nccl.GroupEnd();
  nccl.Wait(stream, "moe_experts_ep.backward's all-to-all");

  // The local experts' backward, one row per arrived slot: rows = its dx share, row_dgates its
  // dgate; dw_in / dw_out are complete for this rank's experts.
  HCP_RETURN_IF_ERROR(Done(cuda::moe_experts_backward(
      a.gemm(), stream, w.rows, w.row_dgates, a.out<bf16>(2), a.out<bf16>(3), w.recv_dout, w.recv_x,
      w.recv_gates, w.recv_ids, a.in<bf16>(4), a.in<bf16>(5), route.received(), H, s.inner,
      s.local_experts(), /*k=*/1, w.experts)));

  // Back: the dx shares into send_x, the dgates into send_gates; dx sums a token's shares in
  // slot order (as one GPU does), dgates go to their slots.
  nccl.GroupStart();
  nccl.AllToAllV(w.rows, route.RecvCounts(H), w.send_x, route.SendCounts(H), ncclBfloat16,
                 Group::kEp, stream);
  nccl.AllToAllV(w.row_dgates, route.RecvCounts(1), w.send_gates, route.SendCounts(1), ncclFloat32,
                 Group::kEp, stream);
  nccl.GroupEnd();
  HCP_RETURN_IF_ERROR(
      Done(cuda::moe_combine_rows(stream, a.out<bf16>(0), w.send_x,
                                  /*gates=*/nullptr, w.position, s.tokens, H, s.k)));
  return Done(
      cuda::moe_gather_values(stream, a.out<float>(1), w.send_gates, w.position, s.slots()));
}

}  // namespace hcp::cuda_backend::detail
