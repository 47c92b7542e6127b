// What a model costs: parameters (total, and active per token), and training FLOPs per token,
// counted the way ../shared/reference/granite-4.0-h.md does so MFU figures compare with peers.
#pragma once

#include <cstdint>
#include <string>

#include "compiler/import/GraniteConfig.h"

namespace hcp {

struct ParameterCounts {
  int64_t total = 0;   // every stored parameter (tied embeddings counted once)
  int64_t active = 0;  // what one token uses: only experts_per_token of the routed experts
};

ParameterCounts CountParameters(const GraniteConfig& config);

// Training (forward + backward) FLOPs per token at sequence length `seq`:
// 6 * active parameters (every matmul, the tied vocabulary projection included)
// + causal attention scores and values: 6 * seq * heads * head_dim per attention layer
// + the SSD scan per Mamba layer, 3 * (2*Q*G*N + 2*Q*d_inner + 4*d_inner*N) with chunk Q.
double TrainingFlopsPerToken(const GraniteConfig& config, int64_t seq);

// The layer kinds in order, one letter each: "MMMMMAMMMM..." (M = Mamba2, A = attention).
std::string LayerPattern(const GraniteConfig& config);

}  // namespace hcp
