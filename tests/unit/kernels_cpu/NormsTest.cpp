// RMSNorm and gated RMSNorm: forward against the formula, backward against finite differences.
#include <cmath>

#include "runtime/kernels/cpu/Kernels.h"
#include "tests/unit/kernels_cpu/TestUtil.h"

namespace hcp::cpu {
namespace {

using testing::Vec;

double silu(double z) { return z / (1.0 + std::exp(-z)); }

TEST(RmsNorm, ForwardMatchesFormula) {
  std::mt19937 rng(20);
  const int64_t rows = 4, dim = 6;
  const double eps = 1e-5;
  Vec x = testing::random_vec(rng, rows * dim), w = testing::random_vec(rng, dim);
  Vec y(rows * dim), rstd(rows);
  rms_norm_forward<double>(y.data(), rstd.data(), x.data(), w.data(), rows, dim, eps);
  for (int64_t r = 0; r < rows; r++) {
    double ms = 0.0;
    for (int64_t c = 0; c < dim; c++) ms += x[r * dim + c] * x[r * dim + c] / dim;
    const double expected_rstd = 1.0 / std::sqrt(ms + eps);
    EXPECT_NEAR(rstd[r], expected_rstd, 1e-12);
    for (int64_t c = 0; c < dim; c++) {
      EXPECT_NEAR(y[r * dim + c], x[r * dim + c] * expected_rstd * w[c], 1e-12);
    }
  }
}

TEST(RmsNorm, BackwardMatchesFiniteDifferences) {
  std::mt19937 rng(21);
  const int64_t rows = 3, dim = 5;
  const double eps = 1e-5;
  Vec x = testing::random_vec(rng, rows * dim), w = testing::random_vec(rng, dim);
  Vec r = testing::random_vec(rng, rows * dim);
  auto objective = [&] {
    Vec y(rows * dim), rstd(rows);
    rms_norm_forward<double>(y.data(), rstd.data(), x.data(), w.data(), rows, dim, eps);
    return testing::project(r, y);
  };
  Vec y(rows * dim, NAN), rstd(rows, NAN), dx(rows * dim, NAN), dw(dim, NAN);
  rms_norm_forward<double>(y.data(), rstd.data(), x.data(), w.data(), rows, dim, eps);
  rms_norm_backward<double>(dx.data(), dw.data(), r.data(), x.data(), w.data(), rstd.data(), rows,
                            dim);
  testing::expect_gradient("rms_norm dx", x, dx, objective);
  testing::expect_gradient("rms_norm dw", w, dw, objective);
}

TEST(GatedRmsNorm, ForwardGatesBeforeNorm) {
  std::mt19937 rng(22);
  const int64_t rows = 3, dim = 6;
  const double eps = 1e-5;
  Vec y = testing::random_vec(rng, rows * dim), z = testing::random_vec(rng, rows * dim, -3, 3);
  Vec w = testing::random_vec(rng, dim), out(rows * dim), rstd(rows);
  gated_rms_norm_forward<double>(out.data(), rstd.data(), y.data(), z.data(), w.data(), rows, dim,
                                 eps);
  for (int64_t r = 0; r < rows; r++) {
    Vec u(dim);
    double ms = 0.0;
    for (int64_t c = 0; c < dim; c++) {
      u[c] = y[r * dim + c] * silu(z[r * dim + c]);
      ms += u[c] * u[c] / dim;
    }
    const double expected_rstd = 1.0 / std::sqrt(ms + eps);
    EXPECT_NEAR(rstd[r], expected_rstd, 1e-12);
    for (int64_t c = 0; c < dim; c++)
      EXPECT_NEAR(out[r * dim + c], u[c] * expected_rstd * w[c], 1e-12);
  }
}

TEST(GatedRmsNorm, BackwardMatchesFiniteDifferences) {
  std::mt19937 rng(23);
  const int64_t rows = 3, dim = 5;
  const double eps = 1e-5;
  Vec y = testing::random_vec(rng, rows * dim), z = testing::random_vec(rng, rows * dim, -3, 3);
  Vec w = testing::random_vec(rng, dim), r = testing::random_vec(rng, rows * dim);
  auto objective = [&] {
    Vec out(rows * dim), rstd(rows);
    gated_rms_norm_forward<double>(out.data(), rstd.data(), y.data(), z.data(), w.data(), rows, dim,
                                   eps);
    return testing::project(r, out);
  };
  Vec out(rows * dim, NAN), rstd(rows, NAN), dy(rows * dim, NAN), dz(rows * dim, NAN), dw(dim, NAN);
  gated_rms_norm_forward<double>(out.data(), rstd.data(), y.data(), z.data(), w.data(), rows, dim,
                                 eps);
  gated_rms_norm_backward<double>(dy.data(), dz.data(), dw.data(), r.data(), y.data(), z.data(),
                                  w.data(), rstd.data(), rows, dim);
  testing::expect_gradient("gated_rms_norm dy", y, dy, objective);
  testing::expect_gradient("gated_rms_norm dz", z, dz, objective);
  testing::expect_gradient("gated_rms_norm dw", w, dw, objective);
}

}  // namespace
}  // namespace hcp::cpu
