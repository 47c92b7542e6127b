// --data opened in one place: which format a path names (an indexed dataset by prefix, .bin or
// .idx; a token file; a raw file with --data-dtype), what is refused and how it is said, and the
// vocabulary check over the whole data before training.
#include "runtime/data/DataSource.h"

#include <filesystem>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/data/IndexedDataset.h"
#include "tests/unit/data/TestUtil.h"

namespace hcp::data {
namespace {

using testing::FailsWith;
using testing::ScratchDir;
using testing::WriteFileBytes;
using testing::WriteIndexed;

std::string RawU16(const std::vector<uint16_t>& tokens) {
  return std::string(reinterpret_cast<const char*>(tokens.data()), 2 * tokens.size());
}

TEST(DataSource, IndexedDatasetByPrefixBinOrIdx) {
  ScratchDir dir;
  WriteIndexed(dir, "corpus", {{1, 2, 3}, {4, 5}});
  for (const std::string& path : {dir / "corpus", dir / "corpus.bin", dir / "corpus.idx"}) {
    absl::StatusOr<DataSource> source = DataSource::Open(path, std::nullopt);
    ASSERT_TRUE(source.ok()) << path << ": " << source.status();
    EXPECT_EQ(source->format(), DataFormat::kIndexedDataset) << path;
    ASSERT_NE(source->indexed(), nullptr);
    EXPECT_EQ(source->indexed()->documents(), 2);
    EXPECT_EQ(source->tokens().path(), dir / "corpus.bin");
    EXPECT_EQ(source->tokens().size(), 5);
    EXPECT_EQ(source->Describe(), "Megatron indexed dataset " + (dir / "corpus") +
                                      " (.bin/.idx): 2 documents, 5 uint16 tokens");
  }
  // --data-dtype is for raw files: the .idx's own dtype may be repeated, not contradicted.
  EXPECT_TRUE(DataSource::Open(dir / "corpus", TokenDType::U16).ok());
  EXPECT_TRUE(FailsWith(DataSource::Open(dir / "corpus", TokenDType::I32).status(),
                        "--data-dtype int32, but " + (dir / "corpus.idx") +
                            " says its tokens are uint16: leave --data-dtype out"));
}

TEST(DataSource, OpensTheLossMaskBesideADataset) {
  ScratchDir dir;
  WriteIndexed(dir, "corpus", {{1, 2, 3}, {4, 5}});
  absl::StatusOr<DataSource> plain = DataSource::Open(dir / "corpus", std::nullopt);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->loss_mask(), nullptr);
  WriteIndexed(dir, "corpus.lossmask", {{0, 0, 1}, {0, 1}}, TokenDType::U8);
  absl::StatusOr<DataSource> source = DataSource::Open(dir / "corpus", std::nullopt);
  ASSERT_TRUE(source.ok()) << source.status();
  ASSERT_NE(source->loss_mask(), nullptr);
  EXPECT_EQ(source->loss_mask()->size(), 5);
  EXPECT_EQ(source->loss_mask()->at(2), 1u);
  EXPECT_EQ(source->Describe(), "Megatron indexed dataset " + (dir / "corpus") +
                                    " (.bin/.idx): 2 documents, 5 uint16 tokens, with a loss "
                                    "mask (2 of 5 targets count)");
}

TEST(DataSource, ALossMaskThatDoesNotMatchIsRefused) {
  ScratchDir dir;
  WriteIndexed(dir, "corpus", {{1, 2, 3}, {4, 5}});
  const std::string mask = dir / "corpus.lossmask.idx";
  WriteIndexed(dir, "corpus.lossmask", {{0, 1}, {0, 1, 1}}, TokenDType::U8);
  EXPECT_TRUE(FailsWith(DataSource::Open(dir / "corpus", std::nullopt).status(),
                        mask + " (the loss mask of " + (dir / "corpus.idx") +
                            "): sequence 0 has 2 values, but the dataset's sequence 0 has 3 "
                            "tokens: they do not belong together"));
  WriteIndexed(dir, "corpus.lossmask", {{0, 1, 1}}, TokenDType::U8);
  EXPECT_TRUE(FailsWith(DataSource::Open(dir / "corpus", std::nullopt).status(),
                        "has 1 sequences in 1 documents, its dataset 2 in 2"));
  WriteIndexed(dir, "corpus.lossmask", {{0, 1, 1}, {0, 1}}, TokenDType::U16);
  EXPECT_TRUE(FailsWith(DataSource::Open(dir / "corpus", std::nullopt).status(),
                        "holds uint16 values; a loss mask is uint8 (0 or 1)"));
  WriteIndexed(dir, "corpus.lossmask", {{0, 1, 1}, {2, 1}}, TokenDType::U8);
  EXPECT_TRUE(FailsWith(DataSource::Open(dir / "corpus", std::nullopt).status(),
                        "corpus.lossmask.bin: value 2 at index 3; a loss mask holds only 0"));
  std::filesystem::remove(dir / "corpus.lossmask.bin");
  EXPECT_TRUE(FailsWith(DataSource::Open(dir / "corpus", std::nullopt).status(),
                        "the loss mask of " + (dir / "corpus") + ": " + (dir / "corpus.lossmask") +
                            " is not a Megatron indexed dataset"));
}

TEST(DataSource, HalfADatasetSaysWhichHalfIsMissing) {
  ScratchDir dir;
  WriteIndexed(dir, "corpus", {{1, 2}});
  std::filesystem::remove(dir / "corpus.bin");
  EXPECT_TRUE(FailsWith(DataSource::Open(dir / "corpus", std::nullopt).status(),
                        "corpus.idx (present) and " + (dir / "corpus.bin") + " (missing)"));
  EXPECT_TRUE(FailsWith(DataSource::Open(dir / "corpus.idx", std::nullopt).status(), "(missing)"));
}

TEST(DataSource, TokenFileByItsHeader) {
  ScratchDir dir;
  ASSERT_TRUE(WriteTokenFile(dir / "a.tok", std::vector<uint32_t>{1, 2, 3}, TokenDType::U32).ok());
  absl::StatusOr<DataSource> source = DataSource::Open(dir / "a.tok", std::nullopt);
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_EQ(source->format(), DataFormat::kTokenFile);
  EXPECT_EQ(source->indexed(), nullptr);
  EXPECT_EQ(source->tokens().size(), 3);
  EXPECT_EQ(source->Describe(), "token file " + (dir / "a.tok") + ": 3 uint32 tokens");
  EXPECT_TRUE(DataSource::Open(dir / "a.tok", TokenDType::U32).ok());
  EXPECT_TRUE(FailsWith(
      DataSource::Open(dir / "a.tok", TokenDType::U16).status(),
      "--data-dtype uint16, but " + (dir / "a.tok") + "'s header says its tokens are uint32"));
}

// A .bin token file with no .idx beside it is a token file, not half a dataset.
TEST(DataSource, BinWithoutIndexIsATokenFile) {
  ScratchDir dir;
  ASSERT_TRUE(WriteTokenFile(dir / "a.bin", std::vector<uint32_t>{1, 2}, TokenDType::U16).ok());
  absl::StatusOr<DataSource> source = DataSource::Open(dir / "a.bin", std::nullopt);
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_EQ(source->format(), DataFormat::kTokenFile);
}

TEST(DataSource, RawFileNeedsTheDtypeFlag) {
  ScratchDir dir;
  WriteFileBytes(dir / "raw.bin", RawU16({5, 6, 7, 8}));
  EXPECT_TRUE(FailsWith(DataSource::Open(dir / "raw.bin", std::nullopt).status(),
                        (dir / "raw.bin") +
                            " does not start with the HCPTOK1 header of a token file, nor the "
                            ".bin of a Megatron indexed dataset (no " +
                            (dir / "raw.idx") +
                            " beside it): for a raw file of tokens, give their dtype with "
                            "--data-dtype uint16, uint32 or int32"));
  WriteFileBytes(dir / "raw.tokens", RawU16({5}));  // shorter than the header's magic
  EXPECT_TRUE(FailsWith(DataSource::Open(dir / "raw.tokens", std::nullopt).status(),
                        "raw.tokens does not start with the HCPTOK1 header of a token file: for a "
                        "raw file of tokens, give their dtype with --data-dtype"));

  absl::StatusOr<DataSource> source = DataSource::Open(dir / "raw.bin", TokenDType::U16);
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_EQ(source->format(), DataFormat::kRawTokens);
  EXPECT_EQ(source->tokens().size(), 4);
  EXPECT_EQ(source->tokens().at(3), 8u);
  EXPECT_EQ(source->Describe(), "raw token file " + (dir / "raw.bin") + ": 4 uint16 tokens");
  absl::StatusOr<DataSource> wide = DataSource::Open(dir / "raw.bin", TokenDType::I32);
  ASSERT_TRUE(wide.ok()) << wide.status();
  EXPECT_EQ(wide->tokens().size(), 2);
}

TEST(DataSource, MissingDataNamesThePath) {
  ScratchDir dir;
  absl::StatusOr<DataSource> source = DataSource::Open(dir / "nothing", std::nullopt);
  EXPECT_EQ(source.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(FailsWith(source.status(),
                        (dir / "nothing") + ": no such file, nor " + (dir / "nothing.idx") +
                            " and " + (dir / "nothing.bin") + " of a Megatron indexed dataset"));
  EXPECT_TRUE(FailsWith(DataSource::Open(dir.path(), std::nullopt).status(), "not a regular file"));
}

TEST(DataSource, VocabCheckNamesFileIndexAndDocument) {
  ScratchDir dir;
  WriteIndexed(dir, "corpus", {{1, 2, 3}, {}, {4, 400, 5}, {6}});
  absl::StatusOr<DataSource> indexed = DataSource::Open(dir / "corpus", std::nullopt);
  ASSERT_TRUE(indexed.ok()) << indexed.status();
  EXPECT_TRUE(indexed->CheckVocab(401).ok());
  EXPECT_TRUE(FailsWith(indexed->CheckVocab(320),
                        (dir / "corpus.bin") +
                            ": token 400 at index 4 of the tokens (document 2 of 4, its token 1) "
                            "is >= the model's vocab 320"));

  ASSERT_TRUE(
      WriteTokenFile(dir / "a.tok", std::vector<uint32_t>{0, 1, 319, 320}, TokenDType::U16).ok());
  absl::StatusOr<DataSource> file = DataSource::Open(dir / "a.tok", std::nullopt);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE(FailsWith(file->CheckVocab(320),
                        (dir / "a.tok") + ": token 320 at index 3 of the tokens is >= the model's "
                                          "vocab 320"));
  EXPECT_TRUE(file->CheckVocab(321).ok());

  const int32_t i32[] = {1, 2, -7};
  WriteFileBytes(dir / "neg.bin", std::string(reinterpret_cast<const char*>(i32), 12));
  absl::StatusOr<DataSource> negative = DataSource::Open(dir / "neg.bin", TokenDType::I32);
  ASSERT_TRUE(negative.ok()) << negative.status();
  EXPECT_TRUE(FailsWith(negative->CheckVocab(100000),
                        "neg.bin: token -7 at index 2 of the tokens is negative"));
}

TEST(DataSource, MovedSourceKeepsItsTokens) {
  ScratchDir dir;
  WriteIndexed(dir, "corpus", {{7, 8, 9}}, TokenDType::I32);
  absl::StatusOr<DataSource> opened = DataSource::Open(dir / "corpus", std::nullopt);
  ASSERT_TRUE(opened.ok()) << opened.status();
  DataSource source = *std::move(opened);
  EXPECT_EQ(source.tokens().at(2), 9u);
  EXPECT_EQ(source.tokens().dtype(), TokenDType::I32);
}

}  // namespace
}  // namespace hcp::data
