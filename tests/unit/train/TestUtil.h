// Helpers shared by the training tests: a scratch directory per test, raw file access, and
// status matchers.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace hcp::train::testing {

// A fresh directory, removed with everything in it when the object goes away.
class ScratchDir {
 public:
  ScratchDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "hcp_train_XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) ADD_FAILURE() << "mkdtemp failed";
    path_ = pattern;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string operator/(std::string_view name) const {
    return (std::filesystem::path(path_) / name).string();
  }

 private:
  std::string path_;
};

inline std::string ReadFileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void WriteFileBytes(const std::string& path, std::string_view bytes) {
  std::error_code ec;
  std::filesystem::remove(path, ec);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// The status is an error whose message contains `text`.
inline ::testing::AssertionResult FailsWith(const absl::Status& status, std::string_view text) {
  if (status.ok()) return ::testing::AssertionFailure() << "succeeded; expected \"" << text << "\"";
  const std::string message(status.message());
  if (message.find(text) == std::string::npos) {
    return ::testing::AssertionFailure()
           << "message \"" << status.message() << "\" does not contain \"" << text << "\"";
  }
  return ::testing::AssertionSuccess();
}

}  // namespace hcp::train::testing
