// Helpers shared by the weights tests: the file helpers of tests/unit/ScratchFiles.h and
// safetensors files made by hand.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/weights/Safetensors.h"
#include "tests/unit/ScratchFiles.h"

namespace hcp::testing {

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

// Writes a safetensors file at `path` with a tensor of every dtype: "a" F32 [2, 3], "b" BF16 [4],
// "c" F16 [2, 2], "ids" I64 [3], "ids32" I32 [3] (metadata format: pt).
inline void WriteEveryDtype(const std::string& path) {
  static const std::vector<float> a = {1, -2, 3, 0.5f, 7, 8};
  static const std::vector<float> b = {0.25f, -1, 2, 4};
  static const std::vector<int64_t> ids = {1, 2, 3};
  absl::Status status = WriteSafetensors(path,
                                         {{"a", DType::F32, {2, 3}, a, {}},
                                          {"b", DType::BF16, {4}, b, {}},
                                          {"c", DType::F16, {2, 2}, b, {}},
                                          {"ids", DType::I64, {3}, {}, ids},
                                          {"ids32", DType::I32, {3}, {}, ids}},
                                         {{"format", "pt"}});
  EXPECT_TRUE(status.ok()) << status;
}

inline std::string SourcePath(const std::string& relative) {
  return std::string(HYBRIDCP_SOURCE_DIR) + "/" + relative;
}

}  // namespace hcp::testing
