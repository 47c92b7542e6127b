// The float instantiations (what the runtime runs) against the double ones on the same inputs:
// they must agree to ~1e-5 relative RMS, which catches any place where float loses accuracy
// beyond its rounding (e.g. a reduction accumulated in float, a state kept in lower precision).
#include <cmath>
#include <cstdio>
#include <string>

#include "runtime/kernels/cpu/Kernels.h"
#include "tests/unit/kernels_cpu/TestUtil.h"

namespace hcp::cpu {
namespace {

using testing::Vec;

constexpr double kTol = 1e-5;

void expect_agree(const std::vector<Vec>& f, const std::vector<Vec>& d,
                  const std::vector<std::string>& names) {
  ASSERT_EQ(f.size(), names.size());
  for (size_t i = 0; i < f.size(); i++) {
    const double err = testing::rel_rms(f[i], d[i]);
    EXPECT_LT(err, kTol) << names[i];
    EXPECT_GT(testing::max_abs(d[i]), 1e-3) << names[i] << " is all zero";
    std::printf("[ f32/f64  ] %-40s relative RMS difference %.3g\n", names[i].c_str(), err);
  }
}

template <typename T>
std::vector<T> cast(const Vec& v) {
  return std::vector<T>(v.begin(), v.end());
}
template <typename T>
Vec back(const std::vector<T>& v) {
  return Vec(v.begin(), v.end());
}

struct SsdInputs {
  SsdShape s{2, 37, 4, 8, 2, 16, 16};  // three chunks, the last partial
  Vec x, dt, A, B, C, D, init, dy, dfin;
  explicit SsdInputs(std::mt19937& rng) {
    x = testing::random_vec(rng, s.batch * s.seq * s.heads * s.head_dim);
    dt = testing::random_vec(rng, s.batch * s.seq * s.heads, 0.01, 0.5);
    A = testing::random_vec(rng, s.heads, -4.0, -0.5);
    B = testing::random_vec(rng, s.batch * s.seq * s.groups * s.state);
    C = testing::random_vec(rng, B.size());
    D = testing::random_vec(rng, s.heads);
    init = testing::random_vec(rng, s.batch * s.heads * s.head_dim * s.state);
    dy = testing::random_vec(rng, x.size());
    dfin = testing::random_vec(rng, init.size());
  }
};

// Forward outputs then all backward gradients, concatenated.
template <typename T>
std::vector<Vec> run_ssd(const SsdInputs& in) {
  auto x = cast<T>(in.x), dt = cast<T>(in.dt), A = cast<T>(in.A), B = cast<T>(in.B);
  auto C = cast<T>(in.C), D = cast<T>(in.D), init = cast<T>(in.init), dy = cast<T>(in.dy);
  auto dfin = cast<T>(in.dfin);
  std::vector<T> y(x.size()), fin(init.size()), dx(x.size()), ddt(dt.size()), dA(A.size());
  std::vector<T> dB(B.size()), dC(C.size()), dD(D.size()), dinit(init.size());
  ssd_scan_forward<T>(y.data(), fin.data(), x.data(), dt.data(), A.data(), B.data(), C.data(),
                      D.data(), init.data(), in.s);
  ssd_scan_backward<T>(dx.data(), ddt.data(), dA.data(), dB.data(), dC.data(), dD.data(),
                       dinit.data(), dy.data(), dfin.data(), x.data(), dt.data(), A.data(),
                       B.data(), C.data(), D.data(), init.data(), in.s);
  return {back(y),  back(fin), back(dx), back(ddt),  back(dA),
          back(dB), back(dC),  back(dD), back(dinit)};
}

TEST(FloatVsDouble, SsdScan) {
  std::mt19937 rng(80);
  SsdInputs in(rng);
  auto f = run_ssd<float>(in), d = run_ssd<double>(in);
  expect_agree(f, d, {"y", "final_state", "dx", "ddt", "dA", "dB", "dC", "dD", "dinit_state"});
}

struct AttnInputs {
  AttentionShape s{2, 24, 24, 4, 2, 16};
  Vec q, k, v, dout;
  explicit AttnInputs(std::mt19937& rng) {
    q = testing::random_vec(rng, s.batch * s.q_len * s.q_heads * s.head_dim, -2.0, 2.0);
    k = testing::random_vec(rng, s.batch * s.kv_len * s.kv_heads * s.head_dim, -2.0, 2.0);
    v = testing::random_vec(rng, k.size());
    dout = testing::random_vec(rng, q.size());
  }
};

template <typename T>
std::vector<Vec> run_attention(const AttnInputs& in) {
  auto q = cast<T>(in.q), k = cast<T>(in.k), v = cast<T>(in.v), dout = cast<T>(in.dout);
  std::vector<T> out(q.size()), lse(in.s.batch * in.s.q_heads * in.s.q_len);
  std::vector<T> dq(q.size()), dk(k.size()), dv(v.size());
  const T scale = T(1.0 / 16.0);
  attention_forward<T>(out.data(), lse.data(), q.data(), k.data(), v.data(), in.s, scale, true, 0,
                       0);
  attention_backward<T>(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(),
                        out.data(), lse.data(), in.s, scale, true, 0, 0);
  return {back(out), back(lse), back(dq), back(dk), back(dv)};
}

TEST(FloatVsDouble, Attention) {
  std::mt19937 rng(81);
  AttnInputs in(rng);
  auto f = run_attention<float>(in), d = run_attention<double>(in);
  expect_agree(f, d, {"out", "lse", "dq", "dk", "dv"});
}

template <typename T>
std::vector<Vec> run_token_ops(const Vec& xd, const Vec& zd, const Vec& wd, const Vec& cwd,
                               int64_t rows, int64_t dim) {
  auto x = cast<T>(xd), z = cast<T>(zd), w = cast<T>(wd), cw = cast<T>(cwd);
  std::vector<T> norm(x.size()), rstd(rows), gated(x.size()), grstd(rows), conv(x.size());
  std::vector<T> mm(rows * rows), swi(rows * dim / 2), logits_lse(rows);
  rms_norm_forward<T>(norm.data(), rstd.data(), x.data(), w.data(), rows, dim, T(1e-5));
  gated_rms_norm_forward<T>(gated.data(), grstd.data(), x.data(), z.data(), w.data(), rows, dim,
                            T(1e-5));
  // rows as the sequence of one batch row, dim as channels, width 4, the norm weight as bias.
  causal_conv1d_forward<T>(conv.data(), x.data(), nullptr, cw.data(), w.data(), 1, rows, dim, 4);
  gemm<T>(false, true, rows, rows, dim, T(1), x.data(), dim, z.data(), dim, T(0), mm.data(), rows);
  swiglu_forward<T>(swi.data(), x.data(), rows, dim / 2);
  std::vector<int32_t> targets(rows);
  for (int64_t r = 0; r < rows; r++) targets[r] = static_cast<int32_t>((r * 7) % dim);
  T loss, count;
  EXPECT_TRUE(cross_entropy_forward<T>(&loss, &count, logits_lse.data(), x.data(), targets.data(),
                                       rows, dim, -100)
                  .ok());
  return {back(norm), back(gated), back(conv), back(mm), back(swi), back(logits_lse), Vec{loss}};
}

TEST(FloatVsDouble, TokenOps) {
  std::mt19937 rng(82);
  const int64_t rows = 16, dim = 64;
  Vec x = testing::random_vec(rng, rows * dim, -3.0, 3.0), z = testing::random_vec(rng, x.size());
  Vec w = testing::random_vec(rng, dim), cw = testing::random_vec(rng, dim * 4);
  auto f = run_token_ops<float>(x, z, w, cw, rows, dim);
  auto d = run_token_ops<double>(x, z, w, cw, rows, dim);
  expect_agree(f, d, {"rms_norm", "gated_rms_norm", "conv", "gemm", "swiglu", "ce lse", "ce loss"});
}

template <typename T>
std::vector<Vec> run_moe(const Vec& xd, const Vec& logits_d, const Vec& w_in_d, const Vec& w_out_d,
                         const Vec& dout_d, int64_t tokens, int64_t hidden, int64_t inner,
                         int64_t experts, int64_t k) {
  auto x = cast<T>(xd), logits = cast<T>(logits_d), w_in = cast<T>(w_in_d);
  auto w_out = cast<T>(w_out_d), dout = cast<T>(dout_d);
  std::vector<T> gates(tokens * k), out(tokens * hidden), dx(x.size()), dgates(gates.size());
  std::vector<T> dw_in(w_in.size()), dw_out(w_out.size()), dlogits(logits.size());
  std::vector<int32_t> indices(tokens * k);
  topk_softmax_forward<T>(gates.data(), indices.data(), logits.data(), tokens, experts, k);
  moe_experts_forward<T>(out.data(), x.data(), gates.data(), indices.data(), w_in.data(),
                         w_out.data(), tokens, hidden, inner, experts, k);
  moe_experts_backward<T>(dx.data(), dgates.data(), dw_in.data(), dw_out.data(), dout.data(),
                          x.data(), gates.data(), indices.data(), w_in.data(), w_out.data(), tokens,
                          hidden, inner, experts, k);
  topk_softmax_backward<T>(dlogits.data(), dgates.data(), gates.data(), indices.data(), tokens,
                           experts, k);
  return {back(gates), back(out), back(dx), back(dw_in), back(dw_out), back(dlogits)};
}

TEST(FloatVsDouble, Moe) {
  std::mt19937 rng(83);
  const int64_t tokens = 12, hidden = 16, inner = 8, experts = 6, k = 2;
  Vec x = testing::random_vec(rng, tokens * hidden),
      logits = testing::random_vec(rng, tokens * experts);
  Vec w_in = testing::random_vec(rng, experts * 2 * inner * hidden);
  Vec w_out = testing::random_vec(rng, experts * hidden * inner);
  Vec dout = testing::random_vec(rng, tokens * hidden);
  auto f = run_moe<float>(x, logits, w_in, w_out, dout, tokens, hidden, inner, experts, k);
  auto d = run_moe<double>(x, logits, w_in, w_out, dout, tokens, hidden, inner, experts, k);
  expect_agree(f, d, {"gates", "out", "dx", "dw_in", "dw_out", "dlogits"});
}

}  // namespace
}  // namespace hcp::cpu
