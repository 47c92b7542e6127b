// Safetensors reading and writing: the committed fixtures, round trips, atomic writes.
#include <signal.h>
#include <sys/resource.h>

#include <cmath>
#include <limits>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/weights/Safetensors.h"
#include "tests/unit/weights/TestUtil.h"

namespace hcp {
namespace {

using ::hcp::testing::ReadFileBytes;
using ::hcp::testing::ScratchDir;
using ::hcp::testing::SourcePath;

bool Contains(const absl::Status& status, const std::string& text) {
  return std::string(status.message()).find(text) != std::string::npos;
}

TEST(Safetensors, ReadsHybridMoeFixture) {
  const std::string path = SourcePath("tests/fixtures/hybrid-moe/model.safetensors");
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  // 2 global + 3 Mamba layers x 15 + 1 attention layer x 11.
  EXPECT_EQ(file->size(), 58u);
  EXPECT_EQ(file->metadata().at("format"), "pt");

  const TensorInfo* info = file->Find("model.layers.0.mamba.in_proj.weight");
  ASSERT_NE(info, nullptr);
  EXPECT_EQ(info->dtype, DType::F32);
  EXPECT_EQ(info->shape, (std::vector<int64_t>{148, 32}));
  EXPECT_EQ(info->numel, 148 * 32);
  absl::StatusOr<std::vector<float>> values = file->ReadF32(info->name);
  ASSERT_TRUE(values.ok()) << values.status();
  ASSERT_EQ(values->size(), 148u * 32u);
  // First, last and sum as read by Python's struct module.
  EXPECT_EQ(values->front(), -0.03887893632054329f);
  EXPECT_EQ(values->back(), -0.14663253724575043f);
  double sum = 0;
  for (float v : *values) sum += v;
  EXPECT_NEAR(sum, -3.3161773516440007, 1e-9);

  // Every tensor reads.
  for (const std::string& name : file->names()) {
    EXPECT_TRUE(file->ReadF32(name).ok()) << name;
  }
  EXPECT_EQ(file->Find("lm_head.weight"), nullptr);  // tied embeddings: not stored
  absl::StatusOr<std::vector<float>> missing = file->ReadF32("lm_head.weight");
  ASSERT_FALSE(missing.ok());
  EXPECT_TRUE(Contains(missing.status(), "lm_head.weight"));
  EXPECT_TRUE(Contains(missing.status(), path));
}

TEST(Safetensors, ReadsReferenceFixtureIntegers) {
  absl::StatusOr<SafetensorsFile> file =
      SafetensorsFile::Open(SourcePath("tests/fixtures/hybrid-moe/reference.safetensors"));
  ASSERT_TRUE(file.ok()) << file.status();
  const TensorInfo* info = file->Find("input_ids");
  ASSERT_NE(info, nullptr);
  EXPECT_EQ(info->dtype, DType::I64);
  EXPECT_EQ(info->shape, (std::vector<int64_t>{2, 48}));
  absl::StatusOr<std::vector<int64_t>> ids = file->ReadInt("input_ids");
  ASSERT_TRUE(ids.ok()) << ids.status();
  ASSERT_EQ(ids->size(), 96u);
  EXPECT_EQ((std::vector<int64_t>(ids->begin(), ids->begin() + 5)),
            (std::vector<int64_t>{25, 29, 109, 38, 56}));
  int64_t sum = 0;
  for (int64_t id : *ids) sum += id;
  EXPECT_EQ(sum, 5476);
  // Integer tensors are not floats and vice versa.
  absl::StatusOr<std::vector<float>> as_float = file->ReadF32("input_ids");
  ASSERT_FALSE(as_float.ok());
  EXPECT_TRUE(Contains(as_float.status(), "I64")) << as_float.status();
}

TEST(Safetensors, WriteReadRoundTrip) {
  ScratchDir dir;
  const std::string path = dir / "t.safetensors";
  std::vector<float> f32 = {1.5f,   -0.0f,       std::numeric_limits<float>::infinity(),
                            1e-40f, 3.14159265f, -7.0f};
  std::vector<float> bf16 = {1.0f, -2.5f, 0.15625f, 0x1.FEp+127f, 0x1p-133f, 384.0f};
  std::vector<float> f16 = {1.0f, -65504.0f, 0x1p-24f, 0.333251953125f};
  std::vector<int64_t> i32 = {0, -1, INT32_MIN, INT32_MAX};
  std::vector<int64_t> i64 = {INT64_MIN, INT64_MAX, 42};
  std::vector<float> scalar = {2.0f};
  std::vector<TensorToWrite> tensors = {
      {"w.f32", DType::F32, {2, 3}, f32, {}}, {"a.bf16", DType::BF16, {3, 2}, bf16, {}},
      {"m.f16", DType::F16, {4}, f16, {}},    {"ids.i32", DType::I32, {2, 2}, {}, i32},
      {"ids.i64", DType::I64, {3}, {}, i64},  {"scalar", DType::F32, {}, scalar, {}},
      {"empty", DType::BF16, {0, 5}, {}, {}},
  };
  std::map<std::string, std::string> metadata = {{"format", "pt"}, {"step", "12"}};
  absl::Status written = WriteSafetensors(path, tensors, metadata);
  ASSERT_TRUE(written.ok()) << written;
  EXPECT_EQ(dir.List(), std::vector<std::string>{"t.safetensors"});  // no temp file left

  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->metadata(), metadata);
  EXPECT_EQ(file->names(), (std::vector<std::string>{"a.bf16", "empty", "ids.i32", "ids.i64",
                                                     "m.f16", "scalar", "w.f32"}));
  auto read = [&](const std::string& name) {
    absl::StatusOr<std::vector<float>> values = file->ReadF32(name);
    EXPECT_TRUE(values.ok()) << values.status();
    return values.ok() ? *values : std::vector<float>{};
  };
  auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
  };
  EXPECT_TRUE(same_bits(read("w.f32"), f32));
  EXPECT_TRUE(same_bits(read("a.bf16"), bf16));  // all exactly representable in bf16
  EXPECT_TRUE(same_bits(read("m.f16"), f16));
  EXPECT_TRUE(same_bits(read("scalar"), scalar));
  EXPECT_TRUE(read("empty").empty());
  EXPECT_EQ(file->Find("scalar")->shape, std::vector<int64_t>{});
  EXPECT_EQ(file->Find("empty")->shape, (std::vector<int64_t>{0, 5}));
  EXPECT_EQ(file->Find("a.bf16")->dtype, DType::BF16);
  EXPECT_EQ(*file->ReadInt("ids.i32"), i32);
  EXPECT_EQ(*file->ReadInt("ids.i64"), i64);
  EXPECT_FALSE(file->ReadInt("w.f32").ok());

  // Partial reads, as a rank holding a slice does them.
  float part[3];
  ASSERT_TRUE(file->ReadF32Range("a.bf16", 2, 3, part).ok());
  EXPECT_EQ(part[0], 0.15625f);
  EXPECT_EQ(part[2], 0x1p-133f);
  absl::Status past_end = file->ReadF32Range("a.bf16", 4, 3, part);
  EXPECT_EQ(past_end.code(), absl::StatusCode::kOutOfRange) << past_end;
  EXPECT_FALSE(file->ReadF32Range("a.bf16", -1, 1, part).ok());

  // The header: sorted names after __metadata__, padded with spaces to 8-byte alignment.
  std::string bytes = ReadFileBytes(path);
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = (length << 8) | static_cast<uint8_t>(bytes[i]);
  EXPECT_EQ((8 + length) % 8, 0u);
  std::string header = bytes.substr(8, length);
  EXPECT_LT(header.find("__metadata__"), header.find("a.bf16"));
  EXPECT_LT(header.find("a.bf16"), header.find("w.f32"));
  EXPECT_FALSE(nlohmann::json::parse(header, nullptr, false).is_discarded());
}

TEST(Safetensors, Bf16WriteRounds) {
  ScratchDir dir;
  std::vector<float> values = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, std::nanf("")};
  ASSERT_TRUE(WriteSafetensors(dir / "r.safetensors", {{"x", DType::BF16, {3}, values, {}}}).ok());
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(dir / "r.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  std::vector<float> back = *file->ReadF32("x");
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_EQ(back[1], 1.0f + 4 * 0x1p-8f);
  EXPECT_TRUE(std::isnan(back[2]));
}

TEST(Safetensors, WriterRefusesBadTensorsAndWritesNothing) {
  ScratchDir dir;
  const std::string path = dir / "bad.safetensors";
  std::vector<float> four = {1, 2, 3, 4};
  std::vector<int64_t> big = {int64_t{1} << 40};
  struct Case {
    std::vector<TensorToWrite> tensors;
    std::string expected;
  };
  std::vector<Case> cases = {
      {{{"x", DType::F32, {2, 3}, four, {}}}, "needs 6"},
      {{{"x", DType::F32, {2, 2}, four, {}}, {"x", DType::F32, {4}, four, {}}}, "twice"},
      {{{"x", DType::I32, {1}, {}, big}}, "does not fit in I32"},
      {{{"x", DType::F32, {-4}, four, {}}}, "negative"},
      {{{"__metadata__", DType::F32, {4}, four, {}}}, "cannot be written"},
      {{{"x", DType::I64, {4}, four, {}}}, "integer"},
  };
  for (const Case& c : cases) {
    absl::Status status = WriteSafetensors(path, c.tensors);
    EXPECT_FALSE(status.ok());
    EXPECT_TRUE(Contains(status, c.expected)) << status;
    EXPECT_TRUE(dir.List().empty());
  }
}

TEST(Safetensors, AtomicWriteIntoMissingDirectoryLeavesNothing) {
  ScratchDir dir;
  std::vector<float> four = {1, 2, 3, 4};
  absl::Status status =
      WriteSafetensors(dir / "no/such/dir/x.safetensors", {{"x", DType::F32, {4}, four, {}}});
  EXPECT_FALSE(status.ok());
  EXPECT_TRUE(Contains(status, "no/such/dir")) << status;
  EXPECT_TRUE(dir.List().empty());
}

// The rename fails when the target is a directory (root can still not rename a file over a
// directory): the error is reported, the temp file removed, the directory untouched.
TEST(Safetensors, AtomicWriteFailingAtRenameLeavesTargetAndNoTemp) {
  ScratchDir dir;
  std::filesystem::create_directory(dir / "target");
  ::hcp::testing::WriteFileBytes(dir / "target/keep", "keep");
  std::vector<float> four = {1, 2, 3, 4};
  absl::Status status = WriteSafetensors(dir / "target", {{"x", DType::F32, {4}, four, {}}});
  EXPECT_FALSE(status.ok());
  EXPECT_TRUE(Contains(status, "rename")) << status;
  EXPECT_EQ(dir.List(), std::vector<std::string>{"target"});
  EXPECT_EQ(ReadFileBytes(dir / "target/keep"), "keep");
}

// A write that runs out of space (RLIMIT_FSIZE stands in for a full disk; it binds root too)
// fails, removes its temp file and leaves the previous checkpoint intact.
TEST(Safetensors, AtomicWriteFailingMidwayKeepsPreviousFile) {
  ScratchDir dir;
  const std::string path = dir / "model.safetensors";
  std::vector<float> small = {1, 2, 3, 4};
  ASSERT_TRUE(WriteSafetensors(path, {{"x", DType::F32, {4}, small, {}}}).ok());
  const std::string before = ReadFileBytes(path);

  std::vector<float> large(1 << 20, 0.5f);  // 4 MiB
  struct rlimit old_limit;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  struct rlimit limit = old_limit;
  limit.rlim_cur = 64 * 1024;
  auto old_handler = signal(SIGXFSZ, SIG_IGN);  // report EFBIG instead of killing the process
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &limit), 0);
  absl::Status status = WriteSafetensors(path, {{"x", DType::F32, {1 << 20}, large, {}}});
  setrlimit(RLIMIT_FSIZE, &old_limit);
  signal(SIGXFSZ, old_handler);

  EXPECT_FALSE(status.ok());
  EXPECT_TRUE(Contains(status, "cannot write")) << status;
  EXPECT_EQ(ReadFileBytes(path), before);
  EXPECT_EQ(dir.List(), std::vector<std::string>{"model.safetensors"});
}

}  // namespace
}  // namespace hcp
