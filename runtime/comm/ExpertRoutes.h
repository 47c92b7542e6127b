// Where the (token, slot) pairs of an expert-parallel MoE layer travel. Every rank of an ep group
// holds E/ep consecutive experts. Two kinds of routes:
//   - ExpertRoutes, the CPU reference's (runtime/backends/cpu/Collectives.cpp): each slot goes to
//     the rank owning its expert, in send order "by owner rank, then slot", and its result comes
//     back in that order, so a token's sum over its slots is made at home in slot order, as on
//     one rank;
//   - TokenRoutes, the GPUs' (runtime/backends/cuda/CudaBackendExperts.cpp): each token goes once
//     to each owner of one of its experts, which sums over its own slots before sending back.
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

// The counts of the CUDA backend's routes (CudaBackendExperts.cpp): a token's row travels once to
// each rank owning one of its experts, not once per slot, and comes back as the gated sum over
// that owner's slots; home adds the owners' rows. With top-k routing over few ranks most tokens
// reach every owner, so this moves about k / ep times fewer rows than one per slot. Send order:
// by owner rank, then token; the routes' arrays are made on the device (moe_token_routes,
// runtime/kernels/cuda/Kernels.h), the counts here.
struct TokenRoutes {
  int64_t local_experts = 0;        // experts per rank
  std::vector<int64_t> send_rows;   // rows for each ep-group rank
  std::vector<int64_t> send_slots;  // [ep * local_experts] slots for each rank's each expert
  // The first slot whose expert is outside [0, experts) (it goes nowhere), or -1.
  int64_t bad_slot = -1;
  // After the exchange (ExchangeTokenCounts):
  std::vector<int64_t> recv_rows;   // rows from each ep-group rank
  std::vector<int64_t> recv_slots;  // [local_experts] slots for each of this rank's experts,
                                    // from every rank together

  int64_t sent() const;  // rows, all ranks together
  int64_t received() const;
  // Per-peer counts of `per_row` elements each.
  std::vector<int64_t> SendCounts(int64_t per_row) const;
  std::vector<int64_t> RecvCounts(int64_t per_row) const;
};

// The routes' counts for `slot_experts` ([tokens * k] global expert ids), `experts` experts split
// over `ep` ranks; the received counts stay empty. With ep = 1, send_slots is the slots per
// expert.
TokenRoutes CountTokensByOwner(std::span<const int32_t> slot_experts, int64_t k, int64_t experts,
                               int64_t ep);

// Fills r.recv_rows and r.recv_slots: every rank of the ep group sends each its row count and the
// slots for each of its experts. Collective over kEp.
void ExchangeTokenCounts(Communicator& comm, TokenRoutes& r);

}  // namespace hcp::comm
