// RMSNorm and gated RMSNorm, forward and backward, against runtime/kernels/cpu.
#include <string>

#include "runtime/kernels/cpu/Kernels.h"
#include "tests/cuda/Harness.h"

namespace hcp::cuda::test {
namespace {

// bf16 outputs: one rounding of an fp32 result (row reductions in fp32 are ~1e-6 relative).
constexpr double kTolBf16 = 4e-3;
// rstd in fp32: the fp32 sum of squares in another order than the oracle's double.
constexpr double kTolRstd = 1e-5;
constexpr float kEps = 1e-5f;

std::vector<float> rounded(std::vector<float> v) {
  for (float& x : v) x = round_bf16(x);
  return v;
}

void rms_case(Context& ctx, int64_t rows, int64_t dim, bool misalign, bool big) {
  if (!ctx.wants("rms_norm")) return;
  const std::string shape = shape_str({rows, dim}) + (misalign ? " misaligned" : "");
  const int64_t off = misalign ? 1 : 0;
  // Inputs with a non-unit scale and a weight around 1.
  std::vector<float> x = randn(rows * dim + off, ctx.seed(), 2.f);
  std::vector<float> w = randu(dim + off, ctx.seed(), 0.5f, 1.5f);
  std::vector<float> dy = randn(rows * dim + off, ctx.seed(), 1.f);
  Dev<bf16> dx_in = to_device<bf16>(x), dw_in = to_device<bf16>(w), ddy = to_device<bf16>(dy);
  Dev<bf16> y(rows * dim + off), dx(rows * dim + off), dw(dim + off);
  Dev<float> rstd(rows);
  const bf16 *xp = dx_in.get() + off, *wp = dw_in.get() + off, *dyp = ddy.get() + off;
  x.erase(x.begin(), x.begin() + off);
  w.erase(w.begin(), w.begin() + off);
  dy.erase(dy.begin(), dy.begin() + off);

  // Oracle forward (its rstd also feeds both backwards, so they see the same input).
  std::vector<float> y_ref(rows * dim), rstd_ref(rows), dx_ref(rows * dim), dw_ref(dim);
  cpu::rms_norm_forward<float>(y_ref.data(), rstd_ref.data(), x.data(), w.data(), rows, dim, kEps);
  cpu::rms_norm_backward<float>(dx_ref.data(), dw_ref.data(), dy.data(), x.data(), w.data(),
                                rstd_ref.data(), rows, dim);
  auto strip = [off](std::vector<float> v) {
    v.erase(v.begin(), v.begin() + off);
    return v;
  };

  y.poison();
  rstd.poison();
  auto forward = [&] {
    check(rms_norm_forward(ctx.stream(), y.get() + off, rstd.get(), xp, wp, rows, dim, kEps));
  };
  forward();
  ctx.sync();
  const double ms_f = big ? ctx.time_ms(forward) : -1;
  ctx.report("rms_norm.forward", shape,
             {{"y", rel_rms(strip(y.download()), rounded(y_ref)), kTolBf16},
              {"rstd", rel_rms(rstd.download(), rstd_ref), kTolRstd}},
             ms_f, big ? tbps(2.0 * 2 * rows * dim, ms_f) : "");

  // Backward with the saved rstd, (odd shapes) with rstd recomputed from eps, and with the
  // residual stream's gradient added to dx (rounded once: the reference is the fp32 sum of the
  // bf16 residual and the fp32 gradient).
  Dev<float> rstd_saved(rows);
  rstd_saved.upload(rstd_ref);
  Dev<uint8_t> ws = scratch(rms_norm_backward_workspace_bytes(rows, dim));
  std::vector<float> residual = rounded(randn(rows * dim + off, ctx.seed(), 1.f));
  Dev<bf16> dresidual = to_device<bf16>(residual);
  std::vector<float> dx_sum_ref = strip(residual);
  for (int64_t i = 0; i < rows * dim; ++i) dx_sum_ref[i] += dx_ref[i];
  enum Variant { kSaved, kRecomputed, kResidual };
  for (Variant variant : {kSaved, kRecomputed, kResidual}) {
    if (big && variant == kRecomputed) continue;
    const bool saved = variant != kRecomputed, summed = variant == kResidual;
    dx.poison();
    dw.poison();
    auto backward = [&] {
      check(rms_norm_backward(ctx.stream(), dx.get() + off, dw.get() + off, dyp, xp, wp,
                              summed ? dresidual.get() + off : nullptr,
                              saved ? rstd_saved.get() : nullptr, rows, dim, kEps, ws.workspace()));
    };
    backward();
    ctx.sync();
    const double ms_b = big ? ctx.time_ms(backward) : -1;
    const char* name = variant == kSaved        ? "rms_norm.backward"
                       : variant == kRecomputed ? "rms_norm.backward (rstd recomputed)"
                                                : "rms_norm.backward (+ residual)";
    ctx.report(
        name, shape,
        {{"dx", rel_rms(strip(dx.download()), rounded(summed ? dx_sum_ref : dx_ref)), kTolBf16},
         {"dw", rel_rms(strip(dw.download()), rounded(dw_ref)), kTolBf16}},
        ms_b, big ? tbps(2.0 * (summed ? 4 : 3) * rows * dim, ms_b) : "");
  }
}

void gated_case(Context& ctx, int64_t rows, int64_t dim, bool misalign, bool big) {
  if (!ctx.wants("gated_rms_norm")) return;
  const std::string shape = shape_str({rows, dim}) + (misalign ? " misaligned" : "");
  const int64_t off = misalign ? 1 : 0;
  std::vector<float> yv = randn(rows * dim + off, ctx.seed(), 1.f);
  std::vector<float> z = randn(rows * dim + off, ctx.seed(), 2.f);
  std::vector<float> w = randu(dim + off, ctx.seed(), 0.5f, 1.5f);
  std::vector<float> dout = randn(rows * dim + off, ctx.seed(), 1.f);
  Dev<bf16> d_y = to_device<bf16>(yv), d_z = to_device<bf16>(z), d_w = to_device<bf16>(w),
            d_dout = to_device<bf16>(dout);
  Dev<bf16> out(rows * dim + off), dy(rows * dim + off), dz(rows * dim + off), dw(dim + off);
  Dev<float> rstd(rows);
  for (auto* v : {&yv, &z, &w, &dout}) v->erase(v->begin(), v->begin() + off);
  const bf16 *yp = d_y.get() + off, *zp = d_z.get() + off, *wp = d_w.get() + off,
             *doutp = d_dout.get() + off;
  auto strip = [off](std::vector<float> v) {
    v.erase(v.begin(), v.begin() + off);
    return v;
  };

  std::vector<float> out_ref(rows * dim), rstd_ref(rows), dy_ref(rows * dim), dz_ref(rows * dim),
      dw_ref(dim);
  cpu::gated_rms_norm_forward<float>(out_ref.data(), rstd_ref.data(), yv.data(), z.data(), w.data(),
                                     rows, dim, kEps);
  cpu::gated_rms_norm_backward<float>(dy_ref.data(), dz_ref.data(), dw_ref.data(), dout.data(),
                                      yv.data(), z.data(), w.data(), rstd_ref.data(), rows, dim);

  out.poison();
  rstd.poison();
  auto forward = [&] {
    check(gated_rms_norm_forward(ctx.stream(), out.get() + off, rstd.get(), yp, zp, wp, rows, dim,
                                 kEps));
  };
  forward();
  ctx.sync();
  const double ms_f = big ? ctx.time_ms(forward) : -1;
  ctx.report("gated_rms_norm.forward", shape,
             {{"out", rel_rms(strip(out.download()), rounded(out_ref)), kTolBf16},
              {"rstd", rel_rms(rstd.download(), rstd_ref), kTolRstd}},
             ms_f, big ? tbps(2.0 * 3 * rows * dim, ms_f) : "");

  Dev<float> rstd_saved(rows);
  rstd_saved.upload(rstd_ref);
  Dev<uint8_t> ws = scratch(gated_rms_norm_backward_workspace_bytes(rows, dim));
  for (bool saved : {true, false}) {
    if (big && !saved) continue;
    dy.poison();
    dz.poison();
    dw.poison();
    auto backward = [&] {
      check(gated_rms_norm_backward(ctx.stream(), dy.get() + off, dz.get() + off, dw.get() + off,
                                    doutp, yp, zp, wp, saved ? rstd_saved.get() : nullptr, rows,
                                    dim, kEps, ws.workspace()));
    };
    backward();
    ctx.sync();
    const double ms_b = big ? ctx.time_ms(backward) : -1;
    ctx.report(saved ? "gated_rms_norm.backward" : "gated_rms_norm.backward (rstd recomputed)",
               shape,
               {{"dy", rel_rms(strip(dy.download()), rounded(dy_ref)), kTolBf16},
                {"dz", rel_rms(strip(dz.download()), rounded(dz_ref)), kTolBf16},
                {"dw", rel_rms(strip(dw.download()), rounded(dw_ref)), kTolBf16}},
               ms_b, big ? tbps(2.0 * 5 * rows * dim, ms_b) : "");
  }
}

}  // namespace

void test_norms(Context& ctx) {
  // Odd: dims not a multiple of 8 (element-wise path), misaligned; one row; a dim above 8192
  // (teams of 16 and 32 warps, wider than a block of the smaller dims).
  rms_case(ctx, 37, 100, true, false);
  rms_case(ctx, 1, 1536, false, false);
  rms_case(ctx, 5, 12000, false, false);
  rms_case(ctx, 3, 30000, false, false);
  gated_case(ctx, 33, 77, true, false);
  gated_case(ctx, 4, 12000, false, false);
  gated_case(ctx, 2000, 64, false, false);  // more rows than the backward's partial blocks
  // Unaligned rows shared by teams of 2 and 4 warps, several rows per team in the backward.
  rms_case(ctx, 2000, 1540, true, false);
  gated_case(ctx, 600, 3000, true, false);
  if (!ctx.options().big) return;
  // granite-4.0-h-tiny (hidden 1536, d_in 3072) and -small (hidden 4096, d_in 8192), 8192 tokens.
  rms_case(ctx, 8192, 1536, false, true);
  rms_case(ctx, 8192, 4096, false, true);
  gated_case(ctx, 8192, 3072, false, true);
  gated_case(ctx, 8192, 8192, false, true);
}

}  // namespace hcp::cuda::test
