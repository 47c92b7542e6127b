// AdamW (hand-computed and against a double reference), the schedule, clipping, the NaN/Inf
// policy, the decay rule, and sharded updates equal to whole ones.
#include "runtime/train/AdamW.h"

#include <cmath>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/train/TestUtil.h"

namespace hcp::train {
namespace {

using testing::FailsWith;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// ------------------------------------------------------------------------------------------------
// Schedule

TEST(Schedule, WarmupThenCosineToMin) {
  const LrSchedule s{.max_lr = 1e-3, .min_lr = 1e-4, .warmup_steps = 10, .total_steps = 110};
  ASSERT_TRUE(ValidateSchedule(s).ok());
  EXPECT_DOUBLE_EQ(LearningRate(s, 0), 1e-4);  // (0 + 1) / 10 of max
  EXPECT_DOUBLE_EQ(LearningRate(s, 4), 5e-4);
  EXPECT_DOUBLE_EQ(LearningRate(s, 9), 1e-3);     // warmup end
  EXPECT_DOUBLE_EQ(LearningRate(s, 10), 1e-3);    // decay start
  EXPECT_DOUBLE_EQ(LearningRate(s, 60), 5.5e-4);  // halfway: (max + min) / 2
  EXPECT_NEAR(LearningRate(s, 35), 1e-4 + 0.9e-3 * (1 + std::cos(M_PI / 4)) / 2, 1e-15);
  EXPECT_GT(LearningRate(s, 109), 1e-4);
  EXPECT_NEAR(LearningRate(s, 109), 1e-4, 1e-6);
  EXPECT_DOUBLE_EQ(LearningRate(s, 110), 1e-4);  // end
  EXPECT_DOUBLE_EQ(LearningRate(s, 5000), 1e-4);
  EXPECT_DOUBLE_EQ(LearningRate(s, -3), 1e-4);  // as step 0
}

TEST(Schedule, EdgeCases) {
  const LrSchedule no_warmup{.max_lr = 2.0, .min_lr = 0.0, .warmup_steps = 0, .total_steps = 4};
  EXPECT_DOUBLE_EQ(LearningRate(no_warmup, 0), 2.0);
  EXPECT_DOUBLE_EQ(LearningRate(no_warmup, 2), 1.0);
  EXPECT_DOUBLE_EQ(LearningRate(no_warmup, 4), 0.0);
  const LrSchedule all_warmup{.max_lr = 1.0, .min_lr = 0.5, .warmup_steps = 4, .total_steps = 4};
  EXPECT_DOUBLE_EQ(LearningRate(all_warmup, 3), 1.0);
  EXPECT_DOUBLE_EQ(LearningRate(all_warmup, 4), 0.5);
  const LrSchedule constant{.max_lr = 0.1, .min_lr = 0.1, .warmup_steps = 0, .total_steps = 1};
  EXPECT_DOUBLE_EQ(LearningRate(constant, 0), 0.1);
  EXPECT_DOUBLE_EQ(LearningRate(constant, 7), 0.1);
}

TEST(Schedule, LinearAndConstantDecays) {
  LrSchedule s{.max_lr = 1e-3, .min_lr = 1e-4, .warmup_steps = 10, .total_steps = 110};
  s.decay = LrDecay::kLinear;
  EXPECT_DOUBLE_EQ(LearningRate(s, 4), 5e-4);   // the same warmup
  EXPECT_DOUBLE_EQ(LearningRate(s, 10), 1e-3);  // decay start
  EXPECT_NEAR(LearningRate(s, 35), 1e-3 - 0.9e-3 / 4, 1e-15);
  EXPECT_NEAR(LearningRate(s, 60), 5.5e-4, 1e-15);
  EXPECT_DOUBLE_EQ(LearningRate(s, 110), 1e-4);
  s.decay = LrDecay::kConstant;
  EXPECT_DOUBLE_EQ(LearningRate(s, 4), 5e-4);
  EXPECT_DOUBLE_EQ(LearningRate(s, 60), 1e-3);
  EXPECT_DOUBLE_EQ(LearningRate(s, 5000), 1e-3);
  for (LrDecay decay : {LrDecay::kCosine, LrDecay::kLinear, LrDecay::kConstant}) {
    absl::StatusOr<LrDecay> parsed = ParseLrDecay(LrDecayName(decay));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, decay);
  }
  EXPECT_TRUE(FailsWith(ParseLrDecay("step").status(),
                        "schedule step: the learning-rate schedules are cosine, linear and "
                        "constant"));
}

TEST(Schedule, BadSchedulesAreRefused) {
  EXPECT_TRUE(
      FailsWith(ValidateSchedule({.max_lr = 1e-4, .min_lr = 1e-3}), "need 0 <= min_lr <= max_lr"));
  EXPECT_TRUE(FailsWith(ValidateSchedule({.max_lr = kNaN}), "min_lr <= max_lr"));
  EXPECT_TRUE(FailsWith(ValidateSchedule({.total_steps = 0}), "total_steps must be at least 1"));
  EXPECT_TRUE(FailsWith(ValidateSchedule({.warmup_steps = 5, .total_steps = 4}),
                        "warmup_steps 5 is not within [0, total_steps 4]"));
}

// ------------------------------------------------------------------------------------------------
// The update

// One parameter p = 1, gradients 0.5 then -0.25, lr 0.1, beta1 0.9, beta2 0.999, eps 1e-8.
//   t = 1: m = 0.05, v = 0.00025, m^ = 0.5, v^ = 0.25
//          p = 1 - 0.1 * 0.5 / (0.5 + 1e-8) = 0.900000002
//   t = 2: m = 0.045 - 0.025 = 0.02, v = 0.00024975 + 0.0000625 = 0.00031225,
//          m^ = 0.02 / 0.19 = 0.105263158, v^ = 0.00031225 / 0.001999 = 0.156203102
//          p = 0.900000002 - 0.1 * 0.105263158 / (0.395225380 + 1e-8) = 0.873366299
// With weight decay 0.1 the parameter is first scaled by 1 - 0.1 * 0.1 = 0.99 each step:
//   t = 1: 0.99 - 0.099999998 = 0.890000002; t = 2: 0.8811000020 - 0.0266337033 = 0.854466299
TEST(AdamW, HandComputedTwoSteps) {
  for (double wd : {0.0, 0.1}) {
    SCOPED_TRACE(wd);
    absl::StatusOr<FlatLayout> layout = FlatLayout::Create({{"w", {1, 1}, true}});
    ASSERT_TRUE(layout.ok());
    const AdamWConfig config{.beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = wd};
    absl::StatusOr<AdamW> opt = AdamW::Create(*layout, config);
    ASSERT_TRUE(opt.ok()) << opt.status();
    float p = 1.0f;
    const float g1 = 0.5f, g2 = -0.25f;

    AdamWUpdate u1 = opt->NextUpdate(0.1, 1.0);
    EXPECT_EQ(u1.t, 1);
    ASSERT_TRUE(opt->UpdateTensor(u1, "w", &p, &g1).ok());
    ASSERT_TRUE(opt->Commit(u1).ok());
    EXPECT_NEAR(opt->exp_avg()[0], 0.05, 1e-8);
    EXPECT_NEAR(opt->exp_avg_sq()[0], 0.00025, 1e-10);  // fp32: ~1e-7 relative
    EXPECT_NEAR(p, wd == 0 ? 0.900000002 : 0.890000002, 1e-7);

    AdamWUpdate u2 = opt->NextUpdate(0.1, 1.0);
    EXPECT_EQ(u2.t, 2);
    ASSERT_TRUE(opt->UpdateTensor(u2, "w", &p, &g2).ok());
    ASSERT_TRUE(opt->Commit(u2).ok());
    EXPECT_NEAR(opt->exp_avg()[0], 0.02, 1e-8);
    EXPECT_NEAR(opt->exp_avg_sq()[0], 0.00031225, 1e-10);
    EXPECT_NEAR(p, wd == 0 ? 0.873366299 : 0.854466299, 1e-6);
    EXPECT_EQ(opt->updates(), 2);
  }
}

// A small deterministic generator for test data (no <random> distribution differences).
class Lcg {
 public:
  explicit Lcg(uint64_t seed) : state_(seed) {}
  float Next() {  // in [-1, 1)
    state_ = state_ * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<float>(static_cast<int64_t>(state_ >> 11) - (int64_t{1} << 52)) * 0x1p-52f;
  }

 private:
  uint64_t state_;
};

// The formula of AdamW.h in double, element by element.
struct Reference {
  std::vector<double> p, m, v;
  void Update(const AdamWConfig& c, double lr, double clip, int64_t t, bool decay,
              const std::vector<float>& grad) {
    for (size_t i = 0; i < p.size(); ++i) {
      const double g = grad[i] * clip;
      m[i] = c.beta1 * m[i] + (1 - c.beta1) * g;
      v[i] = c.beta2 * v[i] + (1 - c.beta2) * g * g;
      const double mhat = m[i] / (1 - std::pow(c.beta1, t));
      const double vhat = v[i] / (1 - std::pow(c.beta2, t));
      p[i] =
          p[i] - lr * (decay ? c.weight_decay : 0.0) * p[i] - lr * mhat / (std::sqrt(vhat) + c.eps);
    }
  }
};

TEST(AdamW, MatchesTheDoubleReference) {
  const AdamWConfig config{.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  for (bool decay : {false, true}) {
    SCOPED_TRACE(decay);
    const int64_t n = 257;
    absl::StatusOr<FlatLayout> layout = FlatLayout::Create({{"w", {n}, decay}});
    ASSERT_TRUE(layout.ok());
    absl::StatusOr<AdamW> opt = AdamW::Create(*layout, config);
    ASSERT_TRUE(opt.ok());
    Lcg rng(7);
    std::vector<float> p(n);
    for (float& x : p) x = rng.Next();
    Reference ref{std::vector<double>(p.begin(), p.end()), std::vector<double>(n),
                  std::vector<double>(n)};
    for (int t = 1; t <= 6; ++t) {
      std::vector<float> g(n);
      for (float& x : g) x = rng.Next() * static_cast<float>(t);
      const double lr = 1e-2 / t, clip = t % 2 ? 1.0 : 0.5;
      AdamWUpdate u = opt->NextUpdate(lr, clip);
      ASSERT_TRUE(opt->UpdateTensor(u, "w", p.data(), g.data()).ok());
      ASSERT_TRUE(opt->Commit(u).ok());
      ref.Update(config, lr, clip, t, decay, g);
    }
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_NEAR(p[i], ref.p[i], 1e-6 * (1 + std::abs(ref.p[i]))) << i;
      ASSERT_NEAR(opt->exp_avg()[i], ref.m[i], 1e-6 * (1 + std::abs(ref.m[i]))) << i;
      ASSERT_NEAR(opt->exp_avg_sq()[i], ref.v[i], 1e-5 * ref.v[i] + 1e-12) << i;
    }
  }
}

// With zero gradients the Adam term is 0, so the only change is the decay factor, and only on
// the parameters whose flag says so.
TEST(AdamW, DecayOnlyWhereFlagged) {
  absl::StatusOr<FlatLayout> layout =
      FlatLayout::Create({{"w", {2, 2}, true}, {"norm.weight", {2}, false}});
  ASSERT_TRUE(layout.ok());
  absl::StatusOr<AdamW> opt = AdamW::Create(*layout, {.weight_decay = 0.5});
  ASSERT_TRUE(opt.ok());
  std::vector<float> w = {1, 2, 3, 4}, n = {1, 2}, zeros(4, 0.0f);
  std::vector<ParamGrad> tensors = {{w.data(), zeros.data()}, {n.data(), zeros.data()}};
  absl::StatusOr<StepDecision> d = opt->Step(0.1, 1.0, tensors);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(d->applied());
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(w[i], (i + 1) * 0.95f) << i;
  EXPECT_EQ(n, (std::vector<float>{1, 2}));
}

TEST(AdamW, DefaultDecayRule) {
  auto decay = [](std::string_view name, std::vector<int64_t> shape) {
    return DefaultDecay(name, shape);
  };
  EXPECT_TRUE(decay("model.embed_tokens.weight", {100352, 768}));
  EXPECT_TRUE(decay("model.layers.0.mamba.in_proj.weight", {3000, 768}));
  EXPECT_TRUE(decay("model.layers.0.mamba.conv1d.weight", {1792, 1, 4}));
  EXPECT_TRUE(decay("model.layers.0.block_sparse_moe.input_linear.weight", {32, 1024, 768}));
  EXPECT_FALSE(decay("model.layers.0.mamba.conv1d.bias", {1792}));
  EXPECT_FALSE(decay("model.layers.0.mamba.A_log", {48}));
  EXPECT_FALSE(decay("model.layers.0.mamba.D", {48}));
  EXPECT_FALSE(decay("model.layers.0.mamba.dt_bias", {48}));
  EXPECT_FALSE(decay("model.layers.0.mamba.norm.weight", {1536}));
  EXPECT_FALSE(decay("model.layers.0.input_layernorm.weight", {768}));
  EXPECT_FALSE(decay("model.norm.weight", {768}));
  EXPECT_FALSE(decay("some.proj.bias", {4, 4}));       // a 2-D bias still does not decay
  EXPECT_FALSE(decay("some.qk_norm.weight", {4, 4}));  // nor a 2-D norm weight
  EXPECT_FALSE(decay("scalar", {}));
  EXPECT_FALSE(ParamSpec::WithDefaultDecay("model.norm.weight", {768}).decay);
  EXPECT_TRUE(ParamSpec::WithDefaultDecay("lm_head.weight", {10, 768}).decay);
}

// ------------------------------------------------------------------------------------------------
// Clipping and the NaN/Inf policy

TEST(Clipping, NormAndCoefficient) {
  const std::vector<float> a = {3}, b = {4};
  const std::vector<std::span<const float>> grads = {a, b};
  EXPECT_DOUBLE_EQ(GradNorm(grads), 5.0);
  // Squares of 1e20 overflow fp32 but not the double accumulator.
  const std::vector<float> big = {1e20f, 1e20f};
  EXPECT_DOUBLE_EQ(SumOfSquares(big), 2 * double{1e20f} * double{1e20f});
  EXPECT_DOUBLE_EQ(ClipCoefficient(2.0, 1.0), 1.0 / (2.0 + 1e-6));
  EXPECT_DOUBLE_EQ(ClipCoefficient(0.5, 1.0), 1.0);
  EXPECT_DOUBLE_EQ(ClipCoefficient(1e9, 0.0), 1.0);  // clipping off
  EXPECT_DOUBLE_EQ(ClipCoefficient(1e9, -1.0), 1.0);
}

TEST(Clipping, StepScalesGradientsToTheMaxNorm) {
  absl::StatusOr<FlatLayout> layout = FlatLayout::Create({{"a", {1}, false}, {"b", {1}, false}});
  ASSERT_TRUE(layout.ok());
  // Clipped run: gradient (30, 40), norm 50, max 5 -> every gradient times 5 / 50.
  absl::StatusOr<AdamW> clipped = AdamW::Create(*layout, {.max_grad_norm = 5.0});
  // Reference run: the gradient pre-scaled, no clipping.
  absl::StatusOr<AdamW> scaled = AdamW::Create(*layout, {.max_grad_norm = 0.0});
  ASSERT_TRUE(clipped.ok() && scaled.ok());
  std::vector<float> p1 = {1, 1}, p2 = {1, 1};
  const std::vector<float> g = {30, 40};
  const double coef = 5.0 / (50.0 + 1e-6);
  const std::vector<float> g_scaled = {static_cast<float>(30 * coef),
                                       static_cast<float>(40 * coef)};
  absl::StatusOr<StepDecision> d =
      clipped->Step(1e-2, 2.0, std::vector<ParamGrad>{{&p1[0], &g[0]}, {&p1[1], &g[1]}});
  ASSERT_TRUE(d.ok());
  EXPECT_DOUBLE_EQ(d->grad_norm, 50.0);
  EXPECT_DOUBLE_EQ(d->clip_coef, coef);
  ASSERT_TRUE(
      scaled
          ->Step(1e-2, 2.0, std::vector<ParamGrad>{{&p2[0], &g_scaled[0]}, {&p2[1], &g_scaled[1]}})
          .ok());
  EXPECT_NEAR(clipped->exp_avg()[0], scaled->exp_avg()[0], 1e-6);
  EXPECT_NEAR(clipped->exp_avg_sq()[1], scaled->exp_avg_sq()[1], 1e-6);
  EXPECT_NEAR(p1[0], p2[0], 1e-7);
}

TEST(Policy, DecideStep) {
  StepDecision ok = DecideStep(2.0, 0.5, 1.0);
  EXPECT_TRUE(ok.applied());
  EXPECT_EQ(ok.clip_coef, 1.0);
  EXPECT_EQ(DecideStep(kNaN, 0.5, 1.0).outcome, StepOutcome::kSkippedLossNotFinite);
  EXPECT_EQ(DecideStep(kInf, 0.5, 1.0).outcome, StepOutcome::kSkippedLossNotFinite);
  EXPECT_EQ(DecideStep(2.0, kNaN, 1.0).outcome, StepOutcome::kSkippedGradNormNotFinite);
  EXPECT_EQ(DecideStep(2.0, kInf, 0.0).outcome, StepOutcome::kSkippedGradNormNotFinite);
  EXPECT_EQ(StepOutcomeName(StepOutcome::kApplied), "applied");
  EXPECT_EQ(StepOutcomeName(StepOutcome::kSkippedLossNotFinite), "skipped: loss is not finite");
  EXPECT_EQ(StepOutcomeName(StepOutcome::kSkippedGradNormNotFinite),
            "skipped: gradient norm is not finite");
}

// A non-finite loss or gradient changes nothing: parameters, moments and t stay; the next
// finite step is update 1.
TEST(Policy, NonFiniteStepsAreSkippedAndChangeNothing) {
  absl::StatusOr<FlatLayout> layout = FlatLayout::Create({{"w", {3}, true}});
  ASSERT_TRUE(layout.ok());
  absl::StatusOr<AdamW> opt = AdamW::Create(*layout, {});
  ASSERT_TRUE(opt.ok());
  std::vector<float> p = {1, 2, 3}, g = {0.1f, 0.2f, 0.3f};
  ASSERT_TRUE(opt->Step(1e-2, 1.0, std::vector<ParamGrad>{{p.data(), g.data()}}).ok());
  const std::vector<float> p0 = p;
  const std::vector<float> m0(opt->exp_avg().begin(), opt->exp_avg().end());
  const std::vector<float> v0(opt->exp_avg_sq().begin(), opt->exp_avg_sq().end());

  absl::StatusOr<StepDecision> nan_loss =
      opt->Step(1e-2, kNaN, std::vector<ParamGrad>{{p.data(), g.data()}});
  ASSERT_TRUE(nan_loss.ok());
  EXPECT_EQ(nan_loss->outcome, StepOutcome::kSkippedLossNotFinite);
  std::vector<float> bad = {0.1f, std::numeric_limits<float>::infinity(), 0.3f};
  absl::StatusOr<StepDecision> inf_grad =
      opt->Step(1e-2, 1.0, std::vector<ParamGrad>{{p.data(), bad.data()}});
  ASSERT_TRUE(inf_grad.ok());
  EXPECT_EQ(inf_grad->outcome, StepOutcome::kSkippedGradNormNotFinite);
  bad[1] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(opt->Step(1e-2, 1.0, std::vector<ParamGrad>{{p.data(), bad.data()}})->outcome,
            StepOutcome::kSkippedGradNormNotFinite);

  EXPECT_EQ(p, p0);
  EXPECT_EQ(std::vector<float>(opt->exp_avg().begin(), opt->exp_avg().end()), m0);
  EXPECT_EQ(std::vector<float>(opt->exp_avg_sq().begin(), opt->exp_avg_sq().end()), v0);
  EXPECT_EQ(opt->updates(), 1);
  ASSERT_TRUE(opt->Step(1e-2, 1.0, std::vector<ParamGrad>{{p.data(), g.data()}}).ok());
  EXPECT_EQ(opt->updates(), 2);
  EXPECT_NE(p, p0);
}

// ------------------------------------------------------------------------------------------------
// Sharding

TEST(Sharding, ShardRangesPartition) {
  for (int64_t total : {0, 1, 7, 100, 101}) {
    for (int64_t parts : {1, 2, 3, 8}) {
      int64_t next = 0;
      for (int64_t k = 0; k < parts; ++k) {
        FlatRange r = ShardRange(total, k, parts);
        EXPECT_EQ(r.begin, next);
        EXPECT_LE(r.size(), total / parts + 1);
        EXPECT_GE(r.size(), total / parts);
        next = r.end;
      }
      EXPECT_EQ(next, total);
    }
  }
  const int64_t huge = int64_t{1} << 62;
  EXPECT_EQ(ShardRange(huge, 3, 4), (FlatRange{3 * (huge / 4), huge}));
}

// Three optimizers each owning a third of the flat parameters (cutting through tensors with
// different decay flags) reproduce the whole optimizer bit for bit.
TEST(Sharding, ShardedUpdatesEqualTheWholeUpdate) {
  std::vector<ParamSpec> specs = {{"a", {5, 3}, true},
                                  {"b", {4}, false},
                                  {"c", {2, 5}, true},
                                  {"empty", {0}, true},
                                  {"d", {6}, false}};
  absl::StatusOr<FlatLayout> layout = FlatLayout::Create(specs);
  ASSERT_TRUE(layout.ok());
  const int64_t total = layout->total();
  ASSERT_EQ(total, 15 + 4 + 10 + 6);
  const AdamWConfig config{.weight_decay = 0.2, .max_grad_norm = 1.0};

  absl::StatusOr<AdamW> whole = AdamW::Create(*layout, config);
  ASSERT_TRUE(whole.ok());
  std::vector<AdamW> shards;
  for (int64_t k = 0; k < 3; ++k) {
    absl::StatusOr<AdamW> shard = AdamW::Create(*layout, config, ShardRange(total, k, 3));
    ASSERT_TRUE(shard.ok());
    EXPECT_FALSE(shard->owns_all());
    shards.push_back(*std::move(shard));
  }

  Lcg rng(11);
  std::vector<float> p_whole(total), p_sharded;
  for (float& x : p_whole) x = rng.Next();
  p_sharded = p_whole;
  for (int step = 0; step < 4; ++step) {
    std::vector<float> g(total);
    for (float& x : g) x = rng.Next();
    const double lr = 1e-2 * (step + 1);
    // Whole.
    std::vector<ParamGrad> tensors;
    for (size_t i = 0; i < layout->size(); ++i) {
      tensors.push_back({p_whole.data() + layout->offset(i), g.data() + layout->offset(i)});
    }
    absl::StatusOr<StepDecision> d = whole->Step(lr, 1.0, tensors);
    ASSERT_TRUE(d.ok()) << d.status();
    // Sharded: the norm is the square root of the summed per-shard sums of squares.
    double sum = 0;
    for (const AdamW& shard : shards) {
      sum += SumOfSquares(
          std::span<const float>(g).subspan(shard.owned().begin, shard.owned().size()));
    }
    StepDecision sd = DecideStep(1.0, std::sqrt(sum), config.max_grad_norm);
    EXPECT_NEAR(sd.clip_coef, d->clip_coef, 1e-12);
    for (AdamW& shard : shards) {
      AdamWUpdate u = shard.NextUpdate(lr, d->clip_coef);
      const FlatRange r = shard.owned();
      ASSERT_TRUE(shard.UpdateRange(u, r, p_sharded.data() + r.begin, g.data() + r.begin).ok());
      ASSERT_TRUE(shard.Commit(u).ok());
    }
  }
  EXPECT_EQ(p_sharded, p_whole);
  std::vector<float> m, v;
  for (const AdamW& shard : shards) {
    m.insert(m.end(), shard.exp_avg().begin(), shard.exp_avg().end());
    v.insert(v.end(), shard.exp_avg_sq().begin(), shard.exp_avg_sq().end());
  }
  EXPECT_EQ(m, std::vector<float>(whole->exp_avg().begin(), whole->exp_avg().end()));
  EXPECT_EQ(v, std::vector<float>(whole->exp_avg_sq().begin(), whole->exp_avg_sq().end()));
}

TEST(Sharding, MisuseIsRefused) {
  absl::StatusOr<FlatLayout> layout = FlatLayout::Create({{"a", {4}, true}, {"b", {4}, true}});
  ASSERT_TRUE(layout.ok());
  absl::StatusOr<AdamW> shard = AdamW::Create(*layout, {}, FlatRange{2, 6});
  ASSERT_TRUE(shard.ok());
  std::vector<float> p(8), g(8);
  AdamWUpdate u = shard->NextUpdate(1e-3, 1.0);
  EXPECT_TRUE(FailsWith(shard->UpdateRange(u, {0, 4}, p.data(), g.data()),
                        "range [0, 4) is not within this optimizer's range [2, 6)"));
  EXPECT_TRUE(FailsWith(shard->UpdateTensor(u, "a", p.data(), g.data()),
                        "parameter 'a' (flat [0, 4)) is not wholly in"));
  EXPECT_TRUE(FailsWith(shard->UpdateTensor(u, "zz", p.data(), g.data()), "no parameter named"));
  EXPECT_TRUE(FailsWith(shard->ExpAvgOf("b").status(), "not wholly in"));
  EXPECT_TRUE(FailsWith(shard->Step(1e-3, 1.0, {}).status(), "owns every parameter"));
  AdamWUpdate stale = u;
  stale.t = 3;
  EXPECT_TRUE(FailsWith(shard->UpdateRange(stale, {2, 6}, p.data(), g.data()),
                        "update t = 3, but 0 updates have been applied"));
  EXPECT_TRUE(FailsWith(shard->Commit(stale), "committing update t = 3"));
  EXPECT_TRUE(shard->UpdateRange(u, {3, 5}, p.data(), g.data()).ok());

  EXPECT_TRUE(FailsWith(AdamW::Create(*layout, {}, FlatRange{4, 9}).status(),
                        "owned range [4, 9) is not within the 8 parameter elements"));
  EXPECT_TRUE(
      FailsWith(AdamW::Create(*layout, {.beta1 = 1.0}).status(), "beta1 must be in [0, 1)"));
  EXPECT_TRUE(FailsWith(AdamW::Create(*layout, {.eps = 0}).status(), "eps must be positive"));
  EXPECT_TRUE(FailsWith(AdamW::Create(*layout, {.weight_decay = -1}).status(), "weight_decay"));
  absl::StatusOr<AdamW> whole = AdamW::Create(*layout, {});
  ASSERT_TRUE(whole.ok());
  EXPECT_TRUE(FailsWith(whole->Step(1e-3, 1.0, std::vector<ParamGrad>(1)).status(),
                        "1 tensors given for 2 parameters"));
  EXPECT_TRUE(FailsWith(whole->Step(1e-3, 1.0, std::vector<ParamGrad>(2)).status(),
                        "no storage given for 'a'"));

  EXPECT_TRUE(FailsWith(FlatLayout::Create({{"a", {1}}, {"a", {2}}}).status(),
                        "parameter 'a' is listed twice"));
  EXPECT_TRUE(FailsWith(FlatLayout::Create({{"", {1}}}).status(), "empty name"));
  EXPECT_TRUE(FailsWith(FlatLayout::Create({{"n", {-1}}}).status(), "negative"));
}

TEST(Sharding, LayoutOffsets) {
  absl::StatusOr<FlatLayout> layout = FlatLayout::Create({{"a", {2, 3}}, {"b", {}}, {"c", {4}}});
  ASSERT_TRUE(layout.ok());
  EXPECT_EQ(layout->offset(1), 6);
  EXPECT_EQ(layout->numel(1), 1);  // a scalar has one element
  EXPECT_EQ(layout->range(2), (FlatRange{7, 11}));
  EXPECT_EQ(layout->total(), 11);
  EXPECT_EQ(layout->Find("c"), std::optional<size_t>(2));
  EXPECT_EQ(layout->Find("x"), std::nullopt);
}

}  // namespace
}  // namespace hcp::train
