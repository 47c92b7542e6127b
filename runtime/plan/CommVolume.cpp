#include "runtime/plan/CommVolume.h"

#include "runtime/plan/KernelTable.h"

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

std::string Kind(const Step& step) { return std::string(TrafficKind(step.kernel)); }

// One step's bytes sent by cp rank `me` (every dp replica sends the same).
void CountStep(const Mesh& mesh, const Step& step, int64_t me,
               std::map<std::string, uint64_t>& sent) {
  const std::vector<int64_t>& n = step.ints;
  switch (step.kernel) {
    case KernelId::HaloExchangeForward:
    case KernelId::HaloExchangeBackward: {
      // ints: batch, segs, len, channels, width. Forward: tail -> successor; backward: halo
      // gradient -> predecessor.
      int64_t direction = step.kernel == KernelId::HaloExchangeForward ? 1 : -1;
      for (int64_t k = 0; k < n[1]; ++k) {
        if (CrossesRanks(mesh, mesh.GlobalSegment(me, k), direction))
          sent[Kind(step)] += n[0] * n[4] * n[3] * kFloat;
      }
      return;
    }
    case KernelId::StateScanForward:
    case KernelId::StateScanBackward: {
      // ints: batch, segs, heads, head_dim, state, strategy.
      uint64_t states = n[0] * n[2] * n[3] * n[4] * kFloat;  // one segment, every batch row
      if (n[5] == 0) {  // all-gather of [g | states] of every local segment to the cp-1 others
        uint64_t mine = n[1] * (n[0] * n[2] * kFloat + states);
        sent[Kind(step)] += mine * static_cast<uint64_t>(mesh.cp - 1);
        return;
      }
      int64_t direction = step.kernel == KernelId::StateScanForward ? 1 : -1;
      for (int64_t k = 0; k < n[1]; ++k) {
        if (CrossesRanks(mesh, mesh.GlobalSegment(me, k), direction)) sent[Kind(step)] += states;
      }
      return;
    }
    case KernelId::RingAttentionForward:
    case KernelId::RingAttentionBackward: {
      // ints: batch, seq (local), q_heads, kv_heads, head_dim, causal.
      if (mesh.cp == 1) return;
      uint64_t kv = n[0] * n[1] * n[3] * n[4] * kFloat;  // K or V of one rank
      uint64_t shifts = static_cast<uint64_t>(mesh.cp - 1);
      sent[Kind(step)] += step.kernel == KernelId::RingAttentionForward ? shifts * 2 * kv
                                                                        : shifts * 4 * kv + 2 * kv;
      return;
    }
    case KernelId::MoeExpertsEpForward:
    case KernelId::MoeExpertsEpBackward: {
      // ints: tokens, hidden, inner, experts, k, ep. Data-dependent: counted for uniform
      // routing, (ep-1)/ep of the tokens*k slots leave the rank; plus the counts (int64 per peer).
      const int64_t ep = n[5];
      if (ep <= 1) return;
      const uint64_t hidden = n[1];
      const bool forward = step.kernel == KernelId::MoeExpertsEpForward;
      // Forward: out (id, x) in fp32, back the expert output in double. Backward: out (id, gate,
      // x, dout), back (dgate, dx share) in double.
      const uint64_t per_slot =
          forward ? (4 + 4 * hidden) + 8 * hidden : (8 + 8 * hidden) + 8 * (hidden + 1);
      const uint64_t slots = static_cast<uint64_t>(n[0] * n[4]);
      sent[Kind(step)] +=
          slots * per_slot * static_cast<uint64_t>(ep - 1) / static_cast<uint64_t>(ep) +
          sizeof(int64_t) * static_cast<uint64_t>(ep - 1);
      return;
    }
    case KernelId::AllReduce:  // summed in doubles
      sent[Kind(step)] += RingAllReduce(n[0] * sizeof(double), GroupSize(mesh, n[1]));
      return;
    default:
      return;
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
      if (IsCollective(step.kernel)) CountStep(mesh, step, rank % mesh.cp, volume[rank]);
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
