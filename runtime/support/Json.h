// Strict JSON parsing for files we did not write: no exceptions, duplicate keys refused, and an
// error that says where the text went wrong.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace hcp {

// Parses `text`. On failure the message is `what` followed by the reason, e.g.
// "x.json: not valid JSON: ... parse error at line 1, column 7: ..." or
// "x.json: duplicate key \"a\"". nlohmann alone would keep the last of two equal keys silently,
// and two entries for one tensor name must be an error.
absl::StatusOr<nlohmann::json> ParseJsonStrict(std::string_view text, std::string_view what);

// Whether `s` can go into a JSON document as it is (nlohmann's dump throws on invalid UTF-8).
bool IsValidUtf8(std::string_view s);
// The offset of the first byte that does not begin a valid UTF-8 sequence (overlong forms,
// surrogates and values past U+10FFFF included), or s.size() when all of `s` is valid.
size_t FirstInvalidUtf8(std::string_view s);

// `s` quoted for an error message, with unprintable bytes escaped.
std::string Quote(std::string_view s);

// The installed Abseil has its own string_view (ABSL_OPTION_USE_STD_STRING_VIEW is 0), which
// does not convert from std::string_view; this bridges the two for StrCat and friends.
inline absl::string_view ToAbsl(std::string_view s) { return {s.data(), s.size()}; }

}  // namespace hcp
