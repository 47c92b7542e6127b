#include <filesystem>

#include "absl/strings/str_join.h"
#include "tools/hybridcp/Commands.h"

namespace hcp {

absl::StatusOr<GraniteConfig> ResolveModelConfig(const Args& args) {
  std::optional<std::string> preset = args.Get("model");
  const std::vector<std::string>& positionals = args.positionals();
  if (preset && !positionals.empty()) {
    return absl::InvalidArgumentError("give either a config file or --model, not both");
  }
  if (preset) return LoadPresetConfig(*preset);
  if (positionals.empty()) {
    return absl::InvalidArgumentError("no model given: pass a config.json or --model NAME (" +
                                      absl::StrJoin(PresetConfigNames(), ", ") + ")");
  }
  if (positionals.size() > 1) {
    return absl::InvalidArgumentError("unexpected argument '" + positionals[1] + "'");
  }
  const std::string& source = positionals[0];
  if (!std::filesystem::exists(source) && PresetConfigText(source)) return LoadPresetConfig(source);
  return LoadGraniteConfig(source);
}

}  // namespace hcp
