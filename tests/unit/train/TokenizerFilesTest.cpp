// The tokenizer files checkpoints carry: read from a tokenizer.json or its directory (with the
// Hugging Face files beside it), checked against the model's vocabulary, written back unchanged.
#include "runtime/train/TokenizerFiles.h"

#include <filesystem>
#include <string>

#include "gtest/gtest.h"
#include "tests/unit/train/TestUtil.h"

namespace hcp::train {
namespace {

using testing::FailsWith;
using testing::ReadFileBytes;
using testing::ScratchDir;
using testing::WriteFileBytes;

constexpr char kTokenizer[] =
    R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]},)"
    R"( "added_tokens": [{"id": 5, "content": "<|end_of_text|>", "special": true}]})";

TEST(TokenizerFiles, ReadsTheDirectoryOrItsTokenizerJsonAndWritesThemBack) {
  ScratchDir dir;
  std::filesystem::create_directories(dir / "tok");
  WriteFileBytes(dir / "tok/tokenizer.json", kTokenizer);
  WriteFileBytes(dir / "tok/tokenizer_config.json", R"({"eos_token": "<|end_of_text|>"})");
  WriteFileBytes(dir / "tok/model.safetensors", "not a tokenizer file");
  EXPECT_TRUE(HasTokenizer(dir / "tok"));
  EXPECT_FALSE(HasTokenizer(dir.path()));

  for (const std::string& path : {dir / "tok", dir / "tok/tokenizer.json"}) {
    absl::StatusOr<TokenizerFiles> files = ReadTokenizerFiles(path, 6);
    ASSERT_TRUE(files.ok()) << files.status();
    ASSERT_EQ(files->files.size(), 2u);
    EXPECT_EQ(files->files[0].first, "tokenizer.json");
    EXPECT_EQ(files->files[1].first, "tokenizer_config.json");
    EXPECT_NE(DescribeTokenizerFiles(*files).find("2 files from"), std::string::npos);
    EXPECT_NE(DescribeTokenizerFiles(*files).find("(tokenizer.json, tokenizer_config.json)"),
              std::string::npos);

    std::filesystem::create_directories(dir / "out");
    ASSERT_TRUE(WriteTokenizerFiles(*files, dir / "out").ok());
    EXPECT_EQ(ReadFileBytes(dir / "out/tokenizer.json"), kTokenizer);
    EXPECT_EQ(ReadFileBytes(dir / "out/tokenizer_config.json"),
              R"({"eos_token": "<|end_of_text|>"})");
    EXPECT_FALSE(std::filesystem::exists(dir / "out/model.safetensors"));
    std::filesystem::remove_all(dir / "out");
  }
}

// A tokenizer file of another name is the tokenizer.json, without the files beside it.
TEST(TokenizerFiles, AFileOfAnotherNameIsTheTokenizerJsonAlone) {
  ScratchDir dir;
  WriteFileBytes(dir / "granite-style.json", kTokenizer);
  WriteFileBytes(dir / "tokenizer_config.json", "{}");
  absl::StatusOr<TokenizerFiles> files = ReadTokenizerFiles(dir / "granite-style.json", 6);
  ASSERT_TRUE(files.ok()) << files.status();
  ASSERT_EQ(files->files.size(), 1u);
  EXPECT_EQ(files->files[0].first, "tokenizer.json");
  EXPECT_EQ(files->files[0].second, kTokenizer);
  EXPECT_EQ(files->dir, dir / "granite-style.json");
}

// Another model's tokenizer (ids beyond the embedding rows), a file that is not one, a missing one.
TEST(TokenizerFiles, RefusesWhatCannotBeTheModelsTokenizer) {
  ScratchDir dir;
  WriteFileBytes(dir / "tokenizer.json", kTokenizer);
  EXPECT_TRUE(FailsWith(ReadTokenizerFiles(dir.path(), 5).status(),
                        "has token ids up to 5, but the model's vocabulary has 5 rows"));
  WriteFileBytes(dir / "tokenizer.json", "[1, 2]");
  EXPECT_TRUE(FailsWith(ReadTokenizerFiles(dir.path(), 5).status(), "is not a JSON object"));
  WriteFileBytes(dir / "tokenizer.json", "{\"model\": {\"vocab\": {\"a\": \"zero\"}}}");
  EXPECT_TRUE(FailsWith(ReadTokenizerFiles(dir.path(), 5).status(),
                        "model.vocab[\"a\"] is not an integer token id"));
  WriteFileBytes(dir / "tokenizer.json", "{\"added_tokens\": [{\"content\": \"x\"}]}");
  EXPECT_TRUE(FailsWith(ReadTokenizerFiles(dir.path(), 5).status(), "added_tokens[0] has no id"));
  WriteFileBytes(dir / "tokenizer.json", "{\"model\": {\"vocab\": ");  // truncated
  EXPECT_TRUE(FailsWith(ReadTokenizerFiles(dir.path(), 5).status(), "is not a JSON object"));
  // A Unigram vocabulary is a list: its ids are the indices.
  WriteFileBytes(dir / "tokenizer.json", "{\"model\": {\"vocab\": [[\"a\", 0], [\"b\", 0]]}}");
  EXPECT_TRUE(ReadTokenizerFiles(dir.path(), 2).ok());
  EXPECT_TRUE(FailsWith(ReadTokenizerFiles(dir.path(), 1).status(), "token ids up to 1"));

  ScratchDir empty;
  EXPECT_TRUE(FailsWith(ReadTokenizerFiles(empty.path(), 5).status(), "has no tokenizer.json"));
  EXPECT_TRUE(FailsWith(ReadTokenizerFiles(empty / "none.json", 5).status(),
                        "no such tokenizer.json or directory holding one"));
}

}  // namespace
}  // namespace hcp::train
