// Blends of several token sources (Blend.h): the weights, the greedy choice and its bounds, the
// windows a step reads (the same for every dp/grad_accum split), each source's wrap-around, a
// shuffled source, the loss mask, and a restored state checked against the sources.
#include "runtime/data/Blend.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/data/DocumentOrder.h"
#include "runtime/data/IndexedDataset.h"
#include "tests/unit/data/TestUtil.h"

namespace hcp::data {
namespace {

using testing::FailsWith;
using testing::ScratchDir;
using testing::WriteIndexed;

// Tokens base, base + 1, ..., base + n - 1: a read token tells which source and position it is.
TokenFile Counting(const ScratchDir& dir, const std::string& name, uint32_t base, int64_t n) {
  std::vector<uint32_t> tokens(n);
  std::iota(tokens.begin(), tokens.end(), base);
  EXPECT_TRUE(WriteTokenFile(dir / name, tokens, TokenDType::U32).ok());
  absl::StatusOr<TokenFile> file = TokenFile::Open(dir / name);
  EXPECT_TRUE(file.ok()) << file.status();
  return *std::move(file);
}

BatchConfig Config(int64_t seq, int64_t micro_batch, int64_t dp, int64_t grad_accum) {
  return {
      .seq = seq, .micro_batch = micro_batch, .dp = dp, .grad_accum = grad_accum, .vocab = 1 << 20};
}

TEST(BlendWeights, AreNormalisedAndMustBePositive) {
  absl::StatusOr<std::vector<double>> w = NormalizeBlendWeights(std::vector<double>{3, 7});
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_DOUBLE_EQ((*w)[0], 0.3);
  EXPECT_DOUBLE_EQ((*w)[1], 0.7);
  EXPECT_TRUE(FailsWith(NormalizeBlendWeights(std::vector<double>{1, 0}).status(),
                        "the weight of source 1 is 0"));
  EXPECT_TRUE(FailsWith(NormalizeBlendWeights(std::vector<double>{-1, 2}).status(),
                        "weights are positive numbers"));
  EXPECT_TRUE(FailsWith(NormalizeBlendWeights(std::vector<double>{NAN}).status(), "positive"));
  EXPECT_TRUE(FailsWith(NormalizeBlendWeights(std::vector<double>{1e308, 1e308}).status(),
                        "not a finite number"));
  EXPECT_TRUE(FailsWith(NormalizeBlendWeights(std::vector<double>{}).status(), "at least one"));
}

// The greedy rule keeps every source within a window of its share after any number of windows:
// never a window ahead; with two sources within half a window either way (Blend.h).
TEST(BlendChoose, KeepsEverySourceNearItsShare) {
  const std::vector<std::vector<double>> blends = {
      {0.3, 0.7}, {0.5, 0.5}, {0.01, 0.99}, {0.2, 0.3, 0.5}, {0.1, 0.1, 0.1, 0.2, 0.5}};
  for (const std::vector<double>& given : blends) {
    const std::vector<double> w = *NormalizeBlendWeights(given);
    std::vector<int64_t> taken(w.size());
    for (int64_t k = 0; k < 5000; ++k) {
      ++taken[BlendChoose(w, k, taken)];
      for (size_t d = 0; d < w.size(); ++d) {
        const double off = static_cast<double>(taken[d]) - w[d] * static_cast<double>(k + 1);
        ASSERT_LT(off, 1.0) << "source " << d << " after " << k + 1;
        ASSERT_GT(off, -static_cast<double>(w.size() - 1)) << "source " << d << " after " << k + 1;
        if (w.size() == 2) {
          ASSERT_LE(std::abs(off), 0.5 + 1e-9) << k;
        }
      }
    }
  }
  // 0.3 / 0.7: the first ten windows by the rule (ties to the lower).
  const std::vector<double> w = {0.3, 0.7};
  std::vector<int64_t> taken(2), chosen;
  for (int64_t k = 0; k < 10; ++k) {
    chosen.push_back(BlendChoose(w, k, taken));
    ++taken[chosen.back()];
  }
  EXPECT_EQ(chosen, (std::vector<int64_t>{1, 0, 1, 1, 0, 1, 1, 1, 0, 1}));
  EXPECT_EQ(taken, (std::vector<int64_t>{3, 7}));
}

TEST(BlendSourceSeed, DiffersPerSourceAndSeed) {
  EXPECT_NE(BlendSourceSeed(7, 0), BlendSourceSeed(7, 1));
  EXPECT_NE(BlendSourceSeed(7, 0), BlendSourceSeed(8, 0));
  EXPECT_NE(BlendSourceSeed(7, 0), uint64_t{7});
  EXPECT_EQ(BlendSourceSeed(7, 1), Mix64(7 + 2 * 0x9E3779B97F4A7C15ULL));
}

class BlendBatcherTest : public ::testing::Test {
 protected:
  // Source 0: 100 tokens 0..99; source 1: 1000 tokens 10000..10999.
  void SetUp() override {
    a_.emplace(Counting(dir_, "a.bin", 0, 100));
    b_.emplace(Counting(dir_, "b.bin", 10000, 1000));
  }
  absl::StatusOr<BlendBatcher> Make(const BatchConfig& config,
                                    std::vector<double> weights = {0.3, 0.7}) {
    return BlendBatcher::Create({{&*a_, nullptr, nullptr}, {&*b_, nullptr, nullptr}},
                                std::move(weights), config);
  }

  ScratchDir dir_;
  std::optional<TokenFile> a_, b_;
};

// Every window is seq + 1 consecutive tokens of its source, the sources taken by the rule, and
// each source read back to back from its start.
TEST_F(BlendBatcherTest, WindowsAreConsecutiveTokensOfTheChosenSource) {
  absl::StatusOr<BlendBatcher> blend = Make(Config(9, 2, 1, 5));  // 10 windows of 10 tokens
  ASSERT_TRUE(blend.ok()) << blend.status();
  absl::StatusOr<StepBatch> step = blend->NextStep(0);
  ASSERT_TRUE(step.ok()) << step.status();
  const std::vector<int64_t> sources = {1, 0, 1, 1, 0, 1, 1, 1, 0, 1};
  std::vector<int32_t> next_start = {0, 10000};
  for (int64_t s = 0; s < 10; ++s) {
    const int32_t start = next_start[sources[s]];
    for (int64_t j = 0; j < 9; ++j) {
      EXPECT_EQ(step->inputs[s * 9 + j], start + j) << "window " << s;
      EXPECT_EQ(step->targets[s * 9 + j], start + j + 1) << "window " << s;
    }
    next_start[sources[s]] += 10;
  }
  const BlendState& state = blend->state();
  EXPECT_EQ(state.windows, 10);
  EXPECT_EQ(state.sources[0], (DataState{0, 30}));
  EXPECT_EQ(state.sources[1], (DataState{0, 70}));
}

// The global batch is the same whatever the dp / grad_accum / micro-batch split: each rank's rows
// are the windows TokenData.h's rule gives it.
TEST_F(BlendBatcherTest, EverySplitReadsTheSameGlobalBatches) {
  absl::StatusOr<BlendBatcher> one = Make(Config(9, 8, 1, 1));
  ASSERT_TRUE(one.ok());
  std::vector<std::vector<int32_t>> reference;
  for (int step = 0; step < 7; ++step) reference.push_back(one->NextStep(0)->inputs);
  for (const BatchConfig& c : {Config(9, 1, 2, 4), Config(9, 2, 4, 1), Config(9, 4, 1, 2)}) {
    absl::StatusOr<BlendBatcher> split = Make(c);
    ASSERT_TRUE(split.ok());
    for (int step = 0; step < 7; ++step) {
      std::vector<int32_t> global(8 * 9);
      for (int64_t d = 0; d < c.dp; ++d) {
        for (int64_t a = 0; a < c.grad_accum; ++a) {
          std::vector<int32_t> in(c.micro_batch * 9), tg(c.micro_batch * 9);
          ASSERT_TRUE(split->ReadMicroBatch(split->state(), d, a, in, tg).ok());
          for (int64_t row = 0; row < c.micro_batch; ++row) {
            const int64_t s = GlobalSequenceIndex(c, d, a, row);
            std::copy_n(in.begin() + row * 9, 9, global.begin() + s * 9);
          }
        }
      }
      EXPECT_EQ(global, reference[step]) << "step " << step << " dp " << c.dp;
      ASSERT_TRUE(split->NextStep(0).ok());
    }
  }
}

// A source with too little left for a window starts its next epoch; the other goes on. Source 0
// (100 tokens) holds 9 windows of 11: its 10th window is the start of its epoch 1.
TEST_F(BlendBatcherTest, EachSourceWrapsOnItsOwn) {
  absl::StatusOr<BlendBatcher> blend = Make(Config(10, 1, 1, 1), {0.5, 0.5});
  ASSERT_TRUE(blend.ok());
  int64_t wrapped_at = -1;
  for (int64_t step = 0; step < 40; ++step) {
    const std::vector<BlendWindow> w = blend->StepWindows(blend->state());
    ASSERT_EQ(w.size(), 1u);
    absl::StatusOr<StepBatch> batch = blend->NextStep(0);
    ASSERT_TRUE(batch.ok());
    if (w[0].source == 0 && w[0].at.epoch == 1 && wrapped_at < 0) {
      wrapped_at = step;
      EXPECT_EQ(w[0].at.position, 0);
      EXPECT_EQ(batch->inputs[0], 0);
    }
  }
  EXPECT_EQ(wrapped_at, 18);  // source 0 gives every other window, 9 per epoch
  EXPECT_EQ(blend->state().sources[1].epoch, 0);
  EXPECT_EQ(blend->state().sources[1].position, 20 * 11);
}

// Restoring a saved state continues exactly; states that cannot come from these sources and
// weights are refused.
TEST_F(BlendBatcherTest, RestoresExactlyAndRefusesForeignStates) {
  absl::StatusOr<BlendBatcher> run = Make(Config(9, 2, 1, 1));
  ASSERT_TRUE(run.ok());
  for (int i = 0; i < 13; ++i) ASSERT_TRUE(run->NextStep(0).ok());
  const BlendState saved = run->state();
  const std::vector<int32_t> expected = run->NextStep(0)->inputs;

  absl::StatusOr<BlendBatcher> resumed = Make(Config(9, 1, 1, 2));  // another split
  ASSERT_TRUE(resumed.ok());
  ASSERT_TRUE(resumed->Restore(saved).ok());
  EXPECT_EQ(resumed->NextStep(0)->inputs, expected);

  BlendState bad = saved;
  bad.sources.pop_back();
  EXPECT_TRUE(
      FailsWith(resumed->Restore(bad), "a blend of 1 sources does not fit this blend of 2"));
  bad = saved;
  bad.sources[0].position += 1;
  EXPECT_TRUE(FailsWith(resumed->Restore(bad), "blend source 0's data state"));
  bad = saved;
  bad.windows += 1;
  EXPECT_TRUE(FailsWith(resumed->Restore(bad), "but its data state says"));
  // 26 windows as 0.3 / 0.7 gave 8 / 18; with weights 0.7 / 0.3 source 0 is far behind its share.
  absl::StatusOr<BlendBatcher> other = Make(Config(9, 2, 1, 1), {0.7, 0.3});
  ASSERT_TRUE(other.ok());
  EXPECT_TRUE(FailsWith(other->Restore(saved), "far from its share"));
  bad = saved;
  bad.sources[1].epoch = -1;
  EXPECT_TRUE(FailsWith(resumed->Restore(bad), "blend source 1's data state (epoch -1"));
}

TEST_F(BlendBatcherTest, RefusesWhatCannotBlend) {
  EXPECT_TRUE(FailsWith(Make(Config(9, 1, 1, 1), {1.0}).status(), "2 sources with 1 weights"));
  EXPECT_TRUE(FailsWith(Make(Config(9, 1, 1, 1), {0.3, 0.3}).status(), "not 1 (normalise them)"));
  EXPECT_TRUE(FailsWith(Make(Config(9, 1, 1, 1), {1.5, -0.5}).status(), "not a positive number"));
  EXPECT_TRUE(FailsWith(Make(Config(100, 1, 1, 1)).status(),
                        "a.bin has 100 tokens; a blend reads windows of seq + 1 = 101 tokens"));
  EXPECT_TRUE(FailsWith(Make(Config(0, 1, 1, 1)).status(), "seq"));
}

// A shuffled source reads its documents in its order; a masked source's masked targets are
// ignored; an out-of-vocabulary token names its file.
TEST(BlendBatcher, ReadsOrdersMasksAndChecksTheVocabulary) {
  ScratchDir dir;
  std::vector<std::vector<uint32_t>> documents;
  for (uint32_t d = 0; d < 6; ++d) documents.push_back(std::vector<uint32_t>(7, 100 + d));
  WriteIndexed(dir, "docs", documents);
  absl::StatusOr<IndexedDataset> docs = IndexedDataset::Open(dir / "docs");
  ASSERT_TRUE(docs.ok()) << docs.status();
  const DocumentOrder order(*docs, BlendSourceSeed(5, 1));
  const std::vector<int64_t> perm = DocumentPermutation(6, BlendSourceSeed(5, 1), 0);

  std::vector<uint32_t> plain(60, 7), mask_values(60, 1);
  for (int64_t i = 0; i < 60; i += 2) mask_values[i] = 0;
  ASSERT_TRUE(WriteTokenFile(dir / "plain.bin", plain, TokenDType::U16).ok());
  ASSERT_TRUE(WriteTokenFile(dir / "mask.bin", mask_values, TokenDType::U16).ok());
  absl::StatusOr<TokenFile> plain_file = TokenFile::Open(dir / "plain.bin");
  absl::StatusOr<TokenFile> mask = TokenFile::Open(dir / "mask.bin");
  ASSERT_TRUE(plain_file.ok() && mask.ok());

  // Weights 0.5 / 0.5: window 0 from source 0, window 1 from source 1 (ties to the lower).
  BatchConfig config = Config(6, 2, 1, 1);
  absl::StatusOr<BlendBatcher> blend = BlendBatcher::Create(
      {{&*plain_file, &*mask, nullptr}, {&docs->token_file(), nullptr, &order}}, {0.5, 0.5},
      config);
  ASSERT_TRUE(blend.ok()) << blend.status();
  absl::StatusOr<StepBatch> step = blend->NextStep(0);
  ASSERT_TRUE(step.ok()) << step.status();
  for (int64_t j = 0; j < 6; ++j) {
    // Target j is token j + 1, whose mask is 0 where j + 1 is even.
    EXPECT_EQ(step->targets[j], (j + 1) % 2 == 0 ? kIgnoredTarget : 7) << j;
    EXPECT_EQ(step->inputs[6 + j], static_cast<int32_t>(100 + perm[0])) << j;
  }
  EXPECT_EQ(step->targets[6 + 6 - 1], static_cast<int32_t>(100 + perm[0]));  // token 6 of doc 0

  config.vocab = 50;
  blend = BlendBatcher::Create(
      {{&*plain_file, nullptr, nullptr}, {&docs->token_file(), nullptr, &order}}, {0.5, 0.5},
      config);
  ASSERT_TRUE(blend.ok());
  EXPECT_TRUE(FailsWith(blend->NextStep(0).status(), ">= vocab 50"));
  EXPECT_EQ(blend->state().windows, 0);  // unchanged on error
}

}  // namespace
}  // namespace hcp::data
