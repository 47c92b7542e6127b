// Tensor checksums (CRC32C in __metadata__) and the non-finite check: written with every file,
// every flipped bit of a tensor refused by Verify naming the file and the tensor, files of other
// tools (no checksums) still read, NaN and infinities named with their element.
#include <cmath>
#include <limits>
#include <random>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/support/Crc32c.h"
#include "runtime/weights/Checkpoint.h"
#include "runtime/weights/Safetensors.h"
#include "tests/unit/weights/TestUtil.h"

namespace hcp {
namespace {

using ::hcp::testing::MakeSafetensors;
using ::hcp::testing::ReadFileBytes;
using ::hcp::testing::ScratchDir;
using ::hcp::testing::WriteEveryDtype;
using ::hcp::testing::WriteFileBytes;

bool Mentions(const absl::Status& status, std::string_view text) {
  return std::string(status.message()).find(text) != std::string::npos;
}

TEST(Crc32c, KnownValues) {
  // The check value of CRC-32C (RFC 3720 and every CRC catalogue).
  EXPECT_EQ(Crc32c(0, "123456789", 9), 0xE3069283u);
  EXPECT_EQ(Crc32cPortable(0, "123456789", 9), 0xE3069283u);
  EXPECT_EQ(Crc32c(0, "", 0), 0u);
  // RFC 3720 B.4: 32 bytes of zeros.
  const std::string zeros(32, '\0');
  EXPECT_EQ(Crc32c(0, zeros.data(), zeros.size()), 0x8A9136AAu);
  EXPECT_EQ(Crc32cHex(0xE3069283u), "e3069283");
  EXPECT_EQ(Crc32cHex(0x1u), "00000001");
}

TEST(Crc32c, HardwareAndPortableAgreeAtEveryLengthAndAlignment) {
  std::mt19937 rng(7);
  std::string bytes(300, '\0');
  for (char& c : bytes) c = static_cast<char>(rng());
  for (size_t begin = 0; begin < 9; ++begin) {
    for (size_t size = 0; begin + size <= bytes.size(); size += 7) {
      const char* p = bytes.data() + begin;
      ASSERT_EQ(Crc32c(0, p, size), Crc32cPortable(0, p, size)) << begin << " " << size;
      // In two pieces: the same as in one.
      const size_t half = size / 2;
      ASSERT_EQ(Crc32c(Crc32c(0, p, half), p + half, size - half), Crc32c(0, p, size));
    }
  }
}

// A file of every dtype, as WriteSafetensors writes it.
std::string WriteAllDtypes(const ScratchDir& dir) {
  const std::string path = dir / "t.safetensors";
  WriteEveryDtype(path);
  return path;
}

uint64_t DataStart(const std::string& bytes) {
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = (length << 8) | static_cast<uint8_t>(bytes[i]);
  return 8 + length;
}

TEST(Checksums, WrittenAsStringsInTheMetadataAndVerified) {
  ScratchDir dir;
  const std::string path = WriteAllDtypes(dir);
  const std::string bytes = ReadFileBytes(path);
  // Hugging Face's reader takes string metadata only: the checksums are strings.
  nlohmann::json header = nlohmann::json::parse(bytes.substr(8, DataStart(bytes) - 8));
  for (const char* name : {"a", "b", "c", "ids", "ids32"}) {
    ASSERT_TRUE(header["__metadata__"][std::string(kCrc32cKeyPrefix) + name].is_string()) << name;
  }
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE(file->has_checksums());
  // The checksums are not part of the metadata the caller gave.
  EXPECT_EQ(file->metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));
  EXPECT_TRUE(file->Verify().ok()) << file->Verify();
  // The recorded value is the CRC32C of the tensor's bytes as stored.
  const TensorInfo* a = file->Find("a");
  EXPECT_EQ(header["__metadata__"]["hybridcp.crc32c.a"],
            Crc32cHex(Crc32c(0, bytes.data() + DataStart(bytes) + a->begin, a->nbytes())));
}

TEST(Checksums, EveryFlippedBitOfEveryTensorIsRefusedNamingFileAndTensor) {
  ScratchDir dir;
  const std::string path = WriteAllDtypes(dir);
  const std::string valid = ReadFileBytes(path);
  absl::StatusOr<SafetensorsFile> original = SafetensorsFile::Open(path);
  ASSERT_TRUE(original.ok());
  const uint64_t data = DataStart(valid);
  for (const std::string& name : original->names()) {
    const TensorInfo* info = original->Find(name);
    for (uint64_t byte = info->begin; byte < info->end; ++byte) {
      for (int bit = 0; bit < 8; ++bit) {
        std::string mutant = valid;
        mutant[data + byte] = static_cast<char>(mutant[data + byte] ^ (1 << bit));
        WriteFileBytes(path, mutant);
        absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
        ASSERT_TRUE(file.ok()) << file.status();  // the header is intact
        absl::Status verified = file->Verify();
        ASSERT_EQ(verified.code(), absl::StatusCode::kDataLoss) << name << " " << byte << verified;
        ASSERT_TRUE(Mentions(verified, path) && Mentions(verified, "'" + name + "'") &&
                    Mentions(verified, "does not match its checksum"))
            << verified;
      }
    }
  }
}

std::string Entry(const std::string& dtype, const std::string& shape, const std::string& offsets) {
  return "{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":" + offsets + "}";
}

std::string Floats(std::initializer_list<float> values) {
  std::string out;
  for (float v : values) out.append(reinterpret_cast<const char*>(&v), 4);
  return out;
}

TEST(Checksums, AFileWithoutThemIsReadAsItIs) {
  // What a Hugging Face checkpoint looks like: no hybridcp metadata.
  ScratchDir dir;
  const std::string path = dir / "hf.safetensors";
  WriteFileBytes(path, MakeSafetensors("{\"__metadata__\":{\"format\":\"pt\"},\"w\":" +
                                           Entry("F32", "[2]", "[0,8]") + "}",
                                       Floats({1, 2})));
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_FALSE(file->has_checksums());
  EXPECT_TRUE(file->Verify().ok());
}

TEST(Checksums, MalformedOrIncompleteChecksumsAreRefusedAtOpen) {
  ScratchDir dir;
  const std::string path = dir / "bad.safetensors";
  const std::string w = Entry("F32", "[1]", "[0,4]"), v = Entry("F32", "[1]", "[4,8]");
  struct Case {
    std::string what, metadata, expected;
  };
  const std::vector<Case> cases = {
      {"not hex", "\"hybridcp.crc32c.w\":\"0000000g\",\"hybridcp.crc32c.v\":\"00000000\"",
       "not a checksum"},
      {"too short", "\"hybridcp.crc32c.w\":\"123\",\"hybridcp.crc32c.v\":\"00000000\"",
       "not a checksum"},
      {"of no tensor",
       "\"hybridcp.crc32c.w\":\"00000000\",\"hybridcp.crc32c.v\":\"00000000\","
       "\"hybridcp.crc32c.x\":\"00000000\"",
       "checksum of tensor 'x', which the file does not hold"},
      {"one tensor without", "\"hybridcp.crc32c.w\":\"00000000\"", "tensor 'v' has no checksum"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    WriteFileBytes(path, MakeSafetensors("{\"__metadata__\":{" + c.metadata + "},\"w\":" + w +
                                             ",\"v\":" + v + "}",
                                         Floats({1, 2})));
    absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
    ASSERT_FALSE(file.ok());
    EXPECT_EQ(file.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_TRUE(Mentions(file.status(), c.expected)) << file.status();
  }
}

TEST(Checksums, MetadataThatWouldPassForAChecksumIsNotWritten) {
  ScratchDir dir;
  std::vector<float> w = {1};
  absl::Status status = WriteSafetensors(dir / "t.safetensors", {{"w", DType::F32, {1}, w, {}}},
                                         {{"hybridcp.crc32c.w", "00000000"}});
  EXPECT_FALSE(status.ok());
  EXPECT_TRUE(Mentions(status, "would pass for a tensor checksum")) << status;
  EXPECT_TRUE(dir.List().empty());
}

TEST(NonFinite, VerifyNamesTheTensorAndTheFirstElementInEveryFloatDtype) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  struct Case {
    DType dtype;
    std::vector<float> values;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {DType::F32, {1, 2, 3, nan, inf}, "tensor 'x' holds NaN at element 3 (of 5)"},
      {DType::BF16, {1, -inf, nan}, "tensor 'x' holds -inf at element 1 (of 3)"},
      {DType::F16, {1, 2, inf}, "tensor 'x' holds inf at element 2 (of 3)"},
      // Finite in f32, too large for f16: written as inf, refused as such.
      {DType::F16, {1e6f}, "tensor 'x' holds inf at element 0 (of 1)"},
  };
  ScratchDir dir;
  const std::string path = dir / "t.safetensors";
  for (const Case& c : cases) {
    SCOPED_TRACE(c.expected);
    const int64_t n = static_cast<int64_t>(c.values.size());
    ASSERT_TRUE(WriteSafetensors(path, {{"x", c.dtype, {n}, c.values, {}}}).ok());
    absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
    ASSERT_TRUE(file.ok());
    absl::Status verified = file->Verify();
    EXPECT_EQ(verified.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(Mentions(verified, c.expected) && Mentions(verified, path) &&
                Mentions(verified, "refusing to train from it"))
        << verified;
  }
}

TEST(NonFinite, RefuseNonFiniteCountsFromTheSlicesFirstElement) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> slice = {0, 1, nan};
  absl::Status s = RefuseNonFinite(slice, 10, 20, "model.norm.weight", "ckpt");
  EXPECT_EQ(s.message(),
            "ckpt: tensor 'model.norm.weight' holds NaN at element 12 (of 20): refusing to train "
            "from it");
  std::vector<float> fine = {0, -1, std::numeric_limits<float>::max()};
  EXPECT_TRUE(RefuseNonFinite(fine, 0, 3, "w", "ckpt").ok());
}

TEST(Checksums, CheckpointVerifyChecksEveryShard) {
  ScratchDir dir;
  std::vector<float> a(100, 1.0f), b(100, 2.0f);
  ASSERT_TRUE(WriteCheckpoint(dir.path(),
                              {{"a", DType::F32, {100}, a, {}}, {"b", DType::F32, {100}, b, {}}},
                              /*max_shard_bytes=*/400)
                  .ok());
  absl::StatusOr<CheckpointReader> reader = CheckpointReader::Open(dir.path());
  ASSERT_TRUE(reader.ok());
  ASSERT_EQ(reader->num_files(), 2u);
  EXPECT_TRUE(reader->Verify().ok());
  // The last byte of the second shard: b's last element.
  const std::string shard = dir / "model-00002-of-00002.safetensors";
  std::string bytes = ReadFileBytes(shard);
  bytes.back() = static_cast<char>(bytes.back() ^ 0x01);
  WriteFileBytes(shard, bytes);
  reader = CheckpointReader::Open(dir.path());
  ASSERT_TRUE(reader.ok());
  absl::Status verified = reader->Verify();
  EXPECT_EQ(verified.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Mentions(verified, shard) && Mentions(verified, "'b'")) << verified;
}

}  // namespace
}  // namespace hcp
