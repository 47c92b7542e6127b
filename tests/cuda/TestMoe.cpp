// MoE routing and expert compute, forward and backward, against runtime/kernels/cpu.
#include <algorithm>
#include <cmath>
#include <mutex>
#include <numeric>
#include <string>
#include <type_traits>

#include "runtime/kernels/cpu/Kernels.h"
#include "tests/cuda/Harness.h"

namespace hcp::cuda::test {
namespace {

// Routing: fp32 softmax over k values (expf against the oracle's double exp): ~1e-7.
constexpr double kTolGates = 1e-5;
// dlogits: fp32 out as above; bf16 out one rounding.
template <typename T>
constexpr double kTolDlogits = std::is_same_v<T, bf16> ? 4e-3 : 1e-5;
// Experts: the GEMM outputs h, u, y (and backward dyp, du, dh, dxp) are rounded to bf16 between
// the stages, as in a bf16 model; a handful of roundings of ~1.1e-3 RMS each, against the
// oracle's double throughout.
constexpr double kTolExperts = 1e-2;
// dgates[t, j] = dout[t] . y with y = W_out[e] (silu(a) b): a sum of `hidden` terms, each carrying
// the error of its y element (y is the bf16-rounded end of the chain above, error within
// kTolExperts relative RMS). Such a sum's error scales with its terms,
// ||terms|| = sqrt(sum_r (dout[t, r] y[r])^2), not with the sum itself, which cancels: at 3 tokens
// x top-2 the 6 |dgates| can all be small, and relative RMS against them overstates the error (a
// CPU model of the bf16 chain at 3x16x8 puts ~2% of correct runs above 1e-2, up to 0.1; the first
// H200 run saw 1.5e-2). So dgates' error is ||dgates - ref|| / sqrt(sum over slots of
// ||terms||^2), which stays at the scale of y's own error whatever the cancellation (the same
// model: median 3.3e-3, at most 7.4e-3 in 20000 runs; at 37x40x24 and 64x72x40 it matches relative
// RMS, ~3.5e-3). For uncorrelated dout and y, ||terms|| is the expected |dgates|, so a wrong
// dgates (a bug) scores as it would under relative RMS; sum |terms| (the worst-case bound) would be
// ~sqrt(hidden) times larger and hide errors at real widths. Tolerance: kTolExperts, as for the
// other outputs.

// Tokens whose outputs are checked at the large shapes (the oracle runs per token).
constexpr int kSampleTokens = 48;

std::vector<float> rounded(std::vector<float> v) {
  for (float& x : v) x = round_bf16(x);
  return v;
}

template <typename T>
void route_case(Context& ctx, int64_t tokens, int64_t experts, int64_t k, bool big) {
  if (!ctx.wants("moe_route")) return;
  constexpr bool kBf16 = std::is_same_v<T, bf16>;
  const std::string type = kBf16 ? ".bf16" : ".f32";
  const std::string shape = shape_str({tokens, experts}) + " top" + std::to_string(k);
  // bf16 logits repeat values often: ties must break to the lower expert, as the oracle does.
  const std::vector<float> logits = randn(tokens * experts, ctx.seed(), 1.f, kBf16);
  Dev<T> d_logits = to_device<T>(logits);
  Dev<float> gates(tokens * k);
  Dev<int32_t> indices(tokens * k);
  gates.poison();
  indices.poison();
  auto forward = [&] {
    check(moe_route_forward(ctx.stream(), gates.get(), indices.get(), d_logits.get(), tokens,
                            experts, k));
  };
  forward();
  ctx.sync();
  std::vector<float> gates_ref(tokens * k);
  std::vector<int32_t> indices_ref(tokens * k);
  cpu::topk_softmax_forward<float>(gates_ref.data(), indices_ref.data(), logits.data(), tokens,
                                   experts, k);
  const double ms_f = big ? ctx.time_ms(forward) : -1;
  ctx.report("moe_route.forward" + type, shape,
             {{"gates", rel_rms(gates.download(), gates_ref), kTolGates},
              {"indices", mismatch(indices.download_raw(), indices_ref), 0.0}},
             ms_f, big ? tbps(tokens * (experts * sizeof(T) + 8.0 * k), ms_f) : "");

  // Backward from the oracle's routing.
  const std::vector<float> dgates = randn(tokens * k, ctx.seed(), 1.f, false);
  Dev<float> d_dgates = to_device<float>(dgates), d_gates = to_device<float>(gates_ref);
  Dev<int32_t> d_indices = to_device_i32(indices_ref);
  Dev<T> dlogits(tokens * experts);
  dlogits.poison();
  auto backward = [&] {
    check(moe_route_backward(ctx.stream(), dlogits.get(), d_dgates.get(), d_gates.get(),
                             d_indices.get(), tokens, experts, k));
  };
  backward();
  ctx.sync();
  std::vector<float> dlogits_ref(tokens * experts);
  cpu::topk_softmax_backward<float>(dlogits_ref.data(), dgates.data(), gates_ref.data(),
                                    indices_ref.data(), tokens, experts, k);
  if (kBf16) dlogits_ref = rounded(dlogits_ref);
  const double ms_b = big ? ctx.time_ms(backward) : -1;
  ctx.report("moe_route.backward" + type, shape,
             {{"dlogits", rel_rms(dlogits.download(), dlogits_ref), kTolDlogits<T>}}, ms_b,
             big ? tbps(tokens * (experts * sizeof(T) + 12.0 * k), ms_b) : "");
}

// The load-balancing loss's statistics, combination and backwards. probs sums `tokens` softmax
// values in fp32 blocks (expf, fp32 partial sums) against the oracle's double: ~1e-6 relative;
// picks are counts (exact); dlogits as moe_route's.
constexpr double kTolLoad = 1e-5;
template <typename T>
void router_load_case(Context& ctx, int64_t tokens, int64_t experts, int64_t k, bool big) {
  if (!ctx.wants("router_load")) return;
  constexpr bool kBf16 = std::is_same_v<T, bf16>;
  const std::string type = kBf16 ? ".bf16" : ".f32";
  const std::string shape = shape_str({tokens, experts}) + " top" + std::to_string(k);
  const std::vector<float> logits = randn(tokens * experts, ctx.seed(), 1.f, kBf16);
  std::vector<float> gates(tokens * k);
  std::vector<int32_t> indices(tokens * k);
  cpu::topk_softmax_forward<float>(gates.data(), indices.data(), logits.data(), tokens, experts, k);
  Dev<T> d_logits = to_device<T>(logits);
  Dev<int32_t> d_indices = to_device_i32(indices);
  Dev<float> probs(experts), picks(experts);
  probs.poison();
  picks.poison();
  Dev<uint8_t> ws = scratch(router_load_forward_workspace_bytes(tokens, experts));
  auto forward = [&] {
    check(router_load_forward(ctx.stream(), probs.get(), picks.get(), d_logits.get(),
                              d_indices.get(), tokens, experts, k, ws.workspace()));
  };
  forward();
  ctx.sync();
  std::vector<float> probs_ref(experts), picks_ref(experts);
  if (!cpu::router_load_forward<float>(probs_ref.data(), picks_ref.data(), logits.data(),
                                       indices.data(), tokens, experts, k)
           .ok()) {
    die("router_load oracle refused valid indices");
  }
  const std::vector<float> first = probs.download();
  forward();  // a second run: the same bits (the sums run in a fixed order)
  ctx.sync();
  const double ms_f = big ? ctx.time_ms(forward) : -1;
  ctx.report("router_load.forward" + type, shape,
             {{"probs", rel_rms(first, probs_ref), kTolLoad},
              {"picks", rel_rms(picks.download(), picks_ref), 0.0},
              {"repeat", rel_rms(probs.download(), first), 0.0}},
             ms_f, big ? tbps(tokens * (experts * sizeof(T) + 4.0 * k), ms_f) : "");

  const std::vector<float> dprobs = randn(experts, ctx.seed(), 1.f, false);
  Dev<float> d_dprobs = to_device<float>(dprobs);
  Dev<T> dlogits(tokens * experts);
  dlogits.poison();
  auto backward = [&] {
    check(router_load_backward(ctx.stream(), dlogits.get(), d_dprobs.get(), d_logits.get(), tokens,
                               experts));
  };
  backward();
  ctx.sync();
  std::vector<float> dlogits_ref(tokens * experts);
  cpu::router_load_backward<float>(dlogits_ref.data(), dprobs.data(), logits.data(), tokens,
                                   experts);
  if (kBf16) dlogits_ref = rounded(dlogits_ref);
  const double ms_b = big ? ctx.time_ms(backward) : -1;
  ctx.report("router_load.backward" + type, shape,
             {{"dlogits", rel_rms(dlogits.download(), dlogits_ref), kTolDlogits<T>}}, ms_b,
             big ? tbps(tokens * experts * 2.0 * sizeof(T), ms_b) : "");

  // The combination and its gradient, from the oracle's statistics.
  const float scale = static_cast<float>(experts) / static_cast<float>(tokens * tokens);
  Dev<float> d_probs = to_device<float>(probs_ref), d_picks = to_device<float>(picks_ref);
  Dev<float> loss(1), dloss = to_device<float>({0.75f}), grad(experts);
  loss.poison();
  grad.poison();
  check(router_aux_loss_forward(ctx.stream(), loss.get(), d_probs.get(), d_picks.get(), experts,
                                scale));
  check(router_aux_loss_backward(ctx.stream(), grad.get(), dloss.get(), d_picks.get(), experts,
                                 scale));
  ctx.sync();
  float loss_ref = 0;
  std::vector<float> grad_ref(experts);
  const float dloss_host = 0.75f;
  cpu::router_aux_loss_forward<float>(&loss_ref, probs_ref.data(), picks_ref.data(), experts,
                                      scale);
  cpu::router_aux_loss_backward<float>(grad_ref.data(), &dloss_host, picks_ref.data(), experts,
                                       scale);
  ctx.report("router_aux_loss" + type, shape,
             {{"loss", rel_rms(loss.download(), {loss_ref}), 1e-6},
              {"dprobs", rel_rms(grad.download(), grad_ref), 1e-6}},
             -1, "");
}

struct Problem {
  int64_t tokens, hidden, inner, experts, k;
  std::vector<float> x, w_in, w_out, gates, dout;
  std::vector<int32_t> indices;
};

// How the slots are routed: top-k of random logits; crowded: every token sends a slot to expert
// 0 (its logit raised by 8), as an untrained or collapsed router may; holes: random, then every
// 5th slot's id -1 and every 7th's `experts` (slots without an expert, as expert parallelism
// hands an owner the slots of other owners' experts).
enum class Routing { kRandom, kCrowded, kHoles };

Problem make_problem(Context& ctx, int64_t tokens, int64_t hidden, int64_t inner, int64_t experts,
                     int64_t k, Routing routing) {
  Problem p;
  p.tokens = tokens;
  p.hidden = hidden;
  p.inner = inner;
  p.experts = experts;
  p.k = k;
  p.x = randn(tokens * hidden, ctx.seed(), 1.f);
  p.w_in = randn(experts * 2 * inner * hidden, ctx.seed(), 1.f / std::sqrt(float(hidden)));
  p.w_out = randn(experts * hidden * inner, ctx.seed(), 1.f / std::sqrt(float(inner)));
  p.dout = randn(tokens * hidden, ctx.seed(), 1.f);
  // Routing as the model does it: top-k of random router logits (distinct experts per token).
  std::vector<float> logits = randn(tokens * experts, ctx.seed(), 1.f, false);
  if (routing == Routing::kCrowded) {
    for (int64_t t = 0; t < tokens; t++) logits[t * experts] += 8.f;
  }
  p.gates.resize(tokens * k);
  p.indices.resize(tokens * k);
  cpu::topk_softmax_forward<float>(p.gates.data(), p.indices.data(), logits.data(), tokens, experts,
                                   k);
  if (routing == Routing::kHoles) {
    for (int64_t s = 0; s < tokens * k; s += 5) p.indices[s] = -1;
    for (int64_t s = 3; s < tokens * k; s += 7) p.indices[s] = static_cast<int32_t>(experts);
  }
  return p;
}

// The oracle on a subset of the (token, slot) pairs, with only the experts they use: `slots`
// lists (token, slot) pairs; each becomes its own token with k = 1 when `split`, else the tokens'
// full slot lists are kept (slots must then hold all k slots of each token, in order). Outputs
// per oracle token: out, dx [n, hidden], dgates [n, k'], and dw of the compact experts.
struct Compact {
  int64_t tokens, k, experts;
  std::vector<float> x, gates, dout, w_in, w_out;
  std::vector<int32_t> indices;
  std::vector<int64_t> expert_ids;  // compact expert -> original
};

Compact compact(const Problem& p, const std::vector<int64_t>& tokens, bool one_slot_each,
                const std::vector<std::pair<int64_t, int64_t>>& pairs) {
  Compact c{};
  const int64_t H = p.hidden, I = p.inner;
  std::vector<std::pair<int64_t, std::vector<int64_t>>> rows;  // token, its slots
  if (one_slot_each) {
    for (const auto& [t, j] : pairs) rows.push_back({t, {j}});
  } else {
    for (int64_t t : tokens) {
      std::vector<int64_t> all(p.k);
      std::iota(all.begin(), all.end(), 0);
      rows.push_back({t, all});
    }
  }
  c.tokens = static_cast<int64_t>(rows.size());
  c.k = static_cast<int64_t>(rows.empty() ? 1 : rows[0].second.size());
  for (const auto& [t, slots] : rows) {
    c.x.insert(c.x.end(), p.x.begin() + t * H, p.x.begin() + (t + 1) * H);
    c.dout.insert(c.dout.end(), p.dout.begin() + t * H, p.dout.begin() + (t + 1) * H);
    for (int64_t j : slots) {
      const int64_t e = p.indices[t * p.k + j];
      c.gates.push_back(p.gates[t * p.k + j]);
      if (e < 0 || e >= p.experts) {  // no expert: stays without one
        c.indices.push_back(-1);
        continue;
      }
      auto it = std::find(c.expert_ids.begin(), c.expert_ids.end(), e);
      if (it == c.expert_ids.end()) {
        c.expert_ids.push_back(e);
        it = c.expert_ids.end() - 1;
      }
      c.indices.push_back(static_cast<int32_t>(it - c.expert_ids.begin()));
    }
  }
  c.experts = static_cast<int64_t>(c.expert_ids.size());
  for (int64_t e : c.expert_ids) {
    c.w_in.insert(c.w_in.end(), p.w_in.begin() + e * 2 * I * H,
                  p.w_in.begin() + (e + 1) * 2 * I * H);
    c.w_out.insert(c.w_out.end(), p.w_out.begin() + e * H * I, p.w_out.begin() + (e + 1) * H * I);
  }
  return c;
}

// The oracle's expert output y = W_out[e] (silu(a) b) of each (token, slot) pair: each pair as a
// one-slot token with gate 1.
std::vector<float> slot_outputs(const Problem& p,
                                const std::vector<std::pair<int64_t, int64_t>>& pairs) {
  Compact c = compact(p, {}, true, pairs);
  std::fill(c.gates.begin(), c.gates.end(), 1.f);
  std::vector<float> y(c.tokens * p.hidden);
  cpu::moe_experts_forward<float>(y.data(), c.x.data(), c.gates.data(), c.indices.data(),
                                  c.w_in.data(), c.w_out.data(), c.tokens, p.hidden, p.inner,
                                  c.experts, 1);
  return y;
}

// sum_r (dout[t, r] y[r])^2 of each pair: the squared scale of its dgates' error (kTolExperts'
// comment above).
std::vector<double> dgates_scale2(const Problem& p,
                                  const std::vector<std::pair<int64_t, int64_t>>& pairs) {
  const std::vector<float> y = slot_outputs(p, pairs);
  std::vector<double> scale2(pairs.size(), 0.0);
  for (size_t i = 0; i < pairs.size(); i++) {
    const float* d = p.dout.data() + pairs[i].first * p.hidden;
    const float* yi = y.data() + static_cast<int64_t>(i) * p.hidden;
    for (int64_t r = 0; r < p.hidden; r++) {
      const double term = static_cast<double>(d[r]) * static_cast<double>(yi[r]);
      scale2[i] += term * term;
    }
  }
  return scale2;
}

// ||out - ref|| / sqrt(sum scale2): +inf when out has a non-finite element where ref is finite.
double dgates_error(const std::vector<float>& out, const std::vector<float>& ref,
                    const std::vector<double>& scale2) {
  if (out.size() != ref.size() || out.size() != scale2.size()) die("dgates_error: size mismatch");
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < out.size(); i++) {
    if (!std::isfinite(out[i]) && std::isfinite(ref[i])) return INFINITY;
    const double d = static_cast<double>(out[i]) - static_cast<double>(ref[i]);
    diff += d * d;
    norm += scale2[i];
  }
  if (norm == 0.0) return diff == 0.0 ? 0.0 : INFINITY;
  return std::sqrt(diff / norm);
}

// All k slots of each token, in slot order.
std::vector<std::pair<int64_t, int64_t>> token_slots(const std::vector<int64_t>& tokens,
                                                     int64_t k) {
  std::vector<std::pair<int64_t, int64_t>> pairs;
  for (int64_t t : tokens) {
    for (int64_t j = 0; j < k; j++) pairs.push_back({t, j});
  }
  return pairs;
}

// The kernels lay the experts' rows out padded (one batched GEMM) unless one expert has far more
// rows than the average (crowded): then compact, one GEMM per expert. Both are checked. The
// tokens run in chunks of at most `token_chunk` (the weight gradients summed over them).
void experts_case(Context& ctx, int64_t tokens, int64_t hidden, int64_t inner, int64_t experts,
                  int64_t k, bool big, Routing routing = Routing::kRandom,
                  int64_t token_chunk = kExpertTokenChunk) {
  if (!ctx.wants("moe_experts")) return;
  const char* routing_name = routing == Routing::kCrowded ? " crowded"
                             : routing == Routing::kHoles ? " holes"
                                                          : "";
  const int64_t chunks = (tokens + token_chunk - 1) / token_chunk;
  std::string shape = shape_str({tokens, hidden, inner}) + " E" + std::to_string(experts) + " top" +
                      std::to_string(k) + routing_name;
  if (chunks > 1) shape.append(" ").append(std::to_string(chunks)).append(" chunks");
  const Problem p = make_problem(ctx, tokens, hidden, inner, experts, k, routing);
  const int64_t H = hidden, I = inner, S = tokens * k;
  Dev<bf16> x = to_device<bf16>(p.x), w_in = to_device<bf16>(p.w_in),
            w_out = to_device<bf16>(p.w_out), dout = to_device<bf16>(p.dout);
  Dev<float> gates = to_device<float>(p.gates);
  Dev<int32_t> indices = to_device_i32(p.indices);
  Dev<bf16> out(tokens * H), dx(tokens * H), dw_in(experts * 2 * I * H), dw_out(experts * H * I);
  Dev<float> dgates(S);
  Dev<uint8_t> ws_f =
      scratch(moe_experts_forward_workspace_bytes(tokens, H, I, experts, k, token_chunk));
  Dev<uint8_t> ws_b =
      scratch(moe_experts_backward_workspace_bytes(tokens, H, I, experts, k, token_chunk));

  // The routing as callers pass it: none (the kernels count each chunk on the device and wait),
  // the host's copy of the indices, and for a call of one chunk the per-expert counts alone.
  std::vector<int64_t> host_counts(experts, 0);
  for (int32_t e : p.indices) {
    if (e >= 0 && e < experts) host_counts[e]++;
  }
  ExpertRoutingOnHost on_host;
  auto forward = [&] {
    check(moe_experts_forward(ctx.gemm(), ctx.stream(), out.get(), x.get(), gates.get(),
                              indices.get(), w_in.get(), w_out.get(), tokens, H, I, experts, k,
                              ws_f.workspace(), on_host, token_chunk));
  };
  auto backward = [&] {
    check(moe_experts_backward(ctx.gemm(), ctx.stream(), dx.get(), dgates.get(), dw_in.get(),
                               dw_out.get(), dout.get(), x.get(), gates.get(), indices.get(),
                               w_in.get(), w_out.get(), tokens, H, I, experts, k, ws_b.workspace(),
                               on_host, token_chunk));
  };
  // The workspaces too: a padding row the kernels forget to zero reads as NaN.
  auto run_both = [&] {
    for (Dev<bf16>* d : {&out, &dx, &dw_in, &dw_out}) d->poison();
    dgates.poison();
    ws_f.poison();
    ws_b.poison();
    forward();
    ctx.sync();
    backward();
    ctx.sync();
    return std::vector<std::vector<float>>{out.download(), dx.download(), dgates.download(),
                                           dw_in.download(), dw_out.download()};
  };
  const std::vector<std::vector<float>> counted = run_both();
  on_host = {.expert_counts = host_counts.data()};
  const std::vector<std::vector<float>> counts_given = run_both();
  on_host = {.indices = p.indices.data()};
  const std::vector<std::vector<float>> given = run_both();
  const std::vector<float>&out_h = given[0], &dx_h = given[1], &dg_h = given[2], &dwi_h = given[3],
        &dwo_h = given[4];
  // However the counts come: the same launches, so the same bits.
  double counts_differ = 0.0;
  for (const std::vector<std::vector<float>>* other : {&counted, &counts_given}) {
    for (size_t i = 0; i < given.size(); i++) {
      counts_differ = std::max(counts_differ, max_abs_diff(given[i], (*other)[i]));
    }
  }
  // With h kept from the forward (poisoned first: the backward must read what the forward
  // wrote): the same product of the same rows, so again the same bits.
  Dev<bf16> kept(S * 2 * I);
  auto forward_kept = [&] {
    check(moe_experts_forward(ctx.gemm(), ctx.stream(), out.get(), x.get(), gates.get(),
                              indices.get(), w_in.get(), w_out.get(), tokens, H, I, experts, k,
                              ws_f.workspace(), on_host, token_chunk, kept.get()));
  };
  auto backward_kept = [&] {
    check(moe_experts_backward(ctx.gemm(), ctx.stream(), dx.get(), dgates.get(), dw_in.get(),
                               dw_out.get(), dout.get(), x.get(), gates.get(), indices.get(),
                               w_in.get(), w_out.get(), tokens, H, I, experts, k, ws_b.workspace(),
                               on_host, token_chunk, kept.get()));
  };
  for (Dev<bf16>* d : {&out, &dx, &dw_in, &dw_out, &kept}) d->poison();
  dgates.poison();
  ws_f.poison();
  ws_b.poison();
  forward_kept();
  ctx.sync();
  backward_kept();
  ctx.sync();
  double kept_differ = 0.0;
  const std::vector<std::vector<float>> with_kept = {
      out.download(), dx.download(), dgates.download(), dw_in.download(), dw_out.download()};
  for (size_t i = 0; i < given.size(); i++) {
    kept_differ = std::max(kept_differ, max_abs_diff(given[i], with_kept[i]));
  }
  // dout_scale (a residual multiplier folded in): the same bits as the backward of dout scaled
  // and rounded to bf16 first, as the scale step it replaces wrote it.
  constexpr float kDoutScale = 0.22f;
  std::vector<float> scaled(p.dout.size());
  for (size_t i = 0; i < scaled.size(); i++) {
    scaled[i] = round_bf16(round_bf16(p.dout[i]) * kDoutScale);
  }
  Dev<bf16> dout_scaled = to_device<bf16>(scaled);
  auto scaled_backward = [&](const bf16* d, float dout_scale) {
    for (Dev<bf16>* buffer : {&dx, &dw_in, &dw_out}) buffer->poison();
    dgates.poison();
    check(moe_experts_backward(ctx.gemm(), ctx.stream(), dx.get(), dgates.get(), dw_in.get(),
                               dw_out.get(), d, x.get(), gates.get(), indices.get(), w_in.get(),
                               w_out.get(), tokens, H, I, experts, k, ws_b.workspace(), on_host,
                               token_chunk, kept.get(), dout_scale));
    ctx.sync();
    return std::vector<std::vector<float>>{dx.download(), dgates.download(), dw_in.download(),
                                           dw_out.download()};
  };
  const std::vector<std::vector<float>> folded = scaled_backward(dout.get(), kDoutScale);
  const std::vector<std::vector<float>> prescaled = scaled_backward(dout_scaled.get(), 1.f);
  double scale_differs = 0.0;
  for (size_t i = 0; i < folded.size(); i++) {
    scale_differs = std::max(scale_differs, max_abs_diff(folded[i], prescaled[i]));
  }

  std::vector<Output> fwd, bwd;
  if (!big) {
    std::vector<float> out_ref(tokens * H), dx_ref(tokens * H), dg_ref(S),
        dwi_ref(experts * 2 * I * H), dwo_ref(experts * H * I);
    cpu::moe_experts_forward<float>(out_ref.data(), p.x.data(), p.gates.data(), p.indices.data(),
                                    p.w_in.data(), p.w_out.data(), tokens, H, I, experts, k);
    cpu::moe_experts_backward<float>(dx_ref.data(), dg_ref.data(), dwi_ref.data(), dwo_ref.data(),
                                     p.dout.data(), p.x.data(), p.gates.data(), p.indices.data(),
                                     p.w_in.data(), p.w_out.data(), tokens, H, I, experts, k);
    std::vector<int64_t> all(tokens);
    std::iota(all.begin(), all.end(), 0);
    const std::vector<double> dg_scale2 = dgates_scale2(p, token_slots(all, k));
    fwd = {{"out", rel_rms(out_h, out_ref), kTolExperts}};
    bwd = {{"dx", rel_rms(dx_h, dx_ref), kTolExperts},
           {"dgates", dgates_error(dg_h, dg_ref, dg_scale2), kTolExperts},
           {"dw_in", rel_rms(dwi_h, dwi_ref), kTolExperts},
           {"dw_out", rel_rms(dwo_h, dwo_ref), kTolExperts}};
  } else {
    // out, dx, dgates on sampled tokens: the oracle per token, with its k experts only.
    std::vector<int64_t> sample = {0, tokens - 1};
    for (int32_t t : randint(kSampleTokens - 2, ctx.seed(), 0, static_cast<int32_t>(tokens))) {
      sample.push_back(t);
    }
    const int64_t n = static_cast<int64_t>(sample.size());
    std::vector<float> out_ref(n * H), dx_ref(n * H), dg_ref(n * k), out_got(n * H), dx_got(n * H),
        dg_got(n * k);
    std::vector<double> dg_scale2(n * k);
    parallel_for(
        n,
        [&](int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; i++) {
            const int64_t t = sample[i];
            const Compact c = compact(p, {t}, false, {});
            std::vector<float> dwi(c.experts * 2 * I * H), dwo(c.experts * H * I);
            cpu::moe_experts_forward<float>(out_ref.data() + i * H, c.x.data(), c.gates.data(),
                                            c.indices.data(), c.w_in.data(), c.w_out.data(), 1, H,
                                            I, c.experts, k);
            cpu::moe_experts_backward<float>(dx_ref.data() + i * H, dg_ref.data() + i * k,
                                             dwi.data(), dwo.data(), c.dout.data(), c.x.data(),
                                             c.gates.data(), c.indices.data(), c.w_in.data(),
                                             c.w_out.data(), 1, H, I, c.experts, k);
            std::copy(out_h.begin() + t * H, out_h.begin() + (t + 1) * H, out_got.begin() + i * H);
            std::copy(dx_h.begin() + t * H, dx_h.begin() + (t + 1) * H, dx_got.begin() + i * H);
            std::copy(dg_h.begin() + t * k, dg_h.begin() + (t + 1) * k, dg_got.begin() + i * k);
            const std::vector<double> scale2 = dgates_scale2(p, token_slots({t}, k));
            std::copy(scale2.begin(), scale2.end(), dg_scale2.begin() + i * k);
          }
        },
        1);
    // dw of the expert with the fewest slots: its slots as separate one-slot tokens, in parallel
    // pieces whose dw are summed in double.
    std::vector<int64_t> counts(experts, 0);
    for (int32_t e : p.indices) {
      if (e >= 0 && e < experts) counts[e]++;
    }
    const int64_t target = std::min_element(counts.begin(), counts.end()) - counts.begin();
    std::vector<std::pair<int64_t, int64_t>> pairs;
    for (int64_t s = 0; s < S; s++) {
      if (p.indices[s] == target) pairs.push_back({s / k, s % k});
    }
    std::vector<double> dwi_acc(2 * I * H, 0.0), dwo_acc(H * I, 0.0);
    std::mutex lock;
    parallel_for(
        static_cast<int64_t>(pairs.size()),
        [&](int64_t begin, int64_t end) {
          if (begin == end) return;
          const std::vector<std::pair<int64_t, int64_t>> piece(pairs.begin() + begin,
                                                               pairs.begin() + end);
          const Compact c = compact(p, {}, true, piece);
          std::vector<float> dxp(c.tokens * H), dgp(c.tokens), dwi(2 * I * H), dwo(H * I);
          cpu::moe_experts_backward<float>(dxp.data(), dgp.data(), dwi.data(), dwo.data(),
                                           c.dout.data(), c.x.data(), c.gates.data(),
                                           c.indices.data(), c.w_in.data(), c.w_out.data(),
                                           c.tokens, H, I, 1, 1);
          std::lock_guard<std::mutex> guard(lock);
          for (size_t i = 0; i < dwi.size(); i++) dwi_acc[i] += dwi[i];
          for (size_t i = 0; i < dwo.size(); i++) dwo_acc[i] += dwo[i];
        },
        16);
    const std::vector<float> dwi_ref(dwi_acc.begin(), dwi_acc.end()),
        dwo_ref(dwo_acc.begin(), dwo_acc.end());
    const std::vector<float> dwi_got(dwi_h.begin() + target * 2 * I * H,
                                     dwi_h.begin() + (target + 1) * 2 * I * H),
        dwo_got(dwo_h.begin() + target * H * I, dwo_h.begin() + (target + 1) * H * I);
    fwd = {{"out", std::max(rel_rms(out_got, out_ref), nonfinite(out_h)), kTolExperts}};
    bwd = {
        {"dx", std::max(rel_rms(dx_got, dx_ref), nonfinite(dx_h)), kTolExperts},
        {"dgates", std::max(dgates_error(dg_got, dg_ref, dg_scale2), nonfinite(dg_h)), kTolExperts},
        {"dw_in", std::max(rel_rms(dwi_got, dwi_ref), nonfinite(dwi_h)), kTolExperts},
        {"dw_out", std::max(rel_rms(dwo_got, dwo_ref), nonfinite(dwo_h)), kTolExperts}};
  }
  fwd.push_back({"all, routing on the host or counted", counts_differ, 0.0});
  fwd.push_back({"all, h kept", kept_differ, 0.0});
  bwd.push_back({"all, dout_scale", scale_differs, 0.0});
  const double flops = 6.0 * S * H * I;  // forward: two GEMMs, 2 * S * (2I*H + H*I)
  const double ms_f = big ? ctx.time_ms(forward) : -1;
  ctx.report("moe_experts.forward", shape, fwd, ms_f, big ? tflops(flops, ms_f) : "");
  const double ms_b = big ? ctx.time_ms(backward) : -1;
  ctx.report("moe_experts.backward", shape, bwd, ms_b, big ? tflops(3 * flops, ms_b) : "");
  if (big) {  // the kept h's cost in the forward and gain in the backward (its four GEMMs)
    const double ms_fk = ctx.time_ms(forward_kept), ms_bk = ctx.time_ms(backward_kept);
    ctx.report("moe_experts.forward (h kept)", shape, {}, ms_fk, tflops(flops, ms_fk));
    ctx.report("moe_experts.backward (h kept)", shape, {}, ms_bk, tflops(2 * flops, ms_bk));
  }
}

// The expert-parallel exchange's pieces (the CUDA backend's moe_experts_ep): gathering a
// permutation of token rows, combining rows that came back by each slot's place (-1: the slot
// stayed home), and gathering per-slot values. Gathers copy, so they must be exact; the combine
// is the experts' own fp32 slot-order sum, here against the same sum on the host in the same
// order: only FMA contraction can differ, one bf16 ulp on rare elements (far below 1e-3).
constexpr double kTolCombine = 1e-3;

void exchange_case(Context& ctx, int64_t tokens, int64_t hidden, int64_t k) {
  if (!ctx.wants("moe_exchange")) return;
  const std::string shape = shape_str({tokens, hidden}) + " k" + std::to_string(k);
  const int64_t slots = tokens * k;
  // Send order: a random permutation of the slots, a few of which stay home (row -1).
  std::vector<int32_t> order(slots);
  std::iota(order.begin(), order.end(), 0);
  const std::vector<int32_t> keys = randint(slots, ctx.seed(), 0, 1 << 30);
  std::sort(order.begin(), order.end(),
            [&](int32_t a, int32_t b) { return keys[a] != keys[b] ? keys[a] < keys[b] : a < b; });
  std::vector<int32_t> position(slots, -1);
  const std::vector<int32_t> home = randint(slots, ctx.seed(), 0, 10);
  std::vector<int32_t> sent;
  for (int32_t slot : order) {
    if (home[slot] == 0) continue;  // ~10% stay home
    position[slot] = static_cast<int32_t>(sent.size());
    sent.push_back(slot);
  }
  const auto rows = static_cast<int64_t>(sent.size());
  const std::vector<float> x = randn(tokens * hidden, ctx.seed(), 1.f);
  const std::vector<float> back = randn(std::max<int64_t>(rows, 1) * hidden, ctx.seed(), 1.f);
  const std::vector<float> gates = randu(slots, ctx.seed(), 0.f, 1.f, false);
  const std::vector<float> values = randn(std::max<int64_t>(rows, 1), ctx.seed(), 1.f, false);
  Dev<bf16> d_x = to_device<bf16>(x), d_back = to_device<bf16>(back);
  Dev<float> d_gates = to_device<float>(gates), d_values = to_device<float>(values);
  Dev<int32_t> d_sent = to_device_i32(sent.empty() ? std::vector<int32_t>{0} : sent);
  Dev<int32_t> d_position = to_device_i32(position);
  Dev<bf16> gathered(std::max<int64_t>(rows, 1) * hidden), combined(tokens * hidden),
      unweighted(tokens * hidden);
  Dev<float> slot_values(slots);
  for (Dev<bf16>* d : {&gathered, &combined, &unweighted}) d->poison();
  slot_values.poison();
  check(moe_gather_rows(ctx.stream(), gathered.get(), d_x.get(), d_sent.get(), rows, hidden, k));
  check(moe_combine_rows(ctx.stream(), combined.get(), d_back.get(), d_gates.get(),
                         d_position.get(), tokens, hidden, k));
  check(moe_combine_rows(ctx.stream(), unweighted.get(), d_back.get(), nullptr, d_position.get(),
                         tokens, hidden, k));
  check(
      moe_gather_values(ctx.stream(), slot_values.get(), d_values.get(), d_position.get(), slots));
  ctx.sync();

  std::vector<float> gathered_ref(std::max<int64_t>(rows, 1) * hidden, 0.f);
  for (int64_t p = 0; p < rows; ++p) {
    std::copy_n(x.begin() + (sent[p] / k) * hidden, hidden, gathered_ref.begin() + p * hidden);
  }
  std::vector<float> gathered_out = gathered.download();
  if (rows == 0) gathered_out.assign(gathered_ref.size(), 0.f);  // nothing to gather
  std::vector<float> combined_ref(tokens * hidden), unweighted_ref(tokens * hidden);
  std::vector<float> values_ref(slots);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t c = 0; c < hidden; ++c) {
      float weighted = 0.f, plain = 0.f;
      for (int64_t j = 0; j < k; ++j) {
        const int32_t p = position[t * k + j];
        if (p < 0) continue;
        weighted += gates[t * k + j] * back[p * hidden + c];
        plain += back[p * hidden + c];
      }
      combined_ref[t * hidden + c] = round_bf16(weighted);
      unweighted_ref[t * hidden + c] = round_bf16(plain);
    }
  }
  for (int64_t s = 0; s < slots; ++s) values_ref[s] = position[s] < 0 ? 0.f : values[position[s]];
  ctx.report(
      "moe_exchange", shape,
      {{"gather_rows", rel_rms(gathered_out, gathered_ref), 0.0},
       {"combine_rows", rel_rms(combined.download(), combined_ref), kTolCombine},
       {"combine_rows(no gates)", rel_rms(unweighted.download(), unweighted_ref), kTolCombine},
       {"gather_values", rel_rms(slot_values.download(), values_ref), 0.0}});
}

// Expert parallelism's token routes made on the device (moe_token_routes) against the send
// order "by owner rank, then token" written out plainly; every array must match exactly. A few
// slots have no expert (-1 or E): they go nowhere.
void token_routes_case(Context& ctx, int64_t tokens, int64_t k, int64_t experts, int64_t ep) {
  if (!ctx.wants("moe_token_routes")) return;
  const std::string shape = shape_str({tokens}) + " k" + std::to_string(k) + " E" +
                            std::to_string(experts) + " ep" + std::to_string(ep);
  std::vector<int32_t> ids = randint(tokens * k, ctx.seed(), 0, static_cast<int32_t>(experts));
  const std::vector<int32_t> holes = randint(tokens * k, ctx.seed() + 1, 0, 50);
  for (int64_t s = 0; s < tokens * k; ++s) {
    if (holes[s] == 0) ids[s] = -1;
    if (holes[s] == 1) ids[s] = static_cast<int32_t>(experts);
  }
  const int64_t per_rank = experts / ep, max_rows = tokens * ep;
  std::vector<int32_t> row_token, row_slot, row_experts, token_row(tokens * ep, -1),
      slot_row(tokens * k, -1);
  for (int64_t p = 0; p < ep; ++p) {
    for (int64_t t = 0; t < tokens; ++t) {
      bool reaches = false;
      for (int64_t j = 0; j < k; ++j) {
        const int32_t e = ids[t * k + j];
        reaches = reaches || (e >= 0 && e < experts && e / per_rank == p);
      }
      if (!reaches) continue;
      const auto at = static_cast<int32_t>(row_token.size());
      token_row[t * ep + p] = at;
      row_token.push_back(static_cast<int32_t>(t));
      for (int64_t j = 0; j < k; ++j) {
        const int32_t e = ids[t * k + j];
        const bool here = e >= 0 && e < experts && e / per_rank == p;
        row_slot.push_back(static_cast<int32_t>(t * k + j));
        row_experts.push_back(here ? static_cast<int32_t>(e - p * per_rank) : -1);
        if (here) slot_row[t * k + j] = static_cast<int32_t>(at * k + j);
      }
    }
  }
  const auto sent = static_cast<int64_t>(row_token.size());
  Dev<int32_t> d_ids = to_device_i32(ids), d_row_token(max_rows), d_row_slot(max_rows * k),
               d_row_experts(max_rows * k), d_token_row(tokens * ep), d_slot_row(tokens * k);
  // Not the usual poison: its -1 is a value the routes write.
  for (Dev<int32_t>* d : {&d_row_token, &d_row_slot, &d_row_experts, &d_token_row, &d_slot_row}) {
    d->upload_raw(std::vector<int32_t>(d->size(), 0x5EEDBEEF));
  }
  check(moe_token_routes(ctx.stream(), d_row_token.get(), d_row_slot.get(), d_row_experts.get(),
                         d_token_row.get(), d_slot_row.get(), d_ids.get(), tokens, k, experts, ep));
  ctx.sync();
  // The count of entries that differ from the reference (the device's first ref.size()).
  auto differ = [](const Dev<int32_t>& device, const std::vector<int32_t>& ref) {
    const std::vector<int32_t> got = device.download_raw();
    double count = 0;
    for (size_t i = 0; i < ref.size(); ++i) count += got[i] != ref[i];
    return count;
  };
  ctx.report("moe_token_routes", shape,
             {{"row_token", differ(d_row_token, row_token), 0.0},
              {"row_slot", differ(d_row_slot, row_slot), 0.0},
              {"row_experts", differ(d_row_experts, row_experts), 0.0},
              {"token_row", differ(d_token_row, token_row), 0.0},
              {"slot_row", differ(d_slot_row, slot_row), 0.0},
              {"rows sent", static_cast<double>(sent > max_rows), 0.0}});
}

}  // namespace

void test_moe(Context& ctx) {
  route_case<float>(ctx, 37, 5, 3, false);
  route_case<float>(ctx, 50, 33, 1, false);    // experts across two lanes' worth
  route_case<bf16>(ctx, 300, 64, 6, false);    // ties
  route_case<float>(ctx, 20, 256, 16, false);  // the largest supported
  route_case<float>(ctx, 37, 40, 12, false);   // k above experts % 32 (the backward's last pass)
  router_load_case<float>(ctx, 37, 5, 3, false);
  router_load_case<bf16>(ctx, 300, 64, 6, false);
  router_load_case<float>(ctx, 20, 256, 16, false);   // the largest supported
  router_load_case<float>(ctx, 70000, 40, 4, false);  // every block of the cut, the last short
  experts_case(ctx, 37, 40, 24, 5, 2, false);
  experts_case(ctx, 3, 16, 8, 9, 2, false);  // most experts get no token: zero weight gradients
  experts_case(ctx, 64, 72, 40, 8, 3, false);
  experts_case(ctx, 200, 72, 40, 8, 2, false, Routing::kCrowded);  // the compact layout
  experts_case(ctx, 300, 72, 40, 8, 3, false, Routing::kHoles);    // 4 chunks of the plan
  // Chunks of tokens: 5 (the last one short), and chunks where an expert gets no row.
  experts_case(ctx, 300, 72, 40, 8, 3, false, Routing::kRandom, 64);
  experts_case(ctx, 200, 72, 40, 8, 2, false, Routing::kCrowded, 50);
  experts_case(ctx, 90, 16, 8, 40, 1, false, Routing::kHoles, 7);
  exchange_case(ctx, 37, 40, 3);  // hidden not a multiple of 8: the scalar path
  exchange_case(ctx, 64, 72, 6);
  exchange_case(ctx, 1, 16, 1);
  token_routes_case(ctx, 37, 3, 6, 2);
  token_routes_case(ctx, 3000, 6, 64, 4);  // several chunks of the block
  token_routes_case(ctx, 500, 2, 16, 16);  // the most ranks
  token_routes_case(ctx, 100, 4, 8, 1);
  if (!ctx.options().big) return;
  // granite-4.0-h-tiny: 64 experts, top-6, width 512, hidden 1536; -small: 72 experts, top-10.
  route_case<float>(ctx, 8192, 64, 6, true);
  route_case<bf16>(ctx, 8192, 64, 6, true);
  route_case<float>(ctx, 8192, 72, 10, true);
  router_load_case<bf16>(ctx, 8192, 64, 6, true);
  experts_case(ctx, 8192, 1536, 512, 64, 6, true);
  experts_case(ctx, 8192, 1536, 512, 64, 6, true, Routing::kCrowded);
  experts_case(ctx, 2 * kExpertTokenChunk, 1536, 512, 64, 6, true);  // 2 chunks
  exchange_case(ctx, 8192, 1536, 6);
  token_routes_case(ctx, 8192, 6, 64, 2);
}

}  // namespace hcp::cuda::test
