#include "compiler/import/GraniteConfig.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "runtime/support/Status.h"

namespace hcp {
namespace {

using nlohmann::json;

// Reads typed fields from the config object; every error names the source and the field.
class FieldReader {
 public:
  FieldReader(const json& object, std::string_view source) : object_(object), source_(source) {}

  absl::Status Error(std::string_view field, std::string_view what) const {
    return absl::InvalidArgumentError(absl::StrFormat("%s: field '%s': %s", source_, field, what));
  }

  bool Has(std::string_view field) const {
    auto it = object_.find(field);
    return it != object_.end() && !it->is_null();
  }

  absl::StatusOr<int64_t> Int(std::string_view field, std::optional<int64_t> fallback = {}) const {
    auto it = object_.find(field);
    if (it == object_.end() || it->is_null()) {
      if (fallback) return *fallback;
      return Error(field, "missing");
    }
    if (!it->is_number_integer()) return Error(field, "must be an integer, got " + it->dump());
    return it->get<int64_t>();
  }

  absl::StatusOr<int64_t> Positive(std::string_view field,
                                   std::optional<int64_t> fallback = {}) const {
    HCP_ASSIGN_OR_RETURN(int64_t value, Int(field, fallback));
    if (value <= 0) return Error(field, absl::StrCat("must be positive, got ", value));
    return value;
  }

  absl::StatusOr<double> Number(std::string_view field, std::optional<double> fallback = {}) const {
    auto it = object_.find(field);
    if (it == object_.end() || it->is_null()) {
      if (fallback) return *fallback;
      return Error(field, "missing");
    }
    if (!it->is_number()) return Error(field, "must be a number, got " + it->dump());
    return it->get<double>();
  }

  absl::StatusOr<bool> Bool(std::string_view field, bool fallback) const {
    auto it = object_.find(field);
    if (it == object_.end() || it->is_null()) return fallback;
    if (!it->is_boolean()) return Error(field, "must be true or false, got " + it->dump());
    return it->get<bool>();
  }

  absl::StatusOr<std::string> String(std::string_view field,
                                     std::optional<std::string> fallback = {}) const {
    auto it = object_.find(field);
    if (it == object_.end() || it->is_null()) {
      if (fallback) return *fallback;
      return Error(field, "missing");
    }
    if (!it->is_string()) return Error(field, "must be a string, got " + it->dump());
    return it->get<std::string>();
  }

  const json* Find(std::string_view field) const {
    auto it = object_.find(field);
    return it == object_.end() ? nullptr : &*it;
  }

 private:
  const json& object_;
  std::string_view source_;
};

// Accepts the published spellings ("mamba"/"attention") and transformers 5's rewrite
// ("linear_attention"/"full_attention").
std::optional<LayerKind> ParseLayerKind(const std::string& name) {
  if (name == "mamba" || name == "linear_attention") return LayerKind::kMamba;
  if (name == "attention" || name == "full_attention") return LayerKind::kAttention;
  return std::nullopt;
}

absl::Status ReadLayers(const FieldReader& in, GraniteConfig& config) {
  // Older files call the list layers_block_type.
  std::string field = in.Has("layer_types") ? "layer_types" : "layers_block_type";
  const json* list = in.Find(field);
  if (list == nullptr || list->is_null()) return in.Error("layer_types", "missing");
  if (!list->is_array()) return in.Error(field, "must be a list of layer kinds");
  if (static_cast<int64_t>(list->size()) != config.num_layers) {
    return in.Error(field, absl::StrFormat("has %d entries but num_hidden_layers is %d",
                                           list->size(), config.num_layers));
  }
  for (size_t i = 0; i < list->size(); ++i) {
    const json& entry = (*list)[i];
    std::optional<LayerKind> kind;
    if (entry.is_string()) kind = ParseLayerKind(entry.get<std::string>());
    if (!kind) {
      return in.Error(field, absl::StrFormat("entry %d is %s; expected \"mamba\" or \"attention\"",
                                             i, entry.dump()));
    }
    config.layers.push_back(*kind);
  }
  return absl::OkStatus();
}

absl::Status ReadAttention(const FieldReader& in, GraniteConfig& c) {
  HCP_ASSIGN_OR_RETURN(c.num_heads, in.Positive("num_attention_heads"));
  HCP_ASSIGN_OR_RETURN(c.num_kv_heads, in.Positive("num_key_value_heads", c.num_heads));
  if (c.hidden_size % c.num_heads != 0) {
    return in.Error("num_attention_heads", absl::StrFormat("%d does not divide hidden_size (%d)",
                                                           c.num_heads, c.hidden_size));
  }
  HCP_ASSIGN_OR_RETURN(c.head_dim, in.Positive("head_dim", c.hidden_size / c.num_heads));
  if (c.num_heads % c.num_kv_heads != 0) {
    return in.Error("num_key_value_heads",
                    absl::StrFormat("%d does not divide num_attention_heads (%d)", c.num_kv_heads,
                                    c.num_heads));
  }
  HCP_ASSIGN_OR_RETURN(c.attention_multiplier, in.Number("attention_multiplier", 1.0));
  HCP_ASSIGN_OR_RETURN(bool attention_bias, in.Bool("attention_bias", false));
  if (attention_bias) return in.Error("attention_bias", "biases in attention are not supported");
  HCP_ASSIGN_OR_RETURN(std::string positions, in.String("position_embedding_type", "nope"));
  if (positions != "nope") {
    return in.Error("position_embedding_type",
                    "\"" + positions + "\" is not supported; Granite 4.0-H uses \"nope\"");
  }
  return absl::OkStatus();
}

absl::Status ReadMamba(const FieldReader& in, GraniteConfig& c) {
  HCP_ASSIGN_OR_RETURN(int64_t expand, in.Positive("mamba_expand", 2));
  HCP_ASSIGN_OR_RETURN(c.mamba_heads, in.Positive("mamba_n_heads"));
  int64_t inner = expand * c.hidden_size;
  if (inner % c.mamba_heads != 0) {
    return in.Error("mamba_n_heads",
                    absl::StrFormat("%d does not divide mamba_expand * hidden_size (%d)",
                                    c.mamba_heads, inner));
  }
  // "auto" (a string) means inner / heads.
  if (const json* d = in.Find("mamba_d_head"); d == nullptr || d->is_string() || d->is_null()) {
    c.mamba_head_dim = inner / c.mamba_heads;
  } else {
    HCP_ASSIGN_OR_RETURN(c.mamba_head_dim, in.Positive("mamba_d_head"));
  }
  if (c.mamba_head_dim * c.mamba_heads != inner) {
    return in.Error("mamba_d_head",
                    absl::StrFormat("%d heads of %d do not make mamba_expand * hidden_size (%d)",
                                    c.mamba_heads, c.mamba_head_dim, inner));
  }
  HCP_ASSIGN_OR_RETURN(c.mamba_groups, in.Positive("mamba_n_groups", 1));
  if (c.mamba_heads % c.mamba_groups != 0) {
    return in.Error("mamba_n_groups", absl::StrFormat("%d does not divide mamba_n_heads (%d)",
                                                      c.mamba_groups, c.mamba_heads));
  }
  HCP_ASSIGN_OR_RETURN(c.mamba_state, in.Positive("mamba_d_state"));
  HCP_ASSIGN_OR_RETURN(c.mamba_conv_width, in.Positive("mamba_d_conv", 4));
  HCP_ASSIGN_OR_RETURN(c.mamba_chunk, in.Positive("mamba_chunk_size", 256));
  HCP_ASSIGN_OR_RETURN(c.mamba_conv_bias, in.Bool("mamba_conv_bias", true));
  HCP_ASSIGN_OR_RETURN(bool proj_bias, in.Bool("mamba_proj_bias", false));
  if (proj_bias)
    return in.Error("mamba_proj_bias", "biases in the Mamba projections are not supported");
  // time_step_limit other than (0, inf) would clamp dt; Granite 4.0-H has none.
  if (const json* limit = in.Find("time_step_limit"); limit != nullptr && !limit->is_null()) {
    bool unbounded = limit->is_array() && limit->size() == 2 && (*limit)[0].is_number() &&
                     (*limit)[0].get<double>() == 0.0 &&
                     ((*limit)[1].is_object() ||
                      ((*limit)[1].is_number() && std::isinf((*limit)[1].get<double>())));
    if (!unbounded)
      return in.Error("time_step_limit", "only (0, inf) (no clamp on dt) is supported");
  }
  return absl::OkStatus();
}

absl::Status ReadFeedForward(const FieldReader& in, GraniteConfig& c) {
  HCP_ASSIGN_OR_RETURN(c.num_experts, in.Int("num_local_experts", 0));
  if (c.num_experts < 0) return in.Error("num_local_experts", "must not be negative");
  if (c.num_experts > 0) {
    HCP_ASSIGN_OR_RETURN(c.experts_per_token, in.Positive("num_experts_per_tok"));
    if (c.experts_per_token > c.num_experts) {
      return in.Error("num_experts_per_tok",
                      absl::StrFormat("%d is more than num_local_experts (%d)", c.experts_per_token,
                                      c.num_experts));
    }
    HCP_ASSIGN_OR_RETURN(c.expert_width, in.Positive("intermediate_size"));
  }
  HCP_ASSIGN_OR_RETURN(c.shared_width, in.Positive("shared_intermediate_size"));
  HCP_ASSIGN_OR_RETURN(std::string act, in.String("hidden_act", "silu"));
  if (act != "silu")
    return in.Error("hidden_act", "\"" + act + "\" is not supported; only \"silu\"");
  return absl::OkStatus();
}

}  // namespace

int64_t GraniteConfig::count(LayerKind kind) const {
  int64_t n = 0;
  for (LayerKind k : layers) n += (k == kind);
  return n;
}

absl::StatusOr<GraniteConfig> ParseGraniteConfig(std::string_view json_text,
                                                 std::string_view source) {
  json root = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: not valid JSON", source));
  }
  if (!root.is_object()) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: expected a JSON object", source));
  }
  FieldReader in(root, source);
  GraniteConfig c;
  c.source = std::string(source);

  HCP_ASSIGN_OR_RETURN(std::string model_type, in.String("model_type"));
  if (model_type != "granitemoehybrid") {
    return in.Error("model_type",
                    "\"" + model_type + "\" is not supported; expected \"granitemoehybrid\"");
  }
  HCP_ASSIGN_OR_RETURN(c.vocab_size, in.Positive("vocab_size"));
  HCP_ASSIGN_OR_RETURN(c.hidden_size, in.Positive("hidden_size"));
  HCP_ASSIGN_OR_RETURN(c.num_layers, in.Positive("num_hidden_layers"));
  HCP_RETURN_IF_ERROR(ReadLayers(in, c));
  HCP_ASSIGN_OR_RETURN(c.tie_word_embeddings, in.Bool("tie_word_embeddings", false));
  if (in.Has("pad_token_id")) {
    HCP_ASSIGN_OR_RETURN(int64_t pad, in.Int("pad_token_id"));
    if (pad < 0 || pad >= c.vocab_size) {
      return in.Error("pad_token_id",
                      absl::StrFormat("%d is outside the vocabulary [0, %d)", pad, c.vocab_size));
    }
    c.pad_token_id = pad;
  }
  HCP_RETURN_IF_ERROR(ReadAttention(in, c));
  HCP_RETURN_IF_ERROR(ReadMamba(in, c));
  HCP_RETURN_IF_ERROR(ReadFeedForward(in, c));
  HCP_ASSIGN_OR_RETURN(c.embedding_multiplier, in.Number("embedding_multiplier", 1.0));
  HCP_ASSIGN_OR_RETURN(c.residual_multiplier, in.Number("residual_multiplier", 1.0));
  HCP_ASSIGN_OR_RETURN(c.logits_scaling, in.Number("logits_scaling", 1.0));
  if (c.logits_scaling == 0.0)
    return in.Error("logits_scaling", "must not be zero (logits are divided by it)");
  HCP_ASSIGN_OR_RETURN(c.rms_norm_eps, in.Number("rms_norm_eps", 1e-6));
  if (c.rms_norm_eps <= 0.0) return in.Error("rms_norm_eps", "must be positive");
  HCP_ASSIGN_OR_RETURN(c.initializer_range, in.Number("initializer_range", 0.02));
  if (c.initializer_range <= 0.0) return in.Error("initializer_range", "must be positive");
  return c;
}

absl::StatusOr<GraniteConfig> LoadGraniteConfig(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::NotFoundError(absl::StrFormat("%s: cannot open the config file", path));
  std::stringstream text;
  text << file.rdbuf();
  return ParseGraniteConfig(text.str(), path);
}

absl::StatusOr<GraniteConfig> LoadPresetConfig(std::string_view name) {
  std::optional<std::string_view> text = PresetConfigText(name);
  if (!text) {
    return absl::NotFoundError(absl::StrFormat("unknown model '%s'; known models: %s", name,
                                               absl::StrJoin(PresetConfigNames(), ", ")));
  }
  return ParseGraniteConfig(*text, name);
}

}  // namespace hcp
