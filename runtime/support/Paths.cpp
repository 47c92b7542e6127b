#include "runtime/support/Paths.h"

#include <sys/stat.h>

#include <filesystem>
#include <system_error>

#include "absl/strings/str_format.h"

namespace hcp {

bool SameFile(const std::string& a, const std::string& b) {
  struct stat sa {
  }, sb{};
  const bool has_a = ::stat(a.c_str(), &sa) == 0;
  const bool has_b = ::stat(b.c_str(), &sb) == 0;
  if (has_a && has_b) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  if (has_a != has_b) return false;
  std::error_code error_a, error_b;
  const std::filesystem::path pa = std::filesystem::weakly_canonical(a, error_a);
  const std::filesystem::path pb = std::filesystem::weakly_canonical(b, error_b);
  return !error_a && !error_b && pa == pb;
}

absl::Status RefuseOutputOntoInput(std::string_view option, const std::string& output,
                                   const std::vector<std::string>& inputs) {
  for (const std::string& input : inputs) {
    if (!SameFile(output, input)) continue;
    const std::string same =
        output == input ? "" : absl::StrFormat(" (the same file as %s)", input);
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s %s is an input of this command%s: writing it would destroy the input; choose another "
        "file",
        std::string(option), output, same));
  }
  return absl::OkStatus();
}

}  // namespace hcp
