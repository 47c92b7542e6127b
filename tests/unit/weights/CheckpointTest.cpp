// Checkpoint directories: single file and Hugging Face shards + index.
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/weights/Checkpoint.h"
#include "tests/unit/weights/TestUtil.h"

namespace hcp {
namespace {

using ::hcp::testing::ReadFileBytes;
using ::hcp::testing::ScratchDir;
using ::hcp::testing::SourcePath;
using ::hcp::testing::WriteFileBytes;

bool Contains(const absl::Status& status, const std::string& text) {
  return std::string(status.message()).find(text) != std::string::npos;
}

// Ten tensors "t0".."t9" of 100 floats each (400 bytes as F32), values depending on the name.
class CheckpointTest : public ::testing::Test {
 protected:
  CheckpointTest() {
    for (int t = 0; t < 10; ++t) {
      values_.emplace_back(100);
      for (int i = 0; i < 100; ++i) values_[t][i] = static_cast<float>(t * 1000 + i);
    }
    for (int t = 0; t < 10; ++t) {
      tensors_.push_back({absl::StrCat("t", t), DType::F32, {10, 10}, values_[t], {}});
    }
  }
  void ExpectReadsBack(const CheckpointReader& reader) {
    EXPECT_EQ(reader.names().size(), 10u);
    for (int t = 0; t < 10; ++t) {
      absl::StatusOr<std::vector<float>> read = reader.ReadF32(absl::StrCat("t", t));
      ASSERT_TRUE(read.ok()) << read.status();
      EXPECT_EQ(*read, values_[t]);
    }
  }

  ScratchDir dir_;
  std::vector<std::vector<float>> values_;
  std::vector<TensorToWrite> tensors_;
};

TEST_F(CheckpointTest, SingleFile) {
  ASSERT_TRUE(WriteCheckpoint(dir_.path(), tensors_, kDefaultMaxShardBytes, {{"step", "7"}}).ok());
  EXPECT_EQ(dir_.List(), std::vector<std::string>{"model.safetensors"});
  absl::StatusOr<CheckpointReader> reader = CheckpointReader::Open(dir_.path());
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ(reader->num_files(), 1u);
  EXPECT_EQ(reader->metadata().at("step"), "7");
  ExpectReadsBack(*reader);
  absl::StatusOr<TensorInfo> info = reader->Info("t3");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->shape, (std::vector<int64_t>{10, 10}));
  EXPECT_EQ(info->dtype, DType::F32);
}

TEST_F(CheckpointTest, ShardedRoundTrip) {
  // 1000 bytes per shard: two 400-byte tensors each, so five shards.
  ASSERT_TRUE(WriteCheckpoint(dir_.path(), tensors_, 1000, {{"step", "7"}}).ok());
  EXPECT_EQ(dir_.List(), (std::vector<std::string>{
                             "model-00001-of-00005.safetensors", "model-00002-of-00005.safetensors",
                             "model-00003-of-00005.safetensors", "model-00004-of-00005.safetensors",
                             "model-00005-of-00005.safetensors", "model.safetensors.index.json"}));
  nlohmann::json index =
      nlohmann::json::parse(ReadFileBytes(dir_ / "model.safetensors.index.json"), nullptr, false);
  ASSERT_TRUE(index.is_object());
  EXPECT_EQ(index["metadata"]["total_size"], 4000);
  EXPECT_EQ(index["weight_map"]["t0"], "model-00001-of-00005.safetensors");
  EXPECT_EQ(index["weight_map"]["t9"], "model-00005-of-00005.safetensors");

  absl::StatusOr<CheckpointReader> reader = CheckpointReader::Open(dir_.path());
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ(reader->num_files(), 5u);
  EXPECT_EQ(reader->metadata().at("step"), "7");
  ExpectReadsBack(*reader);
  EXPECT_TRUE(reader->Has("t5"));
  float part[4];
  ASSERT_TRUE(reader->ReadF32Range("t7", 96, 4, part).ok());
  EXPECT_EQ(part[3], 7099.0f);
}

TEST_F(CheckpointTest, MissingTensorNamesTensorAndDirectory) {
  ASSERT_TRUE(WriteCheckpoint(dir_.path(), tensors_, 1000).ok());
  absl::StatusOr<CheckpointReader> reader = CheckpointReader::Open(dir_.path());
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_FALSE(reader->Has("model.norm.weight"));
  absl::StatusOr<TensorInfo> info = reader->Info("model.norm.weight");
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Contains(info.status(), "model.norm.weight")) << info.status();
  EXPECT_TRUE(Contains(info.status(), dir_.path())) << info.status();
  EXPECT_FALSE(reader->ReadF32("model.norm.weight").ok());
}

TEST_F(CheckpointTest, MissingShard) {
  ASSERT_TRUE(WriteCheckpoint(dir_.path(), tensors_, 1000).ok());
  std::filesystem::remove(dir_ / "model-00003-of-00005.safetensors");
  absl::StatusOr<CheckpointReader> reader = CheckpointReader::Open(dir_.path());
  ASSERT_FALSE(reader.ok());
  EXPECT_TRUE(Contains(reader.status(), "model-00003-of-00005.safetensors")) << reader.status();
}

TEST_F(CheckpointTest, IndexNamingTheWrongShard) {
  ASSERT_TRUE(WriteCheckpoint(dir_.path(), tensors_, 1000).ok());
  const std::string index_path = dir_ / "model.safetensors.index.json";
  nlohmann::json index = nlohmann::json::parse(ReadFileBytes(index_path), nullptr, false);
  index["weight_map"]["t0"] = "model-00002-of-00005.safetensors";
  WriteFileBytes(index_path, index.dump());
  absl::StatusOr<CheckpointReader> reader = CheckpointReader::Open(dir_.path());
  ASSERT_FALSE(reader.ok());
  EXPECT_TRUE(Contains(reader.status(), "'t0' is in model-00002-of-00005.safetensors"))
      << reader.status();
}

TEST_F(CheckpointTest, BadIndexes) {
  ASSERT_TRUE(WriteCheckpoint(dir_.path(), tensors_, 1000).ok());
  const std::string index_path = dir_ / "model.safetensors.index.json";
  struct Case {
    std::string text;
    std::string expected;
  };
  for (const Case& c : std::vector<Case>{
           {"{\"weight_map\": ", "not valid JSON"},
           {"[]", "not a JSON object"},
           {"{\"metadata\": {}}", "weight_map"},
           {"{\"weight_map\": {\"t0\": 3}}", "not a file name"},
           {"{\"weight_map\": {\"t0\": \"../model-00001-of-00005.safetensors\"}}",
            "not a file name"},
           {"{\"weight_map\": {\"t0\": \"a\", \"t0\": \"b\"}}", "duplicate key 't0'"},
       }) {
    WriteFileBytes(index_path, c.text);
    absl::StatusOr<CheckpointReader> reader = CheckpointReader::Open(dir_.path());
    ASSERT_FALSE(reader.ok()) << c.text;
    EXPECT_TRUE(Contains(reader.status(), c.expected)) << reader.status();
    EXPECT_TRUE(Contains(reader.status(), index_path)) << reader.status();
  }
}

TEST_F(CheckpointTest, RewritingSwitchesFormCleanly) {
  ASSERT_TRUE(WriteCheckpoint(dir_.path(), tensors_, 1000).ok());
  ASSERT_TRUE(WriteCheckpoint(dir_.path(), tensors_, 2000).ok());  // 2 shards now
  EXPECT_EQ(dir_.List(), (std::vector<std::string>{"model-00001-of-00002.safetensors",
                                                   "model-00002-of-00002.safetensors",
                                                   "model.safetensors.index.json"}));
  ASSERT_TRUE(WriteCheckpoint(dir_.path(), tensors_).ok());  // single file
  EXPECT_EQ(dir_.List(), std::vector<std::string>{"model.safetensors"});
  ASSERT_TRUE(WriteCheckpoint(dir_.path(), tensors_, 1000).ok());  // sharded again
  EXPECT_EQ(dir_.List().size(), 6u);
  absl::StatusOr<CheckpointReader> reader = CheckpointReader::Open(dir_.path());
  ASSERT_TRUE(reader.ok()) << reader.status();
  ExpectReadsBack(*reader);
}

TEST(Checkpoint, EmptyOrMissingDirectory) {
  ScratchDir dir;
  absl::StatusOr<CheckpointReader> reader = CheckpointReader::Open(dir.path());
  ASSERT_FALSE(reader.ok());
  EXPECT_TRUE(Contains(reader.status(), "holds neither")) << reader.status();
  reader = CheckpointReader::Open(dir / "absent");
  ASSERT_FALSE(reader.ok());
  EXPECT_TRUE(Contains(reader.status(), "does not exist")) << reader.status();
}

TEST(Checkpoint, OpensFixtureDirectory) {
  absl::StatusOr<CheckpointReader> reader =
      CheckpointReader::Open(SourcePath("tests/fixtures/hybrid-moe"));
  ASSERT_TRUE(reader.ok()) << reader.status();
  absl::StatusOr<TensorInfo> info = reader->Info("model.layers.0.mamba.in_proj.weight");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->shape, (std::vector<int64_t>{148, 32}));
  EXPECT_EQ(reader->ReadF32("model.embed_tokens.weight")->size(), 128u * 32u);
}

}  // namespace
}  // namespace hcp
