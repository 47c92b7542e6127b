// The MoE load-balancing loss: a layer's statistics against their definition, the combination,
// and both backwards against finite differences of the whole loss (through the logits' softmax;
// the picks, counts, carry no gradient).
#include <cmath>
#include <numeric>

#include "runtime/kernels/cpu/Kernels.h"
#include "tests/unit/kernels_cpu/TestUtil.h"

namespace hcp::cpu {
namespace {

using testing::Vec;

TEST(RouterLoad, SumsTheSoftmaxAndCountsThePicks) {
  const int64_t tokens = 3, experts = 4, k = 2;
  const Vec logits = {0.0,  1.0, 2.0, 3.0,  //
                      1.0,  1.0, 1.0, 1.0,  //
                      -2.0, 0.5, 0.0, 4.0};
  const std::vector<int32_t> picked = {3, 2, 0, 1, 3, 1};
  Vec probs(experts), picks(experts);
  ASSERT_TRUE(router_load_forward<double>(probs.data(), picks.data(), logits.data(), picked.data(),
                                          tokens, experts, k)
                  .ok());
  EXPECT_EQ(picks, (Vec{1, 2, 1, 2}));
  for (int64_t e = 0; e < experts; e++) {
    double expected = 0.0;
    for (int64_t t = 0; t < tokens; t++) {
      double denom = 0.0;
      for (int64_t f = 0; f < experts; f++) denom += std::exp(logits[t * experts + f]);
      expected += std::exp(logits[t * experts + e]) / denom;
    }
    EXPECT_NEAR(probs[e], expected, 1e-15) << e;
  }
  EXPECT_NEAR(std::accumulate(probs.begin(), probs.end(), 0.0), tokens, 1e-14);

  const std::vector<int32_t> bad = {3, 2, 0, 4, 3, 1};
  absl::Status status = router_load_forward<double>(probs.data(), picks.data(), logits.data(),
                                                    bad.data(), tokens, experts, k);
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find("expert index 4 of token 1, slot 1, is outside [0, 4)"),
            std::string::npos)
      << status;
}

// aux = scale * sum probs * picks; with every token spread evenly (probs 1/E each, picks k/E of
// the rows each) it is k, the balanced value transformers' loss takes.
TEST(RouterAuxLoss, IsTheScaledDotProductAndKWhenBalanced) {
  const int64_t experts = 4, k = 2, rows = 8;
  const Vec probs(experts, rows / 4.0), picks(experts, rows * k / 4.0);
  double loss = 0.0;
  router_aux_loss_forward<double>(&loss, probs.data(), picks.data(), experts,
                                  static_cast<double>(experts) / (rows * rows));
  EXPECT_NEAR(loss, k, 1e-15);
  Vec dprobs(experts);
  const double dloss = 0.5;
  router_aux_loss_backward<double>(dprobs.data(), &dloss, picks.data(), experts, 3.0);
  for (int64_t e = 0; e < experts; e++) EXPECT_DOUBLE_EQ(dprobs[e], 0.5 * 3.0 * picks[e]);
}

// The whole loss of two layers' logits (picks held fixed: a count has no gradient) against
// finite differences: router_aux_loss_backward, then router_load_backward per layer.
TEST(RouterLoad, BackwardMatchesFiniteDifferences) {
  std::mt19937 rng(71);
  const int64_t tokens = 5, experts = 6, k = 2;
  Vec layer0 = testing::random_vec(rng, tokens * experts, -2.0, 2.0);
  Vec layer1 = testing::random_vec(rng, tokens * experts, -2.0, 2.0);
  std::vector<int32_t> picked(tokens * k);
  for (int64_t i = 0; i < tokens * k; i++) picked[i] = static_cast<int32_t>((i * 5 + 1) % experts);
  const double scale = static_cast<double>(experts) / std::pow(2.0 * tokens, 2);
  auto stats = [&](const Vec& logits, Vec& probs, Vec& picks) {
    EXPECT_TRUE(router_load_forward<double>(probs.data(), picks.data(), logits.data(),
                                            picked.data(), tokens, experts, k)
                    .ok());
  };
  auto objective = [&] {
    Vec p0(experts), c0(experts), p1(experts), c1(experts);
    stats(layer0, p0, c0);
    stats(layer1, p1, c1);
    for (int64_t e = 0; e < experts; e++) p0[e] += p1[e], c0[e] += c1[e];
    double loss = 0.0;
    router_aux_loss_forward<double>(&loss, p0.data(), c0.data(), experts, scale);
    return loss;
  };
  Vec p0(experts), c0(experts), p1(experts), c1(experts);
  stats(layer0, p0, c0);
  stats(layer1, p1, c1);
  Vec picks(experts);
  for (int64_t e = 0; e < experts; e++) picks[e] = c0[e] + c1[e];
  const double dloss = 1.0;
  Vec dprobs(experts), d0(layer0.size()), d1(layer1.size());
  router_aux_loss_backward<double>(dprobs.data(), &dloss, picks.data(), experts, scale);
  router_load_backward<double>(d0.data(), dprobs.data(), layer0.data(), tokens, experts);
  router_load_backward<double>(d1.data(), dprobs.data(), layer1.data(), tokens, experts);
  testing::expect_gradient("router logits, layer 0", layer0, d0, objective);
  testing::expect_gradient("router logits, layer 1", layer1, d1, objective);
}

}  // namespace
}  // namespace hcp::cpu
