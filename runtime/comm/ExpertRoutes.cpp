#include "runtime/comm/ExpertRoutes.h"

#include <algorithm>
#include <numeric>

namespace hcp::comm {
namespace {

std::vector<int64_t> Times(const std::vector<int64_t>& count, int64_t per_slot) {
  std::vector<int64_t> elements(count.size());
  for (size_t p = 0; p < count.size(); ++p) elements[p] = count[p] * per_slot;
  return elements;
}

int64_t Sum(const std::vector<int64_t>& count) {
  return std::accumulate(count.begin(), count.end(), int64_t{0});
}

}  // namespace

int64_t ExpertRoutes::received() const { return Sum(recv_count); }

std::vector<int64_t> ExpertRoutes::SendCounts(int64_t per_slot) const {
  return Times(send_count, per_slot);
}
std::vector<int64_t> ExpertRoutes::RecvCounts(int64_t per_slot) const {
  return Times(recv_count, per_slot);
}

ExpertRoutes BucketByOwner(std::span<const int32_t> slot_experts, int64_t experts, int64_t ep) {
  const auto slots = static_cast<int64_t>(slot_experts.size());
  const int64_t per_rank = experts / ep;
  auto valid = [&](int32_t e) { return e >= 0 && e < experts; };
  ExpertRoutes r;
  r.send_count.assign(ep, 0);
  r.position.assign(slots, -1);
  for (int64_t i = 0; i < slots; ++i) {
    if (valid(slot_experts[i])) {
      ++r.send_count[slot_experts[i] / per_rank];
    } else if (r.bad_slot < 0) {
      r.bad_slot = i;
    }
  }
  // Each owner's first place in send order, then the slots in order.
  std::vector<int64_t> next(ep, 0);
  for (int64_t p = 1; p < ep; ++p) next[p] = next[p - 1] + r.send_count[p - 1];
  const int64_t sent = next[ep - 1] + r.send_count[ep - 1];
  r.order.resize(sent);
  r.local_expert.resize(sent);
  for (int64_t i = 0; i < slots; ++i) {
    const int32_t e = slot_experts[i];
    if (!valid(e)) continue;
    const int64_t owner = e / per_rank, at = next[owner]++;
    r.order[at] = static_cast<int32_t>(i);
    r.local_expert[at] = static_cast<int32_t>(e - owner * per_rank);
    r.position[i] = static_cast<int32_t>(at);
  }
  return r;
}

ExpertRoutes RouteToExpertOwners(Communicator& comm, std::span<const int32_t> slot_experts,
                                 int64_t experts, int64_t ep) {
  ExpertRoutes r = BucketByOwner(slot_experts, experts, ep);
  r.recv_count.assign(ep, 0);
  comm.AllToAll(std::as_bytes(std::span(r.send_count)),
                std::as_writable_bytes(std::span(r.recv_count)), Group::kEp);
  return r;
}

int64_t TokenRoutes::sent() const { return Sum(send_rows); }

int64_t TokenRoutes::received() const { return Sum(recv_rows); }

std::vector<int64_t> TokenRoutes::SendCounts(int64_t per_row) const {
  return Times(send_rows, per_row);
}
std::vector<int64_t> TokenRoutes::RecvCounts(int64_t per_row) const {
  return Times(recv_rows, per_row);
}

// Runs before every expert-parallel MoE step on the GPUs, with the GPU waiting in the forward:
// no divisions per slot (a 64-bit division costs tens of cycles), the owners from a table.
TokenRoutes CountTokensByOwner(std::span<const int32_t> slot_experts, int64_t k, int64_t experts,
                               int64_t ep) {
  const auto slots = static_cast<int64_t>(slot_experts.size());
  const int64_t tokens = slots / k, per_rank = experts / ep;
  std::vector<int32_t> owner(experts);
  for (int64_t e = 0; e < experts; ++e) owner[e] = static_cast<int32_t>(e / per_rank);
  TokenRoutes r;
  r.local_experts = per_rank;
  r.send_rows.assign(ep, 0);
  r.send_slots.assign(ep * per_rank, 0);
  std::vector<int64_t> reached(ep, -1);  // the last token that reached each owner
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = slot_experts[t * k + j];
      if (e < 0 || e >= experts) {
        if (r.bad_slot < 0) r.bad_slot = t * k + j;
        continue;
      }
      ++r.send_slots[e];
      if (reached[owner[e]] != t) {
        reached[owner[e]] = t;
        ++r.send_rows[owner[e]];
      }
    }
  }
  return r;
}

void ExchangeTokenCounts(Communicator& comm, TokenRoutes& r) {
  const auto ep = static_cast<int64_t>(r.send_rows.size());
  // To each rank: its row count, then the slots for each of its experts.
  const int64_t block = 1 + r.local_experts;
  std::vector<int64_t> send(ep * block), recv(ep * block);
  for (int64_t p = 0; p < ep; ++p) {
    send[p * block] = r.send_rows[p];
    std::copy_n(r.send_slots.begin() + p * r.local_experts, r.local_experts,
                send.begin() + p * block + 1);
  }
  comm.AllToAll(std::as_bytes(std::span(send)), std::as_writable_bytes(std::span(recv)),
                Group::kEp);
  r.recv_rows.assign(ep, 0);
  r.recv_slots.assign(r.local_experts, 0);
  for (int64_t p = 0; p < ep; ++p) {
    r.recv_rows[p] = recv[p * block];
    for (int64_t e = 0; e < r.local_experts; ++e) r.recv_slots[e] += recv[p * block + 1 + e];
  }
}

}  // namespace hcp::comm
