#include "runtime/support/Status.h"

#include <string>

namespace hcp {

std::string FormatError(const absl::Status& status) {
  return absl::StrFormat("error: %s", status.message());
}

}  // namespace hcp
