// Packed documents in the sequence kernels (Kernels.h, `positions`): each kernel on a row of
// several documents equals the same kernel run on each document alone, its backward matches
// finite differences, and a row split into segments (context parallelism) passes nothing across
// a document start: the halo, the incoming state, the segment summary.
#include <cmath>
#include <limits>
#include <vector>

#include "runtime/kernels/cpu/Kernels.h"
#include "tests/unit/kernels_cpu/SsdData.h"
#include "tests/unit/kernels_cpu/TestUtil.h"

namespace hcp::cpu {
namespace {

using testing::SsdData;
using testing::Vec;

// Documents of these lengths, back to back in one row: Hugging Face's position_ids.
std::vector<int32_t> Positions(const std::vector<int64_t>& lengths) {
  std::vector<int32_t> positions;
  for (int64_t length : lengths) {
    for (int64_t i = 0; i < length; i++) positions.push_back(static_cast<int32_t>(i));
  }
  return positions;
}

// Tokens [from, from + n) of a [seq, inner] row.
Vec Rows(const Vec& v, int64_t inner, int64_t from, int64_t n) {
  return Vec(v.begin() + from * inner, v.begin() + (from + n) * inner);
}

double Project(const Vec& r, const Vec& out) { return testing::project(r, out); }

// Uneven documents: one token, two, three (shorter than the conv), a long one across chunks.
const std::vector<int64_t> kLengths = {1, 5, 2, 3, 13, 1};
constexpr int64_t kSeq = 25;

// ---------------------------------------------------------------------------------------------
// Causal conv1d.

TEST(Documents, ConvEqualsEachDocumentAlone) {
  std::mt19937 rng(101);
  const int64_t C = 3, W = 4;
  const std::vector<int32_t> pos = Positions(kLengths);
  ASSERT_EQ(static_cast<int64_t>(pos.size()), kSeq);
  Vec x = testing::random_vec(rng, kSeq * C), w = testing::random_vec(rng, C * W),
      bias = testing::random_vec(rng, C), halo = testing::random_vec(rng, (W - 1) * C);
  Vec y(kSeq * C);
  // A halo that the first document (it starts at 0) must not read.
  causal_conv1d_forward<double>(y.data(), x.data(), halo.data(), w.data(), bias.data(), 1, kSeq, C,
                                W, pos.data());
  int64_t at = 0;
  for (int64_t length : kLengths) {
    Vec alone(length * C);
    const Vec xd = Rows(x, C, at, length);
    causal_conv1d_forward<double>(alone.data(), xd.data(), nullptr, w.data(), bias.data(), 1,
                                  length, C, W);
    EXPECT_LT(testing::max_rel_diff(Rows(y, C, at, length), alone), 1e-15) << "document at " << at;
    at += length;
  }
  // A row that continues a document begun before it reads the halo up to that document's start.
  const std::vector<int32_t> continued = {2, 3, 4, 0, 1};
  Vec yc(5 * C), yref(5 * C);
  const Vec xc = Rows(x, C, 0, 5);
  causal_conv1d_forward<double>(yc.data(), xc.data(), halo.data(), w.data(), bias.data(), 1, 5, C,
                                W, continued.data());
  causal_conv1d_forward<double>(yref.data(), xc.data(), halo.data(), w.data(), bias.data(), 1, 5, C,
                                W);
  // Positions 2, 3, 4 see 2, 3, 3 earlier tokens: 2 of the halo's 3 rows at most for the first.
  EXPECT_NE(Rows(yc, C, 0, 1), Rows(yref, C, 0, 1));  // the oldest halo row is another document
  EXPECT_EQ(Rows(yc, C, 1, 2), Rows(yref, C, 1, 2));
}

TEST(Documents, ConvBackwardMatchesFiniteDifferences) {
  std::mt19937 rng(102);
  const int64_t B = 2, C = 2, W = 4, S = 9;
  // Row 0: documents of 2, 4, 3; row 1 continues one from the previous segment, then 1, 4.
  std::vector<int32_t> pos = Positions({2, 4, 3});
  for (int32_t p : std::vector<int32_t>{1, 2, 3, 4, 0, 0, 1, 2, 3}) pos.push_back(p);
  Vec x = testing::random_vec(rng, B * S * C), w = testing::random_vec(rng, C * W),
      bias = testing::random_vec(rng, C), halo = testing::random_vec(rng, B * (W - 1) * C),
      r = testing::random_vec(rng, B * S * C);
  auto objective = [&] {
    Vec y(B * S * C);
    causal_conv1d_forward<double>(y.data(), x.data(), halo.data(), w.data(), bias.data(), B, S, C,
                                  W, pos.data());
    return Project(r, y);
  };
  Vec dx(x.size()), dhalo(halo.size()), dw(w.size()), dbias(bias.size());
  causal_conv1d_backward<double>(dx.data(), dhalo.data(), dw.data(), dbias.data(), r.data(),
                                 x.data(), halo.data(), w.data(), B, S, C, W, pos.data());
  testing::expect_gradient("dx", x, dx, objective);
  testing::expect_gradient("dhalo", halo, dhalo, objective);
  testing::expect_gradient("dw", w, dw, objective);
  testing::expect_gradient("dbias", bias, dbias, objective);
  // Row 0 starts a document: its halo gets nothing.
  for (int64_t i = 0; i < (W - 1) * C; i++) EXPECT_EQ(dhalo[i], 0.0);
}

// ---------------------------------------------------------------------------------------------
// SSD scan.

TEST(Documents, SsdScanEqualsEachDocumentAlone) {
  std::mt19937 rng(103);
  // Chunks of 4: documents start inside chunks, at chunk starts, and span several.
  const SsdShape shape{1, kSeq, 2, 3, 1, 2, 4};
  SsdData d(shape, rng);
  const std::vector<int32_t> pos = Positions(kLengths);
  Vec y(d.x.size()), final_state(d.state_size());
  ssd_scan_forward<double>(y.data(), final_state.data(), d.x.data(), d.dt.data(), d.A.data(),
                           d.B.data(), d.C.data(), d.D.data(), d.init.data(), shape, {},
                           pos.data());
  const int64_t HP = shape.heads * shape.head_dim, GN = shape.groups * shape.state;
  int64_t at = 0;
  for (size_t k = 0; k < kLengths.size(); k++) {
    const int64_t length = kLengths[k];
    SsdShape one = shape;
    one.seq = length;
    const Vec x = Rows(d.x, HP, at, length), dt = Rows(d.dt, shape.heads, at, length),
              B = Rows(d.B, GN, at, length), C = Rows(d.C, GN, at, length);
    Vec alone(x.size()), last(d.state_size());
    // The row starts a document (position 0): the state before it reaches nothing.
    ssd_scan_forward<double>(alone.data(), last.data(), x.data(), dt.data(), d.A.data(), B.data(),
                             C.data(), d.D.data(), nullptr, one);
    EXPECT_LT(testing::max_rel_diff(Rows(y, HP, at, length), alone), 1e-13) << "document " << k;
    if (k + 1 == kLengths.size()) {
      EXPECT_LT(testing::max_rel_diff(final_state, last), 1e-13);
    }
    at += length;
  }
}

TEST(Documents, SsdScanBackwardMatchesFiniteDifferences) {
  std::mt19937 rng(104);
  const SsdShape shape{2, 9, 2, 2, 1, 2, 4};
  SsdData d(shape, rng);
  std::vector<int32_t> pos = Positions({2, 4, 3});
  for (int32_t p : std::vector<int32_t>{5, 6, 7, 8, 0, 0, 1, 2, 3}) pos.push_back(p);
  const Vec ry = testing::random_vec(rng, d.x.size()),
            rs = testing::random_vec(rng, d.state_size());
  auto objective = [&] {
    Vec y(d.x.size()), final_state(d.state_size());
    ssd_scan_forward<double>(y.data(), final_state.data(), d.x.data(), d.dt.data(), d.A.data(),
                             d.B.data(), d.C.data(), d.D.data(), d.init.data(), shape, {},
                             pos.data());
    return Project(ry, y) + Project(rs, final_state);
  };
  Vec dx(d.x.size()), ddt(d.dt.size()), dA(d.A.size()), dB(d.B.size()), dC(d.C.size()),
      dD(d.D.size()), dinit(d.init.size());
  ssd_scan_backward<double>(dx.data(), ddt.data(), dA.data(), dB.data(), dC.data(), dD.data(),
                            dinit.data(), ry.data(), rs.data(), d.x.data(), d.dt.data(), d.A.data(),
                            d.B.data(), d.C.data(), d.D.data(), d.init.data(), shape, {},
                            pos.data());
  testing::expect_gradient("dx", d.x, dx, objective);
  testing::expect_gradient("ddt", d.dt, ddt, objective);
  testing::expect_gradient("dA", d.A, dA, objective);
  testing::expect_gradient("dB", d.B, dB, objective);
  testing::expect_gradient("dC", d.C, dC, objective);
  testing::expect_gradient("dD", d.D, dD, objective);
  testing::expect_gradient("dinit", d.init, dinit, objective);
  // Row 0 starts a document at its first token: the incoming state reaches nothing.
  const int64_t PN = shape.head_dim * shape.state;
  for (int64_t i = 0; i < shape.heads * PN; i++) EXPECT_EQ(dinit[i], 0.0);
}

// A row split in two segments at `cut`, as context parallelism does: the second segment scanned
// from zero and corrected by the incoming state (ssd_add_initial_state), or scanned from it,
// equals the whole row's scan; the first segment's summary (final state and log-decay) passes
// nothing through a document start.
void ExpectSegmentsCompose(const std::vector<int64_t>& lengths, int64_t cut) {
  std::mt19937 rng(105 + cut);
  const std::vector<int32_t> pos = Positions(lengths);
  const int64_t seq = static_cast<int64_t>(pos.size());
  const SsdShape whole{1, seq, 2, 3, 1, 2, 4};
  SsdData d(whole, rng);
  Vec y(d.x.size()), final_state(d.state_size());
  ssd_scan_forward<double>(y.data(), final_state.data(), d.x.data(), d.dt.data(), d.A.data(),
                           d.B.data(), d.C.data(), d.D.data(), nullptr, whole, {}, pos.data());

  const int64_t HP = whole.heads * whole.head_dim, GN = whole.groups * whole.state;
  SsdShape first = whole, second = whole;
  first.seq = cut;
  second.seq = seq - cut;
  const std::vector<int32_t> pos1(pos.begin(), pos.begin() + cut),
      pos2(pos.begin() + cut, pos.end());
  auto part = [&](const Vec& v, int64_t inner, bool tail) {
    return tail ? Rows(v, inner, cut, seq - cut) : Rows(v, inner, 0, cut);
  };
  // The first segment's summary: its state from zero and its log-decay.
  Vec s1(d.state_size()), g1(whole.heads);
  const Vec x1 = part(d.x, HP, false), dt1 = part(d.dt, whole.heads, false),
            B1 = part(d.B, GN, false);
  ssd_final_state_forward<double>(s1.data(), x1.data(), dt1.data(), d.A.data(), B1.data(), first,
                                  {}, pos1.data());
  ssd_log_decay<double>(g1.data(), dt1.data(), d.A.data(), 1, cut, whole.heads, pos1.data());
  const bool blocked = pos1.back() < cut;  // a document starts in the first segment
  for (double g : g1) EXPECT_EQ(std::isinf(g), blocked);
  // The second segment: from zero, then corrected; or scanned from the incoming state (the
  // summary combined with the zero state before the row: s1).
  const Vec x2 = part(d.x, HP, true), dt2 = part(d.dt, whole.heads, true), B2 = part(d.B, GN, true),
            C2 = part(d.C, GN, true);
  Vec zero_start(x2.size()), corrected(x2.size()), rescanned(x2.size()), end(d.state_size());
  ssd_scan_forward<double>(zero_start.data(), nullptr, x2.data(), dt2.data(), d.A.data(), B2.data(),
                           C2.data(), d.D.data(), nullptr, second, {}, pos2.data());
  ssd_add_initial_state_forward<double>(corrected.data(), zero_start.data(), dt2.data(), d.A.data(),
                                        C2.data(), s1.data(), second, pos2.data());
  ssd_scan_forward<double>(rescanned.data(), end.data(), x2.data(), dt2.data(), d.A.data(),
                           B2.data(), C2.data(), d.D.data(), s1.data(), second, {}, pos2.data());
  EXPECT_LT(testing::max_rel_diff(corrected, part(y, HP, true)), 1e-13) << "cut " << cut;
  EXPECT_LT(testing::max_rel_diff(rescanned, part(y, HP, true)), 1e-13) << "cut " << cut;
  EXPECT_LT(testing::max_rel_diff(end, final_state), 1e-13) << "cut " << cut;
}

TEST(Documents, SegmentsPassNothingAcrossADocumentStart) {
  ExpectSegmentsCompose({3, 9, 4}, 5);     // a document spans the cut
  ExpectSegmentsCompose({3, 9, 4}, 12);    // a document starts right at the cut
  ExpectSegmentsCompose({16}, 7);          // one document: everything passes
  ExpectSegmentsCompose({1, 1, 1, 9}, 2);  // one-token documents in the first segment
}

TEST(Documents, InitialStateCorrectionBackwardMatchesFiniteDifferences) {
  std::mt19937 rng(106);
  const SsdShape shape{2, 7, 2, 2, 1, 3, 4};
  SsdData d(shape, rng);
  Vec y = testing::random_vec(rng, d.x.size());
  std::vector<int32_t> pos = {4, 5, 6, 0, 1, 0, 1};  // row 0: 3 reached
  for (int32_t p : std::vector<int32_t>{7, 8, 9, 10, 11, 12, 13}) pos.push_back(p);  // row 1: all
  const Vec r = testing::random_vec(rng, d.x.size());
  auto objective = [&] {
    Vec out(d.x.size());
    ssd_add_initial_state_forward<double>(out.data(), y.data(), d.dt.data(), d.A.data(), d.C.data(),
                                          d.init.data(), shape, pos.data());
    return Project(r, out);
  };
  Vec ddt(d.dt.size()), dA(d.A.size()), dC(d.C.size()), dinit(d.init.size());
  ssd_add_initial_state_backward<double>(ddt.data(), dA.data(), dC.data(), dinit.data(), r.data(),
                                         d.dt.data(), d.A.data(), d.C.data(), d.init.data(), shape,
                                         pos.data());
  testing::expect_gradient("ddt", d.dt, ddt, objective);
  testing::expect_gradient("dA", d.A, dA, objective);
  testing::expect_gradient("dC", d.C, dC, objective);
  testing::expect_gradient("dinit", d.init, dinit, objective);
  // Row 0's tokens from its first document start on get nothing of the state.
  Vec out(d.x.size());
  ssd_add_initial_state_forward<double>(out.data(), y.data(), d.dt.data(), d.A.data(), d.C.data(),
                                        d.init.data(), shape, pos.data());
  const int64_t HP = shape.heads * shape.head_dim;
  EXPECT_EQ(Rows(out, HP, 3, 4), Rows(y, HP, 3, 4));
  EXPECT_NE(Rows(out, HP, 0, 3), Rows(y, HP, 0, 3));
}

// ---------------------------------------------------------------------------------------------
// Attention.

TEST(Documents, AttentionEqualsEachDocumentAlone) {
  std::mt19937 rng(107);
  const AttentionShape shape{1, kSeq, kSeq, 4, 2, 3};
  const std::vector<int32_t> pos = Positions(kLengths);
  Vec q = testing::random_vec(rng, kSeq * 4 * 3), k = testing::random_vec(rng, kSeq * 2 * 3),
      v = testing::random_vec(rng, kSeq * 2 * 3);
  Vec out(q.size()), lse(4 * kSeq);
  attention_forward<double>(out.data(), lse.data(), q.data(), k.data(), v.data(), shape, 0.4, true,
                            0, 0, pos.data());
  int64_t at = 0;
  for (int64_t length : kLengths) {
    const AttentionShape one{1, length, length, 4, 2, 3};
    const Vec qd = Rows(q, 12, at, length), kd = Rows(k, 6, at, length),
              vd = Rows(v, 6, at, length);
    Vec alone(qd.size()), lse_alone(4 * length);
    attention_forward<double>(alone.data(), lse_alone.data(), qd.data(), kd.data(), vd.data(), one,
                              0.4, true, 0, 0);
    EXPECT_LT(testing::max_rel_diff(Rows(out, 12, at, length), alone), 1e-14)
        << "document at " << at;
    at += length;
  }
}

// A query block against a key block of another place in the row (ring attention): rows see only
// keys of their own document, a key block wholly before every row's document is empty (-inf).
TEST(Documents, AttentionBackwardMatchesFiniteDifferences) {
  std::mt19937 rng(108);
  const AttentionShape shape{2, 5, 6, 2, 1, 3};
  // Queries at positions 8..12, keys at 3..8; row 0's documents start at 6 and 10, row 1's at 2.
  const std::vector<int32_t> pos = {2, 3, 0, 1, 2, 6, 7, 8, 9, 10};
  Vec q = testing::random_vec(rng, 2 * 5 * 2 * 3), k = testing::random_vec(rng, 2 * 6 * 3),
      v = testing::random_vec(rng, 2 * 6 * 3), r = testing::random_vec(rng, q.size());
  Vec out(q.size()), lse(2 * 2 * 5);
  auto forward = [&] {
    attention_forward<double>(out.data(), lse.data(), q.data(), k.data(), v.data(), shape, 0.7,
                              true, 8, 3, pos.data());
  };
  forward();
  // Row 0's queries 10..12 (document from 10) see no key of 3..8: empty.
  for (int64_t h = 0; h < 2; h++) {
    for (int64_t i = 2; i < 5; i++)
      EXPECT_EQ(lse[h * 5 + i], -std::numeric_limits<double>::infinity());
  }
  const Vec out0 = out, lse0 = lse;
  // The gradient of one block with the final out and lse held (as the ring uses it) is the
  // gradient of sum r . out through this block alone when out and lse are this block's own.
  auto objective = [&] {
    forward();
    return Project(r, out);
  };
  Vec dq(q.size()), dk(k.size()), dv(v.size());
  attention_backward<double>(dq.data(), dk.data(), dv.data(), r.data(), q.data(), k.data(),
                             v.data(), out0.data(), lse0.data(), shape, 0.7, true, 8, 3,
                             pos.data());
  testing::expect_gradient("dq", q, dq, objective);
  testing::expect_gradient("dk", k, dk, objective);
  testing::expect_gradient("dv", v, dv, objective);
}

}  // namespace
}  // namespace hcp::cpu
