// Helpers shared by the data tests: the file helpers of tests/unit/ScratchFiles.h and a status
// matcher.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "tests/unit/ScratchFiles.h"

namespace hcp::data::testing {

using hcp::testing::ReadFileBytes;
using hcp::testing::ScratchDir;
using hcp::testing::WriteFileBytes;

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

}  // namespace hcp::data::testing
