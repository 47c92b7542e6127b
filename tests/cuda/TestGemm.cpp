// gemm (cuBLASLt) against hcp::cpu::gemm.
#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>

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
  int64_t pad = 0;  // extra elements in every row stride
};

template <typename TC>
void run_case(Context& ctx, const GemmCase& g, bool big) {
  const std::string name = std::string(std::is_same_v<TC, float> ? "gemm.f32c" : "gemm") +
                           (g.label.empty() ? "" : " " + g.label);
  if (!ctx.wants("gemm")) return;
  // A row stride is at least 1 even for an empty row (k == 0), as cuBLASLt requires.
  const int64_t lda = std::max<int64_t>(1, g.ta ? g.m : g.k) + g.pad,
                ldb = std::max<int64_t>(1, g.tb ? g.k : g.n) + g.pad, ldc = g.n + g.pad;
  const int64_t a_rows = g.ta ? g.k : g.m, b_rows = g.tb ? g.n : g.k;
  const std::vector<float> a = randn(a_rows * lda, ctx.seed(), 1.f);
  const std::vector<float> b = randn(b_rows * ldb, ctx.seed(), 1.f);
  // C's old contents matter only when beta != 0.
  const std::vector<float> c0 = g.beta != 0.f
                                    ? randn(g.m * ldc, ctx.seed(), 1.f, std::is_same_v<TC, bf16>)
                                    : std::vector<float>();
  Dev<bf16> da = to_device<bf16>(a), db = to_device<bf16>(b);
  Dev<TC> dc(g.m * ldc);
  if (g.beta == 0.f) {
    dc.poison();  // beta == 0 must not read C
  } else {
    dc.upload(c0);
  }
  auto launch = [&] {
    check(gemm<TC>(ctx.gemm(), ctx.stream(), g.ta, g.tb, g.m, g.n, g.k, g.alpha, da.get(), lda,
                   db.get(), ldb, g.beta, dc.get(), ldc));
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
          cpu::gemm<float>(g.ta, g.tb, 1, g.n, g.k, g.alpha, a_i, lda, b.data(), ldb, g.beta,
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
  ctx.report(name, shape, {{"C", std::max(rel_rms(got, ref), unwritten), tol}}, ms, rate);
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
  run_case<bf16>(ctx, {"bucket", false, true, 70, 64, 48}, false);
  run_case<bf16>(ctx, {"bucket", false, true, 100, 64, 48}, false);
  run_case<bf16>(ctx, {"bucket dW", true, false, 64, 48, 70}, false);
  run_case<bf16>(ctx, {"bucket dW", true, false, 64, 48, 100}, false);
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
}

}  // namespace hcp::cuda::test
