// gemm against a naive product, for every transpose combination and padded strides, and as the
// backward of a linear layer.
#include <limits>

#include "runtime/kernels/cpu/Kernels.h"
#include "tests/unit/kernels_cpu/TestUtil.h"

namespace hcp::cpu {
namespace {

using testing::Vec;

// op(X)[r, c] for X stored with row stride ld.
double op_at(const Vec& x, bool trans, int64_t ld, int64_t r, int64_t c) {
  return trans ? x[c * ld + r] : x[r * ld + c];
}

TEST(Gemm, MatchesNaiveForAllTransposes) {
  std::mt19937 rng(1);
  const int64_t m = 3, n = 4, k = 5;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      // Stored shapes: A is [m, k] or [k, m]; B is [k, n] or [n, k]; two padding columns each.
      const int64_t a_rows = ta ? k : m, a_cols = ta ? m : k;
      const int64_t b_rows = tb ? n : k, b_cols = tb ? k : n;
      const int64_t lda = a_cols + 2, ldb = b_cols + 2, ldc = n + 2;
      Vec a = testing::random_vec(rng, a_rows * lda), b = testing::random_vec(rng, b_rows * ldb);
      Vec c0 = testing::random_vec(rng, m * ldc);
      Vec c = c0;
      const double alpha = 1.5, beta = -0.5;
      gemm<double>(ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
      for (int64_t i = 0; i < m; i++) {
        for (int64_t j = 0; j < ldc; j++) {
          double expected = c0[i * ldc + j];  // padding columns stay untouched
          if (j < n) {
            double acc = 0.0;
            for (int64_t p = 0; p < k; p++)
              acc += op_at(a, ta, lda, i, p) * op_at(b, tb, ldb, p, j);
            expected = alpha * acc + beta * c0[i * ldc + j];
          }
          EXPECT_NEAR(c[i * ldc + j], expected, 1e-12) << "ta=" << ta << " tb=" << tb;
        }
      }
    }
  }
}

// The blocked product sums each element in the order of the plain definition, so in float it
// equals, bit for bit, one double accumulator per element over p = 0..k-1: for shapes that cut
// blocks unevenly, every transpose, beta 0 and not. And a row's value does not depend on m (a
// context-parallel split changes m).
TEST(Gemm, BlockedEqualsPlainSumBitForBit) {
  std::mt19937 rng(3);
  struct Shape {
    int64_t m, n, k;
  };
  for (const Shape& s : {Shape{1, 1, 1}, Shape{5, 67, 3}, Shape{9, 130, 17}, Shape{4, 64, 100}}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        const int64_t lda = (ta ? s.m : s.k) + 1, ldb = (tb ? s.k : s.n) + 3, ldc = s.n + 2;
        const std::vector<float> a =
            testing::to_float(testing::random_vec(rng, (ta ? s.k : s.m) * lda));
        const std::vector<float> b =
            testing::to_float(testing::random_vec(rng, (tb ? s.n : s.k) * ldb));
        const std::vector<float> c0 = testing::to_float(testing::random_vec(rng, s.m * ldc));
        for (float beta : {0.0f, 0.75f}) {
          std::vector<float> c = c0;
          gemm<float>(ta, tb, s.m, s.n, s.k, 1.25f, a.data(), lda, b.data(), ldb, beta, c.data(),
                      ldc);
          for (int64_t i = 0; i < s.m; i++) {
            for (int64_t j = 0; j < s.n; j++) {
              double acc = 0.0;
              for (int64_t p = 0; p < s.k; p++) {
                const float a_ip = ta ? a[p * lda + i] : a[i * lda + p];
                const float b_pj = tb ? b[j * ldb + p] : b[p * ldb + j];
                acc += static_cast<double>(a_ip) * static_cast<double>(b_pj);
              }
              double want = 1.25 * acc;
              if (beta != 0.0f) want += static_cast<double>(beta) * c0[i * ldc + j];
              ASSERT_EQ(c[i * ldc + j], static_cast<float>(want))
                  << "m=" << s.m << " n=" << s.n << " k=" << s.k << " ta=" << ta << " tb=" << tb
                  << " beta=" << beta << " at " << i << "," << j;
            }
          }
          // The last row alone (m = 1) gives the same bits as within the whole product.
          if (!ta && beta == 0.0f) {
            std::vector<float> last(s.n);
            gemm<float>(false, tb, 1, s.n, s.k, 1.25f, a.data() + (s.m - 1) * lda, lda, b.data(),
                        ldb, 0.0f, last.data(), s.n);
            for (int64_t j = 0; j < s.n; j++) ASSERT_EQ(last[j], c[(s.m - 1) * ldc + j]);
          }
        }
      }
    }
  }
}

TEST(Gemm, BetaZeroIgnoresOldContents) {
  std::mt19937 rng(2);
  const int64_t m = 2, n = 3, k = 4;
  Vec a = testing::random_vec(rng, m * k), b = testing::random_vec(rng, k * n);
  Vec c(m * n, std::numeric_limits<double>::quiet_NaN());
  gemm<double>(false, false, m, n, k, 1.0, a.data(), k, b.data(), n, 0.0, c.data(), n);
  for (int64_t i = 0; i < m; i++) {
    for (int64_t j = 0; j < n; j++) {
      double acc = 0.0;
      for (int64_t p = 0; p < k; p++) acc += a[i * k + p] * b[p * n + j];
      EXPECT_NEAR(c[i * n + j], acc, 1e-12);
    }
  }
}

// A linear layer y = x W^T lowers to gemm(false, true); its backward to dx = dy W
// (gemm(false, false)) and dW = dy^T x (gemm(true, false)).
TEST(Gemm, LinearBackwardMatchesFiniteDifferences) {
  std::mt19937 rng(3);
  const int64_t rows = 3, in = 4, out = 5;
  Vec x = testing::random_vec(rng, rows * in), w = testing::random_vec(rng, out * in);
  Vec r = testing::random_vec(rng, rows * out);
  auto objective = [&] {
    Vec y(rows * out);
    gemm<double>(false, true, rows, out, in, 1.0, x.data(), in, w.data(), in, 0.0, y.data(), out);
    return testing::project(r, y);
  };
  Vec dx(rows * in), dw(out * in);
  gemm<double>(false, false, rows, in, out, 1.0, r.data(), out, w.data(), in, 0.0, dx.data(), in);
  gemm<double>(true, false, out, in, rows, 1.0, r.data(), out, x.data(), in, 0.0, dw.data(), in);
  testing::expect_gradient("linear dx", x, dx, objective);
  testing::expect_gradient("linear dw", w, dw, objective);
}

}  // namespace
}  // namespace hcp::cpu
