// `hybridcp inspect`: what a model costs (parameters, FLOPs per token, layer pattern).
#include <cstdio>

#include "absl/strings/str_format.h"
#include "compiler/cost/ModelCost.h"
#include "runtime/support/Status.h"
#include "tools/hybridcp/Commands.h"

namespace hcp {
namespace {

// 6939037248 -> "6,939,037,248"
std::string WithCommas(int64_t value) {
  std::string digits = std::to_string(value), text;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) text += ',';
    text += digits[i];
  }
  return text;
}

absl::Status Inspect(const Args& args) {
  if (args.positionals().size() == 1 && !args.Has("model")) {
    HCP_ASSIGN_OR_RETURN(const bool plan, InspectsAsPlan(args.positionals()[0]));
    if (plan) return InspectPlan(args.positionals()[0], args.Has("buffers"));
  }
  absl::StatusOr<GraniteConfig> config = ResolveModelConfig(args);
  if (!config.ok()) return config.status();
  absl::StatusOr<int64_t> seq = args.GetInt("seq", 8192);
  if (!seq.ok()) return seq.status();
  if (*seq <= 0) return absl::InvalidArgumentError("--seq must be positive");

  const GraniteConfig& c = *config;
  ParameterCounts params = CountParameters(c);
  std::printf("model: %s\n", c.source.c_str());
  std::printf("layers: %lld (%lld mamba2, %lld attention)\n", static_cast<long long>(c.num_layers),
              static_cast<long long>(c.count(LayerKind::kMamba)),
              static_cast<long long>(c.count(LayerKind::kAttention)));
  std::printf("layer pattern: %s\n", LayerPattern(c).c_str());
  std::printf(
      "hidden: %lld, vocab: %lld, attention heads: %lld/%lld x %lld, mamba heads: %lld x %lld, "
      "d_state: %lld\n",
      static_cast<long long>(c.hidden_size), static_cast<long long>(c.vocab_size),
      static_cast<long long>(c.num_heads), static_cast<long long>(c.num_kv_heads),
      static_cast<long long>(c.head_dim), static_cast<long long>(c.mamba_heads),
      static_cast<long long>(c.mamba_head_dim), static_cast<long long>(c.mamba_state));
  if (c.has_experts()) {
    std::printf("experts: %lld, top-%lld, width %lld; shared MLP width %lld\n",
                static_cast<long long>(c.num_experts), static_cast<long long>(c.experts_per_token),
                static_cast<long long>(c.expert_width), static_cast<long long>(c.shared_width));
  } else {
    std::printf("experts: none (dense); shared MLP width %lld\n",
                static_cast<long long>(c.shared_width));
  }
  std::printf("parameters: %s total, %s active per token\n", WithCommas(params.total).c_str(),
              WithCommas(params.active).c_str());
  std::printf("training FLOPs per token at seq %lld: %.3f GFLOP\n", static_cast<long long>(*seq),
              TrainingFlopsPerToken(c, *seq) / 1e9);
  return absl::OkStatus();
}

}  // namespace

Command MakeInspectCommand() {
  return Command{
      "inspect",
      "print what a model or a plan costs: parameters, memory, kernels, FLOPs",
      "inspect (CONFIG.json | --model NAME) [--seq N]  |  inspect FILE.plan [--buffers]",
      {kModelOption,
       {"seq", "N", "sequence length for the FLOPs figure (default 8192)"},
       {"buffers", "", "for a plan: list every buffer (arena, offset, bytes, shape)"}},
      Inspect,
  };
}

}  // namespace hcp
