// A GoogleTest check of an error status by the words of its message.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace hcp::testing {

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

}  // namespace hcp::testing
