// Shared helpers for the CPU kernel tests: seeded random data, scalar projections, and the
// central finite-difference check every backward kernel goes through.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace hcp::cpu::testing {

using Vec = std::vector<double>;

inline Vec random_vec(std::mt19937& rng, int64_t n, double lo = -1.0, double hi = 1.0) {
  std::uniform_real_distribution<double> dist(lo, hi);
  Vec v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// sum_i r_i * out_i: the scalar whose gradient with respect to out is r.
inline double project(const Vec& r, const Vec& out) {
  EXPECT_EQ(r.size(), out.size());
  double acc = 0.0;
  for (size_t i = 0; i < r.size(); i++) acc += r[i] * out[i];
  return acc;
}

// Largest |a - b| / max(1, |b|): relative for large values, absolute for small ones.
inline double max_rel_diff(const Vec& a, const Vec& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0.0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); i++) {
    double err = std::abs(a[i] - b[i]) / std::max(1.0, std::abs(b[i]));
    if (!(err <= worst)) worst = err;  // also catches NaN
  }
  return worst;
}

inline double max_abs(const Vec& v) {
  double m = 0.0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

// Checks `analytic` against central finite differences of `objective` with respect to every
// element of `param` (perturbed in place and restored). The error of one element is
// |fd - analytic| / max(1, |analytic|). A gradient that is zero everywhere would make the check
// vacuous, so that fails too unless the caller says zero is expected.
inline double expect_gradient(const std::string& name, Vec& param, const Vec& analytic,
                              const std::function<double()>& objective, double tol = 1e-6,
                              bool allow_zero = false) {
  EXPECT_EQ(param.size(), analytic.size()) << name;
  const double eps = 1e-6;
  double worst = 0.0;
  size_t worst_index = 0;
  Vec fd(param.size());
  for (size_t i = 0; i < param.size(); i++) {
    const double saved = param[i];
    param[i] = saved + eps;
    const double up = objective();
    param[i] = saved - eps;
    const double down = objective();
    param[i] = saved;
    fd[i] = (up - down) / (2.0 * eps);
    const double err = std::abs(fd[i] - analytic[i]) / std::max(1.0, std::abs(analytic[i]));
    if (!(err <= worst)) {
      worst = err;
      worst_index = i;
    }
  }
  EXPECT_LT(worst, tol) << name << ": worst at element " << worst_index << " analytic "
                        << analytic[worst_index] << " finite difference " << fd[worst_index];
  if (!allow_zero) {
    EXPECT_GT(max_abs(analytic), 1e-3) << name << ": gradient is all zero";
  }
  std::printf("[   fd     ] %-40s worst relative error %.3g over %zu elements\n", name.c_str(),
              worst, param.size());
  return worst;
}

// Conversions for the float-versus-double checks.
// Elementwise a + b and a - b (same sizes).
inline Vec add(const Vec& a, const Vec& b) {
  Vec out(a.size());
  for (size_t i = 0; i < a.size(); i++) out[i] = a[i] + b[i];
  return out;
}
inline Vec sub(const Vec& a, const Vec& b) {
  Vec out(a.size());
  for (size_t i = 0; i < a.size(); i++) out[i] = a[i] - b[i];
  return out;
}
inline std::vector<float> to_float(const Vec& v) { return std::vector<float>(v.begin(), v.end()); }
inline Vec to_double(const std::vector<float>& v) { return Vec(v.begin(), v.end()); }

// ||a - b|| / ||b||.
inline double rel_rms(const Vec& a, const Vec& b) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < a.size(); i++) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

}  // namespace hcp::cpu::testing
