// Where the (token, slot) pairs of an expert-parallel MoE layer travel: the same routes for every
// backend (runtime/backends/cpu/DistKernels.cpp's moe_experts_ep over a Communicator, runtime/
// backends/cuda/CudaBackendExperts.cpp's over NCCL). Every rank of an ep group holds E/ep
// consecutive experts; a slot goes to the rank owning its expert, in send order "by owner rank,
// then slot", and its results come back in that order.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "runtime/comm/Communicator.h"

namespace hcp::comm {

struct ExpertRoutes {
  std::vector<int64_t> send_count;    // slots for each ep-group rank
  std::vector<int64_t> recv_count;    // slots from each ep-group rank (after ExchangeCounts)
  std::vector<int32_t> order;         // the sent slots' indices t*k+j, in send order
  std::vector<int32_t> position;      // per slot: its place in `order`, -1 if not sent
  std::vector<int32_t> local_expert;  // per sent slot: its expert, counted from its owner's first
  // The first slot whose expert is outside [0, experts) (such slots stay home), or -1.
  int64_t bad_slot = -1;

  int64_t received() const;
  // Per-peer counts of `per_slot` elements (bytes, floats, ...) each.
  std::vector<int64_t> SendCounts(int64_t per_slot) const;
  std::vector<int64_t> RecvCounts(int64_t per_slot) const;
};

// Buckets the slots by owner: experts[i] is slot i's global expert id, `experts` experts split
// over `ep` ranks. recv_count stays empty. Slot indices are int32 (the backends check that
// tokens * k fits).
ExpertRoutes BucketByOwner(std::span<const int32_t> slot_experts, int64_t experts, int64_t ep);

// BucketByOwner, then the counts exchanged over the ep group (recv_count). Collective over kEp:
// every rank of the group calls it for the same layer.
ExpertRoutes RouteToExpertOwners(Communicator& comm, std::span<const int32_t> slot_experts,
                                 int64_t experts, int64_t ep);

}  // namespace hcp::comm
