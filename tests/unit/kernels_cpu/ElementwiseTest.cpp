// Elementwise ops, broadcasts, slices and SwiGLU: forward against direct formulas, backward
// against finite differences.
#include <cmath>

#include "runtime/kernels/cpu/Kernels.h"
#include "tests/unit/kernels_cpu/TestUtil.h"

namespace hcp::cpu {
namespace {

using testing::Vec;

TEST(Elementwise, SiluForwardAndBackward) {
  std::mt19937 rng(10);
  Vec x = testing::random_vec(rng, 17, -6.0, 6.0), r = testing::random_vec(rng, 17);
  Vec y(x.size());
  silu_forward<double>(y.data(), x.data(), x.size());
  for (size_t i = 0; i < x.size(); i++) EXPECT_NEAR(y[i], x[i] / (1.0 + std::exp(-x[i])), 1e-14);
  auto objective = [&] {
    Vec out(x.size());
    silu_forward<double>(out.data(), x.data(), x.size());
    return testing::project(r, out);
  };
  Vec dx(x.size());
  silu_backward<double>(dx.data(), r.data(), x.data(), x.size());
  testing::expect_gradient("silu dx", x, dx, objective);
}

TEST(Elementwise, SoftplusUsesTorchThreshold) {
  Vec x = {-30.0, -2.0, 0.0, 3.0, 19.5, 20.0, 20.5, 40.0};
  Vec y(x.size());
  softplus_forward<double>(y.data(), x.data(), x.size());
  for (size_t i = 0; i < x.size(); i++) {
    const double expected = x[i] > 20.0 ? x[i] : std::log(1.0 + std::exp(x[i]));
    EXPECT_NEAR(y[i], expected, 1e-14) << "x = " << x[i];
  }
  // Above the threshold the output is x itself, not log1p(exp(x)) (which differs by ~exp(-x)).
  EXPECT_EQ(y[6], 20.5);
  EXPECT_EQ(y[7], 40.0);
}

TEST(Elementwise, SoftplusBackward) {
  std::mt19937 rng(11);
  Vec x = testing::random_vec(rng, 12, -5.0, 5.0);
  x.push_back(21.0);  // identity branch: gradient exactly dy
  x.push_back(35.0);
  Vec r = testing::random_vec(rng, x.size());
  auto objective = [&] {
    Vec out(x.size());
    softplus_forward<double>(out.data(), x.data(), x.size());
    return testing::project(r, out);
  };
  Vec dx(x.size());
  softplus_backward<double>(dx.data(), r.data(), x.data(), x.size());
  EXPECT_EQ(dx[x.size() - 1], r[x.size() - 1]);
  testing::expect_gradient("softplus dx", x, dx, objective);
}

TEST(Elementwise, AddAndScale) {
  std::mt19937 rng(12);
  Vec a = testing::random_vec(rng, 9), b = testing::random_vec(rng, 9), y(9), z(9);
  add<double>(y.data(), a.data(), b.data(), 9);
  scale<double>(z.data(), a.data(), -2.5, 9);
  for (int i = 0; i < 9; i++) {
    EXPECT_EQ(y[i], a[i] + b[i]);
    EXPECT_EQ(z[i], a[i] * -2.5);
  }
}

TEST(Elementwise, NegExpForwardAndBackward) {
  std::mt19937 rng(13);
  Vec x = testing::random_vec(rng, 8, -2.0, 2.0), r = testing::random_vec(rng, 8), y(8);
  neg_exp_forward<double>(y.data(), x.data(), 8);
  for (int i = 0; i < 8; i++) EXPECT_NEAR(y[i], -std::exp(x[i]), 1e-14);
  auto objective = [&] {
    Vec out(8);
    neg_exp_forward<double>(out.data(), x.data(), 8);
    return testing::project(r, out);
  };
  Vec dx(8);
  neg_exp_backward<double>(dx.data(), r.data(), y.data(), 8);
  testing::expect_gradient("neg_exp dx", x, dx, objective);
}

TEST(Elementwise, BiasAddAndColumnSum) {
  std::mt19937 rng(14);
  const int64_t rows = 4, cols = 5;
  Vec x = testing::random_vec(rng, rows * cols), bias = testing::random_vec(rng, cols);
  Vec r = testing::random_vec(rng, rows * cols), y(rows * cols);
  bias_add_forward<double>(y.data(), x.data(), bias.data(), rows, cols);
  for (int64_t i = 0; i < rows; i++) {
    for (int64_t c = 0; c < cols; c++) EXPECT_EQ(y[i * cols + c], x[i * cols + c] + bias[c]);
  }
  auto objective = [&] {
    Vec out(rows * cols);
    bias_add_forward<double>(out.data(), x.data(), bias.data(), rows, cols);
    return testing::project(r, out);
  };
  Vec dbias(cols);
  column_sum<double>(dbias.data(), r.data(), rows, cols);
  testing::expect_gradient("bias_add dbias (column_sum)", bias, dbias, objective);
}

TEST(Elementwise, SliceColumnsAndBackward) {
  std::mt19937 rng(15);
  const int64_t rows = 3, in_cols = 7, offset = 2, width = 3;
  Vec in = testing::random_vec(rng, rows * in_cols), out(rows * width);
  slice_columns<double>(out.data(), in.data(), rows, in_cols, offset, width);
  for (int64_t i = 0; i < rows; i++) {
    for (int64_t c = 0; c < width; c++) EXPECT_EQ(out[i * width + c], in[i * in_cols + offset + c]);
  }
  Vec r = testing::random_vec(rng, rows * width);
  auto objective = [&] {
    Vec o(rows * width);
    slice_columns<double>(o.data(), in.data(), rows, in_cols, offset, width);
    return testing::project(r, o);
  };
  // The other columns belong to other slices: they must be left as they are.
  Vec din(rows * in_cols, 7.0);
  slice_columns_backward<double>(din.data(), r.data(), rows, in_cols, offset, width);
  for (int64_t i = 0; i < rows; i++) {
    for (int64_t c = 0; c < in_cols; c++) {
      if (c < offset || c >= offset + width) {
        EXPECT_EQ(din[i * in_cols + c], 7.0);
      }
    }
  }
  Vec full(rows * in_cols, 0.0);
  slice_columns_backward<double>(full.data(), r.data(), rows, in_cols, offset, width);
  testing::expect_gradient("slice_columns din", in, full, objective);
}

TEST(Elementwise, SwigluForwardAndBackward) {
  std::mt19937 rng(16);
  const int64_t rows = 3, inner = 4;
  Vec x = testing::random_vec(rng, rows * 2 * inner, -3.0, 3.0);
  Vec r = testing::random_vec(rng, rows * inner), y(rows * inner);
  swiglu_forward<double>(y.data(), x.data(), rows, inner);
  for (int64_t i = 0; i < rows; i++) {
    for (int64_t c = 0; c < inner; c++) {
      const double a = x[i * 2 * inner + c], b = x[i * 2 * inner + inner + c];
      EXPECT_NEAR(y[i * inner + c], a / (1.0 + std::exp(-a)) * b, 1e-14);
    }
  }
  auto objective = [&] {
    Vec out(rows * inner);
    swiglu_forward<double>(out.data(), x.data(), rows, inner);
    return testing::project(r, out);
  };
  Vec dx(x.size());
  swiglu_backward<double>(dx.data(), r.data(), x.data(), rows, inner);
  testing::expect_gradient("swiglu dx", x, dx, objective);
}

}  // namespace
}  // namespace hcp::cpu
