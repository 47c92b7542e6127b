// gemm and gemm_add (cuBLASLt) against hcp::cpu::gemm.
#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "runtime/kernels/cpu/Kernels.h"
#include "tests/cuda/Harness.h"

namespace hcp::cuda::test {
namespace {

// bf16 C: one rounding of the fp32 result; bf16 keeps 8 significant bits, so a rounding is at
// most 2^-9 relative (RMS ~1.1e-3 over many values).
constexpr double kTolBf16 = 4e-3;
// fp32 C: the products of bf16 operands are exact in fp32, only the fp32 sums round.
constexpr double kTolF32 = 1e-4;
// Rows of C checked against the oracle for the large shapes (the oracle is a triple loop).
constexpr int kSampleRows = 12;

struct GemmCase {
  std::string label;
  bool ta, tb;
  int64_t m, n, k;
  float alpha = 1.f, beta = 0.f;
  int64_t pad = 0;   // extra elements in every row stride
  bool add = false;  // gemm_add: C = alpha op(A) op(B) + an addend of C's layout (C poisoned)
  float addend_scale = 1.f;  // gemm_add's beta: what the addend is multiplied by
};

template <typename TC>
void run_case(Context& ctx, const GemmCase& g, bool big) {
  const std::string name = std::string(g.add ? "gemm_add" : "gemm") +
                           (std::is_same_v<TC, float> ? ".f32c" : "") +
                           (g.label.empty() ? "" : " " + g.label);
  const float beta = g.add ? g.addend_scale : g.beta;  // what the oracle adds of C's old contents
  if (!ctx.wants("gemm")) return;
  // A row stride is at least 1 even for an empty row (k == 0), as cuBLASLt requires.
  const int64_t lda = std::max<int64_t>(1, g.ta ? g.m : g.k) + g.pad,
                ldb = std::max<int64_t>(1, g.tb ? g.k : g.n) + g.pad, ldc = g.n + g.pad;
  const int64_t a_rows = g.ta ? g.k : g.m, b_rows = g.tb ? g.n : g.k;
  const std::vector<float> a = randn(a_rows * lda, ctx.seed(), 1.f);
  const std::vector<float> b = randn(b_rows * ldb, ctx.seed(), 1.f);
  // C's old contents (gemm_add's addend) matter only when beta != 0.
  const std::vector<float> c0 = beta != 0.f
                                    ? randn(g.m * ldc, ctx.seed(), 1.f, std::is_same_v<TC, bf16>)
                                    : std::vector<float>();
  Dev<bf16> da = to_device<bf16>(a), db = to_device<bf16>(b);
  Dev<TC> dc(g.m * ldc);
  Dev<TC> addend(g.add ? g.m * ldc : 1);
  if (g.add) addend.upload(c0);
  if (g.beta == 0.f) {
    dc.poison();  // beta == 0 must not read C, nor gemm_add (C is only its output)
  } else {
    dc.upload(c0);
  }
  auto launch = [&] {
    if (g.add) {
      check(gemm_add<TC>(ctx.gemm(), ctx.stream(), g.ta, g.tb, g.m, g.n, g.k, g.alpha, da.get(),
                         lda, db.get(), ldb, g.addend_scale, addend.get(), dc.get(), ldc));
    } else {
      check(gemm<TC>(ctx.gemm(), ctx.stream(), g.ta, g.tb, g.m, g.n, g.k, g.alpha, da.get(), lda,
                     db.get(), ldb, g.beta, dc.get(), ldc));
    }
  };
  launch();
  ctx.sync();
  const std::vector<float> out = dc.download();

  std::vector<int64_t> rows;
  if (big) {
    rows = {0, g.m - 1};
    for (int32_t r : randint(kSampleRows - 2, ctx.seed(), 0, static_cast<int32_t>(g.m))) {
      rows.push_back(r);
    }
  } else {
    for (int64_t r = 0; r < g.m; r++) rows.push_back(r);
  }
  std::vector<float> got(rows.size() * g.n), ref(rows.size() * g.n);
  parallel_for(
      static_cast<int64_t>(rows.size()),
      [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; r++) {
          const int64_t i = rows[r];
          std::vector<float> c(ldc, 0.f);
          if (!c0.empty()) std::copy(c0.begin() + i * ldc, c0.begin() + (i + 1) * ldc, c.begin());
          const float* a_i = g.ta ? a.data() + i : a.data() + i * lda;
          cpu::gemm<float>(g.ta, g.tb, 1, g.n, g.k, g.alpha, a_i, lda, b.data(), ldb, beta,
                           c.data(), ldc);
          std::copy(c.begin(), c.begin() + g.n, ref.begin() + r * g.n);
          std::copy(out.begin() + i * ldc, out.begin() + i * ldc + g.n, got.begin() + r * g.n);
        }
      },
      1);
  // Every element of C's m x n part written (finite), not just the sampled rows.
  double unwritten = 0;
  for (int64_t i = 0; i < g.m && unwritten == 0; i++) {
    for (int64_t j = 0; j < g.n; j++) {
      if (!std::isfinite(out[i * ldc + j])) unwritten = INFINITY;
    }
  }
  const double tol = std::is_same_v<TC, float> ? kTolF32 : kTolBf16;
  double ms = -1;
  std::string rate;
  if (big) {
    ms = ctx.time_ms(launch);
    rate = tflops(2.0 * g.m * g.n * g.k, ms);
  }
  const std::string shape = shape_str({g.m, g.n, g.k}) + (g.ta ? " T" : " N") + (g.tb ? "T" : "N");
  std::vector<Output> metrics = {{"C", std::max(rel_rms(got, ref), unwritten), tol}};
  // gemm_add reads its addend and leaves it as it was (bit for bit: c0 is representable in TC).
  if (g.add) metrics.push_back({"addend kept", addend.download() == c0 ? 0.0 : INFINITY, 0.0});
  ctx.report(name, shape, metrics, ms, rate);
}

// gemm_group: independent products, some with no rows (k = 0 zeroes C), spread over the
// context's lanes, against gemm() of the same problems (itself checked against the oracle
// above). A lane's product may run another algorithm (planned for its share of the SMs), whose
// fp32 sums round differently before the one bf16 rounding: kTolBf16, as against the oracle.
// `experts` products of `rows[e]` x n x k (forward-like) and their k = rows[e] weight-gradient
// twins, as the MoE experts issue them.
void group_case(Context& ctx, const std::vector<int64_t>& rows, int64_t n, int64_t k, bool big) {
  if (!ctx.wants("gemm")) return;
  int64_t total = 0;
  for (int64_t r : rows) total += r;
  const std::vector<float> a = randn(std::max<int64_t>(total, 1) * k, ctx.seed(), 1.f);
  const std::vector<float> w = randn(rows.size() * n * k, ctx.seed(), 1.f);
  const std::vector<float> g = randn(std::max<int64_t>(total, 1) * n, ctx.seed(), 1.f);
  Dev<bf16> da = to_device<bf16>(a), dw = to_device<bf16>(w), dg = to_device<bf16>(g);
  const int64_t out_elems = std::max<int64_t>(total, 1) * n;
  const int64_t grad_elems = static_cast<int64_t>(rows.size()) * k * n;
  Dev<bf16> grouped_out(out_elems), single_out(out_elems), grouped_grad(grad_elems),
      single_grad(grad_elems);
  for (Dev<bf16>* d : {&grouped_out, &single_out, &grouped_grad, &single_grad}) d->poison();
  // out[rows of e] = a[rows of e] w[e]^T; grad[e] = a[rows of e]^T g[rows of e].
  auto problems = [&](bf16* out, bf16* grad) {
    std::vector<GemmProblem> list;
    int64_t r0 = 0;
    for (size_t e = 0; e < rows.size(); ++e) {
      if (rows[e] > 0) {
        list.push_back({.trans_b = true,
                        .m = rows[e],
                        .n = n,
                        .k = k,
                        .a = da.get() + r0 * k,
                        .lda = k,
                        .b = dw.get() + e * n * k,
                        .ldb = k,
                        .c = out + r0 * n,
                        .ldc = n});
      }
      list.push_back({.trans_a = true,
                      .m = k,
                      .n = n,
                      .k = rows[e],
                      .a = da.get() + r0 * k,
                      .lda = k,
                      .b = dg.get() + r0 * n,
                      .ldb = n,
                      .c = grad + e * k * n,
                      .ldc = n});
      r0 += rows[e];
    }
    return list;
  };
  const std::vector<GemmProblem> grouped = problems(grouped_out.get(), grouped_grad.get());
  const std::vector<GemmProblem> single = problems(single_out.get(), single_grad.get());
  auto launch = [&] { check(gemm_group<bf16>(ctx.gemm(), ctx.stream(), grouped)); };
  launch();
  for (const GemmProblem& p : single) {
    check(gemm<bf16>(ctx.gemm(), ctx.stream(), p.trans_a, p.trans_b, p.m, p.n, p.k, p.alpha, p.a,
                     p.lda, p.b, p.ldb, p.beta, p.c, p.ldc));
  }
  ctx.sync();
  std::vector<float> got_out = grouped_out.download(), ref_out = single_out.download();
  if (total == 0) got_out = ref_out = std::vector<float>(1, 0.f);  // no rows: nothing written
  double flops = 0;
  for (int64_t r : rows) flops += 4.0 * r * n * k;
  double ms = -1;
  std::string rate;
  if (big) {
    ms = ctx.time_ms(launch);
    rate = tflops(flops, ms);
  }
  ctx.report("gemm_group",
             std::to_string(rows.size()) + " x (~" +
                 std::to_string(total / std::max<size_t>(rows.size(), 1)) + ")x" +
                 shape_str({n, k}),
             {{"out", rel_rms(got_out, ref_out), kTolBf16},
              {"grad", rel_rms(grouped_grad.download(), single_grad.download()), kTolBf16}},
             ms, rate);
}

// The algorithm tuning (on by default, so every case above runs a tuned first call): a
// strided-batched product shaped like the experts' (K = 512, wide N) and a padded one give the
// same bits through the harness's tuned context as through one that keeps the heuristic's first
// pick: on the call that times the candidates, on the cached algorithm's next call, and for 64
// more rows (another bucket of the same tuning family: its bits checked, not timed).
void tuning_case(Context& ctx, int64_t batch, int64_t m, int64_t n, int64_t k, int64_t pad) {
  if (!ctx.wants("gemm")) return;
  const int64_t rows = m + 64, lda = k + pad, ldb = k + pad, ldc = n + pad;
  const std::vector<float> a = randn(batch * rows * lda, ctx.seed(), 1.f);
  const std::vector<float> b = randn(batch * n * ldb, ctx.seed(), 1.f);
  Dev<bf16> da = to_device<bf16>(a), db = to_device<bf16>(b);
  Dev<bf16> tuned(batch * rows * ldc), plain(batch * rows * ldc);
  GemmContext* untuned = nullptr;
  check(gemm_context_create(&untuned));
  gemm_context_set_tuning(untuned, false);
  auto product = [&](GemmContext* gc, Dev<bf16>& c, int64_t r) {
    const GemmProblem p{.trans_b = true,
                        .m = r,
                        .n = n,
                        .k = k,
                        .a = da.get(),
                        .lda = lda,
                        .b = db.get(),
                        .ldb = ldb,
                        .c = c.get(),
                        .ldc = ldc};
    check(gemm_strided_batched<bf16>(gc, ctx.stream(), p, batch, r * lda, n * ldb, r * ldc));
  };
  // The products' elements (not the padding past each row's n, never written).
  auto written = [&](const Dev<bf16>& c, int64_t total_rows) {
    const std::vector<float> all = c.download();
    std::vector<float> out;
    for (int64_t i = 0; i < total_rows; i++) {
      out.insert(out.end(), all.begin() + i * ldc, all.begin() + i * ldc + n);
    }
    return out;
  };
  std::vector<Output> outputs;
  for (const auto& [call, r] :
       {std::pair<const char*, int64_t>{"first call", m}, {"cached", m}, {"64 rows more", rows}}) {
    tuned.poison();
    plain.poison();
    product(ctx.gemm(), tuned, r);
    product(untuned, plain, r);
    ctx.sync();
    outputs.push_back({std::string("bits, ") + call,
                       max_abs_diff(written(tuned, batch * r), written(plain, batch * r)), 0.0});
  }
  // gemm_add with an addend other than its output is tuned too.
  const std::vector<float> addend_values = randn(m * ldc, ctx.seed(), 1.f);
  Dev<bf16> addend = to_device<bf16>(addend_values);
  for (const auto& [call, gc, out] :
       {std::tuple<const char*, GemmContext*, Dev<bf16>*>{"tuned", ctx.gemm(), &tuned},
        {"plain", untuned, &plain}}) {
    out->poison();
    check(gemm_add<bf16>(gc, ctx.stream(), false, true, m, n, k, 0.5f, da.get(), lda, db.get(), ldb,
                         0.75f, addend.get(), out->get(), ldc));
  }
  ctx.sync();
  outputs.push_back({"bits, gemm_add", max_abs_diff(written(tuned, m), written(plain, m)), 0.0});
  gemm_context_destroy(untuned);
  ctx.report("gemm tuning", std::to_string(batch) + " x " + shape_str({m, n, k}), outputs, -1, "");
}

}  // namespace

void test_gemm(Context& ctx) {
  // Small and odd: every transpose pair, padded strides, beta, k == 0, MoE-like row counts that
  // share an algorithm-cache bucket.
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      run_case<bf16>(ctx, {"odd", ta, tb, 37, 53, 29, 1.f, 0.f, 3}, false);
    }
  }
  run_case<float>(ctx, {"odd beta", true, true, 37, 53, 29, 1.5f, 0.5f, 1}, false);
  run_case<float>(ctx, {"odd", false, false, 33, 17, 65, 1.f, 0.f, 0}, false);
  run_case<bf16>(ctx, {"k=0", false, true, 5, 7, 0, 1.f, 0.f, 0}, false);
  // gemm_add (hcp-fuse-gemm-epilogue's residual adds and gradient sums): odd shapes and strides,
  // both C types, k == 0 (the addend copied).
  for (bool ta : {false, true}) {
    run_case<bf16>(ctx, {"odd", ta, !ta, 37, 53, 29, 0.5f, 0.f, 3, true}, false);
  }
  run_case<float>(ctx, {"odd", true, false, 33, 17, 65, 1.f, 0.f, 1, true}, false);
  run_case<bf16>(ctx, {"k=0", false, true, 5, 7, 0, 1.f, 0.f, 0, true}, false);
  // The addend scaled too (a residual multiplier folded into alpha and beta).
  run_case<bf16>(ctx, {"odd beta", false, true, 37, 53, 29, 0.22f, 0.f, 3, true, 0.22f}, false);
  run_case<float>(ctx, {"odd beta", true, false, 33, 17, 65, 0.5f, 0.f, 1, true, 0.25f}, false);
  run_case<bf16>(ctx, {"bucket", false, true, 70, 64, 48}, false);
  run_case<bf16>(ctx, {"bucket", false, true, 100, 64, 48}, false);
  run_case<bf16>(ctx, {"bucket dW", true, false, 64, 48, 70}, false);
  run_case<bf16>(ctx, {"bucket dW", true, false, 64, 48, 100}, false);
  group_case(ctx, {37, 0, 70, 5, 64, 1, 0, 100, 33}, 48, 40, false);
  group_case(ctx, {0, 0}, 16, 8, false);
  tuning_case(ctx, 8, 192, 1536, 512, 0);
  tuning_case(ctx, 3, 77, 300, 136, 8);
  if (!ctx.options().big) return;
  // granite-4.0-h-tiny, 8192 tokens: Mamba in_proj forward and both backward products, out_proj,
  // the vocabulary projection, the router (fp32 logits), a weight-gradient accumulation, and the
  // 8192^3 square of the peers' anchor table.
  run_case<bf16>(ctx, {"in_proj", false, true, 8192, 6448, 1536}, true);
  run_case<bf16>(ctx, {"in_proj dx", false, false, 8192, 1536, 6448}, true);
  run_case<bf16>(ctx, {"in_proj dW", true, false, 6448, 1536, 8192}, true);
  run_case<bf16>(ctx, {"out_proj", false, true, 8192, 1536, 3072}, true);
  run_case<bf16>(ctx, {"lm_head", false, true, 8192, 100352, 1536}, true);
  run_case<bf16>(ctx, {"square", false, true, 8192, 8192, 8192}, true);
  run_case<float>(ctx, {"router", false, true, 8192, 64, 1536}, true);
  run_case<float>(ctx, {"dW accumulate", true, false, 1536, 3072, 8192, 1.f, 1.f}, true);
  // A layer's residual (hidden + multiplier * out_proj) and in_proj's dx added to the residual
  // gradient, as gemm_add runs them.
  run_case<bf16>(ctx, {"residual", false, true, 8192, 1536, 3072, 0.22f, 0.f, 0, true}, true);
  run_case<bf16>(ctx, {"in_proj dx", false, false, 8192, 1536, 6448, 1.f, 0.f, 0, true}, true);
  // The MoE block's output: (shared MLP product + experts' output) times the multiplier.
  run_case<bf16>(ctx, {"moe block", false, true, 8192, 1536, 1024, 0.22f, 0.f, 0, true, 0.22f},
                 true);
  // The tiny MoE layer's expert products: 64 experts x ~768 rows (8192 tokens, top-6).
  group_case(ctx, std::vector<int64_t>(64, 768), 1024, 1536, true);
}

}  // namespace hcp::cuda::test
