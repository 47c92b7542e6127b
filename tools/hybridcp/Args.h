// A small command-line parser for hybridcp's subcommands (the runtime-only build has no LLVM,
// so llvm::cl is not available to every command).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace hcp {

struct OptionSpec {
  std::string name;        // without the leading dashes; "o" is spelled -o
  std::string value_name;  // empty for a flag
  std::string help;
  // Takes every word after it up to the next one that starts with "--" (at least one; --name=V
  // gives one): Args::GetAll reads them.
  bool multi = false;
};

class Args {
 public:
  // Accepts --name value, --name=value, -o value, flags and --name V1 V2 ... for a multi-value
  // option; anything else that starts with '-' is an error naming the option; the rest are
  // positionals.
  static absl::StatusOr<Args> Parse(const std::vector<std::string>& argv,
                                    const std::vector<OptionSpec>& specs);

  bool Has(const std::string& name) const { return values_.count(name) > 0; }
  // The option's value (a multi-value option's values joined by spaces).
  std::optional<std::string> Get(const std::string& name) const;
  // Each value of the option, in order (one for an option that takes one); empty when absent.
  std::vector<std::string> GetAll(const std::string& name) const;
  // The option as an integer; `fallback` when absent; an error if it is not an integer.
  absl::StatusOr<int64_t> GetInt(const std::string& name, std::optional<int64_t> fallback) const;
  // The option as a floating-point number; `fallback` when absent.
  absl::StatusOr<double> GetDouble(const std::string& name, double fallback) const;
  const std::vector<std::string>& positionals() const { return positionals_; }
  // Every option given: name -> value ("" for a flag).
  const std::map<std::string, std::string>& values() const { return values_; }

 private:
  std::map<std::string, std::string> values_;
  std::map<std::string, std::vector<std::string>> all_;  // each value of every option with one
  std::vector<std::string> positionals_;
};

// "  --seq N        sequence length" lines for a usage message.
std::string FormatOptions(const std::vector<OptionSpec>& specs);

}  // namespace hcp
