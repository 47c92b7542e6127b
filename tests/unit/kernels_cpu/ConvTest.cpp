// Causal depthwise conv1d: forward against a padded direct convolution (with and without a
// halo), backward against finite differences, and the context-parallel split (halo forward,
// halo gradient backward) against one whole run.
#include "runtime/kernels/cpu/Kernels.h"
#include "tests/unit/kernels_cpu/TestUtil.h"

namespace hcp::cpu {
namespace {

using testing::Vec;

struct ConvCase {
  int64_t batch, seq, channels, width;
};

// Direct convolution over [halo rows | x rows] (zeros for the halo when there is none).
Vec naive_conv(const Vec& x, const Vec* halo, const Vec& w, const Vec& bias, const ConvCase& c) {
  const int64_t pad = c.width - 1;
  Vec y(c.batch * c.seq * c.channels);
  for (int64_t b = 0; b < c.batch; b++) {
    Vec padded((pad + c.seq) * c.channels, 0.0);
    for (int64_t t = 0; t < pad; t++) {
      for (int64_t ch = 0; ch < c.channels; ch++) {
        if (halo != nullptr) padded[t * c.channels + ch] = (*halo)[(b * pad + t) * c.channels + ch];
      }
    }
    for (int64_t t = 0; t < c.seq; t++) {
      for (int64_t ch = 0; ch < c.channels; ch++) {
        padded[(pad + t) * c.channels + ch] = x[(b * c.seq + t) * c.channels + ch];
      }
    }
    for (int64_t t = 0; t < c.seq; t++) {
      for (int64_t ch = 0; ch < c.channels; ch++) {
        double acc = bias[ch];
        for (int64_t j = 0; j < c.width; j++)
          acc += w[ch * c.width + j] * padded[(t + j) * c.channels + ch];
        y[(b * c.seq + t) * c.channels + ch] = acc;
      }
    }
  }
  return y;
}

TEST(CausalConv1d, ForwardMatchesDirectConvolution) {
  std::mt19937 rng(30);
  // The last case is shorter than the halo: outputs read halo rows only.
  for (ConvCase c : {ConvCase{2, 7, 3, 4}, ConvCase{1, 5, 2, 2}, ConvCase{2, 2, 3, 4}}) {
    Vec x = testing::random_vec(rng, c.batch * c.seq * c.channels);
    Vec halo = testing::random_vec(rng, c.batch * (c.width - 1) * c.channels);
    Vec w = testing::random_vec(rng, c.channels * c.width),
        bias = testing::random_vec(rng, c.channels);
    Vec y(x.size());
    causal_conv1d_forward<double>(y.data(), x.data(), nullptr, w.data(), bias.data(), c.batch,
                                  c.seq, c.channels, c.width);
    EXPECT_LT(testing::max_rel_diff(y, naive_conv(x, nullptr, w, bias, c)), 1e-14) << "no halo";
    causal_conv1d_forward<double>(y.data(), x.data(), halo.data(), w.data(), bias.data(), c.batch,
                                  c.seq, c.channels, c.width);
    EXPECT_LT(testing::max_rel_diff(y, naive_conv(x, &halo, w, bias, c)), 1e-14) << "halo";
  }
}

TEST(CausalConv1d, BackwardMatchesFiniteDifferences) {
  std::mt19937 rng(31);
  const ConvCase c{2, 6, 3, 4};
  Vec x = testing::random_vec(rng, c.batch * c.seq * c.channels);
  Vec halo = testing::random_vec(rng, c.batch * (c.width - 1) * c.channels);
  Vec w = testing::random_vec(rng, c.channels * c.width),
      bias = testing::random_vec(rng, c.channels);
  Vec r = testing::random_vec(rng, x.size());
  for (bool with_halo : {true, false}) {
    const double* h = with_halo ? halo.data() : nullptr;
    auto objective = [&] {
      Vec y(x.size());
      causal_conv1d_forward<double>(y.data(), x.data(), h, w.data(), bias.data(), c.batch, c.seq,
                                    c.channels, c.width);
      return testing::project(r, y);
    };
    Vec dx(x.size(), NAN), dhalo(halo.size(), NAN), dw(w.size(), NAN), dbias(bias.size(), NAN);
    causal_conv1d_backward<double>(dx.data(), with_halo ? dhalo.data() : nullptr, dw.data(),
                                   dbias.data(), r.data(), x.data(), h, w.data(), c.batch, c.seq,
                                   c.channels, c.width);
    const std::string tag = with_halo ? " (halo)" : " (no halo)";
    testing::expect_gradient("conv dx" + tag, x, dx, objective);
    testing::expect_gradient("conv dw" + tag, w, dw, objective);
    testing::expect_gradient("conv dbias" + tag, bias, dbias, objective);
    if (with_halo) testing::expect_gradient("conv dhalo", halo, dhalo, objective);
  }
}

// Rows [0, s) and [s, S) as two ranks: the second reads the first's last width-1 rows as halo;
// backward, the halo gradient is added into the tail of the first's input gradient.
TEST(CausalConv1d, SplitWithHaloEqualsWhole) {
  std::mt19937 rng(32);
  const int64_t batch = 2, seq = 9, channels = 3, width = 4, split = 5, pad = width - 1;
  Vec x = testing::random_vec(rng, batch * seq * channels);
  Vec w = testing::random_vec(rng, channels * width), bias = testing::random_vec(rng, channels);
  Vec dy = testing::random_vec(rng, x.size());
  auto rows = [&](const Vec& v, int64_t from, int64_t to) {
    Vec out;
    for (int64_t b = 0; b < batch; b++) {
      out.insert(out.end(), v.begin() + (b * seq + from) * channels,
                 v.begin() + (b * seq + to) * channels);
    }
    return out;
  };
  Vec y(x.size()), dx(x.size()), dw(w.size()), dbias(channels);
  causal_conv1d_forward<double>(y.data(), x.data(), nullptr, w.data(), bias.data(), batch, seq,
                                channels, width);
  causal_conv1d_backward<double>(dx.data(), nullptr, dw.data(), dbias.data(), dy.data(), x.data(),
                                 nullptr, w.data(), batch, seq, channels, width);

  const int64_t s1 = split, s2 = seq - split;
  Vec x1 = rows(x, 0, split), x2 = rows(x, split, seq), halo = rows(x, split - pad, split);
  Vec dy1 = rows(dy, 0, split), dy2 = rows(dy, split, seq);
  Vec y1(x1.size()), y2(x2.size());
  causal_conv1d_forward<double>(y1.data(), x1.data(), nullptr, w.data(), bias.data(), batch, s1,
                                channels, width);
  causal_conv1d_forward<double>(y2.data(), x2.data(), halo.data(), w.data(), bias.data(), batch, s2,
                                channels, width);
  EXPECT_LT(testing::max_rel_diff(y1, rows(y, 0, split)), 1e-14);
  EXPECT_LT(testing::max_rel_diff(y2, rows(y, split, seq)), 1e-14);

  Vec dx1(x1.size()), dx2(x2.size()), dhalo(halo.size()), dw1(w.size()), dw2(w.size());
  Vec db1(channels), db2(channels);
  causal_conv1d_backward<double>(dx1.data(), nullptr, dw1.data(), db1.data(), dy1.data(), x1.data(),
                                 nullptr, w.data(), batch, s1, channels, width);
  causal_conv1d_backward<double>(dx2.data(), dhalo.data(), dw2.data(), db2.data(), dy2.data(),
                                 x2.data(), halo.data(), w.data(), batch, s2, channels, width);
  for (int64_t b = 0; b < batch; b++) {
    for (int64_t t = 0; t < pad; t++) {
      for (int64_t ch = 0; ch < channels; ch++) {
        dx1[(b * s1 + s1 - pad + t) * channels + ch] += dhalo[(b * pad + t) * channels + ch];
      }
    }
  }
  EXPECT_LT(testing::max_rel_diff(dx1, rows(dx, 0, split)), 1e-14);
  EXPECT_LT(testing::max_rel_diff(dx2, rows(dx, split, seq)), 1e-14);
  Vec dw_sum(w.size()), db_sum(channels);
  add<double>(dw_sum.data(), dw1.data(), dw2.data(), w.size());
  add<double>(db_sum.data(), db1.data(), db2.data(), channels);
  EXPECT_LT(testing::max_rel_diff(dw_sum, dw), 1e-13);
  EXPECT_LT(testing::max_rel_diff(db_sum, dbias), 1e-13);
}

}  // namespace
}  // namespace hcp::cpu
