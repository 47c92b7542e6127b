// The collectives of context parallelism on N MPI ranks (N = 1, 2, 4, 8), both sequence layouts
// and both state-scan strategies: each rank's result of a small plan over its shard equals its
// shard of the single-rank computation on the whole sequence (in double), to fp32 accuracy.
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/kernels/cpu/Kernels.h"
#include "tests/unit/comm/MpiTestUtil.h"

namespace hcp::testing {
namespace {

using plan::Mesh;
using plan::SequenceLayout;

Mesh CpMesh(SequenceLayout layout) {
  return Mesh{.cp = World().world_size(), .dp = 1, .layout = layout};
}

// ---------------------------------------------------------------------------------------------
// Causal conv1d: halo exchange, then the conv with the halo; backward through the conv and the
// halo's transpose. dw and dbias are sums over the sequence: all-reduced over cp.

class HaloExchange : public ::testing::TestWithParam<SequenceLayout> {};

TEST_P(HaloExchange, ConvWithHaloEqualsConvOnTheWholeSequence) {
  const Mesh mesh = CpMesh(GetParam());
  auto comm = NewCommunicator(mesh);
  const int64_t r = comm->cp_index();
  const int64_t B = 2, C = 3, W = 4, len = 3, segs = mesh.segments_per_rank();
  const int64_t seq = mesh.segments() * len, R = B * segs;

  std::mt19937 rng(11);
  const Vec x = RandomVec(rng, B * seq * C), w = RandomVec(rng, C * W), bias = RandomVec(rng, C),
            dy = RandomVec(rng, B * seq * C);
  Vec y_ref(B * seq * C), dx_ref(B * seq * C), dw_ref(C * W), db_ref(C);
  cpu::causal_conv1d_forward<double>(y_ref.data(), x.data(), nullptr, w.data(), bias.data(), B, seq,
                                     C, W);
  cpu::causal_conv1d_backward<double>(dx_ref.data(), nullptr, dw_ref.data(), db_ref.data(),
                                      dy.data(), x.data(), nullptr, w.data(), B, seq, C, W);

  DistPlan p(1, seq, mesh);
  const uint32_t bx = p.Input("x", {R, len, C}, Shard(x, B, seq, C, mesh, r)),
                 bw = p.Input("w", {C, W}, w), bb = p.Input("bias", {C}, bias),
                 bdy = p.Input("dy", {R, len, C}, Shard(dy, B, seq, C, mesh, r));
  const uint32_t halo = p.Buffer("halo", {R, W - 1, C}), y = p.Buffer("y", {R, len, C});
  p.Step("halo_exchange.forward", {bx}, {halo}, {B, segs, len, C, W - 1});
  p.Step("causal_conv1d.forward", {bx, bw, bb, halo}, {y}, {R, len, C, W, 1, 0, 0});
  const uint32_t dx_local = p.Buffer("dx_local", {R, len, C}), dw_local = p.Buffer("dw_l", {C, W}),
                 db_local = p.Buffer("db_l", {C}), dhalo = p.Buffer("dhalo", {R, W - 1, C});
  const uint32_t dx_halo = p.Buffer("dx_halo", {R, len, C}), dx = p.Buffer("dx", {R, len, C}),
                 dw = p.Buffer("dw", {C, W}), db = p.Buffer("db", {C});
  p.Step("causal_conv1d.backward", {bdy, bx, bw, halo}, {dx_local, dw_local, db_local, dhalo},
         {R, len, C, W, 1, 0, 0});
  p.Step("halo_exchange.backward", {dhalo}, {dx_halo}, {B, segs, len, C, W - 1});
  p.Step("add", {dx_local, dx_halo}, {dx}, {R * len * C, R * len * C});
  p.Step("all_reduce", {dw_local}, {dw}, {C * W, 1});
  p.Step("all_reduce", {db_local}, {db}, {C, 1});
  const absl::Status status = p.Run(*comm);
  ASSERT_TRUE(status.ok()) << status;

  EXPECT_LT(RelRms(p.Get(y), Shard(y_ref, B, seq, C, mesh, r)), kFp32Tolerance);
  EXPECT_LT(RelRms(p.Get(dx), Shard(dx_ref, B, seq, C, mesh, r)), kFp32Tolerance);
  EXPECT_LT(RelRms(p.Get(dw), dw_ref), kFp32Tolerance);
  EXPECT_LT(RelRms(p.Get(db), db_ref), kFp32Tolerance);
}

INSTANTIATE_TEST_SUITE_P(Layouts, HaloExchange,
                         ::testing::Values(SequenceLayout::Contiguous, SequenceLayout::Zigzag),
                         [](const auto& info) { return LayoutName(info.param); });

// ---------------------------------------------------------------------------------------------
// Mamba2 SSD: summary scans from zero, log-decays, state_scan, the rescan with the incoming
// state; the backward as autodiff writes it (rescan backward, state_scan backward, summary-scan
// backward with dfinal, log-decay backward, sums; dA and dD all-reduced over cp).

class StateScan : public ::testing::TestWithParam<std::tuple<SequenceLayout, int64_t>> {};

TEST_P(StateScan, SegmentScansEqualTheScanOfTheWholeSequence) {
  const auto [layout, strategy] = GetParam();
  const Mesh mesh = CpMesh(layout);
  auto comm = NewCommunicator(mesh);
  const int64_t r = comm->cp_index();
  const int64_t B = 2, H = 2, P = 2, G = 1, N = 3, chunk = 3, len = 4;
  const int64_t segs = mesh.segments_per_rank(), seq = mesh.segments() * len, R = B * segs;

  std::mt19937 rng(23);
  const Vec x = RandomVec(rng, B * seq * H * P), dt = RandomVec(rng, B * seq * H, 0.05, 0.8),
            A = RandomVec(rng, H, -1.5, -0.2), Bm = RandomVec(rng, B * seq * G * N),
            Cm = RandomVec(rng, B * seq * G * N), D = RandomVec(rng, H),
            dy = RandomVec(rng, B * seq * H * P);
  const cpu::SsdShape whole{B, seq, H, P, G, N, chunk};
  Vec y_ref(x.size()), dx_ref(x.size()), ddt_ref(dt.size()), dA_ref(H), dB_ref(Bm.size()),
      dC_ref(Cm.size()), dD_ref(H);
  cpu::ssd_scan_forward<double>(y_ref.data(), nullptr, x.data(), dt.data(), A.data(), Bm.data(),
                                Cm.data(), D.data(), nullptr, whole);
  cpu::ssd_scan_backward<double>(dx_ref.data(), ddt_ref.data(), dA_ref.data(), dB_ref.data(),
                                 dC_ref.data(), dD_ref.data(), nullptr, dy.data(), nullptr,
                                 x.data(), dt.data(), A.data(), Bm.data(), Cm.data(), D.data(),
                                 nullptr, whole);

  DistPlan p(1, seq, mesh);
  auto shard = [&](const Vec& v, int64_t inner) { return Shard(v, B, seq, inner, mesh, r); };
  const uint32_t bx = p.Input("x", {R, len, H, P}, shard(x, H * P)),
                 bdt = p.Input("dt", {R, len, H}, shard(dt, H)), bA = p.Input("A", {H}, A),
                 bB = p.Input("B", {R, len, G, N}, shard(Bm, G * N)),
                 bC = p.Input("C", {R, len, G, N}, shard(Cm, G * N)), bD = p.Input("D", {H}, D),
                 bdy = p.Input("dy", {R, len, H, P}, shard(dy, H * P));
  const std::vector<int64_t> x_shape = {R, len, H, P}, dt_shape = {R, len, H},
                             bc_shape = {R, len, G, N}, state_shape = {R, H, P, N};
  auto ints = [&](int64_t has_init) {
    return std::vector<int64_t>{R,
                                len,
                                H,
                                P,
                                G,
                                N,
                                chunk,
                                has_init,
                                /*documents=*/0,
                                /*keep_states=*/0};
  };
  const std::vector<int64_t> scan_ints = {B, segs, H, P, N, strategy};

  // Forward.
  const uint32_t y0 = p.Buffer("y0", x_shape), s_loc = p.Buffer("s_loc", state_shape),
                 g = p.Buffer("g", {R, H}), s_in = p.Buffer("s_in", state_shape),
                 y = p.Buffer("y", x_shape), fin = p.Buffer("final", state_shape);
  p.Step("ssd_scan.forward", {bx, bdt, bA, bB, bC, bD}, {y0, s_loc}, ints(0));
  p.Step("ssd_log_decay.forward", {bdt, bA}, {g}, {R, len, H, 0});
  p.Step("state_scan.forward", {g, s_loc}, {s_in}, scan_ints);
  p.Step("ssd_scan.forward", {bx, bdt, bA, bB, bC, bD, s_in}, {y, fin}, ints(1));

  // Backward.
  auto grads = [&](const std::string& tag) {
    return std::vector<uint32_t>{p.Buffer("dx" + tag, x_shape),  p.Buffer("ddt" + tag, dt_shape),
                                 p.Buffer("dA" + tag, {H}),      p.Buffer("dB" + tag, bc_shape),
                                 p.Buffer("dC" + tag, bc_shape), p.Buffer("dD" + tag, {H})};
  };
  std::vector<uint32_t> g1 = grads("1");
  const uint32_t ds_in = p.Buffer("ds_in", state_shape);
  g1.push_back(ds_in);
  p.Step("ssd_scan.backward", {bdy, bx, bdt, bA, bB, bC, bD, s_in}, g1,
         {R, len, H, P, G, N, chunk, 1, 0, 0, 0});
  const uint32_t dg = p.Buffer("dg", {R, H}), ds = p.Buffer("ds", state_shape);
  p.Step("state_scan.backward", {ds_in, g, s_in}, {dg, ds}, scan_ints);
  const uint32_t zeros = p.Buffer("zeros", x_shape);
  p.Step("fill", {}, {zeros}, {R * len * H * P}, {0.0});
  const std::vector<uint32_t> g2 = grads("2");
  p.Step("ssd_scan.backward", {zeros, bx, bdt, bA, bB, bC, bD, ds}, g2,
         {R, len, H, P, G, N, chunk, 0, 1, 0, 0});
  const uint32_t ddt3 = p.Buffer("ddt3", dt_shape), dA3 = p.Buffer("dA3", {H});
  p.Step("ssd_log_decay.backward", {dg, bdt, bA}, {ddt3, dA3}, {R, len, H});
  // Sums.
  auto add = [&](const std::string& name, uint32_t a, uint32_t b, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    const uint32_t out = p.Buffer(name, shape);
    p.Step("add", {a, b}, {out}, {n, n});
    return out;
  };
  const uint32_t dx = add("dx", g1[0], g2[0], x_shape);
  const uint32_t ddt = add("ddt", add("ddt12", g1[1], g2[1], dt_shape), ddt3, dt_shape);
  const uint32_t dB = add("dB", g1[3], g2[3], bc_shape), dC = add("dC", g1[4], g2[4], bc_shape);
  const uint32_t dA_local = add("dA_local", add("dA12", g1[2], g2[2], {H}), dA3, {H});
  const uint32_t dD_local = add("dD_local", g1[5], g2[5], {H});
  const uint32_t dA = p.Buffer("dA", {H}), dD = p.Buffer("dD", {H});
  p.Step("all_reduce", {dA_local}, {dA}, {H, 1});
  p.Step("all_reduce", {dD_local}, {dD}, {H, 1});

  const absl::Status status = p.Run(*comm);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_LT(RelRms(p.Get(y), shard(y_ref, H * P)), kFp32Tolerance);
  EXPECT_LT(RelRms(p.Get(dx), shard(dx_ref, H * P)), kFp32Tolerance);
  EXPECT_LT(RelRms(p.Get(ddt), shard(ddt_ref, H)), kFp32Tolerance);
  EXPECT_LT(RelRms(p.Get(dB), shard(dB_ref, G * N)), kFp32Tolerance);
  EXPECT_LT(RelRms(p.Get(dC), shard(dC_ref, G * N)), kFp32Tolerance);
  EXPECT_LT(RelRms(p.Get(dA), dA_ref), kFp32Tolerance);
  EXPECT_LT(RelRms(p.Get(dD), dD_ref), kFp32Tolerance);
}

INSTANTIATE_TEST_SUITE_P(LayoutsAndStrategies, StateScan,
                         ::testing::Combine(::testing::Values(SequenceLayout::Contiguous,
                                                              SequenceLayout::Zigzag),
                                            ::testing::Values(int64_t{0}, int64_t{1})),
                         [](const auto& info) {
                           return LayoutName(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) == 0 ? "_AllGather" : "_Chain");
                         });

// ---------------------------------------------------------------------------------------------
// Ring attention, forward and backward, causal or not.

class RingAttention : public ::testing::TestWithParam<std::tuple<SequenceLayout, bool>> {};

TEST_P(RingAttention, EqualsAttentionOnTheWholeSequence) {
  const auto [layout, causal] = GetParam();
  const Mesh mesh = CpMesh(layout);
  auto comm = NewCommunicator(mesh);
  const int64_t r = comm->cp_index();
  const int64_t B = 2, Hq = 4, Hkv = 2, D = 3, len = 3;
  const int64_t seq = mesh.segments() * len, S = seq / mesh.cp;
  const double scale = 0.45;

  std::mt19937 rng(31);
  const Vec q = RandomVec(rng, B * seq * Hq * D), k = RandomVec(rng, B * seq * Hkv * D),
            v = RandomVec(rng, B * seq * Hkv * D), dout = RandomVec(rng, B * seq * Hq * D);
  const cpu::AttentionShape whole{B, seq, seq, Hq, Hkv, D};
  Vec out_ref(q.size()), lse_ref(B * Hq * seq), dq_ref(q.size()), dk_ref(k.size()),
      dv_ref(v.size());
  cpu::attention_forward<double>(out_ref.data(), lse_ref.data(), q.data(), k.data(), v.data(),
                                 whole, scale, causal, 0, 0);
  cpu::attention_backward<double>(dq_ref.data(), dk_ref.data(), dv_ref.data(), dout.data(),
                                  q.data(), k.data(), v.data(), out_ref.data(), lse_ref.data(),
                                  whole, scale, causal, 0, 0);

  DistPlan p(1, seq, mesh);
  auto shard = [&](const Vec& t, int64_t inner) { return Shard(t, B, seq, inner, mesh, r); };
  const uint32_t bq = p.Input("q", {B, S, Hq, D}, shard(q, Hq * D)),
                 bk = p.Input("k", {B, S, Hkv, D}, shard(k, Hkv * D)),
                 bv = p.Input("v", {B, S, Hkv, D}, shard(v, Hkv * D)),
                 bdout = p.Input("dout", {B, S, Hq, D}, shard(dout, Hq * D));
  const uint32_t out = p.Buffer("out", {B, S, Hq, D}), lse = p.Buffer("lse", {B, Hq, S});
  const uint32_t dq = p.Buffer("dq", {B, S, Hq, D}), dk = p.Buffer("dk", {B, S, Hkv, D}),
                 dv = p.Buffer("dv", {B, S, Hkv, D});
  const std::vector<int64_t> ints = {B, S, Hq, Hkv, D, causal ? 1 : 0, /*documents=*/0};
  p.Step("ring_attention.forward", {bq, bk, bv}, {out, lse}, ints, {scale});
  p.Step("ring_attention.backward", {bdout, bq, bk, bv, out, lse}, {dq, dk, dv}, ints, {scale});
  const absl::Status status = p.Run(*comm);
  ASSERT_TRUE(status.ok()) << status;

  EXPECT_LT(RelRms(p.Get(out), shard(out_ref, Hq * D)), kFp32Tolerance);
  EXPECT_LT(RelRms(p.Get(lse), ShardLast(lse_ref, B * Hq, seq, mesh, r)), kFp32Tolerance);
  EXPECT_LT(RelRms(p.Get(dq), shard(dq_ref, Hq * D)), kFp32Tolerance);
  EXPECT_LT(RelRms(p.Get(dk), shard(dk_ref, Hkv * D)), kFp32Tolerance);
  EXPECT_LT(RelRms(p.Get(dv), shard(dv_ref, Hkv * D)), kFp32Tolerance);
}

INSTANTIATE_TEST_SUITE_P(LayoutsAndMasks, RingAttention,
                         ::testing::Combine(::testing::Values(SequenceLayout::Contiguous,
                                                              SequenceLayout::Zigzag),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return LayoutName(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) ? "_Causal" : "_Full");
                         });

// ---------------------------------------------------------------------------------------------
// all_reduce over each group, on cp = N/2 x dp = 2 (one rank: 1 x 1); and the group ranks'
// translation to world ranks, through a shift around the dp group.

TEST(AllReduce, SumsOverWorldCpAndDp) {
  const int world = World().world_size();
  const int64_t dp = world >= 2 ? 2 : 1, cp = world / dp;
  const Mesh mesh{.cp = cp, .dp = dp};
  auto comm = NewCommunicator(mesh);
  const int me = comm->world_rank();
  EXPECT_EQ(comm->cp_index(), me % cp);
  EXPECT_EQ(comm->dp_index(), me / cp);
  EXPECT_EQ(comm->rank(comm::Group::kCp), me % cp);
  EXPECT_EQ(comm->size(comm::Group::kDp), dp);

  const int64_t n = 5;
  auto value = [](int rank, int64_t i) { return double((rank + 1) * (i + 1)); };
  Vec x(n);
  for (int64_t i = 0; i < n; ++i) x[i] = value(me, i);
  DistPlan p(1, cp, mesh);
  const uint32_t bx = p.Input("x", {n}, x);
  const uint32_t y_world = p.Buffer("y_world", {n}), y_cp = p.Buffer("y_cp", {n}),
                 y_dp = p.Buffer("y_dp", {n});
  p.Step("all_reduce", {bx}, {y_world}, {n, 0});
  p.Step("all_reduce", {bx}, {y_cp}, {n, 1});
  p.Step("all_reduce", {bx}, {y_dp}, {n, 2});
  const absl::Status status = p.Run(*comm);
  ASSERT_TRUE(status.ok()) << status;

  Vec want_world(n, 0.0), want_cp(n, 0.0), want_dp(n, 0.0);
  for (int rank = 0; rank < world; ++rank) {
    for (int64_t i = 0; i < n; ++i) {
      want_world[i] += value(rank, i);
      if (rank / cp == me / cp) want_cp[i] += value(rank, i);  // same dp_index
      if (rank % cp == me % cp) want_dp[i] += value(rank, i);  // same cp_index
    }
  }
  EXPECT_EQ(p.Get(y_world), want_world);
  EXPECT_EQ(p.Get(y_cp), want_cp);
  EXPECT_EQ(p.Get(y_dp), want_dp);

  // A shift around the dp group: dp rank d sends its world rank to d+1 and gets d-1's.
  const int d = comm->dp_index(), next = (d + 1) % dp, previous = (d + dp - 1) % dp;
  const int32_t mine = me;
  int32_t got = -1;
  comm->SendRecv(std::as_bytes(std::span(&mine, 1)), next,
                 std::as_writable_bytes(std::span(&got, 1)), previous, comm::Group::kDp);
  EXPECT_EQ(got, previous * cp + comm->cp_index());
  EXPECT_EQ(comm->WorldRank(comm::Group::kDp, previous), got);
}

// ---------------------------------------------------------------------------------------------
// The communicator's traffic accounting: bytes for other ranks only, under the label set last;
// a ring all-reduce's 2 (n-1)/n of the data.

TEST(Traffic, CountsBytesLeavingTheRankByLabel) {
  const int world = World().world_size();
  auto comm = NewCommunicator(Mesh{.cp = world, .dp = 1});
  const int me = comm->world_rank();
  const uint64_t others = static_cast<uint64_t>(world - 1);
  EXPECT_TRUE(comm->bytes_sent().empty());

  std::vector<float> values(12, 1.0f);
  comm->SetTrafficLabel("sums");
  comm->AllReduceSum(values.data(), 12, comm::Group::kWorld);  // 48 bytes of floats
  comm->SetTrafficLabel("gather");
  std::vector<std::byte> gathered(8 * static_cast<size_t>(world));
  comm->AllGather(std::span<const std::byte>(gathered.data(), 8), gathered, comm::Group::kCp);
  // A shift to the next rank (on one rank, to itself: nothing leaves) and an all-to-all with
  // 3 bytes for every group rank, this one's own included.
  comm->SetTrafficLabel("exchange");
  const int32_t mine = me;
  int32_t got = -1;
  comm->SendRecv(std::as_bytes(std::span(&mine, 1)), (me + 1) % world,
                 std::as_writable_bytes(std::span(&got, 1)), (me + world - 1) % world,
                 comm::Group::kCp);
  std::vector<std::byte> send(3 * static_cast<size_t>(world)), recv(send.size());
  comm->AllToAll(send, recv, comm::Group::kCp);

  std::map<std::string, uint64_t, std::less<>> want;
  if (world > 1) {
    want["sums"] = 2 * 48 * others / static_cast<uint64_t>(world);
    want["gather"] = 8 * others;
    want["exchange"] = 4 + 3 * others;
  }
  EXPECT_EQ(comm->bytes_sent(), want);
  comm->ResetTraffic();
  EXPECT_TRUE(comm->bytes_sent().empty());
}

}  // namespace
}  // namespace hcp::testing
