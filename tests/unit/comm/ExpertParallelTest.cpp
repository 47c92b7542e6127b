// Expert parallelism on N MPI ranks (N = 1, 2, 4, 8): the ep and ep-replica groups and the
// all-to-all with per-peer sizes; the moe_experts_ep kernels against the single-rank kernels on
// the union of the ep group's tokens (also when some ranks receive no token); sharded parameters'
// gathering and the gradient sums over the right ranks.
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/backends/cpu/Collectives.h"
#include "runtime/kernels/cpu/Kernels.h"
#include "runtime/weights/Init.h"
#include "tests/unit/comm/MpiTestUtil.h"

namespace hcp::testing {
namespace {

using comm::Group;
using plan::Mesh;

// The ep values that divide the world, each with the cp x dp splits of the world to try.
std::vector<Mesh> EpMeshes() {
  const int64_t n = World().world_size();
  std::vector<Mesh> meshes;
  for (int64_t ep = 1; ep <= n; ep *= 2) {
    if (n % ep != 0) continue;
    meshes.push_back(Mesh{.cp = n, .dp = 1, .ep = ep});
    if (n > 1) meshes.push_back(Mesh{.cp = 1, .dp = n, .ep = ep});
    if (n >= 4) meshes.push_back(Mesh{.cp = n / 2, .dp = 2, .ep = ep});
  }
  return meshes;
}

std::string MeshName(const Mesh& m) { return absl::StrFormat("cp%d-dp%d-ep%d", m.cp, m.dp, m.ep); }

// ---------------------------------------------------------------------------------------------
// Groups and AllToAllV.

TEST(EpGroups, RanksSizesAndTranslation) {
  for (const Mesh& mesh : EpMeshes()) {
    SCOPED_TRACE(MeshName(mesh));
    auto comm = NewCommunicator(mesh);
    const int me = comm->world_rank(), ep = static_cast<int>(mesh.ep);
    const int world = comm->world_size();
    EXPECT_EQ(comm->size(Group::kEp), ep);
    EXPECT_EQ(comm->rank(Group::kEp), me % ep);
    EXPECT_EQ(comm->ep_index(), me % ep);
    EXPECT_EQ(comm->size(Group::kEpReplica), world / ep);
    EXPECT_EQ(comm->rank(Group::kEpReplica), me / ep);
    for (int i = 0; i < ep; ++i) EXPECT_EQ(comm->WorldRank(Group::kEp, i), me / ep * ep + i);
    for (int i = 0; i < world / ep; ++i) {
      EXPECT_EQ(comm->WorldRank(Group::kEpReplica, i), i * ep + me % ep);
    }
    // Sums over the groups reach exactly their members.
    double in_ep = me, in_replica = me;
    comm->AllReduceSum(&in_ep, 1, Group::kEp);
    comm->AllReduceSum(&in_replica, 1, Group::kEpReplica);
    double want_ep = 0, want_replica = 0;
    for (int r = 0; r < world; ++r) {
      if (r / ep == me / ep) want_ep += r;
      if (r % ep == me % ep) want_replica += r;
    }
    EXPECT_EQ(in_ep, want_ep);
    EXPECT_EQ(in_replica, want_replica);
  }
}

// Rank `from` sends (from + to) % 3 values to group rank `to` (some pairs nothing at all), each
// value naming its sender, receiver and position.
int64_t Count(int from, int to) { return (from + to) % 3; }
int32_t Value(int from, int to, int64_t i) { return 10000 * from + 100 * to + static_cast<int>(i); }

void CheckAllToAllV(comm::Communicator& comm, Group group) {
  const int n = comm.size(group), me = comm.rank(group);
  std::vector<int64_t> send_bytes(n), recv_bytes(n);
  std::vector<int32_t> send, want;
  for (int p = 0; p < n; ++p) {
    send_bytes[p] = Count(me, p) * static_cast<int64_t>(sizeof(int32_t));
    recv_bytes[p] = Count(p, me) * static_cast<int64_t>(sizeof(int32_t));
    for (int64_t i = 0; i < Count(me, p); ++i) send.push_back(Value(me, p, i));
    for (int64_t i = 0; i < Count(p, me); ++i) want.push_back(Value(p, me, i));
  }
  std::vector<int32_t> recv(want.size(), -1);
  comm.AllToAllV(std::as_bytes(std::span(send)), send_bytes,
                 std::as_writable_bytes(std::span(recv)), recv_bytes, group);
  EXPECT_EQ(recv, want) << comm::GroupName(group);

  // Equal blocks: block p goes to group rank p.
  std::vector<int64_t> blocks(2 * n), got(2 * n);
  for (int p = 0; p < n; ++p) {
    blocks[2 * p] = 1000 * me + p;
    blocks[2 * p + 1] = -(1000 * me + p);
  }
  comm.AllToAll(std::as_bytes(std::span(blocks)), std::as_writable_bytes(std::span(got)), group);
  for (int p = 0; p < n; ++p) {
    EXPECT_EQ(got[2 * p], 1000 * p + me);
    EXPECT_EQ(got[2 * p + 1], -(1000 * p + me));
  }
}

TEST(EpGroups, AllToAllVDeliversEveryPeersPart) {
  for (const Mesh& mesh : EpMeshes()) {
    SCOPED_TRACE(MeshName(mesh));
    auto comm = NewCommunicator(mesh);
    for (Group group : {Group::kWorld, Group::kCp, Group::kDp, Group::kEp, Group::kEpReplica}) {
      CheckAllToAllV(*comm, group);
    }
  }
}

TEST(EpGroups, AllToAllVOfLargeMessages) {
  // A few MiB per peer, in both directions at once.
  auto comm = NewCommunicator(Mesh{.cp = World().world_size(), .dp = 1, .ep = 1});
  const int n = comm->world_size(), me = comm->world_rank();
  const int64_t per_peer = (int64_t{3} << 20) / static_cast<int64_t>(sizeof(float));
  std::vector<float> send(n * per_peer), recv(n * per_peer);
  for (int p = 0; p < n; ++p) {
    for (int64_t i = 0; i < per_peer; ++i) send[p * per_peer + i] = float(me * 7 + p) + 1e-3f * i;
  }
  const std::vector<int64_t> bytes(n, per_peer * static_cast<int64_t>(sizeof(float)));
  comm->AllToAllV(std::as_bytes(std::span(send)), bytes, std::as_writable_bytes(std::span(recv)),
                  bytes, Group::kWorld);
  bool ok = true;
  for (int p = 0; p < n; ++p) {
    for (int64_t i = 0; i < per_peer; ++i)
      ok &= recv[p * per_peer + i] == float(p * 7 + me) + 1e-3f * i;
  }
  EXPECT_TRUE(ok);
}

// ---------------------------------------------------------------------------------------------
// The moe_experts_ep kernels.

constexpr int64_t kTokens = 5, kHidden = 3, kInner = 2, kK = 2;

// One rank's tokens: x, gates (a softmax-like positive pair) and k distinct expert ids. With
// `first_block_only`, every token picks among experts [0, per_rank): only the ep-group rank 0
// receives slots, the others receive none.
struct Tokens {
  std::vector<float> x, gates, dout;
  std::vector<int32_t> experts;
};
Tokens TokensOf(int world_rank, int64_t num_experts, int64_t per_rank, bool first_block_only) {
  std::mt19937 rng(1000 + world_rank);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f), g(0.1f, 0.9f);
  Tokens t;
  for (int64_t i = 0; i < kTokens * kHidden; ++i) t.x.push_back(u(rng));
  for (int64_t i = 0; i < kTokens * kHidden; ++i) t.dout.push_back(u(rng));
  const int64_t choices = first_block_only ? per_rank : num_experts;
  for (int64_t i = 0; i < kTokens; ++i) {
    const float a = g(rng);
    t.gates.push_back(a);
    t.gates.push_back(1.0f - a);
    const auto e0 = static_cast<int32_t>(rng() % choices);
    const auto e1 = static_cast<int32_t>((e0 + 1 + rng() % (choices - 1)) % choices);
    t.experts.push_back(e0);
    t.experts.push_back(e1);
  }
  return t;
}

template <typename T>
std::vector<T> Rows(const std::vector<T>& v, int64_t row, int64_t rows, int64_t width) {
  return std::vector<T>(v.begin() + row * width, v.begin() + (row + rows) * width);
}

class MoeExpertsEp : public ::testing::TestWithParam<bool> {};

TEST_P(MoeExpertsEp, EqualsTheSingleRankKernelsOnTheUnionOfTheTokens) {
  const bool first_block_only = GetParam();
  for (const Mesh& mesh : EpMeshes()) {
    SCOPED_TRACE(MeshName(mesh));
    auto comm = NewCommunicator(mesh);
    const int me = comm->world_rank(), ep = static_cast<int>(mesh.ep);
    const int64_t per_rank = 2, E = per_rank * ep;  // 2 experts per rank, k = 2
    const int64_t H = kHidden, I = kInner, T = kTokens, K = kK;
    const int64_t first = comm->ep_index() * per_rank;

    // Whole weights, the same on every rank; this rank's rows of them.
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-0.5f, 0.5f);
    std::vector<float> w_in(E * 2 * I * H), w_out(E * H * I);
    for (float& w : w_in) w = u(rng);
    for (float& w : w_out) w = u(rng);
    const std::vector<float> w_in_local = Rows(w_in, first, per_rank, 2 * I * H),
                             w_out_local = Rows(w_out, first, per_rank, H * I);

    // The reference: the ep group's tokens together, in group rank order, all experts.
    Tokens all;
    for (int r = me / ep * ep; r < (me / ep + 1) * ep; ++r) {
      const Tokens t = TokensOf(r, E, per_rank, first_block_only);
      all.x.insert(all.x.end(), t.x.begin(), t.x.end());
      all.gates.insert(all.gates.end(), t.gates.begin(), t.gates.end());
      all.dout.insert(all.dout.end(), t.dout.begin(), t.dout.end());
      all.experts.insert(all.experts.end(), t.experts.begin(), t.experts.end());
    }
    const int64_t U = T * ep;
    std::vector<float> out_ref(U * H), dx_ref(U * H), dgates_ref(U * K), dw_in_ref(w_in.size()),
        dw_out_ref(w_out.size());
    cpu::moe_experts_forward<float>(out_ref.data(), all.x.data(), all.gates.data(),
                                    all.experts.data(), w_in.data(), w_out.data(), U, H, I, E, K);
    cpu::moe_experts_backward<float>(dx_ref.data(), dgates_ref.data(), dw_in_ref.data(),
                                     dw_out_ref.data(), all.dout.data(), all.x.data(),
                                     all.gates.data(), all.experts.data(), w_in.data(),
                                     w_out.data(), U, H, I, E, K);

    // This rank through the kernels directly.
    const Tokens mine = TokensOf(me, E, per_rank, first_block_only);
    const cpu::MoeShape shape{.tokens = T, .hidden = H, .inner = I, .experts = E, .k = K, .ep = ep};
    std::vector<float> out(T * H), dx(T * H), dgates(T * K), dw_in(w_in_local.size()),
        dw_out(w_out_local.size());
    const absl::Status forward = cpu::moe_experts_ep_forward(
        *comm, out.data(), mine.x.data(), mine.gates.data(), mine.experts.data(), w_in_local.data(),
        w_out_local.data(), shape);
    const absl::Status backward = cpu::moe_experts_ep_backward(
        *comm, dx.data(), dgates.data(), dw_in.data(), dw_out.data(), mine.dout.data(),
        mine.x.data(), mine.gates.data(), mine.experts.data(), w_in_local.data(),
        w_out_local.data(), shape);
    EXPECT_TRUE(forward.ok()) << forward;
    EXPECT_TRUE(backward.ok()) << backward;

    const int64_t row = comm->ep_index() * T;  // this rank's tokens in the union
    // The forward is the single-rank kernel bit for bit.
    EXPECT_EQ(out, Rows(out_ref, row, T, H));
    EXPECT_LT(RelRms(ToDouble(dx), ToDouble(Rows(dx_ref, row, T, H))), 1e-6);
    EXPECT_LT(RelRms(ToDouble(dgates), ToDouble(Rows(dgates_ref, row, T, K))), 1e-6);
    const std::vector<float> dw_in_want = Rows(dw_in_ref, first, per_rank, 2 * I * H),
                             dw_out_want = Rows(dw_out_ref, first, per_rank, H * I);
    if (first_block_only && comm->ep_index() > 0) {
      // No token reached these experts: their gradients are zero.
      EXPECT_EQ(dw_in, std::vector<float>(dw_in.size(), 0.0f));
      EXPECT_EQ(dw_out, std::vector<float>(dw_out.size(), 0.0f));
    }
    EXPECT_LT(RelRms(ToDouble(dw_in), ToDouble(dw_in_want)), 1e-6);
    EXPECT_LT(RelRms(ToDouble(dw_out), ToDouble(dw_out_want)), 1e-6);
  }
}

INSTANTIATE_TEST_SUITE_P(Routing, MoeExpertsEp, ::testing::Values(false, true),
                         [](const auto& info) {
                           return std::string(info.param ? "FirstBlockOnly" : "Random");
                         });

TEST(MoeExpertsEp, ABadExpertIndexFailsAfterJoiningEveryExchange) {
  const int n = World().world_size();
  auto comm = NewCommunicator(Mesh{.cp = n, .dp = 1, .ep = n});
  const int me = comm->world_rank();
  const int64_t E = 2 * n;
  Tokens mine = TokensOf(me, E, 2, false);
  if (me == n - 1) mine.experts[3] = static_cast<int32_t>(E);  // out of range on the last rank
  const cpu::MoeShape shape{
      .tokens = kTokens, .hidden = kHidden, .inner = kInner, .experts = E, .k = kK, .ep = n};
  std::vector<float> w_in(2 * 2 * kInner * kHidden, 0.1f), w_out(2 * kHidden * kInner, 0.1f);
  std::vector<float> out(kTokens * kHidden);
  const absl::Status status =
      cpu::moe_experts_ep_forward(*comm, out.data(), mine.x.data(), mine.gates.data(),
                                  mine.experts.data(), w_in.data(), w_out.data(), shape);
  // Nobody hangs; only the rank with the bad index reports it.
  if (me == n - 1) {
    EXPECT_EQ(status.message(),
              absl::StrFormat("expert index %d at position 3 is outside [0, %d)", E, E));
  } else {
    EXPECT_TRUE(status.ok()) << status;
  }
}

// ---------------------------------------------------------------------------------------------
// Sharded parameters in the executor.

TEST(ShardedParameters, GatherAndGradientSums) {
  for (const Mesh& mesh : EpMeshes()) {
    SCOPED_TRACE(MeshName(mesh));
    auto comm = NewCommunicator(mesh);
    const int me = comm->world_rank(), world = comm->world_size(), ep = static_cast<int>(mesh.ep);
    DistPlan p(1, 2 * mesh.cp, mesh);
    p.builder().AddParameter("replicated", {5}, plan::ParamInit::Normal, 1.0);
    if (ep > 1) {
      p.builder().AddShardedParameter("experts", {2 * ep, 3}, ep, plan::ParamInit::Normal, 1.0);
    } else {
      p.builder().AddParameter("experts", {2, 3}, plan::ParamInit::Normal, 1.0);
    }
    const absl::Status created = p.Create(*comm);
    ASSERT_TRUE(created.ok()) << created;
    CpuExecutor& exec = p.executor();
    ASSERT_TRUE(exec.InitializeParameters(11).ok());

    // The whole tensor on every rank, as an unsharded run initialises it.
    std::vector<float> whole(2 * ep * 3);
    FillNormal(whole.data(), 0, static_cast<int64_t>(whole.size()), 11, "experts", 1.0f);
    absl::StatusOr<std::vector<float>> gathered = exec.FullParameter("experts");
    ASSERT_TRUE(gathered.ok());
    EXPECT_EQ(*gathered, whole);

    // Gradients: replicated ones sum over the world, sharded ones over the ep replicas.
    std::span<float> g_rep = *exec.Gradient("replicated"), g_exp = *exec.Gradient("experts");
    for (size_t i = 0; i < g_rep.size(); ++i) g_rep[i] = float(me) + float(i);
    for (size_t i = 0; i < g_exp.size(); ++i) g_exp[i] = 100.0f * float(me) + float(i);
    ASSERT_TRUE(exec.SumGradientsOverRanks().ok());
    for (size_t i = 0; i < g_rep.size(); ++i) {
      EXPECT_EQ(g_rep[i], float(world * (world - 1) / 2) + float(world) * float(i));
    }
    for (size_t i = 0; i < g_exp.size(); ++i) {
      double want = 0;
      for (int r = me % ep; r < world; r += ep) want += 100.0 * r + double(i);
      EXPECT_EQ(g_exp[i], float(want));
    }
    // The norm counts every element of the whole model's gradient once.
    double norm = 0;
    for (float g : g_rep) norm += double(g) * g;
    absl::StatusOr<std::vector<float>> whole_grad = exec.FullGradient("experts");
    ASSERT_TRUE(whole_grad.ok());
    for (float g : *whole_grad) norm += double(g) * g;
    EXPECT_DOUBLE_EQ(*exec.GradientSquaredNorm(), norm);
    // The whole gradient: each ep-group rank's rows, in expert-index order.
    absl::StatusOr<std::vector<float>> full_grad = exec.FullGradient("experts");
    ASSERT_TRUE(full_grad.ok());
    for (int e = 0; e < ep; ++e) {
      for (int64_t i = 0; i < 6; ++i) {
        double want = 0;
        for (int r = e; r < world; r += ep) want += 100.0 * r + double(i);
        EXPECT_EQ((*full_grad)[e * 6 + i], float(want));
      }
    }
  }
}

}  // namespace
}  // namespace hcp::testing
