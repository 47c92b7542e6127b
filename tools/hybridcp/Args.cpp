#include "tools/hybridcp/Args.h"

#include <charconv>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace hcp {
namespace {

const OptionSpec* FindSpec(const std::vector<OptionSpec>& specs, const std::string& name) {
  for (const OptionSpec& spec : specs) {
    if (spec.name == name) return &spec;
  }
  return nullptr;
}

}  // namespace

absl::StatusOr<Args> Args::Parse(const std::vector<std::string>& argv,
                                 const std::vector<OptionSpec>& specs) {
  Args args;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& word = argv[i];
    if (word.size() < 2 || word[0] != '-') {
      args.positionals_.push_back(word);
      continue;
    }
    std::string name = word.substr(word[1] == '-' ? 2 : 1);
    std::optional<std::string> inline_value;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      inline_value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    const OptionSpec* spec = FindSpec(specs, name);
    if (spec == nullptr) return absl::InvalidArgumentError("unknown option " + word);
    // A second value would silently win over the first: the user meant one of them.
    if (args.values_.count(name)) {
      return absl::InvalidArgumentError(absl::StrFormat("option %s%s is given twice; give it once",
                                                        name.size() == 1 ? "-" : "--", name));
    }
    if (spec->value_name.empty()) {
      if (inline_value) return absl::InvalidArgumentError("option --" + name + " takes no value");
      args.values_[name] = "";
      continue;
    }
    std::vector<std::string>& all = args.all_[name];
    if (inline_value) {
      all.push_back(*inline_value);
    } else if (spec->multi) {
      while (i + 1 < argv.size() && !argv[i + 1].starts_with("--")) all.push_back(argv[++i]);
    } else if (i + 1 < argv.size()) {
      all.push_back(argv[++i]);
    }
    if (all.empty()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("option --%s needs a value (%s)", name, spec->value_name));
    }
    args.values_[name] = absl::StrJoin(all, " ");
  }
  return args;
}

std::optional<std::string> Args::Get(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

std::vector<std::string> Args::GetAll(const std::string& name) const {
  auto it = all_.find(name);
  return it == all_.end() ? std::vector<std::string>() : it->second;
}

absl::StatusOr<int64_t> Args::GetInt(const std::string& name,
                                     std::optional<int64_t> fallback) const {
  std::optional<std::string> text = Get(name);
  if (!text) {
    if (fallback) return *fallback;
    return absl::InvalidArgumentError("missing required option --" + name);
  }
  int64_t value = 0;
  auto [end, error] = std::from_chars(text->data(), text->data() + text->size(), value);
  if (error != std::errc() || end != text->data() + text->size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("option --%s expects an integer, got '%s'", name, *text));
  }
  return value;
}

absl::StatusOr<double> Args::GetDouble(const std::string& name, double fallback) const {
  std::optional<std::string> text = Get(name);
  if (!text) return fallback;
  char* end = nullptr;
  double value = std::strtod(text->c_str(), &end);
  if (text->empty() || end != text->c_str() + text->size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("option --%s expects a number, got '%s'", name, *text));
  }
  return value;
}

std::string FormatOptions(const std::vector<OptionSpec>& specs) {
  std::string text;
  for (const OptionSpec& spec : specs) {
    std::string left = (spec.name.size() == 1 ? "-" : "--") + spec.name;
    if (!spec.value_name.empty()) left += " " + spec.value_name;
    text += absl::StrFormat("  %-24s %s\n", left, spec.help);
  }
  return text;
}

}  // namespace hcp
