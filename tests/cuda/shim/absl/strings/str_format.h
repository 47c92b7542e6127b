// A stand-in for absl::StrFormat (see ../status/status.h for why): each %-conversion (flags,
// width and precision are accepted and ignored) prints the next argument with operator<<, which
// is all runtime/kernels/cpu's messages need (%d of int32 and int64 values). "%%" prints '%'.
#pragma once

#include <sstream>
#include <string>
#include <string_view>

namespace absl {
namespace shim_detail {

// Copies `format` up to its next conversion (unescaping "%%"); returns what follows the
// conversion, or an empty view when there is none.
inline std::string_view copy_literal(std::ostringstream& out, std::string_view format,
                                     bool* found) {
  *found = false;
  size_t i = 0;
  while (i < format.size()) {
    if (format[i] != '%') {
      out << format[i++];
      continue;
    }
    if (i + 1 < format.size() && format[i + 1] == '%') {
      out << '%';
      i += 2;
      continue;
    }
    size_t j = i + 1;
    while (j < format.size() &&
           !((format[j] >= 'a' && format[j] <= 'z') || (format[j] >= 'A' && format[j] <= 'Z'))) {
      j++;
    }
    *found = true;
    return j < format.size() ? format.substr(j + 1) : std::string_view();
  }
  return std::string_view();
}

inline void format_to(std::ostringstream& out, std::string_view format) {
  bool found = false;
  copy_literal(out, format, &found);
}

template <typename T, typename... Rest>
void format_to(std::ostringstream& out, std::string_view format, const T& value,
               const Rest&... rest) {
  bool found = false;
  std::string_view tail = copy_literal(out, format, &found);
  if (!found) return;
  out << value;
  format_to(out, tail, rest...);
}

}  // namespace shim_detail

template <typename... Args>
std::string StrFormat(std::string_view format, const Args&... args) {
  std::ostringstream out;
  shim_detail::format_to(out, format, args...);
  return out.str();
}

}  // namespace absl
