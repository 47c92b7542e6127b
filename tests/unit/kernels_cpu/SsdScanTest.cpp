// Mamba2 SSD scan: the chunked forward against the plain sequential recurrence, the backward
// against finite differences, and the context-parallel properties (splitting the sequence and
// passing the state, composing segments with the log-decay, the state-only segment summary).
#include <cmath>
#include <vector>

#include "runtime/kernels/cpu/Kernels.h"
#include "tests/unit/kernels_cpu/SsdData.h"
#include "tests/unit/kernels_cpu/TestUtil.h"

namespace hcp::cpu {
namespace {

using testing::SsdData;
using testing::Vec;

// The definition, one step at a time: S_t = exp(dt_t A) S_{t-1} + dt_t x_t B_t^T,
// y_t = S_t C_t + D x_t.
void reference_scan(Vec& y, Vec& final_state, const SsdData& d, bool with_init) {
  const SsdShape& s = d.shape;
  const int64_t P = s.head_dim, N = s.state;
  y.assign(d.x.size(), 0.0);
  final_state.assign(d.state_size(), 0.0);
  for (int64_t b = 0; b < s.batch; b++) {
    for (int64_t h = 0; h < s.heads; h++) {
      const int64_t g = h / (s.heads / s.groups);
      Vec S(P * N, 0.0);
      if (with_init) {
        for (int64_t i = 0; i < P * N; i++) S[i] = d.init[(b * s.heads + h) * P * N + i];
      }
      for (int64_t t = 0; t < s.seq; t++) {
        const double dt = d.dt[(b * s.seq + t) * s.heads + h];
        const double a = std::exp(dt * d.A[h]);
        const double* xt = &d.x[((b * s.seq + t) * s.heads + h) * P];
        const double* Bt = &d.B[((b * s.seq + t) * s.groups + g) * N];
        const double* Ct = &d.C[((b * s.seq + t) * s.groups + g) * N];
        for (int64_t p = 0; p < P; p++) {
          double yp = d.D[h] * xt[p];
          for (int64_t n = 0; n < N; n++) {
            S[p * N + n] = a * S[p * N + n] + dt * xt[p] * Bt[n];
            yp += S[p * N + n] * Ct[n];
          }
          y[((b * s.seq + t) * s.heads + h) * P + p] = yp;
        }
      }
      for (int64_t i = 0; i < P * N; i++) final_state[(b * s.heads + h) * P * N + i] = S[i];
    }
  }
}

// Rows [from, to) of the sequence dimension of a [B, S, ...] tensor with `inner` values per row.
Vec seq_rows(const Vec& v, int64_t batch, int64_t seq, int64_t inner, int64_t from, int64_t to) {
  Vec out;
  for (int64_t b = 0; b < batch; b++) {
    out.insert(out.end(), v.begin() + (b * seq + from) * inner, v.begin() + (b * seq + to) * inner);
  }
  return out;
}

// The segment [from, to) of a scan as its own SsdData (same A, D; init left random).
SsdData segment(const SsdData& d, int64_t from, int64_t to, std::mt19937& rng) {
  SsdShape s = d.shape;
  s.seq = to - from;
  SsdData part(s, rng);
  const SsdShape& f = d.shape;
  part.x = seq_rows(d.x, f.batch, f.seq, f.heads * f.head_dim, from, to);
  part.dt = seq_rows(d.dt, f.batch, f.seq, f.heads, from, to);
  part.B = seq_rows(d.B, f.batch, f.seq, f.groups * f.state, from, to);
  part.C = seq_rows(d.C, f.batch, f.seq, f.groups * f.state, from, to);
  part.A = d.A;
  part.D = d.D;
  return part;
}

TEST(SsdScan, ChunkedForwardMatchesRecurrence) {
  std::mt19937 rng(40);
  const SsdShape cases[] = {
      {2, 10, 4, 3, 2, 5, 4},  // seq not a multiple of the chunk, two groups
      {2, 3, 2, 3, 1, 4, 8},   // seq shorter than one chunk
      {1, 8, 2, 2, 1, 3, 4},   // seq a multiple of the chunk
      {1, 6, 4, 2, 4, 2, 1},   // chunk of one, one head per group
      {2, 9, 6, 2, 3, 3, 9},   // exactly one chunk, three groups
  };
  for (const SsdShape& s : cases) {
    SsdData d(s, rng);
    for (bool with_init : {false, true}) {
      Vec y, fin, y_ref, fin_ref;
      d.forward(y, fin, with_init);
      reference_scan(y_ref, fin_ref, d, with_init);
      EXPECT_LT(testing::max_rel_diff(y, y_ref), 1e-12) << "seq " << s.seq << " chunk " << s.chunk;
      EXPECT_LT(testing::max_rel_diff(fin, fin_ref), 1e-12)
          << "seq " << s.seq << " chunk " << s.chunk;
      EXPECT_GT(testing::max_abs(y), 0.1);
    }
  }
}

TEST(SsdScan, ForwardWithoutFinalStateWritesOutputs) {
  std::mt19937 rng(41);
  SsdData d({1, 5, 2, 2, 1, 3, 2}, rng);
  Vec y(d.x.size(), 0.0), y_ref, fin_ref;
  ssd_scan_forward<double>(y.data(), nullptr, d.x.data(), d.dt.data(), d.A.data(), d.B.data(),
                           d.C.data(), d.D.data(), d.init.data(), d.shape);
  reference_scan(y_ref, fin_ref, d, true);
  EXPECT_LT(testing::max_rel_diff(y, y_ref), 1e-12);
}

void check_backward(const SsdShape& shape, bool with_init, bool with_dfinal, uint32_t seed) {
  std::mt19937 rng(seed);
  SsdData d(shape, rng);
  Vec ry = testing::random_vec(rng, d.x.size());
  Vec rf = with_dfinal ? testing::random_vec(rng, d.state_size()) : Vec(d.state_size(), 0.0);
  auto objective = [&] {
    Vec y, fin;
    d.forward(y, fin, with_init);
    return testing::project(ry, y) + testing::project(rf, fin);
  };
  Vec dx(d.x.size(), NAN), ddt(d.dt.size(), NAN), dA(d.A.size(), NAN), dB(d.B.size(), NAN),
      dC(d.C.size(), NAN);
  Vec dD(d.D.size(), NAN), dinit(d.state_size(), NAN);
  ssd_scan_backward<double>(dx.data(), ddt.data(), dA.data(), dB.data(), dC.data(), dD.data(),
                            with_init ? dinit.data() : nullptr, ry.data(),
                            with_dfinal ? rf.data() : nullptr, d.x.data(), d.dt.data(), d.A.data(),
                            d.B.data(), d.C.data(), d.D.data(), with_init ? d.init.data() : nullptr,
                            shape);
  const std::string tag = std::string(with_init ? " init" : "") + (with_dfinal ? " dfinal" : "");
  testing::expect_gradient("ssd dx" + tag, d.x, dx, objective);
  testing::expect_gradient("ssd ddt" + tag, d.dt, ddt, objective);
  testing::expect_gradient("ssd dA" + tag, d.A, dA, objective);
  testing::expect_gradient("ssd dB" + tag, d.B, dB, objective);
  testing::expect_gradient("ssd dC" + tag, d.C, dC, objective);
  testing::expect_gradient("ssd dD" + tag, d.D, dD, objective);
  if (with_init) testing::expect_gradient("ssd dinit_state" + tag, d.init, dinit, objective);
}

TEST(SsdScan, BackwardMatchesFiniteDifferences) {
  // Partial last chunk, two groups of two heads, incoming state and outgoing-state gradient.
  check_backward({2, 7, 4, 2, 2, 3, 3}, true, true, 42);
}

TEST(SsdScan, BackwardWithoutStatesMatchesFiniteDifferences) {
  check_backward({2, 7, 4, 2, 2, 3, 3}, false, false, 43);
}

TEST(SsdScan, BackwardShortSequenceMatchesFiniteDifferences) {
  // Shorter than one chunk, one group for all heads.
  check_backward({1, 3, 2, 3, 1, 2, 8}, true, true, 44);
}

// Context parallelism: scanning [0, s) and then [s, S) from the first part's final state is the
// whole scan; backward, the second part's dinit_state is the first part's dfinal_state.
TEST(SsdScan, SplitWithStatePassingEqualsWhole) {
  std::mt19937 rng(45);
  const SsdShape shape{2, 11, 4, 2, 2, 3, 4};
  SsdData d(shape, rng);
  const int64_t PH = shape.heads * shape.head_dim;
  Vec y, fin;
  d.forward(y, fin, true);
  Vec dy = testing::random_vec(rng, y.size()), dfin = testing::random_vec(rng, fin.size());
  Vec dx(d.x.size()), ddt(d.dt.size()), dA(shape.heads), dB(d.B.size()), dC(d.C.size());
  Vec dD(shape.heads), dinit(fin.size());
  ssd_scan_backward<double>(dx.data(), ddt.data(), dA.data(), dB.data(), dC.data(), dD.data(),
                            dinit.data(), dy.data(), dfin.data(), d.x.data(), d.dt.data(),
                            d.A.data(), d.B.data(), d.C.data(), d.D.data(), d.init.data(), shape);

  for (int64_t split : {1, 5, 8}) {  // inside a chunk, and on a chunk boundary
    SsdData first = segment(d, 0, split, rng), second = segment(d, split, shape.seq, rng);
    first.init = d.init;
    Vec y1, fin1, y2, fin2;
    first.forward(y1, fin1, true);
    second.init = fin1;
    second.forward(y2, fin2, true);
    EXPECT_LT(testing::max_rel_diff(y1, seq_rows(y, shape.batch, shape.seq, PH, 0, split)), 1e-12);
    EXPECT_LT(testing::max_rel_diff(y2, seq_rows(y, shape.batch, shape.seq, PH, split, shape.seq)),
              1e-12);
    EXPECT_LT(testing::max_rel_diff(fin2, fin), 1e-12) << "split " << split;

    const SsdShape& s1 = first.shape;
    const SsdShape& s2 = second.shape;
    Vec dy2 = seq_rows(dy, shape.batch, shape.seq, PH, split, shape.seq);
    Vec dx2(second.x.size()), ddt2(second.dt.size()), dA2(shape.heads), dB2(second.B.size());
    Vec dC2(second.C.size()), dD2(shape.heads), dinit2(fin.size());
    ssd_scan_backward<double>(dx2.data(), ddt2.data(), dA2.data(), dB2.data(), dC2.data(),
                              dD2.data(), dinit2.data(), dy2.data(), dfin.data(), second.x.data(),
                              second.dt.data(), second.A.data(), second.B.data(), second.C.data(),
                              second.D.data(), second.init.data(), s2);
    Vec dy1 = seq_rows(dy, shape.batch, shape.seq, PH, 0, split);
    Vec dx1(first.x.size()), ddt1(first.dt.size()), dA1(shape.heads), dB1(first.B.size());
    Vec dC1(first.C.size()), dD1(shape.heads), dinit1(fin.size());
    ssd_scan_backward<double>(dx1.data(), ddt1.data(), dA1.data(), dB1.data(), dC1.data(),
                              dD1.data(), dinit1.data(), dy1.data(), dinit2.data(), first.x.data(),
                              first.dt.data(), first.A.data(), first.B.data(), first.C.data(),
                              first.D.data(), first.init.data(), s1);
    EXPECT_LT(testing::max_rel_diff(dx1, seq_rows(dx, shape.batch, shape.seq, PH, 0, split)),
              1e-12);
    EXPECT_LT(
        testing::max_rel_diff(dx2, seq_rows(dx, shape.batch, shape.seq, PH, split, shape.seq)),
        1e-12);
    EXPECT_LT(
        testing::max_rel_diff(ddt1, seq_rows(ddt, shape.batch, shape.seq, shape.heads, 0, split)),
        1e-12);
    EXPECT_LT(testing::max_rel_diff(dinit1, dinit), 1e-12);
    Vec dA_sum(shape.heads), dD_sum(shape.heads);
    add<double>(dA_sum.data(), dA1.data(), dA2.data(), shape.heads);
    add<double>(dD_sum.data(), dD1.data(), dD2.data(), shape.heads);
    EXPECT_LT(testing::max_rel_diff(dA_sum, dA), 1e-12);
    EXPECT_LT(testing::max_rel_diff(dD_sum, dD), 1e-12);
  }
}

// A segment acts on its incoming state as S_out = exp(g) S_in + S_loc, with g its log-decay and
// S_loc its final state from a zero start.
TEST(SsdScan, LogDecayComposesSegments) {
  std::mt19937 rng(46);
  const SsdShape shape{2, 9, 3, 2, 1, 3, 4};
  SsdData d(shape, rng);
  Vec g(shape.batch * shape.heads);
  ssd_log_decay<double>(g.data(), d.dt.data(), d.A.data(), shape.batch, shape.seq, shape.heads);
  for (int64_t b = 0; b < shape.batch; b++) {
    for (int64_t h = 0; h < shape.heads; h++) {
      double expected = 0.0;
      for (int64_t t = 0; t < shape.seq; t++)
        expected += d.dt[(b * shape.seq + t) * shape.heads + h] * d.A[h];
      EXPECT_NEAR(g[b * shape.heads + h], expected, 1e-13);
      EXPECT_LT(g[b * shape.heads + h], 0.0);
    }
  }
  Vec y, fin_with_init, y0, fin_local;
  d.forward(y, fin_with_init, true);
  d.forward(y0, fin_local, false);
  const int64_t PN = shape.head_dim * shape.state;
  Vec composed(fin_local.size());
  for (int64_t bh = 0; bh < shape.batch * shape.heads; bh++) {
    for (int64_t i = 0; i < PN; i++) {
      composed[bh * PN + i] = std::exp(g[bh]) * d.init[bh * PN + i] + fin_local[bh * PN + i];
    }
  }
  EXPECT_LT(testing::max_rel_diff(composed, fin_with_init), 1e-12);
}

// Context parallelism's segment summary: the final state from a zero start, without y. In f32 (the
// CPU backend's type) it must equal ssd_scan_forward's final state and its gradients
// ssd_scan_backward's with dy = 0; both run the same chunk steps, so the tolerance, a relative
// 1e-6 (a few f32 roundings of unit-size values), is there for an implementation that reorders
// them, not for the current one.
constexpr double kFinalStateTolF32 = 1e-6;

struct FinalStateCase {
  SsdShape shape;
  const char* what;
};
const FinalStateCase kFinalStateCases[] = {
    {{2, 10, 4, 3, 2, 5, 4}, "partial last chunk, two groups"},
    {{1, 3, 2, 2, 1, 3, 8}, "shorter than one chunk"},
    {{2, 8, 6, 2, 3, 4, 4}, "exact chunks, three groups"},
};

TEST(SsdFinalState, ForwardEqualsScanFinalStateInF32) {
  std::mt19937 rng(47);
  for (const FinalStateCase& c : kFinalStateCases) {
    SsdData d(c.shape, rng);
    const std::vector<float> x = testing::to_float(d.x), dt = testing::to_float(d.dt),
                             A = testing::to_float(d.A), B = testing::to_float(d.B),
                             C = testing::to_float(d.C), D = testing::to_float(d.D);
    std::vector<float> y(x.size()), scan_final(d.state_size(), NAN),
        final_state(d.state_size(), NAN);
    ssd_scan_forward<float>(y.data(), scan_final.data(), x.data(), dt.data(), A.data(), B.data(),
                            C.data(), D.data(), /*init_state=*/nullptr, c.shape);
    ssd_final_state_forward<float>(final_state.data(), x.data(), dt.data(), A.data(), B.data(),
                                   c.shape);
    EXPECT_LT(
        testing::max_rel_diff(testing::to_double(final_state), testing::to_double(scan_final)),
        kFinalStateTolF32)
        << c.what;
    EXPECT_GT(testing::max_abs(testing::to_double(final_state)), 0.1) << c.what;
  }
}

TEST(SsdFinalState, BackwardEqualsScanBackwardWithZeroDyInF32) {
  std::mt19937 rng(48);
  for (const FinalStateCase& c : kFinalStateCases) {
    SsdData d(c.shape, rng);
    const std::vector<float> x = testing::to_float(d.x), dt = testing::to_float(d.dt),
                             A = testing::to_float(d.A), B = testing::to_float(d.B),
                             C = testing::to_float(d.C), D = testing::to_float(d.D);
    const std::vector<float> dfinal = testing::to_float(testing::random_vec(rng, d.state_size()));
    // The scan's gradients with no output gradient; C and D are random: with dy = 0 they must
    // not matter.
    const std::vector<float> zero_dy(x.size(), 0.0f);
    std::vector<float> want_dx(x.size()), want_ddt(dt.size()), want_dA(A.size()), want_dB(B.size()),
        dC(C.size()), dD(D.size());
    ssd_scan_backward<float>(want_dx.data(), want_ddt.data(), want_dA.data(), want_dB.data(),
                             dC.data(), dD.data(), /*dinit_state=*/nullptr, zero_dy.data(),
                             dfinal.data(), x.data(), dt.data(), A.data(), B.data(), C.data(),
                             D.data(), /*init_state=*/nullptr, c.shape);
    std::vector<float> dx(x.size(), NAN), ddt(dt.size(), NAN), dA(A.size(), NAN), dB(B.size(), NAN);
    ssd_final_state_backward<float>(dx.data(), ddt.data(), dA.data(), dB.data(), dfinal.data(),
                                    x.data(), dt.data(), A.data(), B.data(), c.shape);
    struct Gradient {
      const char* name;
      const std::vector<float>& got;
      const std::vector<float>& want;
    };
    for (const Gradient& g : {Gradient{"dx", dx, want_dx}, Gradient{"ddt", ddt, want_ddt},
                              Gradient{"dA", dA, want_dA}, Gradient{"dB", dB, want_dB}}) {
      const Vec got = testing::to_double(g.got), want = testing::to_double(g.want);
      EXPECT_LT(testing::max_rel_diff(got, want), kFinalStateTolF32) << g.name << ", " << c.what;
      EXPECT_GT(testing::max_abs(want), 1e-3) << g.name << " is all zero, " << c.what;
    }
  }
}

// The gradients of <r, final_state> on their own terms: central finite differences in double.
TEST(SsdFinalState, BackwardMatchesFiniteDifferences) {
  std::mt19937 rng(49);
  const SsdShape shape{2, 7, 4, 2, 2, 3, 3};  // partial last chunk, two groups of two heads
  SsdData d(shape, rng);
  const Vec r = testing::random_vec(rng, d.state_size());
  auto objective = [&] {
    Vec final_state(d.state_size());
    ssd_final_state_forward<double>(final_state.data(), d.x.data(), d.dt.data(), d.A.data(),
                                    d.B.data(), shape);
    return testing::project(r, final_state);
  };
  Vec dx(d.x.size(), NAN), ddt(d.dt.size(), NAN), dA(d.A.size(), NAN), dB(d.B.size(), NAN);
  ssd_final_state_backward<double>(dx.data(), ddt.data(), dA.data(), dB.data(), r.data(),
                                   d.x.data(), d.dt.data(), d.A.data(), d.B.data(), shape);
  testing::expect_gradient("ssd_final_state dx", d.x, dx, objective);
  testing::expect_gradient("ssd_final_state ddt", d.dt, ddt, objective);
  testing::expect_gradient("ssd_final_state dA", d.A, dA, objective);
  testing::expect_gradient("ssd_final_state dB", d.B, dB, objective);
}

// Context parallelism's other way to use the incoming state: the scan from a zero start plus
// ssd_add_initial_state is the scan from that state, forward and backward (the scan is linear in
// its state).
TEST(SsdAddInitialState, ScanFromZeroPlusCorrectionEqualsScanFromState) {
  std::mt19937 rng(50);
  for (const SsdShape& shape : {SsdShape{2, 7, 4, 2, 2, 3, 3}, SsdShape{1, 9, 6, 3, 3, 2, 4}}) {
    SsdData d(shape, rng);
    Vec y_init, fin_init, y_zero, fin_zero;
    d.forward(y_init, fin_init, true);
    d.forward(y_zero, fin_zero, false);
    Vec out(y_zero.size(), NAN);
    ssd_add_initial_state_forward<double>(out.data(), y_zero.data(), d.dt.data(), d.A.data(),
                                          d.C.data(), d.init.data(), shape);
    EXPECT_LT(testing::max_rel_diff(out, y_init), 1e-12);
    EXPECT_GT(testing::max_abs(testing::sub(y_init, y_zero)), 0.1) << "the state must matter";
    // In place.
    ssd_add_initial_state_forward<double>(y_zero.data(), y_zero.data(), d.dt.data(), d.A.data(),
                                          d.C.data(), d.init.data(), shape);
    EXPECT_EQ(y_zero, out);

    // Backward: the scan's gradients from the state, against the zero-start scan's plus the
    // correction's (ddt, dA, dC add up; dinit is the correction's alone).
    const Vec dy = testing::random_vec(rng, y_init.size());
    Vec dx(d.x.size()), ddt(d.dt.size()), dA(shape.heads), dB(d.B.size()), dC(d.C.size());
    Vec dD(shape.heads), dinit(d.state_size());
    ssd_scan_backward<double>(dx.data(), ddt.data(), dA.data(), dB.data(), dC.data(), dD.data(),
                              dinit.data(), dy.data(), nullptr, d.x.data(), d.dt.data(), d.A.data(),
                              d.B.data(), d.C.data(), d.D.data(), d.init.data(), shape);
    Vec dx0(d.x.size()), ddt0(d.dt.size()), dA0(shape.heads), dB0(d.B.size()), dC0(d.C.size());
    Vec dD0(shape.heads);
    ssd_scan_backward<double>(dx0.data(), ddt0.data(), dA0.data(), dB0.data(), dC0.data(),
                              dD0.data(), nullptr, dy.data(), nullptr, d.x.data(), d.dt.data(),
                              d.A.data(), d.B.data(), d.C.data(), d.D.data(), nullptr, shape);
    Vec ddt1(d.dt.size(), NAN), dA1(shape.heads, NAN), dC1(d.C.size(), NAN),
        dinit1(d.state_size(), NAN);
    ssd_add_initial_state_backward<double>(ddt1.data(), dA1.data(), dC1.data(), dinit1.data(),
                                           dy.data(), d.dt.data(), d.A.data(), d.C.data(),
                                           d.init.data(), shape);
    EXPECT_LT(testing::max_rel_diff(testing::add(ddt0, ddt1), ddt), 1e-12);
    EXPECT_LT(testing::max_rel_diff(testing::add(dA0, dA1), dA), 1e-12);
    EXPECT_LT(testing::max_rel_diff(testing::add(dC0, dC1), dC), 1e-12);
    EXPECT_LT(testing::max_rel_diff(dinit1, dinit), 1e-12);
  }
}

// The correction's gradients on their own terms: central finite differences in double.
TEST(SsdAddInitialState, BackwardMatchesFiniteDifferences) {
  std::mt19937 rng(51);
  const SsdShape shape{2, 7, 4, 2, 2, 3, 3};  // two groups of two heads
  SsdData d(shape, rng);
  const Vec y = testing::random_vec(rng, d.x.size());
  const Vec r = testing::random_vec(rng, d.x.size());
  auto objective = [&] {
    Vec out(y.size());
    ssd_add_initial_state_forward<double>(out.data(), y.data(), d.dt.data(), d.A.data(), d.C.data(),
                                          d.init.data(), shape);
    return testing::project(r, out);
  };
  Vec ddt(d.dt.size(), NAN), dA(d.A.size(), NAN), dC(d.C.size(), NAN), dinit(d.state_size(), NAN);
  ssd_add_initial_state_backward<double>(ddt.data(), dA.data(), dC.data(), dinit.data(), r.data(),
                                         d.dt.data(), d.A.data(), d.C.data(), d.init.data(), shape);
  testing::expect_gradient("ssd_add_initial_state ddt", d.dt, ddt, objective);
  testing::expect_gradient("ssd_add_initial_state dA", d.A, dA, objective);
  testing::expect_gradient("ssd_add_initial_state dC", d.C, dC, objective);
  testing::expect_gradient("ssd_add_initial_state dinit_state", d.init, dinit, objective);
}

}  // namespace
}  // namespace hcp::cpu
