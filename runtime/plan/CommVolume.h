// What each rank sends per training step, by collective kind, counted from the plan's steps and
// mesh the way the CPU collectives put bytes on the wire (runtime/backends/cpu/Collectives.cpp):
//   halo_exchange    the last `width` conv-input rows of each segment whose successor lives on
//                    another rank (backward: the halo gradient back to the predecessor's rank);
//   state_scan       all-gather: [g | state] of every local segment to each of the cp-1 others;
//                    chain: the running state [batch, heads, head_dim, state] at each change of
//                    owner along the segment order (backward: in reverse);
//   ring_attention   cp-1 shifts of [K | V] (backward: of [K | V | dK | dV], then [dK | dV] home);
//   all_reduce       the loss (doubles), as a ring all-reduce sends 2 (n-1)/n of the data;
//   moe_experts_ep   the token all-to-alls of expert parallelism, for uniform routing (the real
//                    volume depends on the router);
//   gradient sum     the runtime's all-reduces of the gradients arena: replicated parameters'
//                    over the world, sharded (expert) parameters' over their ep replicas.
// Messages are fp32 unless said otherwise. Bytes that stay on a rank are not counted.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/plan/Plan.h"

namespace hcp::plan {

// bytes[world rank][kind], kinds as named above.
using CommVolume = std::vector<std::map<std::string, uint64_t>>;

CommVolume BytesSentPerRank(const Plan& plan);

// The kind a collective step's bytes count under ("halo_exchange", ...); empty for a step that
// sends nothing. The executors label their traffic with it (comm::Communicator's
// SetTrafficLabel), and the gradient sums with kGradientSumTraffic.
std::string_view TrafficKind(KernelId kernel);
inline constexpr std::string_view kGradientSumTraffic = "gradient sum";
// The ranks' agreement on each step's status (a few bytes; not predicted).
inline constexpr std::string_view kControlTraffic = "control";

}  // namespace hcp::plan
