#include "runtime/support/Paths.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"
#include "tests/unit/ScratchFiles.h"

namespace hcp {
namespace {

void Touch(const std::string& path) { std::ofstream(path) << "x"; }

TEST(SameFile, SpellingsLinksAndMissingFiles) {
  testing::ScratchDir dir;
  const std::string a = dir / "a.txt";
  Touch(a);
  std::filesystem::create_directory(dir / "sub");
  EXPECT_TRUE(SameFile(a, a));
  EXPECT_TRUE(SameFile(a, dir / "sub/../a.txt"));
  EXPECT_TRUE(SameFile(a, dir / "./a.txt"));
  ASSERT_EQ(::symlink(a.c_str(), (dir / "soft").c_str()), 0);
  ASSERT_EQ(::link(a.c_str(), (dir / "hard").c_str()), 0);
  EXPECT_TRUE(SameFile(a, dir / "soft"));
  EXPECT_TRUE(SameFile(dir / "hard", a));
  Touch(dir / "b.txt");
  EXPECT_FALSE(SameFile(a, dir / "b.txt"));
  // One side missing: not the same; both missing: the same when they normalise alike.
  EXPECT_FALSE(SameFile(a, dir / "missing"));
  EXPECT_TRUE(SameFile(dir / "missing", dir / "sub/../missing"));
  EXPECT_FALSE(SameFile(dir / "missing", dir / "other"));
}

TEST(RefuseOutputOntoInput, NamesTheOptionAndBothSpellings) {
  testing::ScratchDir dir;
  const std::string in = dir / "in.json";
  Touch(in);
  std::filesystem::create_directory(dir / "sub");
  EXPECT_TRUE(RefuseOutputOntoInput("-o", dir / "out.json", {in}).ok());
  absl::Status same = RefuseOutputOntoInput("-o", dir / "sub/../in.json", {dir / "x", in});
  EXPECT_EQ(same.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(same.message().find("-o " + (dir / "sub/../in.json")), std::string::npos) << same;
  EXPECT_NE(same.message().find("(the same file as " + in + ")"), std::string::npos) << same;
  EXPECT_NE(same.message().find("would destroy the input"), std::string::npos) << same;
}

}  // namespace
}  // namespace hcp
