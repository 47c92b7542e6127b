// Broken safetensors files: each must give a non-OK status that says what is wrong, and none
// may crash (this suite also runs under AddressSanitizer and UBSan).
#include <random>

#include "gtest/gtest.h"
#include "runtime/weights/Safetensors.h"
#include "tests/unit/weights/TestUtil.h"

namespace hcp {
namespace {

using ::hcp::testing::MakeSafetensors;
using ::hcp::testing::ReadFileBytes;
using ::hcp::testing::ScratchDir;
using ::hcp::testing::WriteEveryDtype;
using ::hcp::testing::WriteFileBytes;

std::string Entry(const std::string& dtype, const std::string& shape, const std::string& offsets) {
  return "{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":" + offsets + "}";
}

struct Corruption {
  std::string what;
  std::string file;      // the whole file
  std::string expected;  // part of the error message
};

std::vector<Corruption> Corruptions() {
  const std::string data(16, '\x01');
  const std::string good_b = Entry("F32", "[2]", "[8,16]");
  auto with_a = [&](const std::string& a_entry) {
    return MakeSafetensors("{\"a\":" + a_entry + ",\"b\":" + good_b + "}", data);
  };
  return {
      {"empty file", "", "too short"},
      {"header length past the end", MakeSafetensors("{}", "", 3), "runs past the end"},
      {"absurd header length", MakeSafetensors("{}", "", uint64_t{1} << 40), "absurd"},
      {"not JSON", MakeSafetensors("{\"a\": nope}", data), "not valid JSON"},
      {"header not an object", MakeSafetensors("[1, 2]", data), "not a JSON object"},
      {"entry not an object", with_a("[0, 8]"), "'a': entry is not a JSON object"},
      {"unknown dtype", with_a(Entry("F64", "[1]", "[0,8]")), "'a': unsupported dtype \"F64\""},
      {"dtype not a string", with_a(Entry("F32", "[2]", "[0,8]").replace(9, 5, "32")), "dtype"},
      {"negative dim", with_a(Entry("F32", "[-2]", "[0,8]")), "negative"},
      {"fractional dim", with_a(Entry("F32", "[2.5]", "[0,8]")), "other than a dimension"},
      {"shape missing", with_a("{\"dtype\":\"F32\",\"data_offsets\":[0,8]}"), "\"shape\""},
      {"offsets past the data", with_a(Entry("F32", "[2]", "[16,24]")), "data section (16 bytes)"},
      {"offsets reversed", with_a(Entry("F32", "[0]", "[8,0]")), "not a range"},
      {"three offsets", with_a(Entry("F32", "[2]", "[0,4,8]")), "[begin, end]"},
      {"negative offset", with_a(Entry("F32", "[2]", "[-8,0]")), "[begin, end]"},
      {"wrong byte size", with_a(Entry("F32", "[3]", "[0,8]")), "needs 12 bytes"},
      {"overflowing shape", with_a(Entry("F32", "[4294967296,4294967296]", "[0,8]")), "int64"},
      {"overlap", with_a(Entry("F32", "[2]", "[4,12]")), "overlap"},
      {"duplicate name", MakeSafetensors("{\"a\":" + good_b + ",\"a\":" + good_b + "}", data),
       "duplicate key 'a'"},
      {"metadata not strings",
       MakeSafetensors("{\"__metadata__\":{\"step\":3},\"b\":" + good_b + "}", data),
       "__metadata__ value of 'step'"},
  };
}

TEST(SafetensorsCorrupt, EachCorruptionIsReported) {
  ScratchDir dir;
  const std::string path = dir / "bad.safetensors";
  for (const Corruption& c : Corruptions()) {
    SCOPED_TRACE(c.what);
    WriteFileBytes(path, c.file);
    absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
    ASSERT_FALSE(file.ok());
    EXPECT_NE(file.status().message().find(c.expected), std::string_view::npos) << file.status();
    EXPECT_NE(file.status().message().find(path), std::string_view::npos) << file.status();
  }
}

TEST(SafetensorsCorrupt, MissingFileIsNotFound) {
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open("/nonexistent/x.safetensors");
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(file.status().message().find("/nonexistent/x.safetensors"), std::string_view::npos);
}

// A valid file with tensors of every dtype, for the truncation and mutation tests.
std::string ValidFile(const ScratchDir& dir) {
  WriteEveryDtype(dir / "valid.safetensors");
  return ReadFileBytes(dir / "valid.safetensors");
}

// Opening, then reading every tensor; must not crash. Returns whether it all worked.
bool LoadEverything(const std::string& path) {
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
  if (!file.ok()) {
    EXPECT_FALSE(file.status().message().empty());
    return false;
  }
  bool ok = true;
  for (const std::string& name : file->names()) {
    const TensorInfo* info = file->Find(name);
    if (IsFloatDType(info->dtype)) {
      ok &= file->ReadF32(name).ok();
    } else {
      ok &= file->ReadInt(name).ok();
    }
  }
  return ok;
}

TEST(SafetensorsCorrupt, EveryTruncationFails) {
  ScratchDir dir;
  const std::string valid = ValidFile(dir);
  const std::string path = dir / "cut.safetensors";
  for (size_t length = 0; length < valid.size(); ++length) {
    WriteFileBytes(path, valid.substr(0, length));
    EXPECT_FALSE(SafetensorsFile::Open(path).ok()) << "length " << length;
  }
  WriteFileBytes(path, valid);
  EXPECT_TRUE(LoadEverything(path));
}

// Random byte flips and truncations: each mutated file either loads (and reads) or fails with a
// message. Half of the flips land in the 8 + header bytes, where they matter most.
TEST(SafetensorsCorrupt, MutationFuzz) {
  ScratchDir dir;
  const std::string valid = ValidFile(dir);
  uint64_t header_end = 8;
  for (int i = 7; i >= 0; --i) header_end += uint64_t{static_cast<uint8_t>(valid[i])} << (8 * i);
  const std::string path = dir / "mutant.safetensors";
  std::mt19937_64 rng(20240611);
  int loaded = 0;
  for (int round = 0; round < 3000; ++round) {
    std::string mutant = valid;
    int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) {
      size_t limit = (rng() % 2) ? header_end : mutant.size();
      size_t at = rng() % limit;
      switch (rng() % 3) {
        case 0:
          mutant[at] = static_cast<char>(rng());
          break;  // any byte
        case 1:
          mutant[at] ^= static_cast<char>(1 << (rng() % 8));
          break;  // one bit
        case 2:
          mutant[at] = "{}[]\",:0-9 e"[rng() % 12];
          break;  // JSON syntax
      }
    }
    if (rng() % 5 == 0) mutant.resize(rng() % mutant.size());
    WriteFileBytes(path, mutant);
    loaded += LoadEverything(path) ? 1 : 0;
  }
  // Flips in the data section leave the file valid, so some loads must succeed.
  EXPECT_GT(loaded, 30);
  EXPECT_LT(loaded, 3000);
}

}  // namespace
}  // namespace hcp
