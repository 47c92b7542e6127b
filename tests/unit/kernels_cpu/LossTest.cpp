// The ends of the model: embedding lookup and cross-entropy, with their error cases.
#include <cmath>

#include "runtime/kernels/cpu/Kernels.h"
#include "tests/unit/kernels_cpu/TestUtil.h"

namespace hcp::cpu {
namespace {

using testing::Vec;

TEST(Embedding, ForwardLooksUpAndScales) {
  std::mt19937 rng(70);
  const int64_t vocab = 5, hidden = 3;
  Vec table = testing::random_vec(rng, vocab * hidden);
  const std::vector<int32_t> ids = {4, 0, 4, 2};
  Vec out(ids.size() * hidden);
  ASSERT_TRUE(embedding_forward<double>(out.data(), ids.data(), table.data(), ids.size(), vocab,
                                        hidden, 12.0)
                  .ok());
  for (size_t t = 0; t < ids.size(); t++) {
    for (int64_t c = 0; c < hidden; c++)
      EXPECT_EQ(out[t * hidden + c], table[ids[t] * hidden + c] * 12.0);
  }
}

TEST(Embedding, IdOutOfRangeNamesThePosition) {
  const int64_t vocab = 5, hidden = 2;
  Vec table(vocab * hidden, 1.0), out(4 * hidden, 0.0);
  for (int32_t bad : {5, -1}) {
    const std::vector<int32_t> ids = {0, 1, bad, 3};
    absl::Status st =
        embedding_forward<double>(out.data(), ids.data(), table.data(), 4, vocab, hidden, 1.0);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("position 2"), std::string::npos) << st.message();
  }
}

TEST(Embedding, BackwardMatchesFiniteDifferencesAndSkipsPadding) {
  std::mt19937 rng(71);
  const int64_t vocab = 6, hidden = 3;
  const double multiplier = 1.7;
  Vec table = testing::random_vec(rng, vocab * hidden);
  const std::vector<int32_t> ids = {2, 5, 2, 0, 5, 2, 3};  // repeats are summed
  const int64_t tokens = ids.size();
  Vec r = testing::random_vec(rng, tokens * hidden);
  auto objective = [&] {
    Vec out(tokens * hidden);
    EXPECT_TRUE(embedding_forward<double>(out.data(), ids.data(), table.data(), tokens, vocab,
                                          hidden, multiplier)
                    .ok());
    return testing::project(r, out);
  };
  Vec dtable(table.size(), NAN);  // every row is overwritten, unused rows with zero
  embedding_backward<double>(dtable.data(), r.data(), ids.data(), tokens, vocab, hidden, multiplier,
                             -1);
  testing::expect_gradient("embedding dtable", table, dtable, objective);

  Vec padded(table.size(), NAN);
  embedding_backward<double>(padded.data(), r.data(), ids.data(), tokens, vocab, hidden, multiplier,
                             5);
  for (int64_t v = 0; v < vocab; v++) {
    for (int64_t c = 0; c < hidden; c++) {
      const double expected = v == 5 ? 0.0 : dtable[v * hidden + c];
      EXPECT_EQ(padded[v * hidden + c], expected) << "row " << v;
    }
  }
  EXPECT_NE(dtable[5 * hidden], 0.0);
}

TEST(CrossEntropy, ForwardMatchesFormulaWithIgnoredRows) {
  std::mt19937 rng(72);
  const int64_t tokens = 5, vocab = 7, ignore = -100;
  Vec logits = testing::random_vec(rng, tokens * vocab, -4.0, 4.0);
  const std::vector<int32_t> targets = {3, -100, 0, 6, -100};
  double loss = NAN, count = NAN;
  Vec lse(tokens);
  ASSERT_TRUE(cross_entropy_forward<double>(&loss, &count, lse.data(), logits.data(),
                                            targets.data(), tokens, vocab, ignore)
                  .ok());
  double expected = 0.0;
  for (int64_t t = 0; t < tokens; t++) {
    double sum = 0.0;
    for (int64_t v = 0; v < vocab; v++) sum += std::exp(logits[t * vocab + v]);
    EXPECT_NEAR(lse[t], std::log(sum), 1e-13) << "lse is kept for ignored rows too";
    if (targets[t] != ignore) expected += std::log(sum) - logits[t * vocab + targets[t]];
  }
  EXPECT_NEAR(loss, expected, 1e-12);
  EXPECT_EQ(count, 3.0);
}

TEST(CrossEntropy, StableForLargeLogits) {
  const Vec logits = {1000.0, 999.0, 998.0};
  const std::vector<int32_t> targets = {1};
  double loss, count, lse;
  ASSERT_TRUE(
      cross_entropy_forward<double>(&loss, &count, &lse, logits.data(), targets.data(), 1, 3, -100)
          .ok());
  EXPECT_NEAR(lse, 1000.0 + std::log(1.0 + std::exp(-1.0) + std::exp(-2.0)), 1e-10);
  EXPECT_NEAR(loss, lse - 999.0, 1e-10);
}

TEST(CrossEntropy, BadTargetNamesThePosition) {
  const int64_t vocab = 4;
  Vec logits(5 * vocab, 0.0), lse(5);
  double loss, count;
  for (int32_t bad : {4, -1, -99}) {
    const std::vector<int32_t> targets = {0, -100, 1, bad, 2};
    absl::Status st = cross_entropy_forward<double>(&loss, &count, lse.data(), logits.data(),
                                                    targets.data(), 5, vocab, -100);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("position 3"), std::string::npos) << st.message();
  }
}

TEST(CrossEntropy, BackwardMatchesFiniteDifferencesAndZeroesIgnoredRows) {
  std::mt19937 rng(73);
  const int64_t tokens = 4, vocab = 5, ignore = -100;
  Vec logits = testing::random_vec(rng, tokens * vocab, -3.0, 3.0);
  const std::vector<int32_t> targets = {2, -100, 4, 0};
  const double dloss = 0.7;
  auto objective = [&] {
    double loss, count;
    Vec lse(tokens);
    EXPECT_TRUE(cross_entropy_forward<double>(&loss, &count, lse.data(), logits.data(),
                                              targets.data(), tokens, vocab, ignore)
                    .ok());
    return dloss * loss;
  };
  double loss, count;
  Vec lse(tokens), dlogits(logits.size(), NAN);
  ASSERT_TRUE(cross_entropy_forward<double>(&loss, &count, lse.data(), logits.data(),
                                            targets.data(), tokens, vocab, ignore)
                  .ok());
  cross_entropy_backward<double>(dlogits.data(), &dloss, logits.data(), lse.data(), targets.data(),
                                 tokens, vocab, ignore);
  testing::expect_gradient("cross_entropy dlogits", logits, dlogits, objective);
  for (int64_t v = 0; v < vocab; v++) EXPECT_EQ(dlogits[1 * vocab + v], 0.0);
  // A valid row's gradient sums to zero (softmax minus one-hot).
  double row_sum = 0.0;
  for (int64_t v = 0; v < vocab; v++) row_sum += dlogits[v];
  EXPECT_NEAR(row_sum, 0.0, 1e-14);
}

}  // namespace
}  // namespace hcp::cpu
