#include "compiler/cost/ModelCost.h"

namespace hcp {

ParameterCounts CountParameters(const GraniteConfig& c) {
  const int64_t h = c.hidden_size;
  ParameterCounts counts;
  auto add = [&counts](int64_t total, int64_t active) {
    counts.total += total;
    counts.active += active;
  };
  add(c.vocab_size * h, c.vocab_size * h);  // embedding, also the tied vocabulary projection
  if (!c.tie_word_embeddings) add(c.vocab_size * h, c.vocab_size * h);
  add(h, h);  // final norm
  for (LayerKind kind : c.layers) {
    int64_t common =
        2 * h + 3 * c.shared_width * h;  // two norms, shared MLP (in: 2S x H, out: H x S)
    add(common, common);
    if (kind == LayerKind::kMamba) {
      int64_t conv = c.mamba_conv_dim();
      int64_t mamba = c.mamba_in_proj_dim() * h + conv * c.mamba_conv_width +
                      (c.mamba_conv_bias ? conv : 0) + 3 * c.mamba_heads + c.mamba_inner() +
                      h * c.mamba_inner();
      add(mamba, mamba);
    } else {
      int64_t attention = 2 * h * c.num_heads * c.head_dim + 2 * h * c.num_kv_heads * c.head_dim;
      add(attention, attention);
    }
    if (c.has_experts()) {
      int64_t router = c.num_experts * h;
      int64_t per_expert = 3 * c.expert_width * h;
      add(router + c.num_experts * per_expert, router + c.experts_per_token * per_expert);
    }
  }
  return counts;
}

double TrainingFlopsPerToken(const GraniteConfig& c, int64_t seq) {
  double flops = 6.0 * static_cast<double>(CountParameters(c).active);
  double attention = 6.0 * seq * c.num_heads * c.head_dim;
  double q = c.mamba_chunk, n = c.mamba_state, inner = c.mamba_inner();
  double ssd = 3.0 * (2 * q * c.mamba_groups * n + 2 * q * inner + 4 * inner * n);
  flops += attention * c.count(LayerKind::kAttention) + ssd * c.count(LayerKind::kMamba);
  return flops;
}

std::string LayerPattern(const GraniteConfig& c) {
  std::string pattern;
  for (LayerKind kind : c.layers) pattern += kind == LayerKind::kMamba ? 'M' : 'A';
  return pattern;
}

}  // namespace hcp
