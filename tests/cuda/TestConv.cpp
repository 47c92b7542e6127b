// Causal depthwise conv1d with halo, forward and backward, against runtime/kernels/cpu.
#include <string>

#include "runtime/kernels/cpu/Kernels.h"
#include "tests/cuda/Harness.h"

namespace hcp::cuda::test {
namespace {

// bf16 out: one rounding of an fp32 result (dx: sums of `width` terms; dw, dbias: fp32 sums over
// batch x seq in fixed slabs).
constexpr double kTolBf16 = 4e-3;

std::vector<float> rounded(std::vector<float> v) {
  for (float& x : v) x = round_bf16(x);
  return v;
}

void conv_case(Context& ctx, int64_t batch, int64_t seq, int64_t channels, int64_t width,
               bool with_halo, bool big) {
  if (!ctx.wants("causal_conv1d")) return;
  const std::string shape =
      shape_str({batch, seq, channels}) + " w" + std::to_string(width) + (with_halo ? " halo" : "");
  const int64_t n = batch * seq * channels, nh = batch * (width - 1) * channels;
  const std::vector<float> x = randn(n, ctx.seed(), 1.f);
  const std::vector<float> w = randn(channels * width, ctx.seed(), 0.5f);
  const std::vector<float> bias = randn(channels, ctx.seed(), 0.5f);
  const std::vector<float> halo = randn(nh, ctx.seed(), 1.f);
  const std::vector<float> dy = randn(n, ctx.seed(), 1.f);
  Dev<bf16> d_x = to_device<bf16>(x), d_w = to_device<bf16>(w), d_bias = to_device<bf16>(bias),
            d_halo = to_device<bf16>(halo), d_dy = to_device<bf16>(dy);
  Dev<bf16> y(n), dx(n), dhalo(nh), dw(channels * width), dbias(channels);
  const bf16* halo_ptr = with_halo ? d_halo.get() : nullptr;
  const float* halo_host = with_halo ? halo.data() : nullptr;

  std::vector<float> y_ref(n), dx_ref(n), dhalo_ref(nh), dw_ref(channels * width),
      dbias_ref(channels);
  cpu::causal_conv1d_forward<float>(y_ref.data(), x.data(), halo_host, w.data(), bias.data(), batch,
                                    seq, channels, width);
  cpu::causal_conv1d_backward<float>(dx_ref.data(), dhalo_ref.data(), dw_ref.data(),
                                     dbias_ref.data(), dy.data(), x.data(), halo_host, w.data(),
                                     batch, seq, channels, width);

  y.poison();
  auto forward = [&] {
    check(causal_conv1d_forward(ctx.stream(), y.get(), d_x.get(), halo_ptr, d_w.get(), d_bias.get(),
                                batch, seq, channels, width));
  };
  forward();
  ctx.sync();
  const double ms_f = big ? ctx.time_ms(forward) : -1;
  ctx.report("causal_conv1d.forward", shape,
             {{"y", rel_rms(y.download(), rounded(y_ref)), kTolBf16}}, ms_f,
             big ? tbps(4.0 * n, ms_f) : "");

  Dev<uint8_t> ws = scratch(causal_conv1d_backward_workspace_bytes(batch, seq, channels, width));
  dx.poison();
  dhalo.poison();
  dw.poison();
  dbias.poison();
  auto backward = [&] {
    check(causal_conv1d_backward(ctx.stream(), dx.get(), with_halo ? dhalo.get() : nullptr,
                                 dw.get(), dbias.get(), d_dy.get(), d_x.get(), halo_ptr, d_w.get(),
                                 batch, seq, channels, width, ws.workspace()));
  };
  backward();
  ctx.sync();
  std::vector<Output> outputs = {
      {"dx", rel_rms(dx.download(), rounded(dx_ref)), kTolBf16},
      {"dw", rel_rms(dw.download(), rounded(dw_ref)), kTolBf16},
      {"dbias", rel_rms(dbias.download(), rounded(dbias_ref)), kTolBf16}};
  if (with_halo && nh > 0) {
    outputs.push_back({"dhalo", rel_rms(dhalo.download(), rounded(dhalo_ref)), kTolBf16});
  }
  const double ms_b = big ? ctx.time_ms(backward) : -1;
  ctx.report("causal_conv1d.backward", shape, outputs, ms_b, big ? tbps(6.0 * n, ms_b) : "");
}

}  // namespace

void test_conv(Context& ctx) {
  conv_case(ctx, 3, 37, 21, 4, true, false);   // channels not a multiple of 8
  conv_case(ctx, 2, 5, 16, 4, false, false);   // a sequence shorter than a slab
  conv_case(ctx, 2, 3, 16, 4, true, false);    // shorter than the halo
  conv_case(ctx, 1, 300, 40, 3, true, false);  // several slabs, another width
  conv_case(ctx, 2, 70, 24, 1, false, false);  // width 1: no halo rows
  conv_case(ctx, 1, 100, 8, 8, true, false);   // the widest supported
  // The backward's partition: several blocks of channels and of time, ends inside a block's
  // last sub-slab and inside a batch of loads; channels a multiple of 4 but not 8, not of 4.
  conv_case(ctx, 2, 1001, 136, 4, true, false);
  conv_case(ctx, 1, 515, 260, 4, true, false);
  conv_case(ctx, 2, 333, 130, 4, false, false);
  conv_case(ctx, 1, 700, 24, 8, true, false);
  conv_case(ctx, 1, 50000, 8, 4, true, false);  // long: more steps per sub-slab
  if (!ctx.options().big) return;
  // granite-4.0-h-tiny's conv: conv_dim 3328 (d_in 3072 + 2 x 128), width 4, 8192 tokens.
  conv_case(ctx, 1, 8192, 3328, 4, false, true);
  conv_case(ctx, 1, 8192, 3328, 4, true, true);
  conv_case(ctx, 2, 4096, 3328, 4, true, true);
}

}  // namespace hcp::cuda::test
