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
  const plan::RankPlan two = plan::ParsePlanForRank(*bytes, "two.plan");
  EXPECT_EQ(two.hash, plan::PlanBytesHash(*bytes));
  EXPECT_EQ(comm::CheckRanksAgree(local, two.plan, two.hash).message(),
            "the plan was compiled for cp=2 x dp=1 = 2 ranks, but 1 rank was started");
  // With one rank a load error comes back as it is.
  const plan::RankPlan missing = plan::LoadPlanForRank("/nonexistent/one.plan");
  EXPECT_THAT(std::string(comm::CheckRanksAgree(local, missing.plan, missing.hash).message()),
              HasSubstr("cannot open plan '/nonexistent/one.plan'"));
  // The FNV-1a hash is stable (the same on every machine and run).
  EXPECT_EQ(plan::HashString(plan::PlanBytesHash("")), "cbf29ce484222325");
  EXPECT_EQ(plan::HashString(plan::PlanBytesHash("a")), "af63dc4c8601ec8c");
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

// The GPUs' token routes as moe_token_routes makes them on the device (Kernels.h), written out
// plainly on the host with their counts: the oracle of the exchange played out below.
struct TokenRouteArrays {
  comm::TokenRoutes counts;
  std::vector<int32_t> row_token, row_slot, row_experts, token_row, slot_row;
};

TokenRouteArrays RouteTokens(const std::vector<int32_t>& ids, int64_t k, int64_t experts,
                             int64_t ep) {
  TokenRouteArrays r;
  r.counts = comm::CountTokensByOwner(ids, k, experts, ep);
  const auto tokens = static_cast<int64_t>(ids.size()) / k;
  const int64_t per_rank = experts / ep;
  r.token_row.assign(tokens * ep, -1);
  r.slot_row.assign(tokens * k, -1);
  auto owner_of = [&](int32_t e) { return e >= 0 && e < experts ? e / per_rank : int64_t{-1}; };
  for (int64_t p = 0; p < ep; ++p) {
    for (int64_t t = 0; t < tokens; ++t) {
      bool reaches = false;
      for (int64_t j = 0; j < k; ++j) reaches = reaches || owner_of(ids[t * k + j]) == p;
      if (!reaches) continue;
      const auto at = static_cast<int32_t>(r.row_token.size());
      r.token_row[t * ep + p] = at;
      r.row_token.push_back(static_cast<int32_t>(t));
      for (int64_t j = 0; j < k; ++j) {
        const int32_t e = ids[t * k + j];
        const bool here = owner_of(e) == p;
        r.row_slot.push_back(static_cast<int32_t>(t * k + j));
        r.row_experts.push_back(here ? static_cast<int32_t>(e - p * per_rank) : -1);
        if (here) r.slot_row[t * k + j] = static_cast<int32_t>(at * k + j);
      }
    }
  }
  return r;
}

// 6 experts over 3 ranks (2 each), k = 2. A token goes once to each owner of one of its
// experts, in send order "by owner, then token"; the counts agree with the rows.
TEST(TokenRoutes, SendEachTokenOnceToEachOwner) {
  // Token 0: experts 5, 4 (owner 2 twice); token 1: 0, 3 (owners 0, 1); token 2: 1, -1.
  const std::vector<int32_t> experts = {5, 4, 0, 3, 1, -1};
  const TokenRouteArrays r = RouteTokens(experts, /*k=*/2, /*experts=*/6, /*ep=*/3);
  EXPECT_EQ(r.counts.bad_slot, 5);
  EXPECT_EQ(r.counts.send_rows, (std::vector<int64_t>{2, 1, 1}));
  EXPECT_EQ(r.counts.sent(), static_cast<int64_t>(r.row_token.size()));
  EXPECT_EQ(r.counts.send_slots, (std::vector<int64_t>{1, 1, 0, 1, 1, 1}));
  EXPECT_EQ(r.row_token, (std::vector<int32_t>{1, 2, 1, 0}));
  EXPECT_EQ(r.row_slot, (std::vector<int32_t>{2, 3, 4, 5, 2, 3, 0, 1}));
  EXPECT_EQ(r.row_experts, (std::vector<int32_t>{0, -1, 1, -1, -1, 1, 1, 0}));
  EXPECT_EQ(r.token_row, (std::vector<int32_t>{-1, -1, 3, 0, 2, -1, 1, -1, -1}));
  EXPECT_EQ(r.slot_row, (std::vector<int32_t>{6, 7, 0, 5, 2, -1}));
  EXPECT_EQ(r.counts.SendCounts(10), (std::vector<int64_t>{20, 10, 10}));
}

// One rank: the counts come back unchanged, per row and per expert.
TEST(TokenRoutes, OneRankReceivesWhatItSends) {
  comm::LocalCommunicator local;
  const std::vector<int32_t> experts = {2, 0, 1, 2};
  comm::TokenRoutes r = comm::CountTokensByOwner(experts, /*k=*/2, /*experts=*/3, /*ep=*/1);
  comm::ExchangeTokenCounts(local, r);
  EXPECT_EQ(r.recv_rows, (std::vector<int64_t>{2}));
  EXPECT_EQ(r.received(), 2);
  EXPECT_EQ(r.recv_slots, (std::vector<int64_t>{1, 1, 2}));
}

// The exchange the CUDA backend makes with these routes, played out on the host with the CPU
// experts in double: every rank's tokens to their owners, the owners' experts on the rows that
// came, the rows back, summed at home. Outputs, input and gate gradients and each owner's weight
// gradients equal the experts of one rank run on each rank's tokens (up to double rounding: the
// sums over a token's slots are grouped by owner).
TEST(TokenRoutes, TheExchangeRepeatsOneRanksExperts) {
  const int64_t ep = 2, E = 6, L = E / ep, k = 3, H = 5, I = 4, tokens = 7;
  std::mt19937 rng(11);
  const Vec w_in = cpu::testing::random_vec(rng, E * 2 * I * H);
  const Vec w_out = cpu::testing::random_vec(rng, E * H * I);
  struct Rank {
    Vec x, gates, dout;
    std::vector<int32_t> ids;
    TokenRouteArrays routes;
  };
  std::vector<Rank> ranks(ep);
  std::uniform_int_distribution<int32_t> expert(0, E - 1);
  for (Rank& rank : ranks) {
    rank.x = cpu::testing::random_vec(rng, tokens * H);
    rank.gates = cpu::testing::random_vec(rng, tokens * k, 0.1, 1.0);
    rank.dout = cpu::testing::random_vec(rng, tokens * H);
    for (int64_t i = 0; i < tokens * k; ++i) rank.ids.push_back(expert(rng));
    rank.routes = RouteTokens(rank.ids, k, E, ep);
  }
  // Where rank r's rows for owner p start in r's send order.
  auto first_row = [&](int64_t r, int64_t p) {
    int64_t at = 0;
    for (int64_t q = 0; q < p; ++q) at += ranks[r].routes.counts.send_rows[q];
    return at;
  };
  // Each owner: the rows that came (x, dout, gates, local ids), its experts, the rows back.
  std::vector<Vec> back_out(ep), back_dx(ep), back_dgates(ep);
  for (int64_t r = 0; r < ep; ++r) {
    back_out[r].assign(ranks[r].routes.counts.sent() * H, 0.0);
    back_dx[r].assign(ranks[r].routes.counts.sent() * H, 0.0);
    back_dgates[r].assign(ranks[r].routes.counts.sent() * k, 0.0);
  }
  Vec dw_in(E * 2 * I * H), dw_out(E * H * I);
  for (int64_t p = 0; p < ep; ++p) {
    Vec x, dout, gates;
    std::vector<int32_t> ids;
    for (int64_t r = 0; r < ep; ++r) {
      const TokenRouteArrays& routes = ranks[r].routes;
      for (int64_t row = first_row(r, p); row < first_row(r, p) + routes.counts.send_rows[p];
           ++row) {
        const int64_t t = routes.row_token[row];
        x.insert(x.end(), ranks[r].x.begin() + t * H, ranks[r].x.begin() + (t + 1) * H);
        dout.insert(dout.end(), ranks[r].dout.begin() + t * H, ranks[r].dout.begin() + (t + 1) * H);
        for (int64_t j = 0; j < k; ++j) {
          gates.push_back(ranks[r].gates[routes.row_slot[row * k + j]]);
          ids.push_back(routes.row_experts[row * k + j]);
        }
      }
    }
    const auto rows = static_cast<int64_t>(ids.size()) / k;
    Vec out(rows * H), dx(rows * H), dgates(rows * k);
    const double* w_in_p = w_in.data() + p * L * 2 * I * H;
    const double* w_out_p = w_out.data() + p * L * H * I;
    cpu::moe_experts_forward<double>(out.data(), x.data(), gates.data(), ids.data(), w_in_p,
                                     w_out_p, rows, H, I, L, k);
    cpu::moe_experts_backward<double>(dx.data(), dgates.data(), dw_in.data() + p * L * 2 * I * H,
                                      dw_out.data() + p * L * H * I, dout.data(), x.data(),
                                      gates.data(), ids.data(), w_in_p, w_out_p, rows, H, I, L, k);
    int64_t at = 0;  // back to each sender, in the order the rows came
    for (int64_t r = 0; r < ep; ++r) {
      const int64_t first = first_row(r, p), count = ranks[r].routes.counts.send_rows[p];
      std::copy_n(out.begin() + at * H, count * H, back_out[r].begin() + first * H);
      std::copy_n(dx.begin() + at * H, count * H, back_dx[r].begin() + first * H);
      std::copy_n(dgates.begin() + at * k, count * k, back_dgates[r].begin() + first * k);
      at += count;
    }
  }
  // Home: add the owners' rows; each slot's dgate from the row that went to its owner.
  Vec dw_in_ref(E * 2 * I * H, 0.0), dw_out_ref(E * H * I, 0.0);
  for (int64_t r = 0; r < ep; ++r) {
    const Rank& rank = ranks[r];
    Vec out(tokens * H, 0.0), dx(tokens * H, 0.0), dgates(tokens * k, 0.0);
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t p = 0; p < ep; ++p) {
        const int32_t row = rank.routes.token_row[t * ep + p];
        for (int64_t c = 0; row >= 0 && c < H; ++c) {
          out[t * H + c] += back_out[r][row * H + c];
          dx[t * H + c] += back_dx[r][row * H + c];
        }
      }
    }
    for (int64_t s = 0; s < tokens * k; ++s) dgates[s] = back_dgates[r][rank.routes.slot_row[s]];
    Vec out_ref(tokens * H), dx_ref(tokens * H), dgates_ref(tokens * k), dwi(dw_in.size()),
        dwo(dw_out.size());
    cpu::moe_experts_forward<double>(out_ref.data(), rank.x.data(), rank.gates.data(),
                                     rank.ids.data(), w_in.data(), w_out.data(), tokens, H, I, E,
                                     k);
    cpu::moe_experts_backward<double>(
        dx_ref.data(), dgates_ref.data(), dwi.data(), dwo.data(), rank.dout.data(), rank.x.data(),
        rank.gates.data(), rank.ids.data(), w_in.data(), w_out.data(), tokens, H, I, E, k);
    EXPECT_LT(cpu::testing::max_rel_diff(out, out_ref), 1e-12) << "rank " << r;
    EXPECT_LT(cpu::testing::max_rel_diff(dx, dx_ref), 1e-12) << "rank " << r;
    EXPECT_EQ(dgates, dgates_ref) << "rank " << r;  // one owner computes each, as one rank does
    for (size_t i = 0; i < dwi.size(); ++i) dw_in_ref[i] += dwi[i];
    for (size_t i = 0; i < dwo.size(); ++i) dw_out_ref[i] += dwo[i];
  }
  EXPECT_LT(cpu::testing::max_rel_diff(dw_in, dw_in_ref), 1e-12);
  EXPECT_LT(cpu::testing::max_rel_diff(dw_out, dw_out_ref), 1e-12);
}

}  // namespace
}  // namespace hcp
