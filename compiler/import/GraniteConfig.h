// The Granite 4.0-H (Hugging Face `granitemoehybrid`) model configuration, read from a
// config.json or a built-in preset, validated, with the sizes every later stage derives from it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace hcp {

enum class LayerKind { kMamba, kAttention };

// A config.json is a few KB; anything beyond this is not one (and is not read further).
inline constexpr size_t kMaxConfigBytes = size_t{16} << 20;

struct GraniteConfig {
  std::string source;  // file path or preset name, for messages
  std::string file;    // the config file read (empty for a preset)
  std::string text;    // the JSON text as given: what the plan carries into checkpoints

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_layers = 0;
  std::vector<LayerKind> layers;
  bool tie_word_embeddings = true;
  std::optional<int64_t> pad_token_id;

  // Attention layers.
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  double attention_multiplier = 1.0;

  // Mamba2 layers.
  int64_t mamba_heads = 0;
  int64_t mamba_head_dim = 0;
  int64_t mamba_groups = 1;
  int64_t mamba_state = 0;
  int64_t mamba_conv_width = 4;
  int64_t mamba_chunk = 256;
  bool mamba_conv_bias = true;

  // Feed-forward: routed experts (0 = dense) and the shared MLP that every layer has.
  int64_t num_experts = 0;
  int64_t experts_per_token = 0;
  int64_t expert_width = 0;
  int64_t shared_width = 0;
  // The MoE load-balancing loss as transformers takes it from the config: added with
  // router_aux_loss_coef when output_router_logits is true.
  bool output_router_logits = false;
  double router_aux_loss_coef = 0.001;

  double embedding_multiplier = 1.0;
  double residual_multiplier = 1.0;
  double logits_scaling = 1.0;
  double rms_norm_eps = 1e-6;
  double initializer_range = 0.02;  // std of the normal init of weight matrices

  // Derived sizes.
  int64_t mamba_inner() const { return mamba_heads * mamba_head_dim; }
  int64_t mamba_conv_dim() const { return mamba_inner() + 2 * mamba_groups * mamba_state; }
  int64_t mamba_in_proj_dim() const { return mamba_inner() + mamba_conv_dim() + mamba_heads; }
  bool has_experts() const { return num_experts > 0; }
  int64_t count(LayerKind kind) const;
};

// Parses and validates the text of a config.json. Errors are one line naming `source` and the
// field, e.g. "cfg.json: field 'num_key_value_heads': 5 does not divide num_attention_heads (12)".
absl::StatusOr<GraniteConfig> ParseGraniteConfig(std::string_view json_text,
                                                 std::string_view source);

// Reads a config.json file, or the config.json of a directory (a Hugging Face checkpoint). Every
// size is bounded (a parameter count beyond any machine, a vocabulary beyond int32, an eps that
// underflows f32 are refused), so that nothing derived from it overflows.
absl::StatusOr<GraniteConfig> LoadGraniteConfig(const std::string& path);

// The Granite 4.0-H configs built into the tool, by name (e.g. "granite-4.0-h-tiny").
absl::StatusOr<GraniteConfig> LoadPresetConfig(std::string_view name);
std::vector<std::string> PresetConfigNames();
// The raw JSON text of a preset, or nullopt.
std::optional<std::string_view> PresetConfigText(std::string_view name);

}  // namespace hcp
