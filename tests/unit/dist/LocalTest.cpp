// The single-rank pieces of context parallelism (no MPI): ssd_log_decay's gradients by finite
// differences, the one-rank communicator, the messages the ranks agree on, and the expert routes
// of expert parallelism.
#include <cmath>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/comm/Agreement.h"
#include "runtime/comm/Communicator.h"
#include "runtime/comm/ExpertRoutes.h"
#include "runtime/kernels/cpu/Kernels.h"
#include "runtime/plan/PlanBuilder.h"
#include "tests/unit/kernels_cpu/TestUtil.h"

namespace hcp {
namespace {

using cpu::testing::Vec;
using ::testing::HasSubstr;

// g[b, h] = sum_t dt[b, t, h] * A[h], and its exact gradients.
TEST(SsdLogDecay, BackwardMatchesFiniteDifferences) {
  std::mt19937 rng(3);
  const int64_t B = 2, S = 5, H = 3;
  Vec dt = cpu::testing::random_vec(rng, B * S * H, 0.05, 0.8);
  Vec A = cpu::testing::random_vec(rng, H, -1.5, -0.2);
  const Vec r = cpu::testing::random_vec(rng, B * H);  // the projection of g
  auto objective = [&]() {
    Vec g(B * H);
    cpu::ssd_log_decay<double>(g.data(), dt.data(), A.data(), B, S, H);
    return cpu::testing::project(r, g);
  };
  Vec ddt(dt.size()), dA(H);
  cpu::ssd_log_decay_backward<double>(ddt.data(), dA.data(), r.data(), dt.data(), A.data(), B, S,
                                      H);
  cpu::testing::expect_gradient("ssd_log_decay dt", dt, ddt, objective);
  cpu::testing::expect_gradient("ssd_log_decay A", A, dA, objective);

  // float against double.
  std::vector<float> ddt_f(ddt.size()), dA_f(H);
  const std::vector<float> r_f = cpu::testing::to_float(r), dt_f = cpu::testing::to_float(dt),
                           A_f = cpu::testing::to_float(A);
  cpu::ssd_log_decay_backward<float>(ddt_f.data(), dA_f.data(), r_f.data(), dt_f.data(), A_f.data(),
                                     B, S, H);
  EXPECT_LT(cpu::testing::max_rel_diff(cpu::testing::to_double(ddt_f), ddt), 1e-6);
  EXPECT_LT(cpu::testing::max_rel_diff(cpu::testing::to_double(dA_f), dA), 1e-6);
}

TEST(LocalCommunicator, IsOneRankWhoseCollectivesAreTheIdentity) {
  comm::LocalCommunicator local;
  EXPECT_EQ(local.world_size(), 1);
  ASSERT_TRUE(local.has_mesh());
  EXPECT_EQ(local.mesh(), plan::Mesh{});
  for (comm::Group group : {comm::Group::kWorld, comm::Group::kCp, comm::Group::kDp}) {
    EXPECT_EQ(local.size(group), 1);
    EXPECT_EQ(local.rank(group), 0);
    EXPECT_EQ(local.WorldRank(group, 0), 0);
  }
  float x[3] = {1, 2, 3};
  local.AllReduceSum(x, 3, comm::Group::kWorld);
  EXPECT_EQ(x[2], 3.0f);
  const int32_t send = 7;
  int32_t recv = 0;
  local.SendRecv(std::as_bytes(std::span(&send, 1)), 0, std::as_writable_bytes(std::span(&recv, 1)),
                 0, comm::Group::kCp);
  EXPECT_EQ(recv, 7);
  EXPECT_THAT(std::string(local.SetMesh(plan::Mesh{.cp = 2}).message()),
              HasSubstr("the plan was compiled for cp=2 x dp=1 = 2 ranks, but 1 rank was started"));
}

TEST(Agreement, MessagesNameTheRanks) {
  EXPECT_EQ(comm::RankList({3}), "rank 3");
  EXPECT_EQ(comm::RankList({0, 1}), "ranks 0,1");
  EXPECT_EQ(comm::RankList({0, 1, 2, 3, 6, 8, 9}), "ranks 0-3,6,8,9");

  std::vector<absl::Status> statuses(6);
  EXPECT_TRUE(comm::CombineRankStatuses(statuses).ok());
  statuses[2] = absl::InvalidArgumentError("token id 99");
  EXPECT_EQ(comm::CombineRankStatuses(statuses), absl::InvalidArgumentError("rank 2: token id 99"));
  statuses[0] = absl::NotFoundError("no file");
  statuses[4] = absl::NotFoundError("no file");
  statuses[5] = absl::NotFoundError("no file");
  // The code of the lowest failing rank; equal messages together, in order of their first rank.
  EXPECT_EQ(comm::CombineRankStatuses(statuses),
            absl::NotFoundError("ranks 0,4,5: no file; rank 2: token id 99"));
}

TEST(Agreement, OneRankChecksItsPlan) {
  plan::PlanBuilder b;
  b.set_shape(1, 4).set_mesh(plan::Mesh{.cp = 2});
  b.AllocateInputs();
  b.set_loss(b.Allocate("loss", plan::Arena::Activations, {1}));
  absl::StatusOr<std::string> bytes = b.Finish();
  ASSERT_TRUE(bytes.ok()) << bytes.status();

  comm::LocalCommunicator local;
  const comm::RankPlan two = comm::ParsePlanForRank(*bytes, "two.plan");
  EXPECT_EQ(two.hash, comm::PlanBytesHash(*bytes));
  EXPECT_EQ(comm::CheckRanksAgree(local, two.plan, two.hash).message(),
            "the plan was compiled for cp=2 x dp=1 = 2 ranks, but 1 rank was started");
  // With one rank a load error comes back as it is.
  const comm::RankPlan missing = comm::LoadPlanForRank("/nonexistent/one.plan");
  EXPECT_THAT(std::string(comm::CheckRanksAgree(local, missing.plan, missing.hash).message()),
              HasSubstr("cannot open plan '/nonexistent/one.plan'"));
  // The FNV-1a hash is stable (the same on every machine and run).
  EXPECT_EQ(comm::HashString(comm::PlanBytesHash("")), "cbf29ce484222325");
  EXPECT_EQ(comm::HashString(comm::PlanBytesHash("a")), "af63dc4c8601ec8c");
}

// 6 experts over 3 ranks (2 each): slots go to their expert's owner in send order "by owner,
// then slot", with the expert counted from the owner's first; an out-of-range id stays home.
TEST(ExpertRoutes, BucketsSlotsByOwnerInSlotOrder) {
  const std::vector<int32_t> experts = {5, 0, 3, 1, 4, 2, 0, 5};
  const comm::ExpertRoutes r = comm::BucketByOwner(experts, /*experts=*/6, /*ep=*/3);
  EXPECT_EQ(r.send_count, (std::vector<int64_t>{3, 2, 3}));
  // Owner 0 (experts 0, 1): slots 1, 3, 6; owner 1 (2, 3): slots 2, 5; owner 2: slots 0, 4, 7.
  EXPECT_EQ(r.order, (std::vector<int32_t>{1, 3, 6, 2, 5, 0, 4, 7}));
  EXPECT_EQ(r.local_expert, (std::vector<int32_t>{0, 1, 0, 1, 0, 1, 0, 1}));
  for (size_t at = 0; at < r.order.size(); ++at) {
    EXPECT_EQ(r.position[r.order[at]], static_cast<int32_t>(at));
  }
  EXPECT_EQ(r.bad_slot, -1);
  EXPECT_EQ(r.SendCounts(10), (std::vector<int64_t>{30, 20, 30}));
}

TEST(ExpertRoutes, OutOfRangeExpertsStayHome) {
  const std::vector<int32_t> experts = {1, 4, -1, 0};
  const comm::ExpertRoutes r = comm::BucketByOwner(experts, /*experts=*/4, /*ep=*/2);
  EXPECT_EQ(r.bad_slot, 1);
  EXPECT_EQ(r.send_count, (std::vector<int64_t>{2, 0}));
  EXPECT_EQ(r.order, (std::vector<int32_t>{0, 3}));
  EXPECT_EQ(r.position, (std::vector<int32_t>{0, -1, -1, 1}));
}

// One rank (ep = 1): everything stays here and the counts come back unchanged.
TEST(ExpertRoutes, OneRankReceivesWhatItSends) {
  comm::LocalCommunicator local;
  const std::vector<int32_t> experts = {2, 0, 1, 2};
  const comm::ExpertRoutes r = comm::RouteToExpertOwners(local, experts, /*experts=*/3, /*ep=*/1);
  EXPECT_EQ(r.send_count, (std::vector<int64_t>{4}));
  EXPECT_EQ(r.recv_count, (std::vector<int64_t>{4}));
  EXPECT_EQ(r.received(), 4);
  EXPECT_EQ(r.order, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(r.local_expert, experts);
}

}  // namespace
}  // namespace hcp
