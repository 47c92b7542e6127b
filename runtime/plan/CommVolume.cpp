#include "runtime/plan/CommVolume.h"

#include "runtime/plan/KernelTable.h"
#include "runtime/plan/Plan.h"

namespace hcp::plan {
namespace {

constexpr uint64_t kFloat = sizeof(float);

// Whether segment j and segment j + step live on different cp ranks (both must exist).
bool CrossesRanks(const Mesh& mesh, int64_t j, int64_t step) {
  int64_t other = j + step;
  if (other < 0 || other >= mesh.segments()) return false;
  return mesh.OwnerOf(j).cp_index != mesh.OwnerOf(other).cp_index;
}

// Bytes a ring all-reduce over n ranks sends per rank for `bytes` of data.
uint64_t RingAllReduce(uint64_t bytes, int64_t n) {
  return n <= 1 ? 0 : 2 * bytes * static_cast<uint64_t>(n - 1) / static_cast<uint64_t>(n);
}

int64_t GroupSize(const Mesh& mesh, int64_t group) {
  if (group == 1) return mesh.cp;
  if (group == 2) return mesh.dp;
  return mesh.world();
}

// Each collective's bytes sent by cp rank `me` (every dp replica sends the same), from its
// kernel's arguments.

// Forward: the tail of each segment -> its successor; backward: the halo gradient -> its
// predecessor.
template <typename Halo>
uint64_t HaloBytes(const Mesh& mesh, const Halo& h, int64_t me, int64_t direction) {
  uint64_t bytes = 0;
  for (int64_t k = 0; k < h.segs; ++k) {
    if (CrossesRanks(mesh, mesh.GlobalSegment(me, k), direction))
      bytes += h.batch * h.width * h.channels * kFloat;
  }
  return bytes;
}

template <typename Scan>
uint64_t StateScanBytes(const Mesh& mesh, const Scan& s, int64_t me, int64_t direction) {
  const uint64_t states = s.batch * s.heads * s.head_dim * s.state * kFloat;  // one segment
  if (s.strategy == 0) {  // all-gather of [g | states] of every local segment to the cp-1 others
    const uint64_t mine = s.segs * (s.batch * s.heads * kFloat + states);
    return mine * static_cast<uint64_t>(mesh.cp - 1);
  }
  uint64_t bytes = 0;
  for (int64_t k = 0; k < s.segs; ++k) {
    if (CrossesRanks(mesh, mesh.GlobalSegment(me, k), direction)) bytes += states;
  }
  return bytes;
}

// The forward sends K and V cp-1 times; the backward K, V, dK and dV, and dK and dV home.
template <typename Ring>
uint64_t RingBytes(const Mesh& mesh, const Ring& r, bool forward) {
  if (mesh.cp == 1) return 0;
  const uint64_t kv = r.batch * r.seq * r.kv_heads * r.head_dim * kFloat;  // K or V of one rank
  const uint64_t shifts = static_cast<uint64_t>(mesh.cp - 1);
  return forward ? shifts * 2 * kv : shifts * 4 * kv + 2 * kv;
}

// Data-dependent: counted for uniform routing, (ep-1)/ep of the tokens*k slots leave the rank;
// plus the counts (int64 per peer). Forward: out (id, x) in fp32, back the expert output in
// double. Backward: out (id, gate, x, dout), back (dgate, dx share) in double.
template <typename Experts>
uint64_t ExpertsBytes(const Experts& e, bool forward) {
  if (e.ep <= 1) return 0;
  const uint64_t hidden = e.hidden;
  const uint64_t per_slot =
      forward ? (4 + 4 * hidden) + 8 * hidden : (8 + 8 * hidden) + 8 * (hidden + 1);
  const uint64_t slots = static_cast<uint64_t>(e.tokens * e.k);
  const uint64_t peers = static_cast<uint64_t>(e.ep - 1);
  return slots * per_slot * peers / static_cast<uint64_t>(e.ep) + sizeof(int64_t) * peers;
}

uint64_t StepBytes(const Mesh& mesh, const Step& step, int64_t me) {
  switch (step.kernel) {
    case KernelId::HaloExchangeForward:
      return HaloBytes(mesh, DecodeStep<HaloExchangeForwardArgs>(step), me, 1);
    case KernelId::HaloExchangeBackward:
      return HaloBytes(mesh, DecodeStep<HaloExchangeBackwardArgs>(step), me, -1);
    case KernelId::StateScanForward:
      return StateScanBytes(mesh, DecodeStep<StateScanForwardArgs>(step), me, 1);
    case KernelId::StateScanBackward:
      return StateScanBytes(mesh, DecodeStep<StateScanBackwardArgs>(step), me, -1);
    case KernelId::RingAttentionForward:
      return RingBytes(mesh, DecodeStep<RingAttentionForwardArgs>(step), /*forward=*/true);
    case KernelId::RingAttentionBackward:
      return RingBytes(mesh, DecodeStep<RingAttentionBackwardArgs>(step), /*forward=*/false);
    case KernelId::MoeExpertsEpForward:
      return ExpertsBytes(DecodeStep<MoeExpertsEpForwardArgs>(step), /*forward=*/true);
    case KernelId::MoeExpertsEpBackward:
      return ExpertsBytes(DecodeStep<MoeExpertsEpBackwardArgs>(step), /*forward=*/false);
    case KernelId::AllReduce: {  // summed in doubles
      const auto r = DecodeStep<AllReduceArgs>(step);
      return RingAllReduce(r.n * sizeof(double), GroupSize(mesh, r.group));
    }
    default:
      return 0;
  }
}

}  // namespace

std::string_view TrafficKind(KernelId kernel) {
  switch (kernel) {
    case KernelId::HaloExchangeForward:
    case KernelId::HaloExchangeBackward:
      return "halo_exchange";
    case KernelId::StateScanForward:
    case KernelId::StateScanBackward:
      return "state_scan";
    case KernelId::RingAttentionForward:
    case KernelId::RingAttentionBackward:
      return "ring_attention";
    case KernelId::MoeExpertsEpForward:
    case KernelId::MoeExpertsEpBackward:
      return "moe_experts_ep";
    case KernelId::AllReduce:
      return "all_reduce";
    default:
      return "";
  }
}

CommVolume BytesSentPerRank(const Plan& plan) {
  const Mesh& mesh = plan.mesh;
  CommVolume volume(mesh.world());
  for (int64_t rank = 0; rank < mesh.world(); ++rank) {
    for (const Step& step : plan.steps) {
      if (!IsCollective(step.kernel)) continue;
      const uint64_t bytes = StepBytes(mesh, step, rank % mesh.cp);
      if (bytes > 0) volume[rank][std::string(TrafficKind(step.kernel))] += bytes;
    }
    // Replicated gradients over the world, sharded ones over the ep replicas (world / ep).
    const uint64_t sharded_from = plan.ShardedGradientsOffset();
    uint64_t gradients =
        RingAllReduce(sharded_from, mesh.world()) +
        RingAllReduce(plan.arena_size(Arena::Gradients) - sharded_from, mesh.world() / mesh.ep);
    if (gradients > 0) volume[rank][std::string(kGradientSumTraffic)] = gradients;
  }
  return volume;
}

}  // namespace hcp::plan
