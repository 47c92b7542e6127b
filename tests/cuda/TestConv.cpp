// Causal depthwise conv1d with halo, forward and backward, against runtime/kernels/cpu.
#include <algorithm>
#include <cmath>
#include <string>

#include "runtime/kernels/cpu/Kernels.h"
#include "tests/cuda/Harness.h"

namespace hcp::cuda::test {
namespace {

// bf16 out: one rounding of an fp32 result (dx: sums of `width` terms; dw, dbias: fp32 sums over
// batch x seq in fixed slabs).
constexpr double kTolBf16 = 4e-3;
// With the SiLU folded in, the conv output is rounded to bf16 before the SiLU (as the separate
// steps store it), and that error reaches the result times silu'(v) v / silu(v), above 1 for
// negative v (1.5 at v = -1); then the SiLU output (or its gradient) and the result are rounded
// again. Measured 2.4-3.3e-3 on the shapes below.
constexpr double kTolSilu = 6e-3;

std::vector<float> rounded(std::vector<float> v) {
  for (float& x : v) x = round_bf16(x);
  return v;
}

// With `silu` (the SiLU folded in, hcp-fuse-conv-silu): y = silu(conv), and the backward takes
// silu's output gradient. Against the oracle's conv and silu in fp32 (kTolSilu), and against the
// separate GPU steps (conv, then silu.forward / silu.backward of the stored conv), which must
// give the same bits. With `documents` (the longest document; 0: none), rows of packed
// documents, each row's first one begun before it where there is a halo.
void conv_case(Context& ctx, int64_t batch, int64_t seq, int64_t channels, int64_t width,
               bool with_halo, bool big, bool silu = false, int32_t documents = 0) {
  if (!ctx.wants("causal_conv1d")) return;
  const std::string shape = shape_str({batch, seq, channels}) + " w" + std::to_string(width) +
                            (with_halo ? " halo" : "") + (silu ? " silu" : "") +
                            (documents > 0 ? " documents" : "");
  const int64_t n = batch * seq * channels, nh = batch * (width - 1) * channels;
  const double tol = silu ? kTolSilu : kTolBf16;
  const std::vector<float> x = randn(n, ctx.seed(), 1.f);
  const std::vector<float> w = randn(channels * width, ctx.seed(), 0.5f);
  const std::vector<float> bias = randn(channels, ctx.seed(), 0.5f);
  const std::vector<float> halo = randn(nh, ctx.seed(), 1.f);
  const std::vector<float> dy = randn(n, ctx.seed(), 1.f);
  const std::vector<int32_t> positions =
      documents > 0 ? packed_positions(batch, seq, ctx.seed(), documents, with_halo ? 2 : 0)
                    : std::vector<int32_t>();
  const Dev<int32_t> d_positions = to_device_i32(positions);
  const int32_t* positions_ptr = documents > 0 ? d_positions.get() : nullptr;
  const int32_t* positions_host = documents > 0 ? positions.data() : nullptr;
  Dev<bf16> d_x = to_device<bf16>(x), d_w = to_device<bf16>(w), d_bias = to_device<bf16>(bias),
            d_halo = to_device<bf16>(halo), d_dy = to_device<bf16>(dy);
  Dev<bf16> y(n), dx(n), dhalo(nh), dw(channels * width), dbias(channels);
  const bf16* halo_ptr = with_halo ? d_halo.get() : nullptr;
  const float* halo_host = with_halo ? halo.data() : nullptr;

  std::vector<float> y_ref(n), dx_ref(n), dhalo_ref(nh), dw_ref(channels * width),
      dbias_ref(channels), dconv_ref(n);
  cpu::causal_conv1d_forward<float>(y_ref.data(), x.data(), halo_host, w.data(), bias.data(), batch,
                                    seq, channels, width, positions_host);
  const float* dy_ref = dy.data();
  if (silu) {
    cpu::silu_backward<float>(dconv_ref.data(), dy.data(), y_ref.data(), n);
    cpu::silu_forward<float>(y_ref.data(), y_ref.data(), n);
    dy_ref = dconv_ref.data();
  }
  cpu::causal_conv1d_backward<float>(dx_ref.data(), dhalo_ref.data(), dw_ref.data(),
                                     dbias_ref.data(), dy_ref, x.data(), halo_host, w.data(), batch,
                                     seq, channels, width, positions_host);

  y.poison();
  auto forward = [&] {
    check(causal_conv1d_forward(ctx.stream(), y.get(), d_x.get(), halo_ptr, d_w.get(), d_bias.get(),
                                batch, seq, channels, width, silu, positions_ptr));
  };
  forward();
  ctx.sync();
  const std::vector<float> y_got = y.download();
  std::vector<Output> forward_outputs = {{"y", rel_rms(y_got, rounded(y_ref)), tol}};
  // The separate steps on the GPU: the conv, then silu.forward and silu.backward of it.
  Dev<bf16> conv(n), dconv(n);
  if (silu) {
    conv.poison();
    dconv.poison();
    check(causal_conv1d_forward(ctx.stream(), conv.get(), d_x.get(), halo_ptr, d_w.get(),
                                d_bias.get(), batch, seq, channels, width, false, positions_ptr));
    check(silu_backward<bf16>(ctx.stream(), dconv.get(), d_dy.get(), conv.get(), n));
    check(silu_forward<bf16>(ctx.stream(), conv.get(), conv.get(), n));
    ctx.sync();
    forward_outputs.push_back({"y vs separate steps", max_abs_diff(y_got, conv.download()), 0.0});
  }
  const double ms_f = big ? ctx.time_ms(forward) : -1;
  ctx.report("causal_conv1d.forward", shape, forward_outputs, ms_f, big ? tbps(4.0 * n, ms_f) : "");

  Dev<uint8_t> ws = scratch(causal_conv1d_backward_workspace_bytes(batch, seq, channels, width));
  auto backward_into = [&](bf16* dx_out, bf16* dhalo_out, bf16* dw_out, bf16* dbias_out,
                           const bf16* grad, bool fused) {
    check(causal_conv1d_backward(ctx.stream(), dx_out, with_halo ? dhalo_out : nullptr, dw_out,
                                 dbias_out, grad, d_x.get(), halo_ptr, d_w.get(), d_bias.get(),
                                 batch, seq, channels, width, fused, ws.workspace(),
                                 positions_ptr));
  };
  dx.poison();
  dhalo.poison();
  dw.poison();
  dbias.poison();
  auto backward = [&] {
    backward_into(dx.get(), dhalo.get(), dw.get(), dbias.get(), d_dy.get(), silu);
  };
  backward();
  ctx.sync();
  const std::vector<float> dx_got = dx.download(), dw_got = dw.download(),
                           dbias_got = dbias.download(), dhalo_got = dhalo.download();
  std::vector<Output> outputs = {{"dx", rel_rms(dx_got, rounded(dx_ref)), tol},
                                 {"dw", rel_rms(dw_got, rounded(dw_ref)), tol},
                                 {"dbias", rel_rms(dbias_got, rounded(dbias_ref)), tol}};
  if (with_halo && nh > 0) {
    outputs.push_back({"dhalo", rel_rms(dhalo_got, rounded(dhalo_ref)), tol});
  }
  if (silu) {
    // The plain backward of the separate silu.backward's output.
    Dev<bf16> dx2(n), dhalo2(nh), dw2(channels * width), dbias2(channels);
    for (Dev<bf16>* d : {&dx2, &dhalo2, &dw2, &dbias2}) d->poison();
    backward_into(dx2.get(), dhalo2.get(), dw2.get(), dbias2.get(), dconv.get(), false);
    ctx.sync();
    double differ =
        std::max({max_abs_diff(dx_got, dx2.download()), max_abs_diff(dw_got, dw2.download()),
                  max_abs_diff(dbias_got, dbias2.download())});
    if (with_halo) differ = std::max(differ, max_abs_diff(dhalo_got, dhalo2.download()));
    outputs.push_back({"all vs separate steps", differ, 0.0});
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
  // The SiLU folded in (hcp-fuse-conv-silu), with and without a halo.
  conv_case(ctx, 3, 37, 21, 4, true, false, true);
  conv_case(ctx, 2, 1001, 136, 4, false, false, true);
  conv_case(ctx, 1, 300, 40, 3, true, false, true);
  // Packed documents: some shorter than the window, the first begun in the halo's segment.
  conv_case(ctx, 3, 37, 21, 4, true, false, false, 9);
  conv_case(ctx, 2, 1001, 136, 4, false, false, false, 40);
  conv_case(ctx, 2, 1001, 136, 4, true, false, true, 40);
  conv_case(ctx, 1, 700, 24, 8, true, false, false, 6);
  if (!ctx.options().big) return;
  // granite-4.0-h-tiny's conv: conv_dim 3328 (d_in 3072 + 2 x 128), width 4, 8192 tokens.
  conv_case(ctx, 1, 8192, 3328, 4, false, true);
  conv_case(ctx, 1, 8192, 3328, 4, true, true);
  conv_case(ctx, 2, 4096, 3328, 4, true, true);
  conv_case(ctx, 1, 8192, 3328, 4, false, true, true);
  // Documents of up to 1,024 tokens: the masks' cost.
  conv_case(ctx, 1, 8192, 3328, 4, false, true, true, 1024);
}

}  // namespace hcp::cuda::test
