// MoE routing and experts: top-k selection (with ties), the softmax over the selected logits,
// the experts' forward against a dense per-expert formulation, and both backwards.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "runtime/kernels/cpu/Kernels.h"
#include "tests/unit/kernels_cpu/TestUtil.h"

namespace hcp::cpu {
namespace {

using testing::Vec;

TEST(TopkSoftmax, TiesGoToTheLowerExpertIndex) {
  const int64_t experts = 6, k = 3;
  const Vec logits = {0.5, 2.0, -1.0, 2.0, 2.0, 1.0,   // three-way tie for the top
                      1.0, 1.0, 1.0,  1.0, 1.0, 1.0};  // all equal
  Vec gates(2 * k);
  std::vector<int32_t> indices(2 * k);
  topk_softmax_forward<double>(gates.data(), indices.data(), logits.data(), 2, experts, k);
  EXPECT_EQ(indices, (std::vector<int32_t>{1, 3, 4, 0, 1, 2}));
  for (double g : gates) EXPECT_NEAR(g, 1.0 / 3.0, 1e-15);
}

TEST(TopkSoftmax, ForwardMatchesRepeatedArgmax) {
  std::mt19937 rng(60);
  const int64_t tokens = 5, experts = 7, k = 3;
  Vec logits = testing::random_vec(rng, tokens * experts, -3.0, 3.0);
  Vec gates(tokens * k);
  std::vector<int32_t> indices(tokens * k);
  topk_softmax_forward<double>(gates.data(), indices.data(), logits.data(), tokens, experts, k);
  for (int64_t t = 0; t < tokens; t++) {
    std::vector<bool> taken(experts, false);
    double denom = 0.0;
    std::vector<int32_t> expected(k);
    for (int64_t j = 0; j < k; j++) {
      int32_t best = -1;
      for (int32_t e = 0; e < experts; e++) {
        if (!taken[e] && (best < 0 || logits[t * experts + e] > logits[t * experts + best]))
          best = e;
      }
      taken[best] = true;
      expected[j] = best;
      denom += std::exp(logits[t * experts + best]);
    }
    for (int64_t j = 0; j < k; j++) {
      EXPECT_EQ(indices[t * k + j], expected[j]);
      EXPECT_NEAR(gates[t * k + j], std::exp(logits[t * experts + expected[j]]) / denom, 1e-14);
    }
  }
}

// Experts chosen elsewhere (the reference of test_plan_step routed as the GPU): the softmax of
// the logits at exactly those experts, in the given order, not the top k.
TEST(SelectedSoftmax, GatesOfTheGivenExperts) {
  std::mt19937 rng(61);
  const int64_t tokens = 4, experts = 6, k = 3;
  Vec logits = testing::random_vec(rng, tokens * experts, -3.0, 3.0);
  const std::vector<int32_t> chosen = {5, 0, 2, 1, 3, 4, 0, 1, 2, 3, 5, 4};
  Vec gates(tokens * k);
  selected_softmax_forward<double>(gates.data(), chosen.data(), logits.data(), tokens, experts, k);
  for (int64_t t = 0; t < tokens; t++) {
    double denom = 0.0;
    for (int64_t j = 0; j < k; j++) denom += std::exp(logits[t * experts + chosen[t * k + j]]);
    for (int64_t j = 0; j < k; j++) {
      EXPECT_NEAR(gates[t * k + j], std::exp(logits[t * experts + chosen[t * k + j]]) / denom,
                  1e-14)
          << t << " " << j;
    }
  }
  // At top_k's own choice it gives top_k's gates, bit for bit.
  Vec top_gates(tokens * k), again(tokens * k);
  std::vector<int32_t> top(tokens * k);
  topk_softmax_forward<double>(top_gates.data(), top.data(), logits.data(), tokens, experts, k);
  selected_softmax_forward<double>(again.data(), top.data(), logits.data(), tokens, experts, k);
  EXPECT_EQ(again, top_gates);
}

TEST(TopkSoftmax, BackwardMatchesFiniteDifferences) {
  std::mt19937 rng(61);
  const int64_t tokens = 4, experts = 6, k = 3;
  // Distinct, well separated logits per row, so a perturbation of 1e-6 never changes the
  // selection (the selection itself is not differentiable).
  Vec logits(tokens * experts);
  for (int64_t t = 0; t < tokens; t++) {
    std::vector<int> perm(experts);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t e = 0; e < experts; e++) logits[t * experts + e] = 0.4 * perm[e] + 0.01 * t;
  }
  Vec r = testing::random_vec(rng, tokens * k);
  auto objective = [&] {
    Vec gates(tokens * k);
    std::vector<int32_t> indices(tokens * k);
    topk_softmax_forward<double>(gates.data(), indices.data(), logits.data(), tokens, experts, k);
    return testing::project(r, gates);
  };
  Vec gates(tokens * k), dlogits(logits.size());
  std::vector<int32_t> indices(tokens * k);
  topk_softmax_forward<double>(gates.data(), indices.data(), logits.data(), tokens, experts, k);
  topk_softmax_backward<double>(dlogits.data(), r.data(), gates.data(), indices.data(), tokens,
                                experts, k);
  testing::expect_gradient("topk_softmax dlogits", logits, dlogits, objective);
  // The unselected logits get exactly zero.
  for (int64_t t = 0; t < tokens; t++) {
    int64_t zeros = 0;
    for (int64_t e = 0; e < experts; e++) zeros += dlogits[t * experts + e] == 0.0;
    EXPECT_EQ(zeros, experts - k);
  }
}

struct MoeData {
  int64_t tokens = 5, hidden = 4, inner = 3, experts = 4, k = 2;
  Vec x, gates, w_in, w_out;
  std::vector<int32_t> indices;
  explicit MoeData(std::mt19937& rng) {
    x = testing::random_vec(rng, tokens * hidden);
    gates = testing::random_vec(rng, tokens * k, 0.1, 0.9);
    w_in = testing::random_vec(rng, experts * 2 * inner * hidden);
    w_out = testing::random_vec(rng, experts * hidden * inner);
    // Expert 3 gets no token: its weight gradients must come out zero.
    indices = {0, 1, 1, 2, 2, 0, 1, 0, 0, 2};
  }
  Vec forward() const {
    Vec out(tokens * hidden);
    moe_experts_forward<double>(out.data(), x.data(), gates.data(), indices.data(), w_in.data(),
                                w_out.data(), tokens, hidden, inner, experts, k);
    return out;
  }
};

TEST(MoeExperts, ForwardMatchesDenseExperts) {
  std::mt19937 rng(62);
  MoeData m(rng);
  // Every expert on every token, weighted by a dense [tokens, experts] gate matrix (zero where
  // the token is not routed).
  Vec dense_gate(m.tokens * m.experts, 0.0);
  for (int64_t t = 0; t < m.tokens; t++) {
    for (int64_t j = 0; j < m.k; j++)
      dense_gate[t * m.experts + m.indices[t * m.k + j]] += m.gates[t * m.k + j];
  }
  Vec expected(m.tokens * m.hidden, 0.0);
  for (int64_t e = 0; e < m.experts; e++) {
    Vec hin(m.tokens * 2 * m.inner), u(m.tokens * m.inner), o(m.tokens * m.hidden);
    gemm<double>(false, true, m.tokens, 2 * m.inner, m.hidden, 1.0, m.x.data(), m.hidden,
                 m.w_in.data() + e * 2 * m.inner * m.hidden, m.hidden, 0.0, hin.data(),
                 2 * m.inner);
    swiglu_forward<double>(u.data(), hin.data(), m.tokens, m.inner);
    gemm<double>(false, true, m.tokens, m.hidden, m.inner, 1.0, u.data(), m.inner,
                 m.w_out.data() + e * m.hidden * m.inner, m.inner, 0.0, o.data(), m.hidden);
    for (int64_t t = 0; t < m.tokens; t++) {
      for (int64_t r = 0; r < m.hidden; r++)
        expected[t * m.hidden + r] += dense_gate[t * m.experts + e] * o[t * m.hidden + r];
    }
  }
  EXPECT_LT(testing::max_rel_diff(m.forward(), expected), 1e-13);
}

// A token's output must not depend on the tokens around it (a context-parallel split changes
// them): 150 tokens against each token alone, bit for bit, in float.
TEST(MoeExperts, ForwardOfATokenDoesNotDependOnTheOthers) {
  std::mt19937 rng(64);
  const int64_t tokens = 150, hidden = 6, inner = 5, experts = 5, k = 2;
  const std::vector<float> x = testing::to_float(testing::random_vec(rng, tokens * hidden));
  const std::vector<float> gates =
      testing::to_float(testing::random_vec(rng, tokens * k, 0.1, 0.9));
  const std::vector<float> w_in =
      testing::to_float(testing::random_vec(rng, experts * 2 * inner * hidden));
  const std::vector<float> w_out =
      testing::to_float(testing::random_vec(rng, experts * hidden * inner));
  std::vector<int32_t> indices(tokens * k);
  for (int64_t t = 0; t < tokens; t++) {
    indices[t * k] = static_cast<int32_t>(rng() % experts);
    indices[t * k + 1] =
        static_cast<int32_t>((indices[t * k] + 1 + rng() % (experts - 1)) % experts);
  }
  std::vector<float> out(tokens * hidden), one(hidden);
  moe_experts_forward<float>(out.data(), x.data(), gates.data(), indices.data(), w_in.data(),
                             w_out.data(), tokens, hidden, inner, experts, k);
  for (int64_t t = 0; t < tokens; t++) {
    moe_experts_forward<float>(one.data(), x.data() + t * hidden, gates.data() + t * k,
                               indices.data() + t * k, w_in.data(), w_out.data(), 1, hidden, inner,
                               experts, k);
    for (int64_t r = 0; r < hidden; r++) ASSERT_EQ(out[t * hidden + r], one[r]) << "token " << t;
  }
}

TEST(MoeExperts, BackwardMatchesFiniteDifferences) {
  std::mt19937 rng(63);
  MoeData m(rng);
  Vec r = testing::random_vec(rng, m.tokens * m.hidden);
  auto objective = [&] { return testing::project(r, m.forward()); };
  Vec dx(m.x.size(), NAN), dgates(m.gates.size(), NAN), dw_in(m.w_in.size(), NAN),
      dw_out(m.w_out.size(), NAN);
  moe_experts_backward<double>(dx.data(), dgates.data(), dw_in.data(), dw_out.data(), r.data(),
                               m.x.data(), m.gates.data(), m.indices.data(), m.w_in.data(),
                               m.w_out.data(), m.tokens, m.hidden, m.inner, m.experts, m.k);
  testing::expect_gradient("moe dx", m.x, dx, objective);
  testing::expect_gradient("moe dgates", m.gates, dgates, objective);
  testing::expect_gradient("moe dw_in", m.w_in, dw_in, objective);
  testing::expect_gradient("moe dw_out", m.w_out, dw_out, objective);
  const int64_t in_size = 2 * m.inner * m.hidden, out_size = m.hidden * m.inner;
  for (int64_t i = 0; i < in_size; i++) EXPECT_EQ(dw_in[3 * in_size + i], 0.0);
  for (int64_t i = 0; i < out_size; i++) EXPECT_EQ(dw_out[3 * out_size + i], 0.0);
}

}  // namespace
}  // namespace hcp::cpu
