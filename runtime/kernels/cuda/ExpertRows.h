// Where the MoE experts' rows go for their GEMMs (Moe.cu), decided on the host from the
// per-expert row counts: expert e's first min(count_e, capacity) rows at e * capacity (the
// padded rows: one strided-batched GEMM runs every expert on them), the rest of its rows in an
// overflow region after all padded rows, expert by expert (one GEMM per expert that overflows).
// Plain C++, so that the choice is unit-tested without a GPU.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

namespace hcp::cuda {

// The capacity is a multiple of this.
inline constexpr int64_t kExpertCapacityRounding = 64;

// The rows the workspace holds for `slots` (token, slot) pairs over `experts`: the padded rows
// may take the slots plus one rounding per expert, the overflow at most the slots.
inline int64_t expert_row_limit(int64_t slots, int64_t experts) {
  return 2 * slots + kExpertCapacityRounding * experts;
}

struct ExpertRows {
  int64_t rows = 0;               // padded and overflow rows together
  int64_t capacity = 0;           // 0 only when no row is routed
  std::vector<int64_t> counts;    // per expert
  std::vector<int64_t> overflow;  // per expert: where its overflow rows start
};

// The layout for `counts`, within `limit` rows (expert_row_limit of sum(counts) <= limit). The
// capacity is the multiple of kExpertCapacityRounding whose work costs least, counting a padded
// row as 1, an overflow row as 2 (a small GEMM runs at about half the batched one's rate) and
// each overflow GEMM as 256 more: the largest count when the routing is balanced, less when a
// few experts take far more rows than the rest.
inline ExpertRows plan_expert_rows(std::vector<int64_t> counts, int64_t limit) {
  ExpertRows layout;
  const auto experts = static_cast<int64_t>(counts.size());
  const int64_t largest = counts.empty() ? 0 : *std::max_element(counts.begin(), counts.end());
  layout.counts = std::move(counts);
  layout.overflow.assign(experts, 0);
  if (largest == 0) return layout;
  int64_t best_cost = std::numeric_limits<int64_t>::max();
  for (int64_t cap = kExpertCapacityRounding; cap < largest + kExpertCapacityRounding;
       cap += kExpertCapacityRounding) {
    int64_t overflow = 0, cost = experts * cap;
    for (int64_t n : layout.counts) {
      if (n > cap) {
        overflow += n - cap;
        cost += 2 * (n - cap) + 256;
      }
    }
    // The smallest capacity always fits: experts * 64 plus at most every row.
    if ((experts * cap + overflow <= limit || cap == kExpertCapacityRounding) && cost < best_cost) {
      layout.capacity = cap;
      best_cost = cost;
    }
  }
  int64_t next = experts * layout.capacity;
  for (int64_t e = 0; e < experts; e++) {
    layout.overflow[e] = next;
    next += std::max<int64_t>(0, layout.counts[e] - layout.capacity);
  }
  layout.rows = next;
  return layout;
}

}  // namespace hcp::cuda
