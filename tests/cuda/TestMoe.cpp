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

struct Problem {
  int64_t tokens, hidden, inner, experts, k;
  std::vector<float> x, w_in, w_out, gates, dout;
  std::vector<int32_t> indices;
};

Problem make_problem(Context& ctx, int64_t tokens, int64_t hidden, int64_t inner, int64_t experts,
                     int64_t k) {
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
  const std::vector<float> logits = randn(tokens * experts, ctx.seed(), 1.f, false);
  p.gates.resize(tokens * k);
  p.indices.resize(tokens * k);
  cpu::topk_softmax_forward<float>(p.gates.data(), p.indices.data(), logits.data(), tokens, experts,
                                   k);
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
      auto it = std::find(c.expert_ids.begin(), c.expert_ids.end(), e);
      if (it == c.expert_ids.end()) {
        c.expert_ids.push_back(e);
        it = c.expert_ids.end() - 1;
      }
      c.indices.push_back(static_cast<int32_t>(it - c.expert_ids.begin()));
      c.gates.push_back(p.gates[t * p.k + j]);
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

void experts_case(Context& ctx, int64_t tokens, int64_t hidden, int64_t inner, int64_t experts,
                  int64_t k, bool big) {
  if (!ctx.wants("moe_experts")) return;
  const std::string shape = shape_str({tokens, hidden, inner}) + " E" + std::to_string(experts) +
                            " top" + std::to_string(k);
  const Problem p = make_problem(ctx, tokens, hidden, inner, experts, k);
  const int64_t H = hidden, I = inner, S = tokens * k;
  Dev<bf16> x = to_device<bf16>(p.x), w_in = to_device<bf16>(p.w_in),
            w_out = to_device<bf16>(p.w_out), dout = to_device<bf16>(p.dout);
  Dev<float> gates = to_device<float>(p.gates);
  Dev<int32_t> indices = to_device_i32(p.indices);
  Dev<bf16> out(tokens * H), dx(tokens * H), dw_in(experts * 2 * I * H), dw_out(experts * H * I);
  Dev<float> dgates(S);
  Dev<uint8_t> ws_f = scratch(moe_experts_forward_workspace_bytes(tokens, H, I, experts, k));
  Dev<uint8_t> ws_b = scratch(moe_experts_backward_workspace_bytes(tokens, H, I, experts, k));

  out.poison();
  auto forward = [&] {
    check(moe_experts_forward(ctx.gemm(), ctx.stream(), out.get(), x.get(), gates.get(),
                              indices.get(), w_in.get(), w_out.get(), tokens, H, I, experts, k,
                              ws_f.workspace()));
  };
  forward();
  ctx.sync();
  dx.poison();
  dgates.poison();
  dw_in.poison();
  dw_out.poison();
  auto backward = [&] {
    check(moe_experts_backward(ctx.gemm(), ctx.stream(), dx.get(), dgates.get(), dw_in.get(),
                               dw_out.get(), dout.get(), x.get(), gates.get(), indices.get(),
                               w_in.get(), w_out.get(), tokens, H, I, experts, k,
                               ws_b.workspace()));
  };
  backward();
  ctx.sync();
  const std::vector<float> out_h = out.download(), dx_h = dx.download(), dg_h = dgates.download(),
                           dwi_h = dw_in.download(), dwo_h = dw_out.download();

  std::vector<Output> fwd, bwd;
  if (!big) {
    std::vector<float> out_ref(tokens * H), dx_ref(tokens * H), dg_ref(S),
        dwi_ref(experts * 2 * I * H), dwo_ref(experts * H * I);
    cpu::moe_experts_forward<float>(out_ref.data(), p.x.data(), p.gates.data(), p.indices.data(),
                                    p.w_in.data(), p.w_out.data(), tokens, H, I, experts, k);
    cpu::moe_experts_backward<float>(dx_ref.data(), dg_ref.data(), dwi_ref.data(), dwo_ref.data(),
                                     p.dout.data(), p.x.data(), p.gates.data(), p.indices.data(),
                                     p.w_in.data(), p.w_out.data(), tokens, H, I, experts, k);
    fwd = {{"out", rel_rms(out_h, out_ref), kTolExperts}};
    bwd = {{"dx", rel_rms(dx_h, dx_ref), kTolExperts},
           {"dgates", rel_rms(dg_h, dg_ref), kTolExperts},
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
          }
        },
        1);
    // dw of the expert with the fewest slots: its slots as separate one-slot tokens, in parallel
    // pieces whose dw are summed in double.
    std::vector<int64_t> counts(experts, 0);
    for (int32_t e : p.indices) counts[e]++;
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
    bwd = {{"dx", std::max(rel_rms(dx_got, dx_ref), nonfinite(dx_h)), kTolExperts},
           {"dgates", std::max(rel_rms(dg_got, dg_ref), nonfinite(dg_h)), kTolExperts},
           {"dw_in", std::max(rel_rms(dwi_got, dwi_ref), nonfinite(dwi_h)), kTolExperts},
           {"dw_out", std::max(rel_rms(dwo_got, dwo_ref), nonfinite(dwo_h)), kTolExperts}};
  }
  const double flops = 6.0 * S * H * I;  // forward: two GEMMs, 2 * S * (2I*H + H*I)
  const double ms_f = big ? ctx.time_ms(forward) : -1;
  ctx.report("moe_experts.forward", shape, fwd, ms_f, big ? tflops(flops, ms_f) : "");
  const double ms_b = big ? ctx.time_ms(backward) : -1;
  ctx.report("moe_experts.backward", shape, bwd, ms_b, big ? tflops(3 * flops, ms_b) : "");
}

}  // namespace

void test_moe(Context& ctx) {
  route_case<float>(ctx, 37, 5, 3, false);
  route_case<float>(ctx, 50, 33, 1, false);    // experts across two lanes' worth
  route_case<bf16>(ctx, 300, 64, 6, false);    // ties
  route_case<float>(ctx, 20, 256, 16, false);  // the largest supported
  experts_case(ctx, 37, 40, 24, 5, 2, false);
  experts_case(ctx, 3, 16, 8, 9, 2, false);  // most experts get no token: zero weight gradients
  experts_case(ctx, 64, 72, 40, 8, 3, false);
  if (!ctx.options().big) return;
  // granite-4.0-h-tiny: 64 experts, top-6, width 512, hidden 1536; -small: 72 experts, top-10.
  route_case<float>(ctx, 8192, 64, 6, true);
  route_case<bf16>(ctx, 8192, 64, 6, true);
  route_case<float>(ctx, 8192, 72, 10, true);
  experts_case(ctx, 8192, 1536, 512, 64, 6, true);
}

}  // namespace hcp::cuda::test
