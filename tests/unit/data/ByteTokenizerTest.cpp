// The byte-level tokenizer and tokenizing text files into a token file.
#include "runtime/data/ByteTokenizer.h"

#include <filesystem>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/data/TestUtil.h"

namespace hcp::data {
namespace {

using testing::FailsWith;
using testing::ScratchDir;
using testing::WriteFileBytes;

std::vector<uint32_t> ReadAll(const TokenFile& file) {
  std::vector<uint32_t> tokens;
  for (int64_t i = 0; i < file.size(); ++i) tokens.push_back(file.at(i));
  return tokens;
}

TEST(ByteTokenizer, BytesAreTokensBetweenBosAndEos) {
  EXPECT_EQ(ByteTokenize("hi"), (std::vector<uint32_t>{256, 'h', 'i', 257}));
  EXPECT_EQ(ByteTokenize("hi", false, false), (std::vector<uint32_t>{'h', 'i'}));
  EXPECT_EQ(ByteTokenize(""), (std::vector<uint32_t>{kByteBos, kByteEos}));
  // UTF-8 is split into its bytes, high bytes stay 128..255.
  EXPECT_EQ(ByteTokenize("\xc3\xa9", false, false), (std::vector<uint32_t>{0xc3, 0xa9}));
  EXPECT_EQ(ByteTokenize(std::string_view("\0", 1), false, false), (std::vector<uint32_t>{0}));
  EXPECT_EQ(kByteVocabMin, 259);
  EXPECT_EQ(kBytePad, 258u);
}

TEST(ByteTokenizer, DetokenizeInvertsTokenize) {
  const std::string text = "caf\xc3\xa9\n\ttab";
  EXPECT_EQ(ByteDetokenize(ByteTokenize(text, false, false)), text);
  EXPECT_EQ(ByteDetokenize(ByteTokenize("ab")), "<bos>ab<eos>");
  const std::vector<uint32_t> odd = {kBytePad, 'x', 1000};
  EXPECT_EQ(ByteDetokenize(odd), "<pad>x<unk:1000>");
}

TEST(ByteTokenizer, TextFilesBecomeOneDocumentEach) {
  ScratchDir dir;
  WriteFileBytes(dir / "a.txt", "ab");
  WriteFileBytes(dir / "b.txt", "c");
  absl::StatusOr<int64_t> count =
      TokenizeTextFiles({dir / "a.txt", dir / "b.txt"}, dir / "out.bin", TokenDType::U32);
  ASSERT_TRUE(count.ok()) << count.status();
  EXPECT_EQ(*count, 7);
  absl::StatusOr<TokenFile> file = TokenFile::Open(dir / "out.bin");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->dtype(), TokenDType::U32);
  EXPECT_EQ(ReadAll(*file), (std::vector<uint32_t>{256, 'a', 'b', 257, 256, 'c', 257}));
}

TEST(ByteTokenizer, BadInputsAreNamed) {
  ScratchDir dir;
  EXPECT_TRUE(FailsWith(TokenizeTextFiles({}, dir / "out.bin").status(), "no text files"));
  EXPECT_TRUE(FailsWith(TokenizeTextFiles({dir / "nope.txt"}, dir / "out.bin").status(),
                        "nope.txt: no such text file"));
  EXPECT_FALSE(std::filesystem::exists(dir / "out.bin"));
  EXPECT_TRUE(FailsWith(ListTextFiles(dir / "nowhere").status(), "cannot list"));
  EXPECT_TRUE(FailsWith(ListTextFiles(dir.path()).status(), "holds no files"));
}

TEST(ByteTokenizer, ListsRegularFilesSortedWithoutSymlinks) {
  ScratchDir dir;
  WriteFileBytes(dir / "b", "2");
  WriteFileBytes(dir / "a", "1");
  std::filesystem::create_symlink(dir / "a", dir / "c");
  std::filesystem::create_directory(dir / "d");
  absl::StatusOr<std::vector<std::string>> files = ListTextFiles(dir.path());
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_EQ(*files, (std::vector<std::string>{dir / "a", dir / "b"}));
}

// The demo corpus: Debian's licence texts, always installed (base-files is essential).
TEST(ByteTokenizer, DemoCorpusTokenizes) {
  if (!std::filesystem::exists(kDemoCorpusDir)) GTEST_SKIP() << kDemoCorpusDir << " is absent";
  absl::StatusOr<std::vector<std::string>> files = ListTextFiles(kDemoCorpusDir);
  ASSERT_TRUE(files.ok()) << files.status();
  int64_t bytes = 0;
  for (const std::string& f : *files) bytes += std::filesystem::file_size(f);
  ScratchDir dir;
  absl::StatusOr<int64_t> count = TokenizeTextFiles(*files, dir / "licenses.bin");
  ASSERT_TRUE(count.ok()) << count.status();
  EXPECT_EQ(*count, bytes + 2 * static_cast<int64_t>(files->size()));
  absl::StatusOr<TokenFile> file = TokenFile::Open(dir / "licenses.bin");
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(file->size(), *count);
  EXPECT_EQ(file->at(0), kByteBos);
  // Every token is inside the byte vocabulary: a batcher with vocab 259 reads a step.
  BatchConfig c{.seq = 64, .micro_batch = 2, .dp = 2, .grad_accum = 1, .vocab = kByteVocabMin};
  absl::StatusOr<TokenBatcher> batcher = TokenBatcher::Create(*file, c);
  ASSERT_TRUE(batcher.ok()) << batcher.status();
  EXPECT_TRUE(batcher->NextStep(1).ok());
}

}  // namespace
}  // namespace hcp::data
