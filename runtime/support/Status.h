// Error handling for the runtime: absl::Status travels to the edge, where it becomes one clear
// line.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"

// Returns from the enclosing function if `expr` (an absl::Status) is not OK.
#define HCP_RETURN_IF_ERROR(expr)              \
  do {                                         \
    ::absl::Status hcp_status_ = (expr);       \
    if (!hcp_status_.ok()) return hcp_status_; \
  } while (0)

#define HCP_CONCAT_INNER_(a, b) a##b
#define HCP_CONCAT_(a, b) HCP_CONCAT_INNER_(a, b)

// Declares `lhs` from an absl::StatusOr expression, or returns its error.
#define HCP_ASSIGN_OR_RETURN(lhs, expr) \
  HCP_ASSIGN_OR_RETURN_IMPL_(HCP_CONCAT_(hcp_statusor_, __LINE__), lhs, expr)
#define HCP_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return tmp.status();              \
  lhs = std::move(tmp).value()

namespace hcp {

// "error: <message>" for the edge of a command-line tool (no status code noise).
std::string FormatError(const absl::Status& status);

}  // namespace hcp
