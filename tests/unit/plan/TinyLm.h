// A tiny but complete training step, built by hand with PlanBuilder: embedding (tied table) ->
// rms_norm -> gemm with the table -> scale -> cross_entropy, the mean loss, then the backward
// down to both parameters' gradients. The plan, executor and fuzz tests all start from it.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/plan/PlanBuilder.h"
#include "runtime/plan/PlanFile.h"
#include "runtime/support/Crc32c.h"

namespace hcp::testing {

struct TinyLm {
  static constexpr int64_t kVocab = 11, kHidden = 6, kMicroBatch = 2, kSeq = 5;
  static constexpr int64_t kTokens = kMicroBatch * kSeq;
  static constexpr double kEmbeddingMultiplier = 2.0, kLogitScale = 0.5, kEps = 1e-5;
  static constexpr int64_t kIgnoreIndex = -100;
  static constexpr char kTable[] = "model.embed_tokens.weight";
  static constexpr char kNorm[] = "model.norm.weight";

  plan::PlanBuilder builder;
  // Buffer indices, for tests that look inside or break the plan.
  uint32_t table, dtable, norm, dnorm, ids, targets;
  uint32_t x, h, logits_raw, logits, loss_sum, count, loss;
  uint32_t dloss, dloss_sum, dlogits, dlogits_raw, dh, dtable_head, dx, dtable_embed;
  // Step indices.
  size_t embedding_step, norm_step, head_gemm_step, ce_forward_step, ce_backward_step, add_step;

  TinyLm() {
    using plan::Arena;
    using plan::ParamInit;
    builder.set_model("tiny-lm").set_shape(kMicroBatch, kSeq).set_flops_per_step(1234.0);
    auto [t, dt] = builder.AddParameter(kTable, {kVocab, kHidden}, ParamInit::Normal, 0.5);
    table = t;
    dtable = dt;
    auto [n, dn] = builder.AddParameter(kNorm, {kHidden}, ParamInit::Ones);
    norm = n;
    dnorm = dn;
    auto [i, tg, scale] = builder.AllocateInputs();
    ids = i;
    targets = tg;

    auto act = [&](std::string name, std::vector<int64_t> shape) {
      return builder.Allocate("act." + name, Arena::Activations, std::move(shape));
    };
    x = act("x", {kTokens, kHidden});
    h = act("h", {kTokens, kHidden});
    logits_raw = act("logits_raw", {kTokens, kVocab});
    logits = act("logits", {kTokens, kVocab});
    loss_sum = act("loss_sum", {1});
    count = act("valid_count", {1});
    loss = act("loss", {1});
    dloss = act("dloss", {1});
    dloss_sum = act("dloss_sum", {1});
    dlogits = act("dlogits", {kTokens, kVocab});
    dlogits_raw = act("dlogits_raw", {kTokens, kVocab});
    dh = act("dh", {kTokens, kHidden});
    dtable_head = act("dtable_head", {kVocab, kHidden});
    dx = act("dx", {kTokens, kHidden});
    dtable_embed = act("dtable_embed", {kVocab, kHidden});
    builder.set_loss(loss);

    const int64_t T = kTokens, V = kVocab, H = kHidden;
    // Forward.
    embedding_step =
        builder.AddStep("embedding.forward", {table, ids}, {x}, {T, V, H}, {kEmbeddingMultiplier});
    norm_step = builder.AddStep("rms_norm.forward", {x, norm}, {h}, {T, H}, {kEps});
    head_gemm_step = builder.AddStep("gemm", {h, table}, {logits_raw}, {0, 1, T, V, H}, {1.0});
    builder.AddStep("scale", {logits_raw}, {logits}, {T * V}, {kLogitScale});
    ce_forward_step = builder.AddStep("cross_entropy.forward", {logits, targets}, {loss_sum, count},
                                      {T, V, kIgnoreIndex});
    builder.AddStep("div", {loss_sum, count}, {loss}, {1, 1});
    // Backward: d(loss)/d(loss_sum) = 1 / count.
    builder.AddStep("fill", {}, {dloss}, {1}, {1.0});
    builder.AddStep("div", {dloss, count}, {dloss_sum}, {1, 1});
    ce_backward_step = builder.AddStep("cross_entropy.backward", {dloss_sum, logits, targets},
                                       {dlogits}, {T, V, kIgnoreIndex});
    builder.AddStep("scale", {dlogits}, {dlogits_raw}, {T * V}, {kLogitScale});
    builder.AddStep("gemm", {dlogits_raw, table}, {dh}, {0, 0, T, H, V}, {1.0});
    builder.AddStep("gemm", {dlogits_raw, h}, {dtable_head}, {1, 0, V, H, T}, {1.0});
    builder.AddStep("rms_norm.backward", {dh, x, norm}, {dx, dnorm}, {T, H, 0}, {kEps});
    builder.AddStep("embedding.backward", {dx, ids}, {dtable_embed}, {T, V, H, -1},
                    {kEmbeddingMultiplier});
    add_step = builder.AddStep("add", {dtable_head, dtable_embed}, {dtable}, {V * H, V * H});
  }

  std::string Bytes() const { return builder.FinishUnchecked(); }
};

// Rewrites the checksum of a (changed) plan file to match its content, as a faulty writer would:
// the change then reaches the checks behind the checksum.
inline void Reseal(std::string& file) {
  if (file.size() < plan::kPlanChecksumBytes) return;
  const size_t at = file.size() - plan::kPlanChecksumBytes;
  const uint32_t crc = Crc32c(std::string_view(file).substr(0, at));
  for (size_t i = 0; i < plan::kPlanChecksumBytes; ++i)
    file[at + i] = static_cast<char>(crc >> (8 * i));
}

}  // namespace hcp::testing
