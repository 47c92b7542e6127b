#include "runtime/comm/ExpertRoutes.h"

namespace hcp::comm {
namespace {

std::vector<int64_t> Times(const std::vector<int64_t>& count, int64_t per_slot) {
  std::vector<int64_t> elements(count.size());
  for (size_t p = 0; p < count.size(); ++p) elements[p] = count[p] * per_slot;
  return elements;
}

}  // namespace

int64_t ExpertRoutes::received() const {
  int64_t total = 0;
  for (int64_t c : recv_count) total += c;
  return total;
}

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

}  // namespace hcp::comm
