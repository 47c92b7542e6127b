// Attention: forward against an explicit masked softmax, backward against finite differences,
// and ring attention's pieces (merging key blocks, per-block backward with the final out/lse).
#include <cmath>
#include <limits>

#include "runtime/kernels/cpu/Kernels.h"
#include "tests/unit/kernels_cpu/TestUtil.h"

namespace hcp::cpu {
namespace {

using testing::Vec;

constexpr double kInf = std::numeric_limits<double>::infinity();

struct AttnData {
  AttentionShape s;
  Vec q, k, v;
  AttnData(const AttentionShape& shape, std::mt19937& rng) : s(shape) {
    q = testing::random_vec(rng, s.batch * s.q_len * s.q_heads * s.head_dim);
    k = testing::random_vec(rng, s.batch * s.kv_len * s.kv_heads * s.head_dim);
    v = testing::random_vec(rng, k.size());
  }
  void forward(Vec& out, Vec& lse, double scale, bool causal, int64_t q_pos0,
               int64_t k_pos0) const {
    out.assign(q.size(), NAN);
    lse.assign(s.batch * s.q_heads * s.q_len, NAN);
    attention_forward<double>(out.data(), lse.data(), q.data(), k.data(), v.data(), s, scale,
                              causal, q_pos0, k_pos0);
  }
};

// softmax(scale q k^T + mask) v written out in full: a score matrix with -inf where masked.
void reference_attention(Vec& out, Vec& lse, const AttnData& d, double scale, bool causal,
                         int64_t q_pos0, int64_t k_pos0) {
  const AttentionShape& s = d.s;
  const int64_t D = s.head_dim;
  out.assign(d.q.size(), 0.0);
  lse.assign(s.batch * s.q_heads * s.q_len, 0.0);
  for (int64_t b = 0; b < s.batch; b++) {
    for (int64_t h = 0; h < s.q_heads; h++) {
      const int64_t kvh = h * s.kv_heads / s.q_heads;
      for (int64_t i = 0; i < s.q_len; i++) {
        Vec scores(s.kv_len);
        for (int64_t j = 0; j < s.kv_len; j++) {
          const bool masked = causal && (k_pos0 + j > q_pos0 + i);
          double dot = 0.0;
          for (int64_t e = 0; e < D; e++) {
            dot += d.q[((b * s.q_len + i) * s.q_heads + h) * D + e] *
                   d.k[((b * s.kv_len + j) * s.kv_heads + kvh) * D + e];
          }
          scores[j] = masked ? -kInf : scale * dot;
        }
        double denom = 0.0;
        for (double sc : scores) denom += std::exp(sc);            // exp(-inf) = 0
        lse[(b * s.q_heads + h) * s.q_len + i] = std::log(denom);  // log(0) = -inf
        for (int64_t j = 0; j < s.kv_len; j++) {
          const double p = denom > 0.0 ? std::exp(scores[j]) / denom : 0.0;
          for (int64_t e = 0; e < D; e++) {
            out[((b * s.q_len + i) * s.q_heads + h) * D + e] +=
                p * d.v[((b * s.kv_len + j) * s.kv_heads + kvh) * D + e];
          }
        }
      }
    }
  }
}

struct AttnCase {
  AttentionShape shape;
  bool causal;
  int64_t q_pos0, k_pos0;
};

TEST(Attention, ForwardMatchesExplicitSoftmax) {
  std::mt19937 rng(50);
  const AttnCase cases[] = {
      {{2, 4, 5, 4, 2, 3}, false, 0, 0},  // full, grouped-query
      {{1, 5, 5, 2, 2, 4}, true, 0, 0},   // diagonal block
      {{2, 3, 6, 4, 1, 2}, true, 7, 2},   // earlier keys: row 0 sees keys 0..5
      {{1, 4, 3, 3, 1, 2}, true, 0, 2},   // later keys: rows 0 and 1 see nothing
  };
  const double scale = 0.37;
  for (const AttnCase& c : cases) {
    AttnData d(c.shape, rng);
    Vec out, lse, out_ref, lse_ref;
    d.forward(out, lse, scale, c.causal, c.q_pos0, c.k_pos0);
    reference_attention(out_ref, lse_ref, d, scale, c.causal, c.q_pos0, c.k_pos0);
    EXPECT_LT(testing::max_rel_diff(out, out_ref), 1e-13);
    int64_t empty_rows = 0;
    for (size_t i = 0; i < lse.size(); i++) {
      if (lse_ref[i] == -kInf) {
        EXPECT_EQ(lse[i], -kInf);
        empty_rows++;
      } else {
        EXPECT_NEAR(lse[i], lse_ref[i], 1e-13);
      }
    }
    if (c.k_pos0 > c.q_pos0) {
      EXPECT_GT(empty_rows, 0) << "the case must exercise empty rows";
    }
  }
}

TEST(Attention, ForwardIsStableForLargeScores) {
  std::mt19937 rng(51);
  AttnData d({1, 3, 4, 1, 1, 2}, rng);
  Vec out, lse;
  d.forward(out, lse, 2000.0, false, 0, 0);  // scores in the thousands: exp() alone overflows
  for (double x : out) EXPECT_TRUE(std::isfinite(x));
  for (double x : lse) EXPECT_TRUE(std::isfinite(x));
}

void check_backward(const AttnCase& c, uint32_t seed) {
  std::mt19937 rng(seed);
  AttnData d(c.shape, rng);
  const double scale = 0.6;
  Vec r = testing::random_vec(rng, d.q.size());
  auto objective = [&] {
    Vec out, lse;
    d.forward(out, lse, scale, c.causal, c.q_pos0, c.k_pos0);
    return testing::project(r, out);
  };
  Vec out, lse, dq(d.q.size()), dk(d.k.size()), dv(d.v.size());
  d.forward(out, lse, scale, c.causal, c.q_pos0, c.k_pos0);
  attention_backward<double>(dq.data(), dk.data(), dv.data(), r.data(), d.q.data(), d.k.data(),
                             d.v.data(), out.data(), lse.data(), d.s, scale, c.causal, c.q_pos0,
                             c.k_pos0);
  const std::string tag = c.causal ? " causal" : " full";
  testing::expect_gradient("attention dq" + tag, d.q, dq, objective);
  testing::expect_gradient("attention dk" + tag, d.k, dk, objective);
  testing::expect_gradient("attention dv" + tag, d.v, dv, objective);
}

TEST(Attention, BackwardMatchesFiniteDifferences) {
  check_backward({{2, 4, 5, 4, 2, 3}, false, 0, 0}, 52);
  check_backward({{1, 5, 5, 4, 2, 3}, true, 0, 0}, 53);
  check_backward({{1, 4, 5, 2, 1, 3}, true, 0, 1}, 54);  // row 0 sees no key
}

// Ring attention: keys [0, s) and [s, Sk) as two blocks. Merging the blocks' partial results is
// the full forward; each block's backward with the final out/lse gives its share of the full
// gradients (dq summed over blocks, dk/dv by rows).
TEST(Attention, KeyBlocksMergeAndSplitBackwardEqualFull) {
  std::mt19937 rng(55);
  const AttentionShape full{2, 6, 6, 4, 2, 3};
  const double scale = 0.45;
  AttnData d(full, rng);
  const int64_t q_pos0 = 0, split = 4, KD = full.kv_heads * full.head_dim;
  Vec out, lse;
  d.forward(out, lse, scale, true, q_pos0, 0);
  Vec dout = testing::random_vec(rng, out.size());
  Vec dq(d.q.size(), NAN), dk(d.k.size(), NAN), dv(d.v.size(), NAN);
  attention_backward<double>(dq.data(), dk.data(), dv.data(), dout.data(), d.q.data(), d.k.data(),
                             d.v.data(), out.data(), lse.data(), full, scale, true, q_pos0, 0);

  auto kv_rows = [&](const Vec& t, int64_t from, int64_t to) {
    Vec o;
    for (int64_t b = 0; b < full.batch; b++) {
      o.insert(o.end(), t.begin() + (b * full.kv_len + from) * KD,
               t.begin() + (b * full.kv_len + to) * KD);
    }
    return o;
  };
  AttentionShape s1 = full, s2 = full;
  s1.kv_len = split;
  s2.kv_len = full.kv_len - split;
  Vec k1 = kv_rows(d.k, 0, split), v1 = kv_rows(d.v, 0, split);
  Vec k2 = kv_rows(d.k, split, full.kv_len), v2 = kv_rows(d.v, split, full.kv_len);

  // The later block first, so that rows which see none of it start out empty (-inf).
  Vec merged(out.size()), merged_lse(lse.size()), out1(out.size()), lse1(lse.size());
  attention_forward<double>(merged.data(), merged_lse.data(), d.q.data(), k2.data(), v2.data(), s2,
                            scale, true, q_pos0, split);
  EXPECT_EQ(merged_lse[0], -kInf);
  attention_forward<double>(out1.data(), lse1.data(), d.q.data(), k1.data(), v1.data(), s1, scale,
                            true, q_pos0, 0);
  attention_merge<double>(merged.data(), merged_lse.data(), out1.data(), lse1.data(), full.batch,
                          full.q_len, full.q_heads, full.head_dim);
  EXPECT_LT(testing::max_rel_diff(merged, out), 1e-13);
  EXPECT_LT(testing::max_rel_diff(merged_lse, lse), 1e-13);

  Vec dq1(d.q.size()), dk1(k1.size()), dv1(v1.size()), dq2(d.q.size()), dk2(k2.size()),
      dv2(v2.size());
  attention_backward<double>(dq1.data(), dk1.data(), dv1.data(), dout.data(), d.q.data(), k1.data(),
                             v1.data(), merged.data(), merged_lse.data(), s1, scale, true, q_pos0,
                             0);
  attention_backward<double>(dq2.data(), dk2.data(), dv2.data(), dout.data(), d.q.data(), k2.data(),
                             v2.data(), merged.data(), merged_lse.data(), s2, scale, true, q_pos0,
                             split);
  Vec dq_sum(dq.size());
  add<double>(dq_sum.data(), dq1.data(), dq2.data(), dq.size());
  EXPECT_LT(testing::max_rel_diff(dq_sum, dq), 1e-13);
  EXPECT_LT(testing::max_rel_diff(dk1, kv_rows(dk, 0, split)), 1e-13);
  EXPECT_LT(testing::max_rel_diff(dv1, kv_rows(dv, 0, split)), 1e-13);
  EXPECT_LT(testing::max_rel_diff(dk2, kv_rows(dk, split, full.kv_len)), 1e-13);
  EXPECT_LT(testing::max_rel_diff(dv2, kv_rows(dv, split, full.kv_len)), 1e-13);
}

TEST(Attention, MergeTreatsMinusInfinityAsEmpty) {
  // One batch row, one head, head_dim 2, three rows: a empty, b empty, both empty.
  Vec out = {0.0, 0.0, 1.0, 2.0, 0.0, 0.0};
  Vec lse = {-kInf, 0.5, -kInf};
  const Vec out_b = {3.0, 4.0, 9.0, 9.0, 0.0, 0.0};
  const Vec lse_b = {1.5, -kInf, -kInf};
  attention_merge<double>(out.data(), lse.data(), out_b.data(), lse_b.data(), 1, 3, 1, 2);
  EXPECT_EQ(out[0], 3.0);
  EXPECT_EQ(out[1], 4.0);
  EXPECT_EQ(lse[0], 1.5);
  EXPECT_EQ(out[2], 1.0);
  EXPECT_EQ(out[3], 2.0);
  EXPECT_EQ(lse[1], 0.5);
  EXPECT_EQ(out[4], 0.0);
  EXPECT_EQ(out[5], 0.0);
  EXPECT_EQ(lse[2], -kInf);

  // Both present: L = log(e^La + e^Lb), weights e^(La-L), e^(Lb-L).
  Vec o2 = {1.0}, l2 = {std::log(3.0)};
  const Vec ob2 = {5.0}, lb2 = {0.0};
  attention_merge<double>(o2.data(), l2.data(), ob2.data(), lb2.data(), 1, 1, 1, 1);
  EXPECT_NEAR(l2[0], std::log(4.0), 1e-15);
  EXPECT_NEAR(o2[0], 0.75 * 1.0 + 0.25 * 5.0, 1e-15);
}

}  // namespace
}  // namespace hcp::cpu
