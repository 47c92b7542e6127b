// Helpers shared by the weights tests: the file helpers of tests/unit/ScratchFiles.h and
// safetensors files made by hand.
#pragma once

#include <cstdint>
#include <string>

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

inline std::string SourcePath(const std::string& relative) {
  return std::string(HYBRIDCP_SOURCE_DIR) + "/" + relative;
}

}  // namespace hcp::testing
