// Cross-entropy on given logits, and fused with the vocabulary projection, against
// runtime/kernels/cpu (cross_entropy_forward/backward and gemm).
#include <climits>
#include <cmath>
#include <mutex>
#include <string>
#include <type_traits>

#include "runtime/kernels/cpu/Kernels.h"
#include "tests/cuda/Harness.h"

namespace hcp::cuda::test {
namespace {

constexpr int64_t kIgnore = -100;
constexpr float kDloss = 0.37f;
// Loss, lse on given logits: fp32 online log-sum-exp (__expf) against the oracle's double.
constexpr double kTolLoss = 1e-5;
// dlogits: bf16 out one rounding; fp32 out a few ulp of exp.
template <typename T>
constexpr double kTolDlogits = std::is_same_v<T, bf16> ? 4e-3 : 2e-5;
// Fused: the chunk's logits are bf16 (as a bf16 model's are), so each logit l carries a rounding
// of up to |l| 2^-9: the lse moves by the softmax-weighted mean of those (tiny), the gradients'
// softmax terms by up to |l| 2^-9 relative each (logits here have std 1, max ~5: a few 1e-3).
constexpr double kTolFusedLoss = 1e-4;
constexpr double kTolFusedGrad = 1e-2;
constexpr int kSampleRows = 24;

std::vector<int32_t> make_targets(Context& ctx, int64_t tokens, int64_t vocab) {
  std::vector<int32_t> targets = randint(tokens, ctx.seed(), 0, static_cast<int32_t>(vocab));
  const std::vector<int32_t> coin = randint(tokens, ctx.seed(), 0, 10);
  for (int64_t t = 0; t < tokens; t++) {
    if (coin[t] == 0) targets[t] = kIgnore;  // ~10% ignored
  }
  return targets;
}

// The oracle's forward over all rows, in parallel row chunks (rows are independent; the chunks'
// sums are added in double).
void oracle_forward(const std::vector<float>& logits, const std::vector<int32_t>& targets,
                    int64_t tokens, int64_t vocab, double* loss, double* count,
                    std::vector<float>* lse) {
  lse->assign(tokens, 0.f);
  *loss = *count = 0.0;
  std::mutex lock;
  parallel_for(
      tokens,
      [&](int64_t begin, int64_t end) {
        float l = 0, c = 0;
        if (!cpu::cross_entropy_forward<float>(&l, &c, lse->data() + begin,
                                               logits.data() + begin * vocab,
                                               targets.data() + begin, end - begin, vocab, kIgnore)
                 .ok()) {
          die("cross_entropy oracle refused valid targets");
        }
        std::lock_guard<std::mutex> guard(lock);
        *loss += l;
        *count += c;
      },
      64);
}

template <typename T>
void plain_case(Context& ctx, int64_t tokens, int64_t vocab, bool big) {
  if (!ctx.wants("cross_entropy")) return;
  const std::string type = std::is_same_v<T, bf16> ? ".bf16" : ".f32";
  const std::string shape = shape_str({tokens, vocab});
  const std::vector<float> logits = randn(tokens * vocab, ctx.seed(), 2.f, std::is_same_v<T, bf16>);
  const std::vector<int32_t> targets = make_targets(ctx, tokens, vocab);
  Dev<T> d_logits = to_device<T>(logits), dlogits(tokens * vocab);
  Dev<int32_t> d_targets = to_device_i32(targets), bad(1);
  Dev<float> loss(1), count(1), lse(tokens);
  Dev<uint8_t> ws = scratch(cross_entropy_forward_workspace_bytes(tokens));
  loss.poison();
  count.poison();
  lse.poison();
  bad.upload_raw({INT32_MAX});
  auto forward = [&] {
    check(cross_entropy_forward(ctx.stream(), loss.get(), count.get(), lse.get(), d_logits.get(),
                                d_targets.get(), tokens, vocab, kIgnore, bad.get(),
                                ws.workspace()));
  };
  forward();
  ctx.sync();
  double loss_ref, count_ref;
  std::vector<float> lse_ref;
  oracle_forward(logits, targets, tokens, vocab, &loss_ref, &count_ref, &lse_ref);
  const double ms_f = big ? ctx.time_ms(forward) : -1;
  ctx.report("cross_entropy.forward" + type, shape,
             {{"loss", rel_rms(loss.download(), {static_cast<float>(loss_ref)}), kTolLoss},
              {"count", rel_rms(count.download(), {static_cast<float>(count_ref)}), 0.0},
              {"lse", rel_rms(lse.download(), lse_ref), kTolLoss},
              {"no_bad", bad.download_raw()[0] == INT32_MAX ? 0.0 : 1.0, 0.0}},
             ms_f, big ? tbps(static_cast<double>(tokens) * vocab * sizeof(T), ms_f) : "");

  Dev<float> dloss = to_device<float>({kDloss}), d_lse = to_device<float>(lse_ref);
  dlogits.poison();
  auto backward = [&] {
    check(cross_entropy_backward(ctx.stream(), dlogits.get(), dloss.get(), d_logits.get(),
                                 d_lse.get(), d_targets.get(), tokens, vocab, kIgnore));
  };
  backward();
  ctx.sync();
  std::vector<float> ref(tokens * vocab);
  parallel_for(
      tokens,
      [&](int64_t begin, int64_t end) {
        cpu::cross_entropy_backward<float>(ref.data() + begin * vocab, &kDloss,
                                           logits.data() + begin * vocab, lse_ref.data() + begin,
                                           targets.data() + begin, end - begin, vocab, kIgnore);
        if constexpr (std::is_same_v<T, bf16>) {
          for (int64_t i = begin * vocab; i < end * vocab; i++) ref[i] = round_bf16(ref[i]);
        }
      },
      64);
  const double ms_b = big ? ctx.time_ms(backward) : -1;
  ctx.report("cross_entropy.backward" + type, shape,
             {{"dlogits", rel_rms(dlogits.download(), ref), kTolDlogits<T>}}, ms_b,
             big ? tbps(2.0 * tokens * vocab * sizeof(T), ms_b) : "");
}

// A target outside the vocabulary: reported, and the loss is NaN.
void bad_target_case(Context& ctx) {
  if (!ctx.wants("cross_entropy")) return;
  const int64_t tokens = 20, vocab = 50;
  std::vector<int32_t> targets = make_targets(ctx, tokens, vocab);
  targets[5] = static_cast<int32_t>(vocab + 1);
  targets[11] = -7;
  Dev<bf16> logits = to_device<bf16>(randn(tokens * vocab, ctx.seed(), 1.f));
  Dev<int32_t> d_targets = to_device_i32(targets), bad(1);
  Dev<float> loss(1), count(1), lse(tokens);
  Dev<uint8_t> ws = scratch(cross_entropy_forward_workspace_bytes(tokens));
  bad.upload_raw({INT32_MAX});
  check(cross_entropy_forward(ctx.stream(), loss.get(), count.get(), lse.get(), logits.get(),
                              d_targets.get(), tokens, vocab, kIgnore, bad.get(), ws.workspace()));
  ctx.sync();
  ctx.report("cross_entropy.forward bad target", shape_str({tokens, vocab}),
             {{"bad_position", bad.download_raw()[0] == 5 ? 0.0 : 1.0, 0.0},
              {"nan_loss", std::isnan(loss.download()[0]) ? 0.0 : 1.0, 0.0}});
}

void fused_case(Context& ctx, int64_t tokens, int64_t vocab, int64_t hid, int64_t chunk, bool big) {
  if (!ctx.wants("lm_head_cross_entropy")) return;
  const float scaling = 6.f;  // granite-4.0-h-tiny's logits_scaling
  const std::string shape = shape_str({tokens, vocab, hid}) + " chunk " + std::to_string(chunk);
  // Logits (hidden . table / scaling) with standard deviation 1.
  const std::vector<float> hidden = randn(tokens * hid, ctx.seed(), 1.f);
  const std::vector<float> table = randn(vocab * hid, ctx.seed(), scaling / std::sqrt(float(hid)));
  const std::vector<int32_t> targets = make_targets(ctx, tokens, vocab);
  Dev<bf16> d_hidden = to_device<bf16>(hidden), d_table = to_device<bf16>(table);
  Dev<bf16> dhidden(tokens * hid), dtable(vocab * hid);
  Dev<int32_t> d_targets = to_device_i32(targets), bad(1);
  Dev<float> loss(1), count(1), lse(tokens), dloss = to_device<float>({kDloss});
  Dev<uint8_t> ws_f = scratch(lm_head_cross_entropy_forward_workspace_bytes(tokens, vocab, chunk));
  Dev<uint8_t> ws_b =
      scratch(lm_head_cross_entropy_backward_workspace_bytes(tokens, vocab, hid, chunk));
  loss.poison();
  count.poison();
  lse.poison();
  bad.upload_raw({INT32_MAX});
  auto forward = [&] {
    check(lm_head_cross_entropy_forward(
        ctx.gemm(), ctx.stream(), loss.get(), count.get(), lse.get(), d_hidden.get(), d_table.get(),
        d_targets.get(), tokens, vocab, hid, scaling, kIgnore, chunk, bad.get(), ws_f.workspace()));
  };
  forward();
  ctx.sync();
  const std::vector<float> lse_gpu = lse.download();
  dhidden.poison();
  dtable.poison();
  auto backward = [&] {
    check(lm_head_cross_entropy_backward(ctx.gemm(), ctx.stream(), dhidden.get(), dtable.get(),
                                         dloss.get(), d_hidden.get(), d_table.get(),
                                         d_targets.get(), lse.get(), tokens, vocab, hid, scaling,
                                         kIgnore, chunk, ws_b.workspace()));
  };
  backward();
  ctx.sync();
  const std::vector<float> dhidden_h = dhidden.download(), dtable_h = dtable.download();
  const float inv = 1.f / scaling;

  std::vector<Output> fwd, bwd;
  if (!big) {
    // The whole oracle: logits = hidden table^T / scaling, cross-entropy, and the two products.
    std::vector<float> logits(tokens * vocab), lse_ref, dlogits(tokens * vocab),
        dhidden_ref(tokens * hid), dtable_ref(vocab * hid);
    cpu::gemm<float>(false, true, tokens, vocab, hid, inv, hidden.data(), hid, table.data(), hid,
                     0.f, logits.data(), vocab);
    double loss_ref, count_ref;
    oracle_forward(logits, targets, tokens, vocab, &loss_ref, &count_ref, &lse_ref);
    // The backward's input lse is the forward's output (the same for both).
    cpu::cross_entropy_backward<float>(dlogits.data(), &kDloss, logits.data(), lse_gpu.data(),
                                       targets.data(), tokens, vocab, kIgnore);
    cpu::gemm<float>(false, false, tokens, hid, vocab, inv, dlogits.data(), vocab, table.data(),
                     hid, 0.f, dhidden_ref.data(), hid);
    cpu::gemm<float>(true, false, vocab, hid, tokens, inv, dlogits.data(), vocab, hidden.data(),
                     hid, 0.f, dtable_ref.data(), hid);
    fwd = {{"loss", rel_rms(loss.download(), {static_cast<float>(loss_ref)}), kTolFusedLoss},
           {"count", rel_rms(count.download(), {static_cast<float>(count_ref)}), 0.0},
           {"lse", rel_rms(lse_gpu, lse_ref), kTolFusedLoss}};
    bwd = {{"dhidden", rel_rms(dhidden_h, dhidden_ref), kTolFusedGrad},
           {"dtable", rel_rms(dtable_h, dtable_ref), kTolFusedGrad}};
  } else {
    // Sampled token rows: their logits, lse (forward) and dhidden (backward) from the oracle.
    std::vector<int64_t> rows = {0, tokens - 1};
    for (int32_t r : randint(kSampleRows - 2, ctx.seed(), 0, static_cast<int32_t>(tokens))) {
      rows.push_back(r);
    }
    const int64_t n = static_cast<int64_t>(rows.size());
    std::vector<float> lse_ref(n), lse_got(n), dh_ref(n * hid), dh_got(n * hid);
    parallel_for(
        n,
        [&](int64_t begin, int64_t end) {
          std::vector<float> row(vocab), drow(vocab);
          for (int64_t i = begin; i < end; i++) {
            const int64_t t = rows[i];
            cpu::gemm<float>(false, true, 1, vocab, hid, inv, hidden.data() + t * hid, hid,
                             table.data(), hid, 0.f, row.data(), vocab);
            float l, c;
            // The row's own target, or the ignore index (its lse is checked either way).
            (void)cpu::cross_entropy_forward<float>(&l, &c, &lse_ref[i], row.data(),
                                                    targets.data() + t, 1, vocab, kIgnore);
            lse_got[i] = lse_gpu[t];
            cpu::cross_entropy_backward<float>(drow.data(), &kDloss, row.data(), &lse_gpu[t],
                                               targets.data() + t, 1, vocab, kIgnore);
            cpu::gemm<float>(false, false, 1, hid, vocab, inv, drow.data(), vocab, table.data(),
                             hid, 0.f, dh_ref.data() + i * hid, hid);
            std::copy(dhidden_h.begin() + t * hid, dhidden_h.begin() + (t + 1) * hid,
                      dh_got.begin() + i * hid);
          }
        },
        1);
    // The loss from every row: sum of (GPU lse - the oracle's target logit) over valid rows.
    double loss_ref = 0.0, count_ref = 0.0;
    for (int64_t t = 0; t < tokens; t++) {
      if (targets[t] == kIgnore) continue;
      float logit;
      cpu::gemm<float>(false, true, 1, 1, hid, inv, hidden.data() + t * hid, hid,
                       table.data() + int64_t{targets[t]} * hid, hid, 0.f, &logit, 1);
      loss_ref += static_cast<double>(lse_gpu[t]) - logit;
      count_ref += 1.0;
    }
    // Sampled vocabulary rows of dtable (half of them targets): the row's logit column over all
    // tokens, the oracle's cross_entropy_backward on that one column (target 0 where the token's
    // target is this row, 1 elsewhere), then its product with hidden.
    std::vector<int64_t> vrows;
    for (int32_t r : randint(kSampleRows / 2, ctx.seed(), 0, static_cast<int32_t>(vocab))) {
      vrows.push_back(r);
    }
    for (int32_t i : randint(kSampleRows / 2, ctx.seed(), 0, static_cast<int32_t>(tokens))) {
      vrows.push_back(targets[i] == kIgnore ? 0 : targets[i]);
    }
    const int64_t nv = static_cast<int64_t>(vrows.size());
    std::vector<float> dt_ref(nv * hid), dt_got(nv * hid);
    parallel_for(
        nv,
        [&](int64_t begin, int64_t end) {
          std::vector<float> column(tokens), dcolumn(tokens);
          std::vector<int32_t> column_targets(tokens);
          for (int64_t i = begin; i < end; i++) {
            const int64_t v = vrows[i];
            cpu::gemm<float>(false, true, tokens, 1, hid, inv, hidden.data(), hid,
                             table.data() + v * hid, hid, 0.f, column.data(), 1);
            for (int64_t t = 0; t < tokens; t++) {
              column_targets[t] =
                  targets[t] == kIgnore ? static_cast<int32_t>(kIgnore) : (targets[t] == v ? 0 : 1);
            }
            cpu::cross_entropy_backward<float>(dcolumn.data(), &kDloss, column.data(),
                                               lse_gpu.data(), column_targets.data(), tokens, 1,
                                               kIgnore);
            cpu::gemm<float>(true, false, 1, hid, tokens, inv, dcolumn.data(), 1, hidden.data(),
                             hid, 0.f, dt_ref.data() + i * hid, hid);
            std::copy(dtable_h.begin() + v * hid, dtable_h.begin() + (v + 1) * hid,
                      dt_got.begin() + i * hid);
          }
        },
        1);
    fwd = {{"loss", rel_rms(loss.download(), {static_cast<float>(loss_ref)}), kTolFusedLoss},
           {"count", rel_rms(count.download(), {static_cast<float>(count_ref)}), 0.0},
           {"lse", std::max(rel_rms(lse_got, lse_ref), nonfinite(lse_gpu)), kTolFusedLoss}};
    bwd = {{"dhidden", std::max(rel_rms(dh_got, dh_ref), nonfinite(dhidden_h)), kTolFusedGrad},
           {"dtable", std::max(rel_rms(dt_got, dt_ref), nonfinite(dtable_h)), kTolFusedGrad}};
  }
  fwd.push_back({"no_bad", bad.download_raw()[0] == INT32_MAX ? 0.0 : 1.0, 0.0});
  const double flops = 2.0 * tokens * vocab * hid;
  const double ms_f = big ? ctx.time_ms(forward) : -1;
  ctx.report("lm_head_cross_entropy.forward", shape, fwd, ms_f, big ? tflops(flops, ms_f) : "");
  const double ms_b = big ? ctx.time_ms(backward) : -1;
  ctx.report("lm_head_cross_entropy.backward", shape, bwd, ms_b,
             big ? tflops(3 * flops, ms_b) : "");
}

}  // namespace

void test_cross_entropy(Context& ctx) {
  plain_case<bf16>(ctx, 37, 1001, false);
  plain_case<float>(ctx, 37, 1001, false);
  plain_case<bf16>(ctx, 5, 4096, false);
  bad_target_case(ctx);
  fused_case(ctx, 37, 1001, 40, 16, false);  // three chunks, the last partial
  fused_case(ctx, 37, 1001, 40, 64, false);  // one chunk (dtable written directly)
  fused_case(ctx, 300, 520, 64, 128, false);
  if (!ctx.options().big) return;
  // granite-4.0-h-tiny: vocabulary 100352, hidden 1536, 8192 tokens (plain: 4096 tokens of
  // materialised logits).
  plain_case<bf16>(ctx, 4096, 100352, true);
  fused_case(ctx, 8192, 100352, 1536, 2048, true);
}

}  // namespace hcp::cuda::test
