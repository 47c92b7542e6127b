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

// The update of n elements that start `offset` elements into their arrays (the gradient
// `grad_offset`): aligned or not, with their alignments agreeing (groups of four between single
// elements) or not (single elements only).
template <typename G>
void adamw_case(Context& ctx, int64_t n, int64_t t, bool decay, bool with_param, bool big,
                int64_t offset = 0, int64_t grad_offset = 0) {
  if (!ctx.wants("adamw")) return;
  constexpr bool kBf16 = std::is_same_v<G, bf16>;
  const std::string shape = shape_str({n}) + " t=" + std::to_string(t) + (decay ? " decay" : "") +
                            (kBf16 ? " bf16 grad" : " f32 grad") +
                            (offset != 0 || grad_offset != 0 ? " at " + std::to_string(offset) +
                                                                   "/" + std::to_string(grad_offset)
                                                             : "");
  AdamWStep step;
  step.lr = 3e-4;
  step.clip_coef = 0.7;
  step.t = t;
  step.decay = decay;
  const auto after = [](const std::vector<float>& x, int64_t k) {
    return std::vector<float>(x.begin() + k, x.end());
  };
  std::vector<float> master = randn(offset + n, ctx.seed(), 0.05f, false);
  const std::vector<float> grad = randn(grad_offset + n, ctx.seed(), 1e-3f, kBf16);
  std::vector<float> m = randn(offset + n, ctx.seed(), 1e-4f, false);
  std::vector<float> v = randu(offset + n, ctx.seed(), 0.f, 1e-6f, false);
  Dev<float> d_master = to_device<float>(master), d_m = to_device<float>(m),
             d_v = to_device<float>(v);
  Dev<G> d_grad = to_device<G>(grad);
  Dev<bf16> param(offset + n);
  param.poison();
  const auto launch = [&] {
    check(adamw_update(ctx.stream(), d_master.get() + offset,
                       with_param ? param.get() + offset : nullptr, d_grad.get() + grad_offset,
                       d_m.get() + offset, d_v.get() + offset, n, step));
  };
  launch();
  ctx.sync();
  oracle_adamw(step, n, master.data() + offset, grad.data() + grad_offset, m.data() + offset,
               v.data() + offset);
  // The whole arrays: nothing before the elements changes either.
  std::vector<Output> outputs = {{"master", rel_rms(d_master.download(), master), kTolAdamW},
                                 {"m", rel_rms(d_m.download(), m), kTolAdamW},
                                 {"v", rel_rms(d_v.download(), v), kTolAdamW}};
  if (with_param) {
    std::vector<float> param_ref = after(master, offset);
    for (float& x : param_ref) x = round_bf16(x);
    outputs.push_back({"param", rel_rms(after(param.download(), offset), param_ref), 0.0});
  }
  // Timed on the updated state (the values keep changing; the traffic is the same).
  const double ms = big ? ctx.time_ms(launch) : -1;
  const double bytes = n * (6.0 * 4 + sizeof(G) + (with_param ? 2.0 : 0.0));
  ctx.report("adamw_update", shape, outputs, ms, big ? tbps(bytes, ms) : "");
}

// Every parameter in one launch: tensors of several sizes (within a chunk, across chunks),
// gradients bf16 and fp32, with and without decay and a compute copy, aligned and not; each
// tensor bit-identical to the CPU's update of it alone.
struct ManySpec {
  int64_t n, offset;
  bool bf16_grad, decay, with_param;
};
const ManySpec kManySpecs[] = {{1, 0, true, true, true},
                               {3, 1, true, false, true},
                               {1001, 3, true, true, true},
                               {70000, 0, false, true, false},
                               {kAdamWChunk * 2 + 5, 2, true, false, true},
                               {4099, 1, false, true, true}};
// A model's mix at a fifth of tiny's scale for the timing: large expert tensors, layer
// matrices, fp32 norm weights without decay or compute copy.
std::vector<ManySpec> model_like_specs() {
  std::vector<ManySpec> specs;
  for (int layer = 0; layer < 8; ++layer) {
    specs.push_back({25'165'824, 0, true, true, true});
    specs.push_back({6'291'456, 0, true, true, true});
    specs.push_back({1536, 0, false, false, false});
  }
  return specs;
}

double adamw_bytes(std::span<const ManySpec> specs) {
  double bytes = 0;
  for (const ManySpec& spec : specs) {
    bytes += spec.n * (6.0 * 4 + (spec.bf16_grad ? 2.0 : 4.0) + (spec.with_param ? 2.0 : 0.0));
  }
  return bytes;
}

void adamw_many_case(Context& ctx, std::span<const ManySpec> specs, bool big) {
  if (!ctx.wants("adamw")) return;
  using Spec = ManySpec;
  AdamWStep step;
  step.lr = 3e-4;
  step.clip_coef = 0.7;
  step.t = 4;
  struct Arrays {
    std::vector<float> master, grad, m, v;
    Dev<float> d_master, d_m, d_v, d_grad_f32;
    Dev<bf16> d_grad_bf16, param;
  };
  std::vector<Arrays> arrays;
  std::vector<AdamWTensor> tensors;
  std::vector<int64_t> sizes;
  for (const Spec& spec : specs) {
    const int64_t total = spec.offset + spec.n;
    Arrays a;
    a.master = randn(total, ctx.seed(), 0.05f, false);
    a.grad = randn(total, ctx.seed(), 1e-3f, spec.bf16_grad);
    a.m = randn(total, ctx.seed(), 1e-4f, false);
    a.v = randu(total, ctx.seed(), 0.f, 1e-6f, false);
    a.d_master = to_device<float>(a.master);
    a.d_m = to_device<float>(a.m);
    a.d_v = to_device<float>(a.v);
    a.d_grad_f32 = to_device<float>(a.grad);
    a.d_grad_bf16 = to_device<bf16>(a.grad);
    a.param = Dev<bf16>(total);
    a.param.poison();
    arrays.push_back(std::move(a));
  }
  for (size_t i = 0; i < arrays.size(); ++i) {
    const Spec& spec = specs[i];
    Arrays& a = arrays[i];
    AdamWTensor t;
    t.master = a.d_master.get() + spec.offset;
    t.param = spec.with_param ? a.param.get() + spec.offset : nullptr;
    t.grad = spec.bf16_grad ? static_cast<const void*>(a.d_grad_bf16.get() + spec.offset)
                            : static_cast<const void*>(a.d_grad_f32.get() + spec.offset);
    t.grad_is_bf16 = spec.bf16_grad;
    t.m = a.d_m.get() + spec.offset;
    t.v = a.d_v.get() + spec.offset;
    t.n = spec.n;
    t.decay = spec.decay;
    tensors.push_back(t);
    sizes.push_back(spec.n);
  }
  Dev<uint8_t> ws = scratch(adamw_update_many_workspace_bytes(sizes));
  const auto launch = [&] {
    check(adamw_update_many(ctx.stream(), tensors, step, ws.workspace()));
  };
  launch();
  ctx.sync();
  std::vector<Output> outputs;
  for (size_t i = 0; i < arrays.size(); ++i) {
    const Spec& spec = specs[i];
    Arrays& a = arrays[i];
    AdamWStep own = step;
    own.decay = spec.decay;
    oracle_adamw(own, spec.n, a.master.data() + spec.offset, a.grad.data() + spec.offset,
                 a.m.data() + spec.offset, a.v.data() + spec.offset);
    const std::string tag = std::to_string(i);
    outputs.push_back({"master" + tag, rel_rms(a.d_master.download(), a.master), kTolAdamW});
    outputs.push_back({"m" + tag, rel_rms(a.d_m.download(), a.m), kTolAdamW});
    outputs.push_back({"v" + tag, rel_rms(a.d_v.download(), a.v), kTolAdamW});
    if (spec.with_param) {
      std::vector<float> got = a.param.download(),
                         want(a.master.begin() + spec.offset, a.master.end());
      for (float& x : want) x = round_bf16(x);
      outputs.push_back({"param" + tag,
                         rel_rms(std::vector<float>(got.begin() + spec.offset, got.end()), want),
                         0.0});
    }
  }
  // Timed on the updated state (the values keep changing; the traffic is the same).
  const double ms = big ? ctx.time_ms(launch) : -1;
  ctx.report("adamw_update_many", std::to_string(arrays.size()) + " tensors", outputs, ms,
             big ? tbps(adamw_bytes(specs), ms) : "");
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

// Every gradient's sum of squares at once: sizes within and across chunks, bf16 and fp32,
// aligned and not, each against the CPU's sum of that tensor alone.
struct SquaresSpec {
  int64_t n, offset;
  bool bf16;
};
const SquaresSpec kSquaresSpecs[] = {{1, 0, true},     {7, 3, true},       {1001, 0, false},
                                     {70000, 1, true}, {131077, 0, false}, {kAdamWChunk, 5, false}};

void squares_many_case(Context& ctx, std::span<const SquaresSpec> specs, bool big) {
  if (!ctx.wants("sum_of_squares")) return;
  std::vector<std::vector<float>> values;
  std::vector<Dev<float>> f32;
  std::vector<Dev<bf16>> b16;
  std::vector<SquaresTensor> tensors;
  std::vector<int64_t> sizes;
  for (const SquaresSpec& spec : specs) {
    values.push_back(randn(spec.offset + spec.n, ctx.seed(), 1e-2f, spec.bf16));
    f32.push_back(to_device<float>(values.back()));
    b16.push_back(to_device<bf16>(values.back()));
  }
  for (size_t i = 0; i < values.size(); ++i) {
    SquaresTensor t;
    t.is_bf16 = specs[i].bf16;
    t.x = t.is_bf16 ? static_cast<const void*>(b16[i].get() + specs[i].offset)
                    : static_cast<const void*>(f32[i].get() + specs[i].offset);
    t.n = specs[i].n;
    tensors.push_back(t);
    sizes.push_back(t.n);
  }
  Dev<double> out(static_cast<int64_t>(tensors.size()));
  out.poison();
  Dev<uint8_t> ws = scratch(sum_of_squares_many_workspace_bytes(sizes));
  const auto launch = [&] {
    check(sum_of_squares_many(ctx.stream(), out.get(), tensors, ws.workspace()));
  };
  launch();
  ctx.sync();
  const std::vector<double> got = out.download_raw();
  std::vector<Output> outputs;
  for (size_t i = 0; i < values.size(); ++i) {
    const double ref = oracle_sum_of_squares(
        std::vector<float>(values[i].begin() + specs[i].offset, values[i].end()));
    const double error = std::isfinite(got[i]) ? std::abs(got[i] - ref) / std::abs(ref) : INFINITY;
    outputs.push_back({"sum" + std::to_string(i), error, kTolSquares});
  }
  const double ms = big ? ctx.time_ms(launch) : -1;
  double bytes = 0;
  for (const SquaresSpec& spec : specs) bytes += spec.n * (spec.bf16 ? 2.0 : 4.0);
  ctx.report("sum_of_squares_many", std::to_string(values.size()) + " tensors", outputs, ms,
             big ? tbps(bytes, ms) : "");
}

}  // namespace

void test_adamw(Context& ctx) {
  adamw_case<float>(ctx, 1001, 1, true, true, false);
  adamw_case<float>(ctx, 1001, 7, false, false, false);
  adamw_case<bf16>(ctx, 777, 3, true, true, false);
  adamw_case<bf16>(ctx, 1001, 2, true, true, false, 3, 3);  // single elements, fours, single
  adamw_case<float>(ctx, 1002, 2, false, true, false, 1, 1);
  adamw_case<bf16>(ctx, 1001, 2, true, true, false, 2, 1);  // alignments disagree
  adamw_case<bf16>(ctx, 3, 5, true, true, false, 1, 1);     // fewer than four
  adamw_many_case(ctx, kManySpecs, false);
  squares_case<float>(ctx, 1001, false);
  squares_case<bf16>(ctx, 12345, false);
  squares_many_case(ctx, kSquaresSpecs, false);
  if (!ctx.options().big) return;
  // 50M parameters (about the tiny model's embedding table and a layer's experts).
  adamw_case<float>(ctx, 50'000'000, 10, true, true, true);
  adamw_case<bf16>(ctx, 50'000'000, 10, true, true, true);
  squares_case<float>(ctx, 50'000'000, true);
  squares_case<bf16>(ctx, 50'000'000, true);
  const std::vector<ManySpec> model = model_like_specs();
  adamw_many_case(ctx, model, true);
  std::vector<SquaresSpec> gradients;
  for (const ManySpec& spec : model) gradients.push_back({spec.n, 0, spec.bf16_grad});
  squares_many_case(ctx, gradients, true);
}

}  // namespace hcp::cuda::test
