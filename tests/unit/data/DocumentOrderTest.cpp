// --shuffle-seed's order (DocumentOrder.h): the generator's numbers are pinned, the permutation is
// one and depends on the seed and the epoch only, the virtual stream's windows are a direct
// concatenation of the documents in that order (with the mask following its tokens), and a
// batcher restored from a DataState reads the same next batches as one that got there.
#include "runtime/data/DocumentOrder.h"

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/data/DataSource.h"
#include "runtime/data/IndexedDataset.h"
#include "runtime/data/TokenData.h"
#include "tests/unit/data/TestUtil.h"

namespace hcp::data {
namespace {

using testing::ScratchDir;
using testing::WriteIndexed;

// Documents of varied lengths (some empty), token t of document d = 1 + (d * 7 + t) % 300, and a
// mask that counts every other token of the odd documents.
struct Corpus {
  std::vector<std::vector<uint32_t>> tokens;
  std::vector<std::vector<uint32_t>> mask;
};
Corpus MakeCorpus(int documents) {
  Corpus c;
  for (int d = 0; d < documents; ++d) {
    const int length = (d * 37) % 23;  // 0..22, d = 0 empty
    std::vector<uint32_t> doc, mask;
    for (int t = 0; t < length; ++t) {
      doc.push_back(1 + static_cast<uint32_t>(d * 7 + t) % 300);
      mask.push_back(d % 2 == 1 && t % 2 == 0 ? 1 : 0);
    }
    c.tokens.push_back(doc);
    c.mask.push_back(mask);
  }
  return c;
}

TEST(DocumentOrder, TheGeneratorIsSplitMix64) {
  // SplitMix64's reference outputs for state 0 (Vigna's splitmix64.c).
  SplitMix64 rng(0);
  EXPECT_EQ(rng.Next(), 0xE220A8397B1DCDAFULL);
  EXPECT_EQ(rng.Next(), 0x6E789E6AA1B965F4ULL);
  EXPECT_EQ(rng.Next(), 0x06C45D188009454FULL);
  SplitMix64 bounded(42);
  for (int i = 0; i < 1000; ++i) EXPECT_LT(bounded.Below(7), 7u);
}

TEST(DocumentOrder, APermutationOfTheSeedAndEpochAlone) {
  const int64_t n = 1000;
  const std::vector<int64_t> p = DocumentPermutation(n, 7, 0);
  std::vector<int64_t> sorted = p;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> identity(n);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_EQ(sorted, identity);
  EXPECT_NE(p, identity);
  EXPECT_EQ(DocumentPermutation(n, 7, 0), p);  // the same every call
  EXPECT_NE(DocumentPermutation(n, 8, 0), p);  // another seed
  EXPECT_NE(DocumentPermutation(n, 7, 1), p);  // another epoch
  // Pinned (an independent Python rendering of DocumentOrder.h's rule gives the same): a change
  // of the generator or the shuffle would reorder every shuffled run's data.
  EXPECT_EQ(DocumentPermutation(8, 1234, 0), (std::vector<int64_t>{2, 4, 0, 3, 1, 6, 7, 5}));
  EXPECT_EQ(DocumentPermutation(8, 1234, 1), (std::vector<int64_t>{6, 3, 4, 7, 5, 1, 2, 0}));
  EXPECT_TRUE(DocumentPermutation(0, 1, 0).empty());
  EXPECT_EQ(DocumentPermutation(1, 1, 0), std::vector<int64_t>{0});
}

TEST(DocumentOrder, WindowsAreTheDocumentsConcatenatedInTheirOrder) {
  ScratchDir dir;
  const Corpus corpus = MakeCorpus(40);
  WriteIndexed(dir, "c", corpus.tokens);
  WriteIndexed(dir, "c.lossmask", corpus.mask, TokenDType::U8);
  absl::StatusOr<DataSource> source = DataSource::Open(dir / "c", std::nullopt);
  ASSERT_TRUE(source.ok()) << source.status();
  ASSERT_NE(source->loss_mask(), nullptr);
  const DocumentOrder order(*source->indexed(), 99);
  const BatchConfig config{/*seq=*/16, /*micro_batch=*/2, /*dp=*/2, /*grad_accum=*/1, 320};
  absl::StatusOr<TokenBatcher> batcher =
      TokenBatcher::Create(source->tokens(), config, source->loss_mask(), &order);
  ASSERT_TRUE(batcher.ok()) << batcher.status();
  ASSERT_EQ(order.tokens(), source->tokens().size());

  // Enough steps to wrap around into epochs 1 and 2.
  const int64_t steps = 3 * source->tokens().size() / config.step_tokens() + 2;
  int64_t epochs_seen = 0;
  for (int64_t s = 0; s < steps; ++s) {
    const DataState start = batcher->StepStart(batcher->state());
    // The stream of this epoch, written out directly.
    std::vector<int32_t> stream, counts;
    for (int64_t d : DocumentPermutation(40, 99, start.epoch)) {
      for (size_t t = 0; t < corpus.tokens[d].size(); ++t) {
        stream.push_back(static_cast<int32_t>(corpus.tokens[d][t]));
        counts.push_back(static_cast<int32_t>(corpus.mask[d][t]));
      }
    }
    std::vector<StepBatch> ranks;
    for (int64_t dp = 0; dp < config.dp; ++dp) {
      absl::StatusOr<TokenBatcher> copy =
          TokenBatcher::Create(source->tokens(), config, source->loss_mask(), &order);
      ASSERT_TRUE(copy->Restore(batcher->state()).ok());
      absl::StatusOr<StepBatch> batch = copy->NextStep(dp);
      ASSERT_TRUE(batch.ok()) << batch.status();
      ranks.push_back(*batch);
    }
    ASSERT_TRUE(batcher->NextStep(0).ok());
    epochs_seen = std::max(epochs_seen, start.epoch);
    for (int64_t dp = 0; dp < config.dp; ++dp) {
      for (int64_t row = 0; row < config.micro_batch; ++row) {
        const int64_t window =
            start.position + GlobalSequenceIndex(config, dp, 0, row) * (config.seq + 1);
        for (int64_t j = 0; j < config.seq; ++j) {
          const int64_t at = row * config.seq + j;
          EXPECT_EQ(ranks[dp].inputs[at], stream[window + j]) << s << " " << dp << " " << j;
          const int32_t target =
              counts[window + j + 1] != 0 ? stream[window + j + 1] : kIgnoredTarget;
          EXPECT_EQ(ranks[dp].targets[at], target) << s << " " << dp << " " << j;
        }
      }
    }
  }
  EXPECT_GE(epochs_seen, 2);
}

TEST(DocumentOrder, ResumedFromADataStateReadsTheSameBatches) {
  ScratchDir dir;
  WriteIndexed(dir, "c", MakeCorpus(50).tokens);
  absl::StatusOr<DataSource> source = DataSource::Open(dir / "c", std::nullopt);
  ASSERT_TRUE(source.ok());
  const DocumentOrder order(*source->indexed(), 5);
  const BatchConfig config{8, 1, 1, 2, 320};
  absl::StatusOr<TokenBatcher> through =
      TokenBatcher::Create(source->tokens(), config, nullptr, &order);
  ASSERT_TRUE(through.ok());
  const int64_t steps = 2 * source->tokens().size() / config.step_tokens() + 3;
  for (int64_t stop = 1; stop < steps; stop += 5) {
    ASSERT_TRUE(through->Restore(DataState{}).ok());
    for (int64_t s = 0; s < stop; ++s) ASSERT_TRUE(through->NextStep(0).ok());
    const DataState saved = through->state();
    // A fresh order and batcher, as a resumed process makes them.
    const DocumentOrder fresh_order(*source->indexed(), 5);
    absl::StatusOr<TokenBatcher> resumed =
        TokenBatcher::Create(source->tokens(), config, nullptr, &fresh_order);
    ASSERT_TRUE(resumed->Restore(saved).ok());
    for (int64_t s = 0; s < 3; ++s) {
      absl::StatusOr<StepBatch> a = through->NextStep(0);
      absl::StatusOr<StepBatch> b = resumed->NextStep(0);
      ASSERT_TRUE(a.ok() && b.ok());
      EXPECT_EQ(a->start, b->start);
      EXPECT_EQ(a->inputs, b->inputs);
      EXPECT_EQ(a->targets, b->targets);
    }
  }
}

TEST(DocumentOrder, ShuffledReadsOtherBatchesThanStored) {
  ScratchDir dir;
  WriteIndexed(dir, "c", MakeCorpus(50).tokens);
  absl::StatusOr<DataSource> source = DataSource::Open(dir / "c", std::nullopt);
  ASSERT_TRUE(source.ok());
  const DocumentOrder order(*source->indexed(), 5);
  const BatchConfig config{8, 2, 1, 1, 320};
  absl::StatusOr<TokenBatcher> stored = TokenBatcher::Create(source->tokens(), config);
  absl::StatusOr<TokenBatcher> shuffled =
      TokenBatcher::Create(source->tokens(), config, nullptr, &order);
  ASSERT_TRUE(stored.ok() && shuffled.ok());
  EXPECT_NE(stored->NextStep(0)->inputs, shuffled->NextStep(0)->inputs);
}

}  // namespace
}  // namespace hcp::data
