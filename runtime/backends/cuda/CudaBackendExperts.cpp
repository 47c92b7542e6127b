// Expert parallelism on the GPUs: moe_experts_ep forward and backward over the ranks of an ep
// group (Communicator.h's kEp), each holding E/ep consecutive experts of every MoE layer.
//
// Who sends what: comm/ExpertRoutes.h's TokenRoutes. A token's row goes once to each rank owning
// one of its experts, with its k gates and its k experts counted from that owner's first (-1 for
// a slot another rank owns); the owner runs moe_experts_forward/backward on the rows that came,
// k slots each, so a row comes back as the gated sum over the owner's slots (the backward: the
// dx share of those slots and each slot's dgate). Home adds the owners' rows in rank order. The
// CPU reference sends a row per slot and sums a token's slots at home in slot order; here the
// partial sums are rounded to bf16 once more, and about k / ep times fewer rows cross the links
// (for tiny at ep = 2, ~2 rows a token instead of 6).
//
// The routes' counts are made on the host from the expert ids, which the executor copies there as
// soon as the step writing them has run (StepResources::host_expert_ids). The row and per-expert
// slot counts go through the host communicator, so the experts' GEMMs know their row counts
// without waiting for the device; the routes' arrays are made on the device (moe_token_routes)
// from the same ids.
// NCCL moves the rows (grouped sends and receives, AllToAllV). Scratch is sized for the worst
// case, every token of every rank of the group sent here: ep * tokens rows of k slots.
#include <cstdint>
#include <span>

#include "runtime/backends/cuda/StepArgs.h"
#include "runtime/comm/ExpertRoutes.h"
#include "runtime/kernels/cuda/Kernels.h"
#include "runtime/support/Status.h"

namespace hcp::cuda_backend::detail {
namespace {

using comm::Group;

// experts: E, the global count.
struct EpShape {
  int64_t tokens, hidden, inner, experts, k, ep;
  int64_t max_sent() const { return tokens * ep; }      // rows: each token once to each owner
  int64_t max_received() const { return ep * tokens; }  // rows: every token of every rank
  int64_t local_experts() const { return experts / ep; }
};

template <typename ExpertsEpArgs>
EpShape EpShapeOf(const ExpertsEpArgs& args) {
  return EpShape{args.tokens, args.hidden, args.inner, args.experts, args.k, args.ep};
}

// The workspace pieces, in order; `experts` is the rest, for moe_experts_forward/backward.
struct EpScratch {
  // The routes (moe_token_routes' arrays of the same names), made on the device.
  int32_t* row_token = nullptr;    // [max sent]
  int32_t* row_slot = nullptr;     // [max sent * k]
  int32_t* row_experts = nullptr;  // [max sent * k]; sent as they are
  int32_t* token_row = nullptr;    // [tokens * ep]
  int32_t* slot_row = nullptr;     // [tokens * k]
  int32_t* recv_ids = nullptr;     // [max received * k]
  bf16* send_x = nullptr;          // [max sent, hidden]; later the rows that come back
  bf16* recv_x = nullptr;          // [max received, hidden]
  bf16* rows = nullptr;            // [max received, hidden] the owner's sums / dx shares
  float* send_gates = nullptr;     // [max sent * k]; in the backward later the dgates back
  float* recv_gates = nullptr;     // [max received * k]
  // Backward only.
  float* row_dgates = nullptr;  // [max received * k]
  bf16* send_dout = nullptr;    // [max sent, hidden]
  bf16* recv_dout = nullptr;    // [max received, hidden]
  cuda::Workspace experts;
  size_t bytes = 0;

  static EpScratch Carve(cuda::Workspace workspace, const EpShape& s, bool backward) {
    Carver carver(workspace);
    EpScratch w;
    const int64_t S = s.max_sent(), R = s.max_received(), H = s.hidden, k = s.k;
    w.row_token = carver.take<int32_t>(S);
    w.row_slot = carver.take<int32_t>(S * k);
    w.row_experts = carver.take<int32_t>(S * k);
    w.token_row = carver.take<int32_t>(s.tokens * s.ep);
    w.slot_row = carver.take<int32_t>(s.tokens * k);
    w.recv_ids = carver.take<int32_t>(R * k);
    w.send_x = carver.take<bf16>(S * H);
    w.recv_x = carver.take<bf16>(R * H);
    w.rows = carver.take<bf16>(R * H);
    w.send_gates = carver.take<float>(S * k);
    w.recv_gates = carver.take<float>(R * k);
    if (backward) {
      w.row_dgates = carver.take<float>(R * k);
      w.send_dout = carver.take<bf16>(S * H);
      w.recv_dout = carver.take<bf16>(R * H);
    }
    w.experts = carver.rest();
    const size_t experts_bytes =
        backward ? cuda::moe_experts_backward_workspace_bytes(R, H, s.inner, s.local_experts(), k)
                 : cuda::moe_experts_forward_workspace_bytes(R, H, s.inner, s.local_experts(), k);
    w.bytes = carver.used() + experts_bytes;
    return w;
  }
};

// Routes the tokens to their experts' owners: the counts on the host, exchanged over the ep
// group (collective over kEp), the routes' arrays on the device from the same ids. A slot whose
// expert is outside [0, E) goes nowhere and contributes nothing, as on one GPU (the ids come from
// moe_route.forward, in range by construction).
absl::StatusOr<comm::TokenRoutes> RouteTokens(const Args& a, const int32_t* device_ids,
                                              const EpShape& s, const EpScratch& w) {
  HCP_ASSIGN_OR_RETURN(const std::span<const int32_t> ids, a.host_expert_ids(s.tokens * s.k));
  comm::TokenRoutes r = comm::CountTokensByOwner(ids, s.k, s.experts, s.ep);
  comm::ExchangeTokenCounts(a.nccl().host(), r);
  HCP_RETURN_IF_ERROR(
      Done(cuda::moe_token_routes(a.stream(), w.row_token, w.row_slot, w.row_experts, w.token_row,
                                  w.slot_row, device_ids, s.tokens, s.k, s.experts, s.ep)));
  return r;
}

}  // namespace

// expert_ids: global ids; w_in, w_out: this rank's experts.
absl::Status RunMoeExpertsEpForward(const Args& a,
                                    const plan::MoeExpertsEpForwardArgs<DeviceBuffer>& args) {
  const EpShape s = EpShapeOf(args);
  const EpScratch w = EpScratch::Carve(a.workspace(), s, /*backward=*/false);
  if (a.workspace().bytes < w.bytes) return absl::InternalError("workspace too small (a bug)");
  HCP_ASSIGN_OR_RETURN(comm::TokenRoutes route,
                       RouteTokens(a, args.expert_ids.as<int32_t>(), s, w));
  const int64_t H = s.hidden, k = s.k, sent = route.sent();
  cudaStream_t stream = a.stream();
  comm::NcclCommunicator& nccl = a.nccl();

  // Out: each sent row's x, its slots' gates and experts.
  HCP_RETURN_IF_ERROR(
      Done(cuda::moe_gather_rows(stream, w.send_x, args.x.as<bf16>(), w.row_token, sent, H, 1)));
  HCP_RETURN_IF_ERROR(Done(
      cuda::moe_gather_values(stream, w.send_gates, args.gates.as<float>(), w.row_slot, sent * k)));
  nccl.GroupStart();
  nccl.AllToAllV(w.send_x, route.SendCounts(H), w.recv_x, route.RecvCounts(H), ncclBfloat16,
                 Group::kEp, stream);
  nccl.AllToAllV(w.row_experts, route.SendCounts(k), w.recv_ids, route.RecvCounts(k), ncclInt32,
                 Group::kEp, stream);
  nccl.AllToAllV(w.send_gates, route.SendCounts(k), w.recv_gates, route.RecvCounts(k), ncclFloat32,
                 Group::kEp, stream);
  nccl.GroupEnd();

  // This rank's experts on every row that arrived: rows = the gated sums over this rank's slots.
  HCP_RETURN_IF_ERROR(Done(cuda::moe_experts_forward(
      a.gemm(), stream, w.rows, w.recv_x, w.recv_gates, w.recv_ids, args.w_in.as<bf16>(),
      args.w_out.as<bf16>(), route.received(), H, s.inner, s.local_experts(), k, w.experts,
      cuda::ExpertRoutingOnHost{.expert_counts = route.recv_slots.data()})));

  // Back in the order they came, into send_x; then each token's owners' rows added.
  nccl.AllToAllV(w.rows, route.RecvCounts(H), w.send_x, route.SendCounts(H), ncclBfloat16,
                 Group::kEp, stream);
  return Done(cuda::moe_combine_rows(stream, args.out.as<bf16>(), w.send_x, /*gates=*/nullptr,
                                     w.token_row, s.tokens, H, s.ep));
}
size_t WorkspaceBytes(const plan::MoeExpertsEpForwardArgs<DeviceBuffer>& args) {
  return EpScratch::Carve(cuda::Workspace{}, EpShapeOf(args), /*backward=*/false).bytes;
}

// dw_in, dw_out: this rank's experts', summed over every row of the ep group that reached them.
absl::Status RunMoeExpertsEpBackward(const Args& a,
                                     const plan::MoeExpertsEpBackwardArgs<DeviceBuffer>& args) {
  const EpShape s = EpShapeOf(args);
  const EpScratch w = EpScratch::Carve(a.workspace(), s, /*backward=*/true);
  if (a.workspace().bytes < w.bytes) return absl::InternalError("workspace too small (a bug)");
  HCP_ASSIGN_OR_RETURN(comm::TokenRoutes route,
                       RouteTokens(a, args.expert_ids.as<int32_t>(), s, w));
  const int64_t H = s.hidden, k = s.k, sent = route.sent();
  cudaStream_t stream = a.stream();
  comm::NcclCommunicator& nccl = a.nccl();

  // Out: each sent row's x and dout, its slots' gates and experts (x again rather than kept
  // from the forward: no buffer of data-dependent size lives between the two).
  HCP_RETURN_IF_ERROR(
      Done(cuda::moe_gather_rows(stream, w.send_x, args.x.as<bf16>(), w.row_token, sent, H, 1)));
  HCP_RETURN_IF_ERROR(Done(
      cuda::moe_gather_rows(stream, w.send_dout, args.dout.as<bf16>(), w.row_token, sent, H, 1)));
  HCP_RETURN_IF_ERROR(Done(
      cuda::moe_gather_values(stream, w.send_gates, args.gates.as<float>(), w.row_slot, sent * k)));
  nccl.GroupStart();
  nccl.AllToAllV(w.send_x, route.SendCounts(H), w.recv_x, route.RecvCounts(H), ncclBfloat16,
                 Group::kEp, stream);
  nccl.AllToAllV(w.send_dout, route.SendCounts(H), w.recv_dout, route.RecvCounts(H), ncclBfloat16,
                 Group::kEp, stream);
  nccl.AllToAllV(w.row_experts, route.SendCounts(k), w.recv_ids, route.RecvCounts(k), ncclInt32,
                 Group::kEp, stream);
  nccl.AllToAllV(w.send_gates, route.SendCounts(k), w.recv_gates, route.RecvCounts(k), ncclFloat32,
                 Group::kEp, stream);
  nccl.GroupEnd();

  // The local experts' backward on every row that arrived: rows = the dx share of this rank's
  // slots, row_dgates their dgates (0 for the other ranks' slots); dw_in / dw_out are complete
  // for this rank's experts.
  HCP_RETURN_IF_ERROR(Done(cuda::moe_experts_backward(
      a.gemm(), stream, w.rows, w.row_dgates, args.dw_in.as<bf16>(), args.dw_out.as<bf16>(),
      w.recv_dout, w.recv_x, w.recv_gates, w.recv_ids, args.w_in.as<bf16>(), args.w_out.as<bf16>(),
      route.received(), H, s.inner, s.local_experts(), k, w.experts,
      cuda::ExpertRoutingOnHost{.expert_counts = route.recv_slots.data()})));

  // Back: the dx shares into send_x, the dgates into send_gates; dx adds each token's owners'
  // shares, and each slot takes its dgate from the row that went to its expert's owner.
  nccl.GroupStart();
  nccl.AllToAllV(w.rows, route.RecvCounts(H), w.send_x, route.SendCounts(H), ncclBfloat16,
                 Group::kEp, stream);
  nccl.AllToAllV(w.row_dgates, route.RecvCounts(k), w.send_gates, route.SendCounts(k), ncclFloat32,
                 Group::kEp, stream);
  nccl.GroupEnd();
  HCP_RETURN_IF_ERROR(
      Done(cuda::moe_combine_rows(stream, args.dx.as<bf16>(), w.send_x,
                                  /*gates=*/nullptr, w.token_row, s.tokens, H, s.ep)));
  return Done(cuda::moe_gather_values(stream, args.dgates.as<float>(), w.send_gates, w.slot_row,
                                      s.tokens * k));
}
size_t WorkspaceBytes(const plan::MoeExpertsEpBackwardArgs<DeviceBuffer>& args) {
  return EpScratch::Carve(cuda::Workspace{}, EpShapeOf(args), /*backward=*/true).bytes;
}

}  // namespace hcp::cuda_backend::detail
