// The MoE experts' row layout (runtime/kernels/cuda/ExpertRows.h): every row has a place, no two
// rows share one, the layout fits the workspace whatever the routing, and balanced routing gets
// one batched GEMM without overflow.
#include "runtime/kernels/cuda/ExpertRows.h"

#include <cstdint>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace hcp::cuda {
namespace {

int64_t Sum(const std::vector<int64_t>& counts) {
  return std::accumulate(counts.begin(), counts.end(), int64_t{0});
}

// Every (expert, i) row lands on a distinct row index below layout.rows, and the rows used are
// exactly the padded region's real rows plus the whole overflow region.
void ExpectValidLayout(const std::vector<int64_t>& counts, int64_t limit) {
  const ExpertRows layout = plan_expert_rows(counts, limit);
  const auto experts = static_cast<int64_t>(counts.size());
  ASSERT_EQ(layout.counts, counts);
  ASSERT_GT(layout.capacity, 0);
  EXPECT_EQ(layout.capacity % kExpertCapacityRounding, 0);
  EXPECT_LE(layout.rows, limit);
  std::set<int64_t> used;
  for (int64_t e = 0; e < experts; e++) {
    for (int64_t i = 0; i < counts[e]; i++) {
      const int64_t row = i < layout.capacity ? e * layout.capacity + i
                                              : layout.overflow[e] + (i - layout.capacity);
      ASSERT_GE(row, 0);
      ASSERT_LT(row, layout.rows);
      ASSERT_TRUE(used.insert(row).second) << "expert " << e << " row " << i;
    }
  }
  int64_t overflow = 0;
  for (int64_t n : counts) overflow += std::max<int64_t>(0, n - layout.capacity);
  EXPECT_EQ(layout.rows, experts * layout.capacity + overflow);
}

TEST(ExpertRows, EvenRoutingIsOneBatchedGemm) {
  // 8192 tokens, top 6 over 64 experts, 768 rows each: no padding, no overflow.
  const std::vector<int64_t> counts(64, 768);
  const ExpertRows layout = plan_expert_rows(counts, expert_row_limit(Sum(counts), 64));
  EXPECT_EQ(layout.capacity, 768);
  EXPECT_EQ(layout.rows, 64 * 768);
}

TEST(ExpertRows, BalancedRoutingIsNearlyAllPadded) {
  // Counts 700..839: at most a few rows of an outlier overflow (cheaper than padding every
  // expert by another 64 rows), never more than 1% of the rows.
  std::mt19937 rng(7);
  std::vector<int64_t> counts(64);
  for (int64_t& n : counts) n = 700 + static_cast<int64_t>(rng() % 140);
  const int64_t slots = Sum(counts), limit = expert_row_limit(slots, 64);
  const ExpertRows layout = plan_expert_rows(counts, limit);
  const int64_t largest = *std::max_element(counts.begin(), counts.end());
  EXPECT_LE(layout.capacity, (largest + 63) / 64 * 64);
  EXPECT_LE(layout.rows - 64 * layout.capacity, slots / 100);
  EXPECT_LE(64 * layout.capacity, slots + 64 * 64);
  ExpectValidLayout(counts, limit);
}

TEST(ExpertRows, ACrowdedExpertOverflowsInsteadOfPaddingEveryone) {
  // One expert takes every token's first slot: padding all 64 experts to its count would need
  // 64 x 8192 rows; the capacity stays near the others' counts and it alone overflows.
  std::vector<int64_t> counts(64, 8192 * 5 / 63);
  counts[0] = 8192;
  const int64_t limit = expert_row_limit(Sum(counts), 64);
  const ExpertRows layout = plan_expert_rows(counts, limit);
  EXPECT_LT(layout.capacity, 1024);
  EXPECT_GT(layout.counts[0], layout.capacity);
  ExpectValidLayout(counts, limit);
}

TEST(ExpertRows, NothingRouted) {
  const ExpertRows layout = plan_expert_rows(std::vector<int64_t>(8, 0), 1000);
  EXPECT_EQ(layout.rows, 0);
  EXPECT_EQ(layout.capacity, 0);
}

// Random and adversarial routings (one expert with everything, a few heavy ones, many empty):
// the layout always fits the workspace the kernels carve (expert_row_limit of the slots).
TEST(ExpertRows, AnyRoutingFitsTheWorkspace) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 300; trial++) {
    const int64_t experts = 1 + static_cast<int64_t>(rng() % 80);
    const int64_t slots = static_cast<int64_t>(rng() % 5000);
    std::vector<int64_t> counts(experts, 0);
    const int mode = trial % 3;
    for (int64_t s = 0; s < slots; s++) {
      int64_t e = static_cast<int64_t>(rng() % experts);
      if (mode == 1) e = 0;  // all on one expert
      if (mode == 2 && rng() % 4 != 0)
        e = static_cast<int64_t>(rng() % 3) % experts;  // a few heavy
      counts[e]++;
    }
    if (slots == 0) continue;
    SCOPED_TRACE(testing::Message() << "trial " << trial << ", " << experts << " experts, " << slots
                                    << " slots, mode " << mode);
    ExpectValidLayout(counts, expert_row_limit(slots, experts));
  }
}

}  // namespace
}  // namespace hcp::cuda
