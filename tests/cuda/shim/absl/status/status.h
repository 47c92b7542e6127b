// A stand-in for absl::Status with just what runtime/kernels/cpu uses (Status, OkStatus,
// InvalidArgumentError), for the standalone kernel-test build on machines without Abseil
// (tests/cuda/standalone). The main build uses the real Abseil and never sees this directory.
#pragma once

#include <string>
#include <string_view>
#include <utility>

namespace absl {

enum class StatusCode : int { kOk = 0, kInvalidArgument = 3 };

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  std::string_view message() const { return message_; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status OkStatus() { return Status(); }
inline Status InvalidArgumentError(std::string message) {
  return Status(StatusCode::kInvalidArgument, std::move(message));
}

}  // namespace absl
