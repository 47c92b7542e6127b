// Deterministic, shard-independent initialisation.
#include <cmath>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/weights/Init.h"

namespace hcp {
namespace {

// The documented building blocks, against published values.
TEST(Init, KnownAnswers) {
  EXPECT_EQ(Fnv1a64(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(Fnv1a64("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(Mix64(0x9E3779B97F4A7C15ull), 0xe220a8397b1dcdafull);  // splitmix64(0), first output
  // Values from an independent Python implementation of the scheme in Init.h.
  float z[4];
  FillNormal(z, 0, 4, 42, "model.embed_tokens.weight", 1.0f);
  EXPECT_FLOAT_EQ(z[0], -0.791583240032196f);
  EXPECT_FLOAT_EQ(z[1], -0.9989436268806458f);
  EXPECT_FLOAT_EQ(z[2], -2.756469488143921f);
  EXPECT_FLOAT_EQ(z[3], 0.9013271331787109f);
  FillNormal(z, 1000001, 1, 42, "model.embed_tokens.weight", 1.0f);
  EXPECT_FLOAT_EQ(z[0], 0.762848436832428f);
}

// Element i is the same bits whichever range of the tensor it was filled as part of.
TEST(Init, IndependentOfRanges) {
  const int64_t n = 1001;
  std::vector<float> whole(n);
  FillNormal(whole.data(), 0, n, 7, "w", 0.02f);
  for (std::vector<int64_t> cuts : std::vector<std::vector<int64_t>>{
           {0, 1, 333, 1001}, {0, 500, 501, 1001}, {0, 2, 3, 4, 998, 1001}}) {
    std::vector<float> pieces(n);
    for (size_t k = 0; k + 1 < cuts.size(); ++k) {
      FillNormal(pieces.data() + cuts[k], cuts[k], cuts[k + 1] - cuts[k], 7, "w", 0.02f);
    }
    EXPECT_EQ(std::memcmp(whole.data(), pieces.data(), n * sizeof(float)), 0);
  }
  std::vector<float> uniform_whole(n), uniform_tail(n - 77);
  FillUniform(uniform_whole.data(), 0, n, 7, "u", -1, 1);
  FillUniform(uniform_tail.data(), 77, n - 77, 7, "u", -1, 1);
  EXPECT_EQ(std::memcmp(uniform_whole.data() + 77, uniform_tail.data(), (n - 77) * 4), 0);
}

TEST(Init, NormalStatistics) {
  const int64_t n = 100000;
  const float stddev = 0.02f;
  std::vector<float> x(n);
  FillNormal(x.data(), 0, n, 1234, "model.layers.0.mamba.in_proj.weight", stddev);
  double sum = 0, sum_sq = 0, beyond_3 = 0;
  for (float v : x) {
    ASSERT_TRUE(std::isfinite(v));
    sum += v;
    sum_sq += double{v} * v;
    beyond_3 += std::abs(v) > 3 * stddev;
  }
  double mean = sum / n;
  double sd = std::sqrt(sum_sq / n - mean * mean);
  EXPECT_LT(std::abs(mean), 4 * stddev / std::sqrt(double(n)));  // 4 standard errors
  EXPECT_NEAR(sd, stddev, 0.02 * stddev);
  EXPECT_NEAR(beyond_3 / n, 0.0027, 0.001);  // the tails are there too
}

TEST(Init, UniformStaysInRange) {
  std::vector<float> x(100000);
  FillUniform(x.data(), 0, x.size(), 5, "u", -0.5f, 0.25f);
  double sum = 0;
  for (float v : x) {
    ASSERT_GE(v, -0.5f);
    ASSERT_LT(v, 0.25f);
    sum += v;
  }
  EXPECT_NEAR(sum / x.size(), -0.125, 0.003);
}

TEST(Init, NamesAndSeedsGiveDifferentStreams) {
  const int64_t n = 4096;
  std::vector<float> a(n), b(n), c(n);
  FillNormal(a.data(), 0, n, 1, "model.layers.0.mamba.A_log", 1);
  FillNormal(b.data(), 0, n, 1, "model.layers.1.mamba.A_log", 1);
  FillNormal(c.data(), 0, n, 2, "model.layers.0.mamba.A_log", 1);
  int same_ab = 0, same_ac = 0;
  double dot = 0;
  for (int64_t i = 0; i < n; ++i) {
    same_ab += a[i] == b[i];
    same_ac += a[i] == c[i];
    dot += double{a[i]} * b[i];
  }
  EXPECT_EQ(same_ab, 0);
  EXPECT_EQ(same_ac, 0);
  EXPECT_LT(std::abs(dot / n), 0.1);  // uncorrelated
}

TEST(Init, Constant) {
  std::vector<float> x(5, 0.0f);
  FillConstant(x.data(), 4, 1.5f);
  EXPECT_EQ(x, (std::vector<float>{1.5f, 1.5f, 1.5f, 1.5f, 0.0f}));
}

}  // namespace
}  // namespace hcp
