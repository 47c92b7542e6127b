#include "compiler/import/GraniteConfig.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "runtime/support/Status.h"

namespace hcp {
namespace {

using nlohmann::json;

// Bounds on sizes, far above any real model (Granite 4.0-H small: hidden 4096, 72 experts, 40
// layers) and low enough that the sizes derived from them fit int64: with every width at most
// 2^20 a product of two widths is below 2^40, and the parameter count is checked as a whole.
constexpr int64_t kMaxWidth = int64_t{1} << 20;
constexpr int64_t kMaxCount = int64_t{1} << 16;  // layers, experts
// Token ids are int32 in the plans and the kernels.
constexpr int64_t kMaxVocab = std::numeric_limits<int32_t>::max();
// 10^13 parameters take 160 TB to train (weights, gradients and two AdamW moments in f32).
constexpr double kMaxParameters = 1e13;

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
    // JSON keeps integers of 2^63 and above unsigned: read as int64 they would turn negative.
    if (it->is_number_unsigned() &&
        it->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return Error(field, it->dump() + " is too large");
    }
    return it->get<int64_t>();
  }

  // An integer in [1, max].
  absl::StatusOr<int64_t> Positive(std::string_view field, std::optional<int64_t> fallback = {},
                                   int64_t max = kMaxWidth) const {
    HCP_ASSIGN_OR_RETURN(int64_t value, Int(field, fallback));
    if (value <= 0) return Error(field, absl::StrCat("must be positive, got ", value));
    if (value > max)
      return Error(field, absl::StrFormat("%d is too large (at most %d)", value, max));
    return value;
  }

  absl::StatusOr<double> Number(std::string_view field, std::optional<double> fallback = {}) const {
    auto it = object_.find(field);
    if (it == object_.end() || it->is_null()) {
      if (fallback) return *fallback;
      return Error(field, "missing");
    }
    if (!it->is_number()) return Error(field, "must be a number, got " + it->dump());
    const double value = it->get<double>();
    // The kernels compute in f32 at most.
    if (!(std::abs(value) <= FLT_MAX)) return Error(field, it->dump() + " does not fit in f32");
    return value;
  }

  // A number whose f32 value is positive and normal: neither 0 nor denormal once rounded.
  absl::StatusOr<double> PositiveF32(std::string_view field, double fallback) const {
    HCP_ASSIGN_OR_RETURN(double value, Number(field, fallback));
    if (value <= 0.0) return Error(field, absl::StrCat("must be positive, got ", value));
    if (!std::isnormal(static_cast<float>(value))) {
      return Error(field, absl::StrFormat("%g underflows f32 (it would be 0 or denormal); the "
                                          "smallest normal f32 is %g",
                                          value, FLT_MIN));
    }
    return value;
  }

  // A token id, if the field is there: an integer, or a list of them (some configs list several
  // end-of-sequence tokens), each in [0, vocab_size).
  absl::Status TokenIds(std::string_view field, int64_t vocab_size) const {
    const json* value = Find(field);
    if (value == nullptr || value->is_null()) return absl::OkStatus();
    std::vector<json> ids =
        value->is_array() ? value->get<std::vector<json>>() : std::vector<json>{*value};
    for (const json& id : ids) {
      if (!id.is_number_integer())
        return Error(field, "must be a token id (an integer), got " + id.dump());
      if (id.is_number_unsigned() ? id.get<uint64_t>() >= static_cast<uint64_t>(vocab_size)
                                  : id.get<int64_t>() < 0 || id.get<int64_t>() >= vocab_size) {
        return Error(
            field, absl::StrFormat("%s is outside the vocabulary [0, %d)", id.dump(), vocab_size));
      }
    }
    return absl::OkStatus();
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
  if (c.num_experts > kMaxCount) {
    return in.Error("num_local_experts",
                    absl::StrFormat("%d is too large (at most %d)", c.num_experts, kMaxCount));
  }
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
  // The load-balancing loss: transformers adds it when output_router_logits is true (default
  // coefficient 0.001, as there).
  HCP_ASSIGN_OR_RETURN(c.output_router_logits, in.Bool("output_router_logits", false));
  HCP_ASSIGN_OR_RETURN(c.router_aux_loss_coef, in.Number("router_aux_loss_coef", 0.001));
  if (!(c.router_aux_loss_coef >= 0)) {
    return in.Error("router_aux_loss_coef",
                    absl::StrFormat("must not be negative, got %g", c.router_aux_loss_coef));
  }
  HCP_ASSIGN_OR_RETURN(std::string act, in.String("hidden_act", "silu"));
  if (act != "silu")
    return in.Error("hidden_act", "\"" + act + "\" is not supported; only \"silu\"");
  return absl::OkStatus();
}

// Every field is bounded, but their products may still make a model no machine holds (and
// whose sizes overflow int64 further on). Counted in double, as compiler/cost counts them; the
// refusal names the fields of the largest part.
absl::Status CheckParameterCount(const GraniteConfig& c) {
  const double h = c.hidden_size, mamba = c.count(LayerKind::kMamba),
               attention = c.count(LayerKind::kAttention), layers = c.num_layers;
  struct Part {
    double parameters;
    std::string fields;
  };
  const Part parts[] = {
      {(c.tie_word_embeddings ? 1.0 : 2.0) * c.vocab_size * h,
       absl::StrFormat("vocab_size %d x hidden_size %d", c.vocab_size, c.hidden_size)},
      {layers * 3.0 * c.shared_width * h,
       absl::StrFormat("num_hidden_layers %d x shared_intermediate_size %d x hidden_size %d",
                       c.num_layers, c.shared_width, c.hidden_size)},
      {mamba * (static_cast<double>(c.mamba_in_proj_dim()) * h +
                static_cast<double>(c.mamba_conv_dim()) * (c.mamba_conv_width + 1) +
                static_cast<double>(c.mamba_inner()) * (h + 1)),
       absl::StrFormat("%d mamba layers x mamba_expand * hidden_size %d, mamba_d_state %d, "
                       "mamba_d_conv %d",
                       c.count(LayerKind::kMamba), c.mamba_inner(), c.mamba_state,
                       c.mamba_conv_width)},
      {attention * 2.0 * h * c.head_dim * (c.num_heads + c.num_kv_heads),
       absl::StrFormat("%d attention layers x head_dim %d x hidden_size %d",
                       c.count(LayerKind::kAttention), c.head_dim, c.hidden_size)},
      {layers * static_cast<double>(c.num_experts) * (3.0 * c.expert_width + 1) * h,
       absl::StrFormat("num_hidden_layers %d x num_local_experts %d x intermediate_size %d x "
                       "hidden_size %d",
                       c.num_layers, c.num_experts, c.expert_width, c.hidden_size)},
  };
  double total = 0;
  const Part* largest = &parts[0];
  for (const Part& part : parts) {
    total += part.parameters;
    if (part.parameters > largest->parameters) largest = &part;
  }
  if (total <= kMaxParameters) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "%s: the model would have %.3g parameters, mostly from %s: beyond any machine (at most "
      "%.0e)",
      c.source, total, largest->fields, kMaxParameters));
}

// How deeply arrays and objects nest in `text` (JSON or not): a config nests three deep, and a
// parser given millions of nested brackets builds millions of values.
int NestingDepth(std::string_view text) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

}  // namespace

int64_t GraniteConfig::count(LayerKind kind) const {
  int64_t n = 0;
  for (LayerKind k : layers) n += (k == kind);
  return n;
}

absl::StatusOr<GraniteConfig> ParseGraniteConfig(std::string_view json_text,
                                                 std::string_view source) {
  if (json_text.size() > kMaxConfigBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: more than %d MiB, which no config.json is (they are a few KB): not a model config",
        source, kMaxConfigBytes >> 20));
  }
  if (constexpr int kMaxDepth = 64; NestingDepth(json_text) > kMaxDepth) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: arrays and objects nested more than %d deep, which no config.json is: not a model "
        "config",
        source, kMaxDepth));
  }
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
  c.text = std::string(json_text);

  HCP_ASSIGN_OR_RETURN(std::string model_type, in.String("model_type"));
  if (model_type != "granitemoehybrid") {
    return in.Error("model_type",
                    "\"" + model_type + "\" is not supported; expected \"granitemoehybrid\"");
  }
  HCP_ASSIGN_OR_RETURN(c.vocab_size, in.Positive("vocab_size", {}, kMaxVocab));
  HCP_ASSIGN_OR_RETURN(c.hidden_size, in.Positive("hidden_size"));
  HCP_ASSIGN_OR_RETURN(c.num_layers, in.Positive("num_hidden_layers", {}, kMaxCount));
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
  HCP_RETURN_IF_ERROR(in.TokenIds("bos_token_id", c.vocab_size));
  HCP_RETURN_IF_ERROR(in.TokenIds("eos_token_id", c.vocab_size));
  HCP_RETURN_IF_ERROR(ReadAttention(in, c));
  HCP_RETURN_IF_ERROR(ReadMamba(in, c));
  HCP_RETURN_IF_ERROR(ReadFeedForward(in, c));
  HCP_ASSIGN_OR_RETURN(c.embedding_multiplier, in.Number("embedding_multiplier", 1.0));
  HCP_ASSIGN_OR_RETURN(c.residual_multiplier, in.Number("residual_multiplier", 1.0));
  HCP_ASSIGN_OR_RETURN(c.logits_scaling, in.Number("logits_scaling", 1.0));
  if (!std::isnormal(static_cast<float>(c.logits_scaling))) {
    return in.Error(
        "logits_scaling",
        absl::StrFormat("must be a nonzero normal f32 (logits are divided by it), got %g",
                        c.logits_scaling));
  }
  HCP_ASSIGN_OR_RETURN(c.rms_norm_eps, in.PositiveF32("rms_norm_eps", 1e-6));
  HCP_ASSIGN_OR_RETURN(c.initializer_range, in.PositiveF32("initializer_range", 0.02));
  HCP_RETURN_IF_ERROR(CheckParameterCount(c));
  return c;
}

absl::StatusOr<GraniteConfig> LoadGraniteConfig(const std::string& given) {
  // A Hugging Face checkpoint directory holds its config as config.json.
  std::string path = given;
  std::error_code error;
  if (std::filesystem::is_directory(given, error)) {
    path = (std::filesystem::path(given) / "config.json").string();
    if (!std::filesystem::exists(path, error)) {
      return absl::NotFoundError(absl::StrFormat(
          "%s is a directory without a config.json: give a config file, or a Hugging Face "
          "checkpoint directory (which holds one)",
          given));
    }
  }
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::NotFoundError(absl::StrFormat("%s: cannot open the config file", path));
  // At most one byte more than a config may have: a device such as /dev/zero has no end.
  std::string text;
  char chunk[1 << 16];
  while (text.size() <= kMaxConfigBytes && file.read(chunk, sizeof chunk).gcount() > 0) {
    text.append(chunk, static_cast<size_t>(file.gcount()));
  }
  if (file.bad())
    return absl::DataLossError(absl::StrFormat("%s: cannot read the config file", path));
  absl::StatusOr<GraniteConfig> config = ParseGraniteConfig(text, path);
  if (config.ok()) config->file = path;
  return config;
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
