// The on-device halves of the context-parallel collectives (CollectiveKernels.h): ring
// attention's log-sum-exp merge against the CPU oracle's attention_merge, the fp32 gradient sums,
// and one Mamba state-passing segment at a time against the recurrence of KernelTable.txt's
// state_scan, evaluated in double on the host.
#include <cmath>
#include <limits>
#include <string>

#include "runtime/kernels/cpu/Kernels.h"
#include "runtime/kernels/cuda/CollectiveKernels.h"
#include "tests/cuda/Harness.h"

namespace hcp::cuda::test {
namespace {

// fp32 arithmetic (expf, logf and a multiply-add per element) against the oracle's double:
// a few fp32 ulps, ~1e-6 relative. The part's output is bf16 on both sides (exact inputs).
constexpr double kTolMerge = 1e-5;
// The sums add bf16 values into fp32 in the same order as the host: exact up to fp32 rounding.
constexpr double kTolSum = 1e-6;
// The state carry runs in fp32 over a few segments (the reference in double): ~1e-6 relative
// per segment. dg is a dot product of pn values in double, rounded once.
constexpr double kTolState = 1e-5;

// Merges a part of `len` rows into the second half of a running result of 2*len rows (a window
// with lse stride 2*len), some rows of the part empty (lse -inf), as ring attention does for a
// zigzag rank's second segment.
void merge_case(Context& ctx, int64_t len, int64_t heads, int64_t dim) {
  if (!ctx.wants("attention_merge")) return;
  const int64_t seq = 2 * len, row = heads * dim;
  std::vector<float> acc_out = randn(seq * row, ctx.seed(), 1.f, false);
  std::vector<float> acc_lse = randn(heads * seq, ctx.seed(), 2.f, false);
  const std::vector<float> part_out = randn(len * row, ctx.seed(), 1.f);  // bf16 values
  std::vector<float> part_lse = randn(heads * len, ctx.seed(), 2.f, false);
  for (int64_t h = 0; h < heads; ++h) {
    part_lse[h * len] = -INFINITY;           // a row that saw no key of this block
    acc_lse[h * seq + len + 1] = -INFINITY;  // a row that has seen nothing yet
    for (int64_t d = 0; d < dim; ++d) acc_out[(len + 1) * row + h * dim + d] = 0.f;
  }
  Dev<float> d_acc_out = to_device<float>(acc_out), d_acc_lse = to_device<float>(acc_lse);
  Dev<bf16> d_part_out = to_device<bf16>(part_out);
  Dev<float> d_part_lse = to_device<float>(part_lse);
  check(attention_merge(ctx.stream(), d_acc_out.get() + len * row, d_acc_lse.get() + len, seq,
                        d_part_out.get(), d_part_lse.get(), len, heads, dim));
  ctx.sync();
  // The oracle merges whole [1, seq] arrays: the part's first half empty.
  std::vector<double> ref_out(acc_out.begin(), acc_out.end());
  std::vector<double> ref_lse(acc_lse.begin(), acc_lse.end());
  std::vector<double> full_out(seq * row, 0.0), full_lse(heads * seq, -INFINITY);
  for (int64_t i = 0; i < len; ++i) {
    for (int64_t c = 0; c < row; ++c) full_out[(len + i) * row + c] = part_out[i * row + c];
  }
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < len; ++i) full_lse[h * seq + len + i] = part_lse[h * len + i];
  }
  cpu::attention_merge<double>(ref_out.data(), ref_lse.data(), full_out.data(), full_lse.data(), 1,
                               seq, heads, dim);
  ctx.report("attention_merge", shape_str({len, heads, dim}),
             {{"out", rel_rms(d_acc_out.download(), {ref_out.begin(), ref_out.end()}), kTolMerge},
              {"lse", rel_rms(d_acc_lse.download(), {ref_lse.begin(), ref_lse.end()}), kTolMerge}});
}

void accumulate_case(Context& ctx, int64_t n) {
  if (!ctx.wants("accumulate")) return;
  const std::vector<float> y = randn(n, ctx.seed(), 1.f, false), x = randn(n, ctx.seed(), 1.f);
  Dev<float> d_y = to_device<float>(y);
  Dev<bf16> d_x = to_device<bf16>(x);
  check(accumulate(ctx.stream(), d_y.get(), d_x.get(), n));
  std::vector<float> ref(n);
  for (int64_t i = 0; i < n; ++i) ref[i] = y[i] + x[i];
  ctx.report("accumulate", shape_str({n}), {{"y", rel_rms(d_y.download(), ref), kTolSum}});
}

// Walks `segs` local segments in order (forward) and back (backward), as one rank holding the
// whole sequence would; segment `foreign` is walked as another rank's (nothing written for it).
void state_pass_case(Context& ctx, int64_t batch, int64_t segs, int64_t heads, int64_t pn,
                     int64_t foreign) {
  if (!ctx.wants("state_pass")) return;
  const int64_t gn = batch * segs * heads, sn = gn * pn, rn = batch * heads * pn;
  const std::vector<float> g = randu(gn, ctx.seed(), -3.f, 0.f, false);
  const std::vector<float> s = randn(sn, ctx.seed(), 1.f, false);
  const std::vector<float> ds_in = randn(sn, ctx.seed(), 1.f, false);
  Dev<float> d_g = to_device<float>(g), d_s = to_device<float>(s),
             d_ds_in = to_device<float>(ds_in);
  Dev<float> s_in(sn), run(rn), dg(gn), ds(sn);
  for (Dev<float>* d : {&s_in, &dg, &ds}) d->poison();
  check(fill<float>(ctx.stream(), run.get(), 0.f, rn));
  for (int64_t k = 0; k < segs; ++k) {
    check(state_pass_forward(ctx.stream(), k == foreign ? nullptr : s_in.get(), run.get(),
                             d_g.get(), d_s.get(), batch, segs, k, heads, pn));
  }
  const std::vector<float> final_run = run.download();
  // The backward's s_in: the forward's (the foreign segment's, unwritten, is never read).
  check(fill<float>(ctx.stream(), run.get(), 0.f, rn));
  for (int64_t k = segs - 1; k >= 0; --k) {
    const bool mine = k != foreign;
    check(state_pass_backward(ctx.stream(), mine ? dg.get() : nullptr, mine ? ds.get() : nullptr,
                              run.get(), d_g.get(), d_ds_in.get(), mine ? s_in.get() : nullptr,
                              batch, segs, k, heads, pn));
  }
  const std::vector<float> first_grad = run.download();

  // The recurrence in double: s_in[k+1] = e^g[k] s_in[k] + s[k]; G[k] = ds_in[k] + e^g[k] G[k+1].
  std::vector<float> s_in_ref(sn, 0.f), final_ref(rn), dg_ref(gn, 0.f), ds_ref(sn, 0.f),
      first_ref(rn);
  std::vector<float> s_in_got = s_in.download(), dg_got = dg.download(), ds_got = ds.download();
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      std::vector<double> carry(pn, 0.0), states(segs * pn);
      for (int64_t k = 0; k < segs; ++k) {
        const int64_t gi = (b * segs + k) * heads + h;
        for (int64_t i = 0; i < pn; ++i) {
          states[k * pn + i] = carry[i];
          carry[i] = std::exp(static_cast<double>(g[gi])) * carry[i] + s[gi * pn + i];
        }
      }
      for (int64_t i = 0; i < pn; ++i) final_ref[(b * heads + h) * pn + i] = carry[i];
      std::vector<double> grad(pn, 0.0);
      for (int64_t k = segs - 1; k >= 0; --k) {
        const int64_t gi = (b * segs + k) * heads + h;
        const double decay = std::exp(static_cast<double>(g[gi]));
        double dot = 0.0;
        for (int64_t i = 0; i < pn; ++i) dot += states[k * pn + i] * grad[i];
        for (int64_t i = 0; i < pn; ++i) {
          if (k != foreign) {
            s_in_ref[gi * pn + i] = static_cast<float>(states[k * pn + i]);
            ds_ref[gi * pn + i] = static_cast<float>(grad[i]);
          }
          grad[i] = ds_in[gi * pn + i] + decay * grad[i];
        }
        if (k != foreign) dg_ref[gi] = static_cast<float>(decay * dot);
      }
      for (int64_t i = 0; i < pn; ++i) first_ref[(b * heads + h) * pn + i] = grad[i];
    }
  }
  // The foreign segment's outputs are not written: compare them as zeros on both sides.
  if (foreign >= 0) {
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t gi = (b * segs + foreign) * heads + h;
        dg_got[gi] = 0.f;
        for (int64_t i = 0; i < pn; ++i) s_in_got[gi * pn + i] = ds_got[gi * pn + i] = 0.f;
      }
    }
  }
  const std::string shape = shape_str({batch, segs, heads, pn});
  ctx.report("state_pass.forward", shape,
             {{"s_in", rel_rms(s_in_got, s_in_ref), kTolState},
              {"carry", rel_rms(final_run, final_ref), kTolState}});
  ctx.report("state_pass.backward", shape,
             {{"dg", rel_rms(dg_got, dg_ref), kTolState},
              {"ds", rel_rms(ds_got, ds_ref), kTolState},
              {"carry", rel_rms(first_grad, first_ref), kTolState}});
}

}  // namespace

void test_collective_kernels(Context& ctx) {
  merge_case(ctx, 37, 3, 64);
  merge_case(ctx, 256, 12, 128);
  accumulate_case(ctx, 100003);
  // Granite 4.0-H shapes per segment: head_dim 64 x state 128 = 8192 per head.
  state_pass_case(ctx, 2, 3, 5, 300, /*foreign=*/1);
  state_pass_case(ctx, 1, 4, 48, 8192, /*foreign=*/-1);
}

}  // namespace hcp::cuda::test
