// Token files (format, validation) and the batching rule (windows, split over dp and gradient
// accumulation, wrap-around, resume).
#include "runtime/data/TokenData.h"

#include <cstring>
#include <numeric>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/data/DocumentOrder.h"
#include "runtime/data/IndexedDataset.h"
#include "tests/unit/data/TestUtil.h"

namespace hcp::data {
namespace {

using testing::FailsWith;
using testing::ReadFileBytes;
using testing::ScratchDir;
using testing::WriteFileBytes;
using testing::WriteIndexed;

// Tokens 0, 1, ..., n - 1: a token's value is its position, so reads show where they came from.
std::vector<uint32_t> Iota(int64_t n) {
  std::vector<uint32_t> tokens(n);
  std::iota(tokens.begin(), tokens.end(), 0u);
  return tokens;
}

std::string Header(uint32_t token_bytes, uint32_t reserved = 0) {
  std::string bytes(kTokenFileMagic, sizeof(kTokenFileMagic));
  bytes.append(reinterpret_cast<const char*>(&token_bytes), 4);
  bytes.append(reinterpret_cast<const char*>(&reserved), 4);
  return bytes;
}

// A token file of `tokens` at dir/name, opened.
TokenFile WriteAndOpen(const ScratchDir& dir, const std::string& name,
                       const std::vector<uint32_t>& tokens, TokenDType dtype = TokenDType::U32) {
  EXPECT_TRUE(WriteTokenFile(dir / name, tokens, dtype).ok());
  absl::StatusOr<TokenFile> file = TokenFile::Open(dir / name);
  EXPECT_TRUE(file.ok()) << file.status();
  return *std::move(file);
}

// ------------------------------------------------------------------------------------------------
// Files

TEST(TokenFile, WritesHeaderThenTokens) {
  ScratchDir dir;
  ASSERT_TRUE(
      WriteTokenFile(dir / "a.bin", std::vector<uint32_t>{1, 2, 65535}, TokenDType::U16).ok());
  std::string bytes = ReadFileBytes(dir / "a.bin");
  ASSERT_EQ(bytes.size(), 16u + 6u);
  EXPECT_EQ(bytes.substr(0, 8), std::string("HCPTOK1\0", 8));
  EXPECT_EQ(bytes.substr(8, 8), std::string("\x02\0\0\0\0\0\0\0", 8));
  EXPECT_EQ(bytes.substr(16), std::string("\x01\0\x02\0\xff\xff", 6));

  absl::StatusOr<TokenFile> file = TokenFile::Open(dir / "a.bin");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE(file->has_header());
  EXPECT_EQ(file->dtype(), TokenDType::U16);
  ASSERT_EQ(file->size(), 3);
  EXPECT_EQ(file->at(0), 1u);
  EXPECT_EQ(file->at(2), 65535u);
}

TEST(TokenFile, RoundTripsU32) {
  ScratchDir dir;
  std::vector<uint32_t> tokens = {0, 70000, 4000000000u, 7};
  TokenFile file = WriteAndOpen(dir, "a.bin", tokens, TokenDType::U32);
  EXPECT_EQ(file.dtype(), TokenDType::U32);
  ASSERT_EQ(file.size(), 4);
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(file.at(i), tokens[i]);
}

TEST(TokenFile, ReadsRawFilesWhenTheDtypeIsGiven) {
  ScratchDir dir;
  const uint16_t u16[] = {5, 6, 7};
  WriteFileBytes(dir / "raw16.bin", std::string(reinterpret_cast<const char*>(u16), 6));
  absl::StatusOr<TokenFile> file = TokenFile::OpenRaw(dir / "raw16.bin", TokenDType::U16);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_FALSE(file->has_header());
  ASSERT_EQ(file->size(), 3);
  EXPECT_EQ(file->at(2), 7u);

  absl::StatusOr<TokenFile> as_u32 = TokenFile::OpenRaw(dir / "raw16.bin", TokenDType::U32);
  EXPECT_TRUE(FailsWith(as_u32.status(), "6 bytes of tokens is not a whole number of 4-byte"));
  // A raw file has no header for Open to find.
  EXPECT_TRUE(FailsWith(TokenFile::Open(dir / "raw16.bin").status(),
                        "shorter than the 16-byte HCPTOK1 header"));
}

TEST(TokenFile, RawOpenOfAHeaderFileIsRefused) {
  ScratchDir dir;
  ASSERT_TRUE(WriteTokenFile(dir / "a.bin", std::vector<uint32_t>{1, 2}, TokenDType::U16).ok());
  EXPECT_TRUE(FailsWith(TokenFile::OpenRaw(dir / "a.bin", TokenDType::U16).status(),
                        "starts with the HCPTOK1 header"));
}

TEST(TokenFile, BadFilesSayWhatIsWrong) {
  ScratchDir dir;
  absl::StatusOr<TokenFile> missing = TokenFile::Open(dir / "missing.bin");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(FailsWith(missing.status(), "missing.bin: no such token file"));

  WriteFileBytes(dir / "short.bin", "HCPTOK1");
  EXPECT_TRUE(FailsWith(TokenFile::Open(dir / "short.bin").status(),
                        "short.bin: 7 bytes, shorter than the 16-byte HCPTOK1 header"));

  WriteFileBytes(dir / "magic.bin", std::string(32, 'x'));
  EXPECT_TRUE(FailsWith(TokenFile::Open(dir / "magic.bin").status(),
                        "does not start with the HCPTOK1 header"));

  WriteFileBytes(dir / "width.bin", Header(3) + "abc");
  EXPECT_TRUE(
      FailsWith(TokenFile::Open(dir / "width.bin").status(), "header says 3 bytes per token"));

  WriteFileBytes(dir / "reserved.bin", Header(2, 9) + "ab");
  EXPECT_TRUE(
      FailsWith(TokenFile::Open(dir / "reserved.bin").status(), "reserved field is 9, expected 0"));

  WriteFileBytes(dir / "truncated.bin", Header(2) + "abc");
  absl::StatusOr<TokenFile> truncated = TokenFile::Open(dir / "truncated.bin");
  EXPECT_EQ(truncated.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(FailsWith(truncated.status(),
                        "3 bytes of tokens is not a whole number of 2-byte (uint16) tokens"));

  EXPECT_TRUE(FailsWith(TokenFile::Open(dir.path()).status(), "not a regular file"));
}

TEST(TokenFile, EmptyFilesOpenWithNoTokens) {
  ScratchDir dir;
  WriteFileBytes(dir / "empty.bin", "");
  absl::StatusOr<TokenFile> raw = TokenFile::OpenRaw(dir / "empty.bin", TokenDType::U16);
  ASSERT_TRUE(raw.ok()) << raw.status();
  EXPECT_EQ(raw->size(), 0);
  TokenFile header_only = WriteAndOpen(dir, "h.bin", {});
  EXPECT_EQ(header_only.size(), 0);
}

TEST(TokenFile, U16RefusesWideTokensNamingThePosition) {
  ScratchDir dir;
  EXPECT_TRUE(
      FailsWith(WriteTokenFile(dir / "a.bin", std::vector<uint32_t>{1, 2, 70000}, TokenDType::U16),
                "token 70000 at position 2 does not fit in uint16"));
  EXPECT_FALSE(std::filesystem::exists(dir / "a.bin"));  // nothing left behind
}

TEST(TokenFile, MovesKeepTheMapping) {
  ScratchDir dir;
  TokenFile a = WriteAndOpen(dir, "a.bin", {3, 4, 5});
  TokenFile b = std::move(a);
  EXPECT_EQ(a.size(), 0);  // NOLINT(bugprone-use-after-move): moved-from is empty
  ASSERT_EQ(b.size(), 3);
  EXPECT_EQ(b.at(1), 4u);
  TokenFile c = WriteAndOpen(dir, "c.bin", {9});
  c = std::move(b);
  EXPECT_EQ(c.at(2), 5u);
}

TEST(TokenFile, ParsesDtypeNames) {
  EXPECT_EQ(*ParseTokenDType("uint16"), TokenDType::U16);
  EXPECT_EQ(*ParseTokenDType("u32"), TokenDType::U32);
  EXPECT_EQ(*ParseTokenDType("int32"), TokenDType::I32);
  EXPECT_EQ(*ParseTokenDType("i32"), TokenDType::I32);
  EXPECT_EQ(*ParseTokenDType("uint8"), TokenDType::U8);
  EXPECT_TRUE(FailsWith(ParseTokenDType("int8").status(), "unknown token dtype \"int8\""));
  EXPECT_EQ(TokenDTypeBytes(TokenDType::U32), 4);
  EXPECT_EQ(TokenDTypeBytes(TokenDType::I32), 4);
  EXPECT_EQ(TokenDTypeBytes(TokenDType::U8), 1);
  EXPECT_EQ(TokenDTypeName(TokenDType::U16), "uint16");
  EXPECT_EQ(TokenDTypeName(TokenDType::I32), "int32");
}

// Megatron's int32 tokens: raw files only (the HCPTOK1 header has no signed type); a negative
// token reads as negative and is found by the scan, and refused by the batcher, by position.
TEST(TokenFile, ReadsRawInt32Tokens) {
  ScratchDir dir;
  const int32_t i32[] = {5, 100000, -3, 7};
  WriteFileBytes(dir / "raw32.bin", std::string(reinterpret_cast<const char*>(i32), 16));
  absl::StatusOr<TokenFile> file = TokenFile::OpenRaw(dir / "raw32.bin", TokenDType::I32);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->dtype(), TokenDType::I32);
  ASSERT_EQ(file->size(), 4);
  EXPECT_EQ(file->value(1), 100000);
  EXPECT_EQ(file->value(2), -3);
  EXPECT_EQ(file->at(2), 0xFFFFFFFDu);  // as stored
  EXPECT_EQ(file->FindTokenOutside(200000, 0, 4), 2);
  EXPECT_EQ(file->FindTokenOutside(200000, 3, 4), -1);
  EXPECT_EQ(file->FindTokenOutside(100000, 0, 4), 1);

  BatchConfig c{.seq = 1, .micro_batch = 1, .dp = 1, .grad_accum = 1, .vocab = 200000};
  absl::StatusOr<TokenBatcher> batcher = TokenBatcher::Create(*file, c);
  ASSERT_TRUE(batcher.ok()) << batcher.status();
  ASSERT_TRUE(batcher->NextStep(0).ok());  // tokens 0..1
  EXPECT_TRUE(
      FailsWith(batcher->NextStep(0).status(), "raw32.bin: token -3 at position 2 is negative"));

  EXPECT_TRUE(FailsWith(WriteTokenFile(dir / "a.bin", std::vector<uint32_t>{1}, TokenDType::I32),
                        "an HCPTOK1 token file holds uint16 or uint32 tokens, not int32"));
  EXPECT_FALSE(std::filesystem::exists(dir / "a.bin"));
}

TEST(TokenFile, FindTokenOutsideScansEveryChunk) {
  ScratchDir dir;
  // More than one 65,536-token chunk, the offender in the second, and one at the very end.
  std::vector<uint32_t> tokens(200000, 3);
  tokens[131071] = 9;
  tokens[199999] = 12;
  TokenFile file = WriteAndOpen(dir, "a.bin", tokens, TokenDType::U16);
  EXPECT_EQ(file.FindTokenOutside(9, 0, file.size()), 131071);
  EXPECT_EQ(file.FindTokenOutside(10, 0, file.size()), 199999);
  EXPECT_EQ(file.FindTokenOutside(13, 0, file.size()), -1);
  EXPECT_EQ(file.FindTokenOutside(4, 131072, 199999), -1);
  const uint8_t u8[] = {1, 2, 255};
  WriteFileBytes(dir / "u8.bin", std::string(reinterpret_cast<const char*>(u8), 3));
  absl::StatusOr<TokenFile> bytes = TokenFile::OpenRaw(dir / "u8.bin", TokenDType::U8);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(bytes->at(2), 255u);
  EXPECT_EQ(bytes->FindTokenOutside(255, 0, 3), 2);
  EXPECT_EQ(bytes->FindTokenOutside(256, 0, 3), -1);
}

// ------------------------------------------------------------------------------------------------
// Batching

TEST(Batching, ConfigIsValidated) {
  BatchConfig c{.seq = 8, .micro_batch = 2, .dp = 2, .grad_accum = 3, .vocab = 100};
  EXPECT_TRUE(ValidateBatchConfig(c).ok());
  EXPECT_EQ(c.global_batch(), 12);
  EXPECT_EQ(c.step_tokens(), 12 * 9);
  BatchConfig bad = c;
  bad.seq = 0;
  EXPECT_TRUE(FailsWith(ValidateBatchConfig(bad), "seq must be positive, got 0"));
  bad = c;
  bad.grad_accum = -1;
  EXPECT_TRUE(FailsWith(ValidateBatchConfig(bad), "grad_accum must be positive"));
  bad = c;
  bad.vocab = int64_t{1} << 31;
  EXPECT_TRUE(FailsWith(ValidateBatchConfig(bad), "does not fit the int32 token inputs"));
  bad = c;
  bad.micro_batch = int64_t{1} << 62;
  EXPECT_TRUE(FailsWith(ValidateBatchConfig(bad), "overflow"));
}

TEST(Batching, FileTooShortForOneStep) {
  ScratchDir dir;
  TokenFile file = WriteAndOpen(dir, "data.bin", Iota(1000));
  BatchConfig c{.seq = 4096, .micro_batch = 1, .dp = 2, .grad_accum = 2, .vocab = 50000};
  absl::StatusOr<TokenBatcher> batcher = TokenBatcher::Create(file, c);
  EXPECT_TRUE(FailsWith(batcher.status(),
                        "data.bin has 1,000 tokens; one step needs global_batch * (seq + 1) = "
                        "4 * (4096 + 1) = 16,388 (global_batch = micro_batch 1 * dp 2 * "
                        "grad_accum 2)"));
}

TEST(Batching, InputsAndTargetsAreShiftedWindows) {
  ScratchDir dir;
  TokenFile file = WriteAndOpen(dir, "a.bin", Iota(100));
  BatchConfig c{.seq = 4, .micro_batch = 2, .dp = 1, .grad_accum = 1, .vocab = 1000};
  absl::StatusOr<TokenBatcher> batcher = TokenBatcher::Create(file, c);
  ASSERT_TRUE(batcher.ok()) << batcher.status();
  absl::StatusOr<StepBatch> step = batcher->NextStep(0);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(step->inputs, (std::vector<int32_t>{0, 1, 2, 3, 5, 6, 7, 8}));
  EXPECT_EQ(step->targets, (std::vector<int32_t>{1, 2, 3, 4, 6, 7, 8, 9}));
  EXPECT_EQ(step->start, (DataState{0, 0}));
  EXPECT_EQ(batcher->state(), (DataState{0, 10}));
  step = batcher->NextStep(0);
  ASSERT_TRUE(step.ok());
  EXPECT_EQ(step->micro_inputs(0)[0], 10);
  EXPECT_EQ(step->micro_targets(0)[7], 19);
}

// A loss mask turns the targets whose token is masked into kIgnoredTarget; the inputs stay.
TEST(Batching, MaskedTokensAreIgnoredTargetsAndStillInputs) {
  ScratchDir dir;
  TokenFile file = WriteAndOpen(dir, "a.bin", Iota(20));
  std::vector<uint32_t> values(20, 1);
  for (int64_t i : {0, 1, 4, 5, 6, 9}) values[i] = 0;
  TokenFile mask = WriteAndOpen(dir, "mask.bin", values, TokenDType::U16);
  BatchConfig c{.seq = 4, .micro_batch = 2, .dp = 1, .grad_accum = 1, .vocab = 1000};
  absl::StatusOr<TokenBatcher> batcher = TokenBatcher::Create(file, c, &mask);
  ASSERT_TRUE(batcher.ok()) << batcher.status();
  absl::StatusOr<StepBatch> step = batcher->NextStep(0);
  ASSERT_TRUE(step.ok()) << step.status();
  constexpr int32_t x = kIgnoredTarget;
  EXPECT_EQ(step->inputs, (std::vector<int32_t>{0, 1, 2, 3, 5, 6, 7, 8}));
  // Window 0 is tokens 0..4: targets name tokens 1..4 (1 and 4 masked); window 1 is 5..9.
  EXPECT_EQ(step->targets, (std::vector<int32_t>{x, 2, 3, x, x, 7, 8, x}));

  TokenFile short_mask = WriteAndOpen(dir, "short.bin", std::vector<uint32_t>(19, 1));
  EXPECT_TRUE(FailsWith(TokenBatcher::Create(file, c, &short_mask).status(),
                        "has 19 values for the 20 tokens of"));
}

// Every (dp rank, accumulation step) pair reads its own rows of the global batch, and together
// they read every window of the step exactly once, at (a * dp + d) * micro_batch + i.
TEST(Batching, RanksAndAccumulationStepsPartitionTheGlobalBatch) {
  ScratchDir dir;
  TokenFile file = WriteAndOpen(dir, "a.bin", Iota(1000));
  BatchConfig c{.seq = 3, .micro_batch = 2, .dp = 3, .grad_accum = 2, .vocab = 1000};
  absl::StatusOr<TokenBatcher> batcher = TokenBatcher::Create(file, c);
  ASSERT_TRUE(batcher.ok()) << batcher.status();
  const DataState state{0, 7};  // any start
  std::multiset<int64_t> windows;
  for (int64_t d = 0; d < c.dp; ++d) {
    for (int64_t a = 0; a < c.grad_accum; ++a) {
      std::vector<int32_t> in(6), target(6), again_in(6), again_target(6);
      ASSERT_TRUE(batcher->ReadMicroBatch(state, d, a, in, target).ok());
      ASSERT_TRUE(batcher->ReadMicroBatch(state, d, a, again_in, again_target).ok());
      EXPECT_EQ(in, again_in);  // deterministic
      EXPECT_EQ(target, again_target);
      for (int64_t i = 0; i < c.micro_batch; ++i) {
        const int64_t window = (in[i * c.seq] - state.position) / (c.seq + 1);
        EXPECT_EQ(window, (a * c.dp + d) * c.micro_batch + i);
        EXPECT_EQ(window, GlobalSequenceIndex(c, d, a, i));
        windows.insert(window);
      }
    }
  }
  std::multiset<int64_t> expected;
  for (int64_t s = 0; s < c.global_batch(); ++s) expected.insert(s);
  EXPECT_EQ(windows, expected);
}

TEST(Batching, NextStepReadsThisRanksMicroBatchesInOrder) {
  ScratchDir dir;
  TokenFile file = WriteAndOpen(dir, "a.bin", Iota(1000));
  BatchConfig c{.seq = 2, .micro_batch = 1, .dp = 2, .grad_accum = 2, .vocab = 1000};
  absl::StatusOr<TokenBatcher> batcher = TokenBatcher::Create(file, c);
  ASSERT_TRUE(batcher.ok());
  absl::StatusOr<StepBatch> rank1 = batcher->NextStep(1);
  ASSERT_TRUE(rank1.ok());
  // Windows of 3: rank 1 gets window 1 (a = 0) and window 3 (a = 1).
  EXPECT_EQ(rank1->inputs, (std::vector<int32_t>{3, 4, 9, 10}));
  EXPECT_EQ(rank1->targets, (std::vector<int32_t>{4, 5, 10, 11}));
}

TEST(Batching, WrapsAroundIntoTheNextEpoch) {
  ScratchDir dir;
  // step_tokens = 2 * 5 = 10; 25 tokens hold two steps, the tail of 5 is skipped.
  TokenFile file = WriteAndOpen(dir, "a.bin", Iota(25));
  BatchConfig c{.seq = 4, .micro_batch = 2, .dp = 1, .grad_accum = 1, .vocab = 1000};
  absl::StatusOr<TokenBatcher> batcher = TokenBatcher::Create(file, c);
  ASSERT_TRUE(batcher.ok());
  std::vector<StepBatch> steps;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<StepBatch> step = batcher->NextStep(0);
    ASSERT_TRUE(step.ok()) << step.status();
    steps.push_back(*step);
  }
  EXPECT_EQ(steps[1].start, (DataState{0, 10}));
  EXPECT_EQ(steps[2].start, (DataState{1, 0}));
  EXPECT_EQ(steps[2].inputs, steps[0].inputs);
  EXPECT_EQ(batcher->state(), (DataState{1, 10}));
  // A step wraps exactly when fewer than step_tokens tokens remain at its start.
  EXPECT_EQ(batcher->StepStart({0, 15}), (DataState{0, 15}));
  EXPECT_EQ(batcher->StepStart({0, 16}), (DataState{1, 0}));
  EXPECT_EQ(batcher->StepStart({0, 25}), (DataState{1, 0}));
  EXPECT_EQ(batcher->NextState({3, 20}), (DataState{4, 10}));
}

TEST(Batching, TokenOutsideVocabNamesItsPosition) {
  ScratchDir dir;
  std::vector<uint32_t> tokens(100, 1);
  tokens[13] = 300;
  TokenFile file = WriteAndOpen(dir, "data.bin", tokens);
  BatchConfig c{.seq = 4, .micro_batch = 2, .dp = 1, .grad_accum = 1, .vocab = 300};
  absl::StatusOr<TokenBatcher> batcher = TokenBatcher::Create(file, c);
  ASSERT_TRUE(batcher.ok());
  ASSERT_TRUE(batcher->NextStep(0).ok());  // tokens 0..9
  absl::StatusOr<StepBatch> bad = batcher->NextStep(0);
  EXPECT_TRUE(FailsWith(bad.status(), "data.bin: token 300 at position 13 is >= vocab 300"));
  EXPECT_EQ(batcher->state(), (DataState{0, 10}));  // unchanged by the failed step
}

TEST(Batching, ResumeFromASavedStateContinuesExactly) {
  ScratchDir dir;
  TokenFile file = WriteAndOpen(dir, "a.bin", Iota(173));
  BatchConfig c{.seq = 5, .micro_batch = 2, .dp = 2, .grad_accum = 2, .vocab = 1000};
  absl::StatusOr<TokenBatcher> first = TokenBatcher::Create(file, c);
  ASSERT_TRUE(first.ok());
  DataState saved;
  std::vector<StepBatch> after;
  for (int step = 0; step < 7; ++step) {  // crosses an epoch boundary (173 / 48 = 3 steps)
    absl::StatusOr<StepBatch> batch = first->NextStep(1);
    ASSERT_TRUE(batch.ok());
    if (step == 3) saved = first->state();
    if (step > 3) after.push_back(*batch);
  }
  absl::StatusOr<TokenBatcher> resumed = TokenBatcher::Create(file, c);
  ASSERT_TRUE(resumed.ok());
  ASSERT_TRUE(resumed->Restore(saved).ok());
  for (const StepBatch& want : after) {
    absl::StatusOr<StepBatch> got = resumed->NextStep(1);
    ASSERT_TRUE(got.ok());
    EXPECT_EQ(got->start, want.start);
    EXPECT_EQ(got->inputs, want.inputs);
    EXPECT_EQ(got->targets, want.targets);
  }
  EXPECT_EQ(resumed->state(), first->state());
}

// The global batch of a step depends only on seq and global_batch, not on the split.
TEST(Batching, AnotherSplitOfTheSameGlobalBatchReadsTheSameSequences) {
  ScratchDir dir;
  TokenFile file = WriteAndOpen(dir, "a.bin", Iota(500));
  auto global_batch = [&](const BatchConfig& c, DataState state) {
    absl::StatusOr<TokenBatcher> batcher = TokenBatcher::Create(file, c);
    EXPECT_TRUE(batcher.ok());
    std::vector<std::vector<int32_t>> rows(c.global_batch());
    for (int64_t d = 0; d < c.dp; ++d) {
      for (int64_t a = 0; a < c.grad_accum; ++a) {
        std::vector<int32_t> in(c.micro_batch * c.seq), target(c.micro_batch * c.seq);
        EXPECT_TRUE(batcher->ReadMicroBatch(state, d, a, in, target).ok());
        for (int64_t i = 0; i < c.micro_batch; ++i) {
          rows[GlobalSequenceIndex(c, d, a, i)].assign(in.begin() + i * c.seq,
                                                       in.begin() + (i + 1) * c.seq);
        }
      }
    }
    return rows;
  };
  BatchConfig dp4{.seq = 6, .micro_batch = 1, .dp = 4, .grad_accum = 1, .vocab = 1000};
  BatchConfig dp1{.seq = 6, .micro_batch = 2, .dp = 1, .grad_accum = 2, .vocab = 1000};
  BatchConfig dp2{.seq = 6, .micro_batch = 1, .dp = 2, .grad_accum = 2, .vocab = 1000};
  EXPECT_EQ(global_batch(dp4, {0, 28}), global_batch(dp1, {0, 28}));
  EXPECT_EQ(global_batch(dp4, {0, 28}), global_batch(dp2, {0, 28}));
}

TEST(Batching, BadRequestsAreRefused) {
  ScratchDir dir;
  TokenFile file = WriteAndOpen(dir, "data.bin", Iota(100));
  BatchConfig c{.seq = 4, .micro_batch = 2, .dp = 2, .grad_accum = 1, .vocab = 1000};
  absl::StatusOr<TokenBatcher> batcher = TokenBatcher::Create(file, c);
  ASSERT_TRUE(batcher.ok());
  EXPECT_TRUE(FailsWith(batcher->Restore({0, 101}), "does not fit"));
  EXPECT_TRUE(FailsWith(batcher->Restore({-1, 0}), "was it saved with another data file?"));
  EXPECT_TRUE(batcher->Restore({2, 100}).ok());  // at the very end: the next step wraps
  std::vector<int32_t> in(8), target(8), small(7);
  EXPECT_TRUE(FailsWith(batcher->ReadMicroBatch({}, 2, 0, in, target), "dp rank 2"));
  EXPECT_TRUE(FailsWith(batcher->ReadMicroBatch({}, 0, 1, in, target), "accumulation step 1"));
  EXPECT_TRUE(FailsWith(batcher->ReadMicroBatch({}, 0, 0, small, target),
                        "expected micro_batch * seq = 8"));
}

// Packed documents: each window gets position_ids (0 at the window's start and at every document
// start), and the target of a document's last token is ignored. The documents come from an
// indexed dataset's .idx, shuffled or not, or from the eos tokens of a plain stream.
TEST(Batching, PackedDocumentsFromAnIndexedDataset) {
  ScratchDir dir;
  // Documents of 3, 1, 4, 2 and 5 tokens; token values tell the document (10s) and position.
  WriteIndexed(dir, "docs", {{10, 11, 12}, {20}, {30, 31, 32, 33}, {40, 41}, {50, 51, 52, 53, 54}});
  absl::StatusOr<IndexedDataset> docs = IndexedDataset::Open(dir / "docs");
  ASSERT_TRUE(docs.ok()) << docs.status();
  BatchConfig c{.seq = 6, .micro_batch = 2, .dp = 1, .grad_accum = 1, .vocab = 100};
  c.documents = true;
  absl::StatusOr<TokenBatcher> batcher =
      TokenBatcher::Create(docs->token_file(), c, nullptr, nullptr, &*docs);
  ASSERT_TRUE(batcher.ok()) << batcher.status();
  absl::StatusOr<StepBatch> step = batcher->NextStep(0);
  ASSERT_TRUE(step.ok()) << step.status();
  // Window 0: tokens 10 11 12 20 30 31 | 32; window 1: 33 40 41 50 51 52 | 53.
  EXPECT_EQ(step->inputs, (std::vector<int32_t>{10, 11, 12, 20, 30, 31, 33, 40, 41, 50, 51, 52}));
  EXPECT_EQ(step->positions, (std::vector<int32_t>{0, 1, 2, 0, 0, 1, 0, 0, 1, 0, 1, 2}));
  const int32_t X = kIgnoredTarget;
  EXPECT_EQ(step->targets, (std::vector<int32_t>{11, 12, X, X, 31, 32, X, 41, X, 51, 52, 53}));
  EXPECT_EQ(step->micro_positions(0).size(), 12u);

  // Shuffled: the same rule over the documents in their order.
  const DocumentOrder order(*docs, 3);
  batcher = TokenBatcher::Create(docs->token_file(), c, nullptr, &order, &*docs);
  ASSERT_TRUE(batcher.ok());
  step = batcher->NextStep(0);
  ASSERT_TRUE(step.ok());
  for (size_t i = 0; i < step->inputs.size(); ++i) {
    if (step->positions[i] > 0) {
      EXPECT_EQ(step->inputs[i] / 10, step->inputs[i - 1] / 10) << i;      // the same document
      EXPECT_EQ(step->inputs[i] % 10, step->inputs[i - 1] % 10 + 1) << i;  // its next token
    } else if (i % 6 != 0) {
      EXPECT_NE(step->inputs[i] / 10, step->inputs[i - 1] / 10) << i;  // another document
      EXPECT_EQ(step->inputs[i] % 10, 0) << i;                         // at its first token
      EXPECT_EQ(step->targets[i - 1], X) << i;
    }
  }
}

TEST(Batching, PackedDocumentsEndAfterEosInAPlainStream) {
  ScratchDir dir;
  // Three documents, each ended by the eos token 9.
  TokenFile file = WriteAndOpen(dir, "data.bin", {1, 2, 9, 3, 9, 4, 5, 6, 9, 7});
  BatchConfig c{.seq = 9, .micro_batch = 1, .dp = 1, .grad_accum = 1, .vocab = 10};
  c.documents = true;
  EXPECT_TRUE(FailsWith(TokenBatcher::Create(file, c).status(),
                        "data.bin is one stream of tokens and the model names no eos_token_id"));
  c.eos_tokens = {9};
  absl::StatusOr<TokenBatcher> batcher = TokenBatcher::Create(file, c);
  ASSERT_TRUE(batcher.ok()) << batcher.status();
  absl::StatusOr<StepBatch> step = batcher->NextStep(0);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(step->positions, (std::vector<int32_t>{0, 1, 2, 0, 1, 0, 1, 2, 3}));
  const int32_t X = kIgnoredTarget;
  // The eos token ends its document: its target, the next document's first token, is ignored.
  EXPECT_EQ(step->targets, (std::vector<int32_t>{2, 9, X, 9, X, 5, 6, 9, X}));
  // Without documents the same window is one stream.
  c.documents = false;
  batcher = TokenBatcher::Create(file, c);
  ASSERT_TRUE(batcher.ok());
  step = batcher->NextStep(0);
  ASSERT_TRUE(step.ok());
  EXPECT_TRUE(step->positions.empty());
  EXPECT_EQ(step->targets, (std::vector<int32_t>{2, 9, 3, 9, 4, 5, 6, 9, 7}));
}

}  // namespace
}  // namespace hcp::data
