// AdamW and the sum of squares against hcp::train (AdamWKernel, SumOfSquares).
#include <cmath>
#include <span>
#include <string>
#include <type_traits>

#include "tests/cuda/Harness.h"

#include "runtime/train/AdamW.h"

namespace hcp::cuda::test {
namespace {

void oracle_adamw(const AdamWStep& s, int64_t n, float* param, const float* grad, float* m,
                  float* v) {
  train::AdamWConfig config;
  config.beta1 = s.beta1;
  config.beta2 = s.beta2;
  config.eps = s.eps;
  config.weight_decay = s.weight_decay;
  train::AdamWKernel(config, train::AdamWUpdate{s.lr, s.clip_coef, s.t}, s.decay, n, param, grad, m,
                     v);
}
double oracle_sum_of_squares(const std::vector<float>& x) { return train::SumOfSquares(x); }

// The same fp32 operations in the same order, no contractions: bit-identical.
constexpr double kTolAdamW = 0.0;
// fp32 squares summed in fp32 per group of 8, then double: ~1e-7 relative.
constexpr double kTolSquares = 1e-6;

template <typename G>
void adamw_case(Context& ctx, int64_t n, int64_t t, bool decay, bool with_param, bool big) {
  if (!ctx.wants("adamw")) return;
  constexpr bool kBf16 = std::is_same_v<G, bf16>;
  const std::string shape = shape_str({n}) + " t=" + std::to_string(t) + (decay ? " decay" : "") +
                            (kBf16 ? " bf16 grad" : " f32 grad");
  AdamWStep step;
  step.lr = 3e-4;
  step.clip_coef = 0.7;
  step.t = t;
  step.decay = decay;
  std::vector<float> master = randn(n, ctx.seed(), 0.05f, false);
  const std::vector<float> grad = randn(n, ctx.seed(), 1e-3f, kBf16);
  std::vector<float> m = randn(n, ctx.seed(), 1e-4f, false);
  std::vector<float> v = randu(n, ctx.seed(), 0.f, 1e-6f, false);
  Dev<float> d_master = to_device<float>(master), d_m = to_device<float>(m),
             d_v = to_device<float>(v);
  Dev<G> d_grad = to_device<G>(grad);
  Dev<bf16> param(n);
  param.poison();
  check(adamw_update(ctx.stream(), d_master.get(), with_param ? param.get() : nullptr, d_grad.get(),
                     d_m.get(), d_v.get(), n, step));
  ctx.sync();
  oracle_adamw(step, n, master.data(), grad.data(), m.data(), v.data());
  std::vector<Output> outputs = {{"master", rel_rms(d_master.download(), master), kTolAdamW},
                                 {"m", rel_rms(d_m.download(), m), kTolAdamW},
                                 {"v", rel_rms(d_v.download(), v), kTolAdamW}};
  if (with_param) {
    std::vector<float> param_ref = master;
    for (float& x : param_ref) x = round_bf16(x);
    outputs.push_back({"param", rel_rms(param.download(), param_ref), 0.0});
  }
  double ms = -1;
  if (big) {
    // Timed on the updated state (the values keep changing; the traffic is the same).
    ms = ctx.time_ms([&] {
      check(adamw_update(ctx.stream(), d_master.get(), with_param ? param.get() : nullptr,
                         d_grad.get(), d_m.get(), d_v.get(), n, step));
    });
  }
  const double bytes = n * (6.0 * 4 + sizeof(G) + (with_param ? 2.0 : 0.0));
  ctx.report("adamw_update", shape, outputs, ms, big ? tbps(bytes, ms) : "");
}

template <typename T>
void squares_case(Context& ctx, int64_t n, bool big) {
  if (!ctx.wants("sum_of_squares")) return;
  constexpr bool kBf16 = std::is_same_v<T, bf16>;
  const std::vector<float> x = randn(n, ctx.seed(), 1e-2f, kBf16);
  Dev<T> d_x = to_device<T>(x);
  Dev<double> out(1);
  Dev<uint8_t> ws = scratch(sum_of_squares_workspace_bytes(n));
  out.poison();
  auto launch = [&] {
    check(sum_of_squares(ctx.stream(), out.get(), d_x.get(), n, ws.workspace()));
  };
  launch();
  ctx.sync();
  const double got = out.download_raw()[0], ref = oracle_sum_of_squares(x);
  const double error = std::isfinite(got) ? std::abs(got - ref) / std::abs(ref) : INFINITY;
  const double ms = big ? ctx.time_ms(launch) : -1;
  ctx.report(std::string("sum_of_squares") + (kBf16 ? ".bf16" : ".f32"), shape_str({n}),
             {{"sum", error, kTolSquares}}, ms, big ? tbps(n * double(sizeof(T)), ms) : "");
}

}  // namespace

void test_adamw(Context& ctx) {
  adamw_case<float>(ctx, 1001, 1, true, true, false);
  adamw_case<float>(ctx, 1001, 7, false, false, false);
  adamw_case<bf16>(ctx, 777, 3, true, true, false);
  squares_case<float>(ctx, 1001, false);
  squares_case<bf16>(ctx, 12345, false);
  if (!ctx.options().big) return;
  // 50M parameters (about the tiny model's embedding table and a layer's experts).
  adamw_case<float>(ctx, 50'000'000, 10, true, true, true);
  adamw_case<bf16>(ctx, 50'000'000, 10, true, true, true);
  squares_case<float>(ctx, 50'000'000, true);
  squares_case<bf16>(ctx, 50'000'000, true);
}

}  // namespace hcp::cuda::test
