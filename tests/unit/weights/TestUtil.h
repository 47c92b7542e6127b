// Helpers shared by the weights tests: a scratch directory per test and raw file access.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace hcp::testing {

// A fresh directory, removed with everything in it when the object goes away.
class ScratchDir {
 public:
  ScratchDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "hcp_weights_XXXXXX").string();
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
  // File names in the directory, sorted.
  std::vector<std::string> List() const {
    std::vector<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(path_)) {
      names.push_back(entry.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    return names;
  }

 private:
  std::string path_;
};

inline std::string ReadFileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void WriteFileBytes(const std::string& path, const std::string& bytes) {
  // Unlink first: ext4 flushes a file truncated and rewritten in place on close
  // (auto_da_alloc), which makes thousands of rewrites slow.
  std::error_code ec;
  std::filesystem::remove(path, ec);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A safetensors file from its parts: 8-byte little-endian length, header text, data bytes.
inline std::string MakeSafetensors(const std::string& header, const std::string& data,
                                   uint64_t length) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(length >> (8 * i));
  return bytes + header + data;
}
inline std::string MakeSafetensors(const std::string& header, const std::string& data) {
  return MakeSafetensors(header, data, header.size());
}

inline std::string SourcePath(const std::string& relative) {
  return std::string(HYBRIDCP_SOURCE_DIR) + "/" + relative;
}

}  // namespace hcp::testing
