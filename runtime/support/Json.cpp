#include "runtime/support/Json.h"

#include <set>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace hcp {
namespace {

using nlohmann::json;

// A SAX pass that only checks: syntax (with nlohmann's positioned message) and duplicate keys
// in every object. The document itself is built by a second, plain parse.
class CheckingSax : public nlohmann::json_sax<json> {
 public:
  std::string error;

  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    keys_.emplace_back();
    return true;
  }
  bool key(string_t& key) override {
    if (keys_.empty() || keys_.back().insert(key).second) return true;
    error = "duplicate key " + Quote(key);
    return false;
  }
  bool end_object() override {
    if (!keys_.empty()) keys_.pop_back();
    return true;
  }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&,
                   const nlohmann::detail::exception& ex) override {
    error = absl::StrCat("not valid JSON: ", ex.what());
    return false;
  }

 private:
  std::vector<std::set<std::string>> keys_;
};

}  // namespace

absl::StatusOr<json> ParseJsonStrict(std::string_view text, std::string_view what) {
  CheckingSax sax;
  bool ok = json::sax_parse(text, &sax, json::input_format_t::json, /*strict=*/true);
  if (!ok || !sax.error.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(ToAbsl(what), ": ", sax.error.empty() ? "not valid JSON" : sax.error));
  }
  json value = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded())
    return absl::InvalidArgumentError(absl::StrCat(ToAbsl(what), ": not valid JSON"));
  return value;
}

size_t FirstInvalidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    int extra;
    uint32_t code;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      extra = 1, code = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      extra = 2, code = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      extra = 3, code = c & 0x07;
    } else {
      return i;
    }
    if (i + extra >= s.size()) return i;  // sequence cut short
    for (int k = 1; k <= extra; ++k) {
      unsigned char d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return i;
      code = (code << 6) | (d & 0x3F);
    }
    // Overlong forms, surrogates and values past U+10FFFF are not UTF-8.
    static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (code < kMin[extra] || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) return i;
    i += extra + 1;
  }
  return s.size();
}

bool IsValidUtf8(std::string_view s) { return FirstInvalidUtf8(s) == s.size(); }

std::string Quote(std::string_view s) {
  constexpr size_t kMaxShown = 200;
  std::string shown = absl::CHexEscape(ToAbsl(s.substr(0, kMaxShown)));
  return absl::StrCat("'", shown, s.size() > kMaxShown ? "...'" : "'");
}

}  // namespace hcp
