// The CPU backend's wrappers, one kernel at a time: a one-step plan run through CpuExecutor must
// give bit-for-bit what a direct call of the reference kernel gives on the same inputs (so
// every wrapper passes the right buffers, ints and floats in the right order), and must write
// every element of its outputs (activations start as NaN).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/backends/cpu/Collectives.h"
#include "runtime/comm/Communicator.h"
#include "runtime/exec/CpuExecutor.h"
#include "runtime/kernels/cpu/Kernels.h"
#include "runtime/plan/PlanBuilder.h"
#include "runtime/plan/PlanFile.h"

namespace hcp {
namespace {

using plan::Arena;
using plan::DType;
using ::testing::HasSubstr;

// Builds and runs a plan of one step. Inputs get random values (or given ones); after Run(),
// f32()/i32() hold every buffer's contents.
class OneStep {
 public:
  explicit OneStep(uint32_t seed = 1) : OneStep(seed, /*seq=*/1, std::nullopt) {}
  // A plan of sequence length `seq` on `mesh` (the collectives check their sizes against both).
  OneStep(uint32_t seed, int64_t seq, std::optional<plan::Mesh> mesh) : rng_(seed) {
    b_.set_shape(1, seq);
    if (mesh) b_.set_mesh(*mesh);
    b_.AllocateInputs();
    b_.set_loss(b_.Allocate("loss", Arena::Activations, {1}));
  }

  uint32_t In(std::vector<int64_t> shape, float lo = -1.0f, float hi = 1.0f) {
    const uint32_t index = Add(shape, DType::F32);
    std::uniform_real_distribution<float> dist(lo, hi);
    for (float& v : f32_[index]) v = dist(rng_);
    return index;
  }
  uint32_t InValues(std::vector<int64_t> shape, std::vector<float> values) {
    const uint32_t index = Add(shape, DType::F32);
    f32_[index] = std::move(values);
    return index;
  }
  uint32_t InI32(std::vector<int64_t> shape, std::vector<int32_t> values) {
    const uint32_t index = Add(shape, DType::I32);
    i32_[index] = std::move(values);
    return index;
  }
  uint32_t Out(std::vector<int64_t> shape, DType dtype = DType::F32) {
    const uint32_t index = Add(shape, dtype);
    outputs_.push_back(index);
    return index;
  }

  // A step to run before the one Run() adds.
  void AddStep(const std::string& kernel, std::vector<uint32_t> ins, std::vector<uint32_t> outs,
               std::vector<int64_t> ints, std::vector<double> floats = {}) {
    b_.AddStep(kernel, std::move(ins), std::move(outs), std::move(ints), std::move(floats));
  }

  // Adds the step, then builds, validates and runs the plan.
  absl::Status Run(const std::string& kernel, std::vector<uint32_t> ins, std::vector<uint32_t> outs,
                   std::vector<int64_t> ints, std::vector<double> floats = {}) {
    AddStep(kernel, std::move(ins), std::move(outs), std::move(ints), std::move(floats));
    absl::StatusOr<std::string> bytes = b_.Finish();
    if (!bytes.ok()) return bytes.status();
    absl::StatusOr<plan::Plan> plan = plan::ParsePlan(*bytes, kernel);
    if (!plan.ok()) return plan.status();
    absl::StatusOr<std::unique_ptr<CpuExecutor>> exec =
        CpuExecutor::Create(*plan, CpuExecutor::Options{.poison_activations = true});
    if (!exec.ok()) return exec.status();
    // Inputs only: outputs stay NaN (or NaN bits for i32) until a step writes them.
    for (auto& [index, values] : f32_) {
      if (IsOutput(index)) continue;
      std::span<float> buffer = (*exec)->F32Buffer(index);
      std::copy(values.begin(), values.end(), buffer.begin());
    }
    for (auto& [index, values] : i32_) {
      if (IsOutput(index)) continue;
      std::span<int32_t> buffer = (*exec)->I32Buffer(index);
      std::copy(values.begin(), values.end(), buffer.begin());
    }
    absl::Status status = (*exec)->RunStep();
    for (auto& [index, values] : f32_) {
      std::span<float> buffer = (*exec)->F32Buffer(index);
      values.assign(buffer.begin(), buffer.end());
    }
    for (auto& [index, values] : i32_) {
      std::span<int32_t> buffer = (*exec)->I32Buffer(index);
      values.assign(buffer.begin(), buffer.end());
    }
    return status;
  }

  // Every output element was written (no NaN left from the poisoned arena).
  void ExpectOutputsWritten() const {
    for (uint32_t index : outputs_) {
      if (!f32_.count(index)) continue;
      for (size_t i = 0; i < f32_.at(index).size(); ++i) {
        ASSERT_FALSE(std::isnan(f32_.at(index)[i])) << "output buffer " << index << "[" << i << "]";
      }
    }
  }

  std::vector<float>& f32(uint32_t index) { return f32_.at(index); }
  std::vector<int32_t>& i32(uint32_t index) { return i32_.at(index); }
  const float* p(uint32_t index) { return f32_.at(index).data(); }
  const int32_t* pi(uint32_t index) { return i32_.at(index).data(); }
  // A zeroed vector the size of buffer `index`, for the direct call's output.
  std::vector<float> Like(uint32_t index) { return std::vector<float>(f32_.at(index).size()); }

 private:
  bool IsOutput(uint32_t index) const {
    return std::find(outputs_.begin(), outputs_.end(), index) != outputs_.end();
  }
  uint32_t Add(const std::vector<int64_t>& shape, DType dtype) {
    const uint32_t index =
        b_.Allocate(absl::StrFormat("t%d", b_.num_buffers()), Arena::Activations, shape, dtype);
    const size_t n = b_.buffer(index).elements;
    if (dtype == DType::I32) {
      i32_[index].resize(n);
    } else {
      f32_[index].resize(n);
    }
    return index;
  }

  plan::PlanBuilder b_;
  std::mt19937 rng_;
  std::map<uint32_t, std::vector<float>> f32_;
  std::map<uint32_t, std::vector<int32_t>> i32_;
  std::vector<uint32_t> outputs_;
};

#define ASSERT_RUNS(one_step, ...)                          \
  do {                                                      \
    absl::Status run_status_ = (one_step).Run(__VA_ARGS__); \
    ASSERT_TRUE(run_status_.ok()) << run_status_;           \
    (one_step).ExpectOutputsWritten();                      \
  } while (0)

// A gemm step's operands, a [m,k] and b [k,n] (each stored transposed when its flag says so),
// and the reference product alpha a b + beta out over them.
struct GemmOperands {
  int trans_a, trans_b;
  int64_t m = 3, n = 4, k = 5;
  uint32_t a = 0, b = 0;

  GemmOperands(OneStep& s, int ta, int tb) : trans_a(ta), trans_b(tb) {
    a = trans_a ? s.In({k, m}) : s.In({m, k});
    b = trans_b ? s.In({n, k}) : s.In({k, n});
  }
  std::vector<int64_t> ints() const { return {trans_a, trans_b, m, n, k}; }
  void Reference(OneStep& s, float alpha, float beta, std::vector<float>& out) const {
    cpu::gemm<float>(trans_a, trans_b, m, n, k, alpha, s.p(a), trans_a ? m : k, s.p(b),
                     trans_b ? k : n, beta, out.data(), n);
  }
};

TEST(CpuBackend, Gemm) {
  for (int trans_a = 0; trans_a < 2; ++trans_a) {
    for (int trans_b = 0; trans_b < 2; ++trans_b) {
      OneStep s;
      const GemmOperands g(s, trans_a, trans_b);
      const uint32_t c = s.Out({g.m, g.n});
      ASSERT_RUNS(s, "gemm", {g.a, g.b}, {c}, g.ints(), {0.5});
      std::vector<float> want = s.Like(c);
      g.Reference(s, 0.5f, 0.0f, want);
      EXPECT_EQ(s.f32(c), want) << trans_a << trans_b;
    }
  }
}

// gemm_add is the reference GEMM with beta 1 over a copy of c (c itself untouched), and within
// float rounding of the gemm -> add it replaces (the sum is rounded once instead of twice).
TEST(CpuBackend, GemmAdd) {
  for (int trans_a = 0; trans_a < 2; ++trans_a) {
    for (int trans_b = 0; trans_b < 2; ++trans_b) {
      OneStep s;
      const GemmOperands g(s, trans_a, trans_b);
      const uint32_t c = s.In({g.m, g.n});
      const uint32_t out = s.Out({g.m, g.n});
      const std::vector<float> c_before = s.f32(c);
      ASSERT_RUNS(s, "gemm_add", {g.a, g.b, c}, {out}, g.ints(), {0.5, 1.0});
      std::vector<float> want = c_before;
      g.Reference(s, 0.5f, 1.0f, want);
      EXPECT_EQ(s.f32(out), want) << trans_a << trans_b;
      EXPECT_EQ(s.f32(c), c_before);
      std::vector<float> product(c_before.size());
      g.Reference(s, 0.5f, 0.0f, product);
      for (size_t i = 0; i < product.size(); ++i) {
        EXPECT_NEAR(s.f32(out)[i], product[i] + c_before[i], 1e-6f) << i;
      }
      // beta scales c: the residual multiplier of a sum folded in.
      ASSERT_RUNS(s, "gemm_add", {g.a, g.b, c}, {out}, g.ints(), {0.5, 0.25});
      for (size_t i = 0; i < product.size(); ++i) {
        EXPECT_NEAR(s.f32(out)[i], product[i] + 0.25f * c_before[i], 1e-6f) << i;
      }
    }
  }
}

TEST(CpuBackend, Embedding) {
  const int64_t tokens = 5, vocab = 4, hidden = 3;
  OneStep s;
  const uint32_t table = s.In({vocab, hidden});
  const uint32_t ids = s.InI32({tokens}, {0, 3, 1, 3, 2});
  const uint32_t out = s.Out({tokens, hidden});
  ASSERT_RUNS(s, "embedding.forward", {table, ids}, {out}, {tokens, vocab, hidden}, {2.0});
  std::vector<float> want = s.Like(out);
  ASSERT_TRUE(
      cpu::embedding_forward<float>(want.data(), s.pi(ids), s.p(table), tokens, vocab, hidden, 2.0f)
          .ok());
  EXPECT_EQ(s.f32(out), want);

  OneStep g;
  const uint32_t dout = g.In({tokens, hidden});
  const uint32_t gids = g.InI32({tokens}, {0, 3, 1, 3, 2});
  const uint32_t dtable = g.Out({vocab, hidden});
  ASSERT_RUNS(g, "embedding.backward", {dout, gids}, {dtable}, {tokens, vocab, hidden, 1}, {2.0});
  std::vector<float> dwant = g.Like(dtable);
  cpu::embedding_backward<float>(dwant.data(), g.p(dout), g.pi(gids), tokens, vocab, hidden, 2.0f,
                                 1);
  EXPECT_EQ(g.f32(dtable), dwant);
}

TEST(CpuBackend, RmsNorm) {
  const int64_t rows = 4, dim = 8;
  const float eps = 1e-5f;
  OneStep s;
  const uint32_t x = s.In({rows, dim}), w = s.In({dim}), y = s.Out({rows, dim});
  ASSERT_RUNS(s, "rms_norm.forward", {x, w}, {y}, {rows, dim}, {eps});
  std::vector<float> want = s.Like(y), rstd(rows);
  cpu::rms_norm_forward<float>(want.data(), rstd.data(), s.p(x), s.p(w), rows, dim, eps);
  EXPECT_EQ(s.f32(y), want);

  OneStep g;
  const uint32_t dy = g.In({rows, dim}), gx = g.In({rows, dim}), gw = g.In({dim});
  const uint32_t dx = g.Out({rows, dim}), dw = g.Out({dim});
  ASSERT_RUNS(g, "rms_norm.backward", {dy, gx, gw}, {dx, dw}, {rows, dim, 0}, {eps});
  std::vector<float> y2(rows * dim), rstd2(rows), dx_want = g.Like(dx), dw_want = g.Like(dw);
  cpu::rms_norm_forward<float>(y2.data(), rstd2.data(), g.p(gx), g.p(gw), rows, dim, eps);
  cpu::rms_norm_backward<float>(dx_want.data(), dw_want.data(), g.p(dy), g.p(gx), g.p(gw),
                                rstd2.data(), rows, dim);
  EXPECT_EQ(g.f32(dx), dx_want);
  EXPECT_EQ(g.f32(dw), dw_want);

  // With the residual stream's gradient: dx is the same gradient plus it, as an add step after
  // would give (the same f32 sums), and dw is unchanged.
  OneStep r;
  const uint32_t rdy = r.In({rows, dim}), rx = r.In({rows, dim}), rw = r.In({dim});
  const uint32_t residual = r.In({rows, dim});
  const uint32_t rdx = r.Out({rows, dim}), rdw = r.Out({dim});
  ASSERT_RUNS(r, "rms_norm.backward", {rdy, rx, rw, residual}, {rdx, rdw}, {rows, dim, 1}, {eps});
  std::vector<float> rdx_want = r.Like(rdx), rdw_want = r.Like(rdw);
  cpu::rms_norm_forward<float>(y2.data(), rstd2.data(), r.p(rx), r.p(rw), rows, dim, eps);
  cpu::rms_norm_backward<float>(rdx_want.data(), rdw_want.data(), r.p(rdy), r.p(rx), r.p(rw),
                                rstd2.data(), rows, dim);
  for (int64_t i = 0; i < rows * dim; ++i) rdx_want[i] += r.p(residual)[i];
  EXPECT_EQ(r.f32(rdx), rdx_want);
  EXPECT_EQ(r.f32(rdw), rdw_want);
}

TEST(CpuBackend, GatedRmsNorm) {
  const int64_t rows = 3, dim = 6;
  const float eps = 1e-6f;
  OneStep s;
  const uint32_t y = s.In({rows, dim}), z = s.In({rows, dim}), w = s.In({dim});
  const uint32_t out = s.Out({rows, dim});
  ASSERT_RUNS(s, "gated_rms_norm.forward", {y, z, w}, {out}, {rows, dim}, {eps});
  std::vector<float> want = s.Like(out), rstd(rows);
  cpu::gated_rms_norm_forward<float>(want.data(), rstd.data(), s.p(y), s.p(z), s.p(w), rows, dim,
                                     eps);
  EXPECT_EQ(s.f32(out), want);

  OneStep g;
  const uint32_t dout = g.In({rows, dim}), gy = g.In({rows, dim}), gz = g.In({rows, dim}),
                 gw = g.In({dim});
  const uint32_t dy = g.Out({rows, dim}), dz = g.Out({rows, dim}), dw = g.Out({dim});
  ASSERT_RUNS(g, "gated_rms_norm.backward", {dout, gy, gz, gw}, {dy, dz, dw}, {rows, dim}, {eps});
  std::vector<float> o(rows * dim), r(rows), dy_w = g.Like(dy), dz_w = g.Like(dz),
                                             dw_w = g.Like(dw);
  cpu::gated_rms_norm_forward<float>(o.data(), r.data(), g.p(gy), g.p(gz), g.p(gw), rows, dim, eps);
  cpu::gated_rms_norm_backward<float>(dy_w.data(), dz_w.data(), dw_w.data(), g.p(dout), g.p(gy),
                                      g.p(gz), g.p(gw), r.data(), rows, dim);
  EXPECT_EQ(g.f32(dy), dy_w);
  EXPECT_EQ(g.f32(dz), dz_w);
  EXPECT_EQ(g.f32(dw), dw_w);
}

TEST(CpuBackend, Elementwise) {
  const int64_t n = 7;
  using Unary = void (*)(float*, const float*, int64_t);
  using Binary = void (*)(float*, const float*, const float*, int64_t);
  const struct {
    const char* forward;
    Unary forward_fn;
    const char* backward;
    Binary backward_fn;
    bool backward_takes_y;
  } cases[] = {
      {"silu.forward", cpu::silu_forward<float>, "silu.backward", cpu::silu_backward<float>, false},
      {"softplus.forward", cpu::softplus_forward<float>, "softplus.backward",
       cpu::softplus_backward<float>, false},
      {"neg_exp.forward", cpu::neg_exp_forward<float>, "neg_exp.backward",
       cpu::neg_exp_backward<float>, true},
  };
  for (const auto& c : cases) {
    OneStep s;
    const uint32_t x = s.In({n}, -3, 3), y = s.Out({n});
    ASSERT_RUNS(s, c.forward, {x}, {y}, {n});
    std::vector<float> want = s.Like(y);
    c.forward_fn(want.data(), s.p(x), n);
    EXPECT_EQ(s.f32(y), want) << c.forward;

    OneStep g;
    const uint32_t dy = g.In({n}), xy = g.In({n}, -3, 3), dx = g.Out({n});
    ASSERT_RUNS(g, c.backward, {dy, xy}, {dx}, {n});
    std::vector<float> dwant = g.Like(dx);
    c.backward_fn(dwant.data(), g.p(dy), g.p(xy), n);
    EXPECT_EQ(g.f32(dx), dwant) << c.backward;
  }
}

TEST(CpuBackend, Swiglu) {
  const int64_t rows = 3, inner = 4;
  OneStep s;
  const uint32_t x = s.In({rows, 2 * inner}), y = s.Out({rows, inner});
  ASSERT_RUNS(s, "swiglu.forward", {x}, {y}, {rows, inner});
  std::vector<float> want = s.Like(y);
  cpu::swiglu_forward<float>(want.data(), s.p(x), rows, inner);
  EXPECT_EQ(s.f32(y), want);

  OneStep g;
  const uint32_t dy = g.In({rows, inner}), gx = g.In({rows, 2 * inner});
  const uint32_t dx = g.Out({rows, 2 * inner});
  ASSERT_RUNS(g, "swiglu.backward", {dy, gx}, {dx}, {rows, inner});
  std::vector<float> dwant = g.Like(dx);
  cpu::swiglu_backward<float>(dwant.data(), g.p(dy), g.p(gx), rows, inner);
  EXPECT_EQ(g.f32(dx), dwant);
}

TEST(CpuBackend, ScaleFillCopy) {
  OneStep s;
  const uint32_t x = s.In({5}), y = s.Out({5});
  ASSERT_RUNS(s, "scale", {x}, {y}, {5}, {-1.5});
  for (int i = 0; i < 5; ++i) EXPECT_EQ(s.f32(y)[i], s.f32(x)[i] * -1.5f);

  OneStep f;
  const uint32_t out = f.Out({4});
  ASSERT_RUNS(f, "fill", {}, {out}, {4}, {0.25});
  EXPECT_EQ(f.f32(out), std::vector<float>(4, 0.25f));

  OneStep c;
  const uint32_t in = c.In({6}), copy = c.Out({6});
  ASSERT_RUNS(c, "copy", {in}, {copy}, {6});
  EXPECT_EQ(c.f32(copy), c.f32(in));
}

TEST(CpuBackend, BroadcastBinaryOps) {
  const int64_t rows = 3, cols = 4;
  for (const char* op : {"add", "mul", "div"}) {
    for (int64_t rhs_n : {cols, rows * cols}) {
      OneStep s;
      const uint32_t a = s.In({rows, cols}), b = s.In({rhs_n}, 0.5f, 2.0f);
      const uint32_t y = s.Out({rows, cols});
      ASSERT_RUNS(s, op, {a, b}, {y}, {rows * cols, rhs_n});
      for (int64_t i = 0; i < rows * cols; ++i) {
        const float x = s.f32(a)[i], r = s.f32(b)[i % rhs_n];
        const float want = op == std::string("add")   ? x + r
                           : op == std::string("mul") ? x * r
                                                      : x / r;
        EXPECT_EQ(s.f32(y)[i], want) << op << " rhs_n=" << rhs_n << " i=" << i;
      }
    }
  }
}

TEST(CpuBackend, SumLeadingAndColumns) {
  const int64_t rows = 3, cols = 5;
  OneStep s;
  const uint32_t x = s.In({rows, cols}), y = s.Out({cols});
  ASSERT_RUNS(s, "sum_leading", {x}, {y}, {rows, cols});
  std::vector<float> want = s.Like(y);
  cpu::column_sum<float>(want.data(), s.p(x), rows, cols);
  EXPECT_EQ(s.f32(y), want);

  OneStep sl;
  const uint32_t in = sl.In({rows, cols}), out = sl.Out({rows, 2});
  ASSERT_RUNS(sl, "slice_columns", {in}, {out}, {rows, cols, 3, 2});
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_EQ(sl.f32(out)[r * 2 + 0], sl.f32(in)[r * cols + 3]);
    EXPECT_EQ(sl.f32(out)[r * 2 + 1], sl.f32(in)[r * cols + 4]);
  }

  // insert_columns writes only its columns: alone it leaves the others unwritten (NaN), and two
  // steps fill [0, 2) and [2, 5) of one buffer.
  OneStep one;
  const uint32_t part = one.In({rows, 2}), target = one.Out({rows, cols});
  ASSERT_TRUE(one.Run("insert_columns", {part}, {target}, {rows, cols, 0, 2}).ok());
  EXPECT_FALSE(std::isnan(one.f32(target)[1]));
  EXPECT_TRUE(std::isnan(one.f32(target)[2]));

  OneStep both;
  const uint32_t left = both.In({rows, 2}), right = both.In({rows, 3});
  const uint32_t whole = both.Out({rows, cols});
  both.AddStep("insert_columns", {left}, {whole}, {rows, cols, 0, 2});
  ASSERT_RUNS(both, "insert_columns", {right}, {whole}, {rows, cols, 2, 3});
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const float want = c < 2 ? both.f32(left)[r * 2 + c] : both.f32(right)[r * 3 + c - 2];
      EXPECT_EQ(both.f32(whole)[r * cols + c], want);
    }
  }
}

TEST(CpuBackend, CausalConv1d) {
  const int64_t batch = 2, seq = 5, channels = 3, width = 4;
  // has_halo = 1 adds the halo input (and the dhalo output of the backward).
  for (int has_halo = 0; has_halo < 2; ++has_halo) {
    OneStep s;
    const uint32_t x = s.In({batch, seq, channels}), w = s.In({channels, width}),
                   bias = s.In({channels});
    std::vector<uint32_t> ins = {x, w, bias};
    const uint32_t halo = has_halo ? s.In({batch, width - 1, channels}) : 0;
    if (has_halo) ins.push_back(halo);
    const uint32_t y = s.Out({batch, seq, channels});
    ASSERT_RUNS(s, "causal_conv1d.forward", ins, {y},
                {batch, seq, channels, width, has_halo, 0, 0});
    std::vector<float> want = s.Like(y);
    cpu::causal_conv1d_forward<float>(want.data(), s.p(x), has_halo ? s.p(halo) : nullptr, s.p(w),
                                      s.p(bias), batch, seq, channels, width);
    EXPECT_EQ(s.f32(y), want) << has_halo;

    OneStep g;
    const uint32_t dy = g.In({batch, seq, channels}), gx = g.In({batch, seq, channels}),
                   gw = g.In({channels, width});
    std::vector<uint32_t> gins = {dy, gx, gw};
    const uint32_t ghalo = has_halo ? g.In({batch, width - 1, channels}) : 0;
    if (has_halo) gins.push_back(ghalo);
    const uint32_t dx = g.Out({batch, seq, channels}), dw = g.Out({channels, width}),
                   dbias = g.Out({channels});
    std::vector<uint32_t> outs = {dx, dw, dbias};
    const uint32_t dhalo = has_halo ? g.Out({batch, width - 1, channels}) : 0;
    if (has_halo) outs.push_back(dhalo);
    ASSERT_RUNS(g, "causal_conv1d.backward", gins, outs,
                {batch, seq, channels, width, has_halo, 0, 0});
    std::vector<float> dx_w = g.Like(dx), dw_w = g.Like(dw), db_w = g.Like(dbias);
    std::vector<float> dhalo_w = has_halo ? g.Like(dhalo) : std::vector<float>();
    cpu::causal_conv1d_backward<float>(
        dx_w.data(), has_halo ? dhalo_w.data() : nullptr, dw_w.data(), db_w.data(), g.p(dy),
        g.p(gx), has_halo ? g.p(ghalo) : nullptr, g.p(gw), batch, seq, channels, width);
    EXPECT_EQ(g.f32(dx), dx_w) << has_halo;
    EXPECT_EQ(g.f32(dw), dw_w) << has_halo;
    EXPECT_EQ(g.f32(dbias), db_w) << has_halo;
    if (has_halo) {
      EXPECT_EQ(g.f32(dhalo), dhalo_w);
    }
  }
  // The halo is what the rows before the sequence would have been: conv of [halo | x] from
  // zeros, cut to x's rows, equals conv of x with the halo.
  const int64_t halo_rows = width - 1;
  OneStep whole;
  const uint32_t xx = whole.In({1, halo_rows + seq, channels}), w = whole.In({channels, width}),
                 bias = whole.In({channels});
  const uint32_t yy = whole.Out({1, halo_rows + seq, channels});
  ASSERT_RUNS(whole, "causal_conv1d.forward", {xx, w, bias}, {yy},
              {1, halo_rows + seq, channels, width, 0, 0, 0});
  OneStep split;
  const std::vector<float>& all = whole.f32(xx);
  const uint32_t halo =
      split.InValues({1, halo_rows, channels}, {all.begin(), all.begin() + halo_rows * channels});
  const uint32_t x =
      split.InValues({1, seq, channels}, {all.begin() + halo_rows * channels, all.end()});
  const uint32_t sw = split.InValues({channels, width}, whole.f32(w)),
                 sb = split.InValues({channels}, whole.f32(bias));
  const uint32_t y = split.Out({1, seq, channels});
  ASSERT_RUNS(split, "causal_conv1d.forward", {x, sw, sb, halo}, {y},
              {1, seq, channels, width, 1, 0, 0});
  const std::vector<float>& y_whole = whole.f32(yy);
  EXPECT_EQ(split.f32(y),
            std::vector<float>(y_whole.begin() + halo_rows * channels, y_whole.end()));
}

// With silu = 1 the conv's output goes through SiLU (hcp-fuse-conv-silu): the same values as
// the conv step and a silu.forward step; the backward recomputes the conv output from x and the
// bias (after the halo in its inputs) and gives what silu.backward then the conv backward give.
TEST(CpuBackend, CausalConv1dWithSilu) {
  const int64_t batch = 2, seq = 5, channels = 3, width = 4, n = batch * seq * channels;
  for (int has_halo = 0; has_halo < 2; ++has_halo) {
    OneStep fused;
    const uint32_t x = fused.In({batch, seq, channels}), w = fused.In({channels, width}),
                   bias = fused.In({channels});
    const uint32_t halo = has_halo ? fused.In({batch, width - 1, channels}) : 0;
    std::vector<uint32_t> ins = {x, w, bias};
    if (has_halo) ins.push_back(halo);
    const uint32_t y = fused.Out({batch, seq, channels});
    ASSERT_RUNS(fused, "causal_conv1d.forward", ins, {y},
                {batch, seq, channels, width, has_halo, 1, 0});
    const float* halo_p = has_halo ? fused.p(halo) : nullptr;
    std::vector<float> conv(n), want(n);
    cpu::causal_conv1d_forward<float>(conv.data(), fused.p(x), halo_p, fused.p(w), fused.p(bias),
                                      batch, seq, channels, width);
    cpu::silu_forward<float>(want.data(), conv.data(), n);
    EXPECT_EQ(fused.f32(y), want) << has_halo;

    OneStep g;
    const uint32_t dy = g.In({batch, seq, channels});
    const uint32_t gx = g.InValues({batch, seq, channels}, fused.f32(x)),
                   gw = g.InValues({channels, width}, fused.f32(w)),
                   gbias = g.InValues({channels}, fused.f32(bias));
    std::vector<uint32_t> gins = {dy, gx, gw};
    if (has_halo) gins.push_back(g.InValues({batch, width - 1, channels}, fused.f32(halo)));
    gins.push_back(gbias);
    const uint32_t dx = g.Out({batch, seq, channels}), dw = g.Out({channels, width}),
                   dbias = g.Out({channels});
    std::vector<uint32_t> outs = {dx, dw, dbias};
    const uint32_t dhalo = has_halo ? g.Out({batch, width - 1, channels}) : 0;
    if (has_halo) outs.push_back(dhalo);
    ASSERT_RUNS(g, "causal_conv1d.backward", gins, outs,
                {batch, seq, channels, width, has_halo, 1, 0});
    std::vector<float> dconv(n), dx_w(n), dw_w(channels * width), db_w(channels),
        dhalo_w(batch * (width - 1) * channels);
    cpu::silu_backward<float>(dconv.data(), g.p(dy), conv.data(), n);
    cpu::causal_conv1d_backward<float>(dx_w.data(), has_halo ? dhalo_w.data() : nullptr,
                                       dw_w.data(), db_w.data(), dconv.data(), fused.p(x), halo_p,
                                       fused.p(w), batch, seq, channels, width);
    EXPECT_EQ(g.f32(dx), dx_w) << has_halo;
    EXPECT_EQ(g.f32(dw), dw_w) << has_halo;
    EXPECT_EQ(g.f32(dbias), db_w) << has_halo;
    if (has_halo) {
      EXPECT_EQ(g.f32(dhalo), dhalo_w);
    }
  }
}

TEST(CpuBackend, SsdLogDecay) {
  const int64_t B = 2, S = 5, Hd = 3;
  OneStep s;
  const uint32_t dt = s.In({B, S, Hd}, 0.1f, 0.5f), A = s.In({Hd}, -1.0f, -0.1f);
  const uint32_t g = s.Out({B, Hd});
  ASSERT_RUNS(s, "ssd_log_decay.forward", {dt, A}, {g}, {B, S, Hd, 0});
  std::vector<float> g_w = s.Like(g);
  cpu::ssd_log_decay<float>(g_w.data(), s.p(dt), s.p(A), B, S, Hd);
  EXPECT_EQ(s.f32(g), g_w);

  OneStep b;
  const uint32_t dg = b.In({B, Hd}), bdt = b.In({B, S, Hd}, 0.1f, 0.5f),
                 bA = b.In({Hd}, -1.0f, -0.1f);
  const uint32_t ddt = b.Out({B, S, Hd}), dA = b.Out({Hd});
  ASSERT_RUNS(b, "ssd_log_decay.backward", {dg, bdt, bA}, {ddt, dA}, {B, S, Hd});
  std::vector<float> ddt_w = b.Like(ddt), dA_w = b.Like(dA);
  cpu::ssd_log_decay_backward<float>(ddt_w.data(), dA_w.data(), b.p(dg), b.p(bdt), b.p(bA), B, S,
                                     Hd);
  EXPECT_EQ(b.f32(ddt), ddt_w);
  EXPECT_EQ(b.f32(dA), dA_w);
}

// The collectives on one rank (LocalCommunicator): under zigzag, cp=1 holds both segments of the
// sequence, so the halo and the state pass from its first segment to its second locally.
TEST(CpuBackend, CollectivesOnOneRank) {
  const plan::Mesh zigzag{.cp = 1, .dp = 1, .layout = plan::SequenceLayout::Zigzag};
  const int64_t B = 2, len = 3, C = 2, width = 2, segs = 2, seq = segs * len;
  {
    OneStep s(1, seq, zigzag);
    const uint32_t x = s.In({B * segs, len, C});
    const uint32_t halo = s.Out({B * segs, width, C});
    ASSERT_RUNS(s, "halo_exchange.forward", {x}, {halo}, {B, segs, len, C, width});
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t i = 0; i < width * C; ++i) {
        // Segment 0 starts the sequence; segment 1 gets segment 0's last rows.
        EXPECT_EQ(s.f32(halo)[(b * segs + 0) * width * C + i], 0.0f);
        EXPECT_EQ(s.f32(halo)[(b * segs + 1) * width * C + i],
                  s.f32(x)[((b * segs + 0) * len + len - width) * C + i]);
      }
    }
    OneStep g(1, seq, zigzag);
    const uint32_t dhalo = g.In({B * segs, width, C});
    const uint32_t dx = g.Out({B * segs, len, C});
    ASSERT_RUNS(g, "halo_exchange.backward", {dhalo}, {dx}, {B, segs, len, C, width});
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t i = 0; i < len * C; ++i) {
        const bool tail = i >= (len - width) * C;
        EXPECT_EQ(g.f32(dx)[(b * segs + 0) * len * C + i],
                  tail ? g.f32(dhalo)[(b * segs + 1) * width * C + i - (len - width) * C] : 0.0f);
        EXPECT_EQ(g.f32(dx)[(b * segs + 1) * len * C + i], 0.0f);
      }
    }
  }
  const int64_t Hd = 2, P = 2, N = 3, PN = P * N;
  for (int strategy = 0; strategy < 2; ++strategy) {
    OneStep s(1, seq, zigzag);
    const uint32_t g = s.In({B * segs, Hd}, -1.0f, -0.1f), st = s.In({B * segs, Hd, P, N});
    const uint32_t s_in = s.Out({B * segs, Hd, P, N});
    ASSERT_RUNS(s, "state_scan.forward", {g, st}, {s_in}, {B, segs, Hd, P, N, strategy});
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t i = 0; i < Hd * PN; ++i) {
        EXPECT_EQ(s.f32(s_in)[(b * segs + 0) * Hd * PN + i], 0.0f);
        EXPECT_EQ(s.f32(s_in)[(b * segs + 1) * Hd * PN + i], s.f32(st)[(b * segs) * Hd * PN + i]);
      }
    }
    OneStep r(1, seq, zigzag);
    const uint32_t ds_in = r.In({B * segs, Hd, P, N}), rg = r.InValues({B * segs, Hd}, s.f32(g)),
                   rs_in = r.InValues({B * segs, Hd, P, N}, s.f32(s_in));
    const uint32_t dg = r.Out({B * segs, Hd}), ds = r.Out({B * segs, Hd, P, N});
    ASSERT_RUNS(r, "state_scan.backward", {ds_in, rg, rs_in}, {dg, ds},
                {B, segs, Hd, P, N, strategy});
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < Hd; ++h) {
        // ds[0] = ds_in[1]; ds[1] = 0 (nothing after the last segment); dg[0] = <s_in[0] = 0, .>.
        for (int64_t i = 0; i < PN; ++i) {
          EXPECT_EQ(r.f32(ds)[((b * segs + 0) * Hd + h) * PN + i],
                    r.f32(ds_in)[((b * segs + 1) * Hd + h) * PN + i]);
          EXPECT_EQ(r.f32(ds)[((b * segs + 1) * Hd + h) * PN + i], 0.0f);
        }
        EXPECT_EQ(r.f32(dg)[(b * segs + 0) * Hd + h], 0.0f);
        EXPECT_EQ(r.f32(dg)[(b * segs + 1) * Hd + h], 0.0f);
      }
    }
  }
  {
    // Ring attention on one rank is attention over its two segments (merged by log-sum-exp).
    const int64_t Hq = 2, Hkv = 1, D = 3;
    const cpu::AttentionShape shape{B, seq, seq, Hq, Hkv, D};
    OneStep s(1, seq, zigzag);
    const uint32_t q = s.In({B, seq, Hq, D}), k = s.In({B, seq, Hkv, D}),
                   v = s.In({B, seq, Hkv, D});
    const uint32_t out = s.Out({B, seq, Hq, D}), lse = s.Out({B, Hq, seq});
    ASSERT_RUNS(s, "ring_attention.forward", {q, k, v}, {out, lse}, {B, seq, Hq, Hkv, D, 1, 0},
                {0.6});
    std::vector<float> out_w = s.Like(out), lse_w = s.Like(lse);
    cpu::attention_forward<float>(out_w.data(), lse_w.data(), s.p(q), s.p(k), s.p(v), shape, 0.6f,
                                  true, 0, 0);
    for (size_t i = 0; i < out_w.size(); ++i) EXPECT_NEAR(s.f32(out)[i], out_w[i], 1e-6);
    for (size_t i = 0; i < lse_w.size(); ++i) EXPECT_NEAR(s.f32(lse)[i], lse_w[i], 1e-6);
  }
  {
    OneStep s(1, seq, zigzag);
    const uint32_t x = s.In({7});
    const uint32_t y = s.Out({7});
    ASSERT_RUNS(s, "all_reduce", {x}, {y}, {7, 1});
    EXPECT_EQ(s.f32(y), s.f32(x));
  }
}

TEST(CpuBackend, SsdScan) {
  const int64_t B = 2, S = 6, Hd = 4, P = 3, G = 2, N = 2;
  // chunk 4 (a partial last chunk) and chunk 100 (longer than the sequence: one chunk).
  for (int64_t chunk : {4, 100}) {
    for (int has_init = 0; has_init < 2; ++has_init) {
      const cpu::SsdShape shape{B, S, Hd, P, G, N, std::min(chunk, S)};
      OneStep s;
      const uint32_t x = s.In({B, S, Hd, P}), dt = s.In({B, S, Hd}, 0.1f, 0.5f),
                     A = s.In({Hd}, -1.0f, -0.1f), Bm = s.In({B, S, G, N}), Cm = s.In({B, S, G, N}),
                     D = s.In({Hd});
      std::vector<uint32_t> ins = {x, dt, A, Bm, Cm, D};
      const uint32_t init = has_init ? s.In({B, Hd, P, N}) : 0;
      if (has_init) ins.push_back(init);
      const uint32_t y = s.Out({B, S, Hd, P}), final_state = s.Out({B, Hd, P, N});
      ASSERT_RUNS(s, "ssd_scan.forward", ins, {y, final_state},
                  {B, S, Hd, P, G, N, chunk, has_init, 0, 0});
      std::vector<float> y_w = s.Like(y), f_w = s.Like(final_state);
      cpu::ssd_scan_forward<float>(y_w.data(), f_w.data(), s.p(x), s.p(dt), s.p(A), s.p(Bm),
                                   s.p(Cm), s.p(D), has_init ? s.p(init) : nullptr, shape);
      EXPECT_EQ(s.f32(y), y_w) << chunk << has_init;
      EXPECT_EQ(s.f32(final_state), f_w) << chunk << has_init;

      for (int has_dfinal = 0; has_dfinal < 2; ++has_dfinal) {
        OneStep g;
        const uint32_t dy = g.In({B, S, Hd, P}), gx = g.In({B, S, Hd, P}),
                       gdt = g.In({B, S, Hd}, 0.1f, 0.5f), gA = g.In({Hd}, -1.0f, -0.1f),
                       gB = g.In({B, S, G, N}), gC = g.In({B, S, G, N}), gD = g.In({Hd});
        std::vector<uint32_t> gins = {dy, gx, gdt, gA, gB, gC, gD};
        const uint32_t ginit = has_init ? g.In({B, Hd, P, N}) : 0;
        if (has_init) gins.push_back(ginit);
        const uint32_t dfinal = has_dfinal ? g.In({B, Hd, P, N}) : 0;
        if (has_dfinal) gins.push_back(dfinal);
        std::vector<uint32_t> outs = {g.Out({B, S, Hd, P}), g.Out({B, S, Hd}),   g.Out({Hd}),
                                      g.Out({B, S, G, N}),  g.Out({B, S, G, N}), g.Out({Hd})};
        if (has_init) outs.push_back(g.Out({B, Hd, P, N}));
        ASSERT_RUNS(g, "ssd_scan.backward", gins, outs,
                    {B, S, Hd, P, G, N, chunk, has_init, has_dfinal, 0, 0});
        std::vector<std::vector<float>> want;
        for (uint32_t o : outs) want.push_back(g.Like(o));
        cpu::ssd_scan_backward<float>(
            want[0].data(), want[1].data(), want[2].data(), want[3].data(), want[4].data(),
            want[5].data(), has_init ? want[6].data() : nullptr, g.p(dy),
            has_dfinal ? g.p(dfinal) : nullptr, g.p(gx), g.p(gdt), g.p(gA), g.p(gB), g.p(gC),
            g.p(gD), has_init ? g.p(ginit) : nullptr, shape);
        for (size_t o = 0; o < outs.size(); ++o) {
          EXPECT_EQ(g.f32(outs[o]), want[o]) << "output " << o << " chunk " << chunk << " has_init "
                                             << has_init << " has_dfinal " << has_dfinal;
        }
      }
    }
  }
}

// Largest |a - b| / max(1, |b|).
double MaxRelDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0.0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    const double err = std::abs(static_cast<double>(a[i]) - b[i]) /
                       std::max(1.0, std::abs(static_cast<double>(b[i])));
    if (!(err <= worst)) worst = err;  // also catches NaN
  }
  return worst;
}

// ssd_final_state.forward / .backward (context parallelism's segment summary): bit for bit the
// reference kernels, and against ssd_scan.forward / .backward in the same plan on the same
// buffers: the final state from a zero start, and the gradients with dy = 0 (C and D random: they
// must not matter). Tolerance a relative 1e-6, a few f32 roundings (the CPU kernels run the same
// chunk steps: in fact equal).
TEST(CpuBackend, SsdFinalStateIsTheScansFinalState) {
  const int64_t B = 2, S = 6, Hd = 4, P = 3, G = 2, N = 2;
  constexpr double kTol = 1e-6;
  for (int64_t chunk : {4, 100}) {  // a partial last chunk; one chunk longer than the sequence
    OneStep s;
    const uint32_t x = s.In({B, S, Hd, P}), dt = s.In({B, S, Hd}, 0.1f, 0.5f),
                   A = s.In({Hd}, -1.0f, -0.1f), Bm = s.In({B, S, G, N}), Cm = s.In({B, S, G, N}),
                   D = s.In({Hd});
    const uint32_t y = s.Out({B, S, Hd, P}), scan_final = s.Out({B, Hd, P, N}),
                   final_state = s.Out({B, Hd, P, N});
    s.AddStep("ssd_scan.forward", {x, dt, A, Bm, Cm, D}, {y, scan_final},
              {B, S, Hd, P, G, N, chunk, /*has_init=*/0, 0, 0});
    ASSERT_RUNS(s, "ssd_final_state.forward", {x, dt, A, Bm}, {final_state},
                {B, S, Hd, P, G, N, chunk, 0});
    const cpu::SsdShape shape{B, S, Hd, P, G, N, std::min(chunk, S)};
    std::vector<float> final_w = s.Like(final_state);
    cpu::ssd_final_state_forward<float>(final_w.data(), s.p(x), s.p(dt), s.p(A), s.p(Bm), shape);
    EXPECT_EQ(s.f32(final_state), final_w) << "chunk " << chunk;
    EXPECT_LT(MaxRelDiff(s.f32(final_state), s.f32(scan_final)), kTol) << "chunk " << chunk;

    OneStep g;
    const uint32_t dfinal = g.In({B, Hd, P, N}), gx = g.In({B, S, Hd, P}),
                   gdt = g.In({B, S, Hd}, 0.1f, 0.5f), gA = g.In({Hd}, -1.0f, -0.1f),
                   gB = g.In({B, S, G, N}), gC = g.In({B, S, G, N}), gD = g.In({Hd});
    const uint32_t zero_dy =
        g.InValues({B, S, Hd, P}, std::vector<float>(static_cast<size_t>(B * S * Hd * P), 0.0f));
    const std::vector<uint32_t> scan_grads = {g.Out({B, S, Hd, P}), g.Out({B, S, Hd}),
                                              g.Out({Hd}),          g.Out({B, S, G, N}),
                                              g.Out({B, S, G, N}),  g.Out({Hd})};
    const std::vector<uint32_t> grads = {g.Out({B, S, Hd, P}), g.Out({B, S, Hd}), g.Out({Hd}),
                                         g.Out({B, S, G, N})};
    g.AddStep("ssd_scan.backward", {zero_dy, gx, gdt, gA, gB, gC, gD, dfinal}, scan_grads,
              {B, S, Hd, P, G, N, chunk, /*has_init=*/0, /*has_dfinal=*/1, 0, 0});
    ASSERT_RUNS(g, "ssd_final_state.backward", {dfinal, gx, gdt, gA, gB}, grads,
                {B, S, Hd, P, G, N, chunk, 0});
    std::vector<std::vector<float>> want;
    for (uint32_t o : grads) want.push_back(g.Like(o));
    cpu::ssd_final_state_backward<float>(want[0].data(), want[1].data(), want[2].data(),
                                         want[3].data(), g.p(dfinal), g.p(gx), g.p(gdt), g.p(gA),
                                         g.p(gB), shape);
    const char* names[] = {"dx", "ddt", "dA", "dB"};
    for (size_t i = 0; i < grads.size(); ++i) {
      EXPECT_EQ(g.f32(grads[i]), want[i]) << names[i] << " chunk " << chunk;
      EXPECT_LT(MaxRelDiff(g.f32(grads[i]), g.f32(scan_grads[i])), kTol)
          << names[i] << " chunk " << chunk;
      const std::vector<float>& scan_grad = g.f32(scan_grads[i]);
      EXPECT_TRUE(
          std::any_of(scan_grad.begin(), scan_grad.end(), [](float v) { return v != 0.0f; }))
          << names[i] << " is all zero, chunk " << chunk;
    }
  }
}

// The incoming state's correction: the steps run the kernels, and a zero-start scan plus the
// correction is the scan from the state.
TEST(CpuBackend, SsdAddInitialStateIsTheScanFromTheState) {
  const int64_t B = 2, S = 6, Hd = 4, P = 3, G = 2, N = 2, chunk = 4;
  constexpr double kTol = 1e-5;
  const cpu::SsdShape shape{B, S, Hd, P, G, N, chunk};
  OneStep s;
  const uint32_t x = s.In({B, S, Hd, P}), dt = s.In({B, S, Hd}, 0.1f, 0.5f),
                 A = s.In({Hd}, -1.0f, -0.1f), Bm = s.In({B, S, G, N}), Cm = s.In({B, S, G, N}),
                 D = s.In({Hd}), init = s.In({B, Hd, P, N});
  const uint32_t y0 = s.Out({B, S, Hd, P}), final0 = s.Out({B, Hd, P, N}),
                 y_init = s.Out({B, S, Hd, P}), final_init = s.Out({B, Hd, P, N}),
                 out = s.Out({B, S, Hd, P});
  s.AddStep("ssd_scan.forward", {x, dt, A, Bm, Cm, D}, {y0, final0},
            {B, S, Hd, P, G, N, chunk, /*has_init=*/0, 0, 0});
  s.AddStep("ssd_scan.forward", {x, dt, A, Bm, Cm, D, init}, {y_init, final_init},
            {B, S, Hd, P, G, N, chunk, /*has_init=*/1, 0, 0});
  ASSERT_RUNS(s, "ssd_add_initial_state.forward", {y0, dt, A, Cm, init}, {out},
              {B, S, Hd, P, G, N, 0});
  std::vector<float> out_w = s.Like(out);
  cpu::ssd_add_initial_state_forward<float>(out_w.data(), s.p(y0), s.p(dt), s.p(A), s.p(Cm),
                                            s.p(init), shape);
  EXPECT_EQ(s.f32(out), out_w);
  EXPECT_LT(MaxRelDiff(s.f32(out), s.f32(y_init)), kTol);

  OneStep g;
  const uint32_t dout = g.In({B, S, Hd, P}), gdt = g.In({B, S, Hd}, 0.1f, 0.5f),
                 gA = g.In({Hd}, -1.0f, -0.1f), gC = g.In({B, S, G, N}),
                 ginit = g.In({B, Hd, P, N});
  const std::vector<uint32_t> grads = {g.Out({B, S, Hd}), g.Out({Hd}), g.Out({B, S, G, N}),
                                       g.Out({B, Hd, P, N})};
  ASSERT_RUNS(g, "ssd_add_initial_state.backward", {dout, gdt, gA, gC, ginit}, grads,
              {B, S, Hd, P, G, N, 0});
  std::vector<std::vector<float>> want;
  for (uint32_t o : grads) want.push_back(g.Like(o));
  cpu::ssd_add_initial_state_backward<float>(want[0].data(), want[1].data(), want[2].data(),
                                             want[3].data(), g.p(dout), g.p(gdt), g.p(gA), g.p(gC),
                                             g.p(ginit), shape);
  const char* names[] = {"ddt", "dA", "dC", "dinit"};
  for (size_t i = 0; i < grads.size(); ++i) EXPECT_EQ(g.f32(grads[i]), want[i]) << names[i];
}

TEST(CpuBackend, Attention) {
  const int64_t B = 2, S = 4, Hq = 4, Hkv = 2, D = 3;
  const cpu::AttentionShape shape{B, S, S, Hq, Hkv, D};
  for (int causal = 0; causal < 2; ++causal) {
    OneStep s;
    const uint32_t q = s.In({B, S, Hq, D}), k = s.In({B, S, Hkv, D}), v = s.In({B, S, Hkv, D});
    const uint32_t out = s.Out({B, S, Hq, D}), lse = s.Out({B, Hq, S});
    ASSERT_RUNS(s, "attention.forward", {q, k, v}, {out, lse}, {B, S, Hq, Hkv, D, causal, 0},
                {0.7});
    std::vector<float> out_w = s.Like(out), lse_w = s.Like(lse);
    cpu::attention_forward<float>(out_w.data(), lse_w.data(), s.p(q), s.p(k), s.p(v), shape, 0.7f,
                                  causal, 0, 0);
    EXPECT_EQ(s.f32(out), out_w);
    EXPECT_EQ(s.f32(lse), lse_w);

    OneStep g;
    const uint32_t dout = g.In({B, S, Hq, D});
    const uint32_t gq = g.InValues({B, S, Hq, D}, s.f32(q)),
                   gk = g.InValues({B, S, Hkv, D}, s.f32(k)),
                   gv = g.InValues({B, S, Hkv, D}, s.f32(v)),
                   gout = g.InValues({B, S, Hq, D}, s.f32(out)),
                   glse = g.InValues({B, Hq, S}, s.f32(lse));
    const uint32_t dq = g.Out({B, S, Hq, D}), dk = g.Out({B, S, Hkv, D}),
                   dv = g.Out({B, S, Hkv, D});
    ASSERT_RUNS(g, "attention.backward", {dout, gq, gk, gv, gout, glse}, {dq, dk, dv},
                {B, S, Hq, Hkv, D, causal, 0}, {0.7});
    std::vector<float> dq_w = g.Like(dq), dk_w = g.Like(dk), dv_w = g.Like(dv);
    cpu::attention_backward<float>(dq_w.data(), dk_w.data(), dv_w.data(), g.p(dout), g.p(gq),
                                   g.p(gk), g.p(gv), g.p(gout), g.p(glse), shape, 0.7f, causal, 0,
                                   0);
    EXPECT_EQ(g.f32(dq), dq_w);
    EXPECT_EQ(g.f32(dk), dk_w);
    EXPECT_EQ(g.f32(dv), dv_w);
  }
}

TEST(CpuBackend, MoeRouting) {
  const int64_t tokens = 5, experts = 4, k = 2;
  OneStep s;
  const uint32_t logits = s.In({tokens, experts});
  const uint32_t gates = s.Out({tokens, k}), idx = s.Out({tokens, k}, DType::I32);
  ASSERT_RUNS(s, "moe_route.forward", {logits}, {gates, idx}, {tokens, experts, k});
  std::vector<float> gates_w = s.Like(gates);
  std::vector<int32_t> idx_w(tokens * k);
  cpu::topk_softmax_forward<float>(gates_w.data(), idx_w.data(), s.p(logits), tokens, experts, k);
  EXPECT_EQ(s.f32(gates), gates_w);
  EXPECT_EQ(s.i32(idx), idx_w);

  OneStep g;
  const uint32_t dgates = g.In({tokens, k}), ggates = g.InValues({tokens, k}, gates_w),
                 gidx = g.InI32({tokens, k}, idx_w);
  const uint32_t dlogits = g.Out({tokens, experts});
  ASSERT_RUNS(g, "moe_route.backward", {dgates, ggates, gidx}, {dlogits}, {tokens, experts, k});
  std::vector<float> want = g.Like(dlogits);
  cpu::topk_softmax_backward<float>(want.data(), g.p(dgates), g.p(ggates), g.pi(gidx), tokens,
                                    experts, k);
  EXPECT_EQ(g.f32(dlogits), want);
}

TEST(CpuBackend, MoeExperts) {
  const int64_t tokens = 4, hidden = 3, inner = 2, experts = 3, k = 2;
  const std::vector<int32_t> idx = {0, 2, 1, 0, 2, 1, 1, 2};
  OneStep s;
  const uint32_t x = s.In({tokens, hidden}), gates = s.In({tokens, k}, 0, 1),
                 experts_buf = s.InI32({tokens, k}, idx), w_in = s.In({experts, 2 * inner, hidden}),
                 w_out = s.In({experts, hidden, inner});
  const uint32_t out = s.Out({tokens, hidden});
  ASSERT_RUNS(s, "moe_experts.forward", {x, gates, experts_buf, w_in, w_out}, {out},
              {tokens, hidden, inner, experts, k, 0});
  std::vector<float> want = s.Like(out);
  cpu::moe_experts_forward<float>(want.data(), s.p(x), s.p(gates), idx.data(), s.p(w_in),
                                  s.p(w_out), tokens, hidden, inner, experts, k);
  EXPECT_EQ(s.f32(out), want);

  OneStep g;
  const uint32_t dout = g.In({tokens, hidden}), gx = g.In({tokens, hidden}),
                 ggates = g.In({tokens, k}, 0, 1), gidx = g.InI32({tokens, k}, idx),
                 gw_in = g.In({experts, 2 * inner, hidden}),
                 gw_out = g.In({experts, hidden, inner});
  const uint32_t dx = g.Out({tokens, hidden}), dg = g.Out({tokens, k}),
                 dw_in = g.Out({experts, 2 * inner, hidden}),
                 dw_out = g.Out({experts, hidden, inner});
  ASSERT_RUNS(g, "moe_experts.backward", {dout, gx, ggates, gidx, gw_in, gw_out},
              {dx, dg, dw_in, dw_out}, {tokens, hidden, inner, experts, k, 0}, {1.0});
  std::vector<float> dx_w = g.Like(dx), dg_w = g.Like(dg), dwi_w = g.Like(dw_in),
                     dwo_w = g.Like(dw_out);
  cpu::moe_experts_backward<float>(dx_w.data(), dg_w.data(), dwi_w.data(), dwo_w.data(), g.p(dout),
                                   g.p(gx), g.p(ggates), idx.data(), g.p(gw_in), g.p(gw_out),
                                   tokens, hidden, inner, experts, k);
  EXPECT_EQ(g.f32(dx), dx_w);
  EXPECT_EQ(g.f32(dg), dg_w);
  EXPECT_EQ(g.f32(dw_in), dwi_w);
  EXPECT_EQ(g.f32(dw_out), dwo_w);

  // dout_scale: exactly the backward of a dout scaled first (the scale step it replaces).
  ASSERT_RUNS(g, "moe_experts.backward", {dout, gx, ggates, gidx, gw_in, gw_out},
              {dx, dg, dw_in, dw_out}, {tokens, hidden, inner, experts, k, 0}, {0.25});
  std::vector<float> scaled_dout = g.f32(dout);
  for (float& v : scaled_dout) v *= 0.25f;
  cpu::moe_experts_backward<float>(dx_w.data(), dg_w.data(), dwi_w.data(), dwo_w.data(),
                                   scaled_dout.data(), g.p(gx), g.p(ggates), idx.data(), g.p(gw_in),
                                   g.p(gw_out), tokens, hidden, inner, experts, k);
  EXPECT_EQ(g.f32(dx), dx_w);
  EXPECT_EQ(g.f32(dg), dg_w);
  EXPECT_EQ(g.f32(dw_in), dwi_w);
  EXPECT_EQ(g.f32(dw_out), dwo_w);
  EXPECT_NE(g.f32(dw_out), g.Like(dw_out));  // not all zero: the comparison can fail
}

// keep_h: the forward also writes each slot's [a | b] = W_in[e] x, and the backward reads it
// instead of recomputing it.
TEST(CpuBackend, MoeExpertsKeptH) {
  const int64_t tokens = 4, hidden = 3, inner = 2, experts = 3, k = 2;
  const std::vector<int32_t> idx = {0, 2, 1, 0, 2, 1, 1, 2};
  OneStep s;
  const uint32_t x = s.In({tokens, hidden}), gates = s.In({tokens, k}, 0, 1),
                 ids = s.InI32({tokens, k}, idx), w_in = s.In({experts, 2 * inner, hidden}),
                 w_out = s.In({experts, hidden, inner});
  const uint32_t out = s.Out({tokens, hidden}), kept = s.Out({tokens, k, 2 * inner});
  ASSERT_RUNS(s, "moe_experts.forward", {x, gates, ids, w_in, w_out}, {out, kept},
              {tokens, hidden, inner, experts, k, 1});
  std::vector<float> want = s.Like(out);
  cpu::moe_experts_forward<float>(want.data(), s.p(x), s.p(gates), idx.data(), s.p(w_in),
                                  s.p(w_out), tokens, hidden, inner, experts, k);
  EXPECT_EQ(s.f32(out), want);
  const std::vector<float> h = s.f32(kept);
  for (int64_t slot = 0; slot < tokens * k; slot++) {
    for (int64_t r = 0; r < 2 * inner; r++) {
      double product = 0;
      for (int64_t c = 0; c < hidden; c++) {
        product += double{s.p(w_in)[(idx[slot] * 2 * inner + r) * hidden + c]} *
                   s.p(x)[slot / k * hidden + c];
      }
      EXPECT_FLOAT_EQ(h[slot * 2 * inner + r], static_cast<float>(product)) << slot << " " << r;
    }
  }

  // The backward given the kept h: the recomputing backward's results to fp32 rounding (the
  // kept h is rounded to f32, the recomputed one stays double); then a changed kept h changes
  // them, so it is what the backward reads.
  auto backward = [&](const std::vector<float>* kept_h) {
    OneStep g(/*seed=*/7);
    const uint32_t dout = g.In({tokens, hidden});
    const uint32_t gx = g.InValues({tokens, hidden}, s.f32(x)),
                   gg = g.InValues({tokens, k}, s.f32(gates)), gi = g.InI32({tokens, k}, idx),
                   gwi = g.InValues({experts, 2 * inner, hidden}, s.f32(w_in)),
                   gwo = g.InValues({experts, hidden, inner}, s.f32(w_out));
    const uint32_t dx = g.Out({tokens, hidden}), dg = g.Out({tokens, k}),
                   dwi = g.Out({experts, 2 * inner, hidden}), dwo = g.Out({experts, hidden, inner});
    std::vector<uint32_t> ins = {dout, gx, gg, gi, gwi, gwo};
    if (kept_h != nullptr) ins.push_back(g.InValues({tokens, k, 2 * inner}, *kept_h));
    EXPECT_TRUE(g.Run("moe_experts.backward", ins, {dx, dg, dwi, dwo},
                      {tokens, hidden, inner, experts, k, kept_h != nullptr ? 1 : 0}, {1.0})
                    .ok());
    std::vector<float> all;
    for (uint32_t b : {dx, dg, dwi, dwo}) {
      const std::vector<float> v = g.f32(b);
      all.insert(all.end(), v.begin(), v.end());
    }
    return all;
  };
  const std::vector<float> recomputed = backward(nullptr), from_kept = backward(&h);
  ASSERT_EQ(recomputed.size(), from_kept.size());
  for (size_t i = 0; i < recomputed.size(); i++) {
    EXPECT_NEAR(from_kept[i], recomputed[i], 1e-5 * (1 + std::abs(recomputed[i]))) << i;
  }
  std::vector<float> changed = h;
  changed[0] += 1.f;  // slot 0's a[0]
  EXPECT_NE(backward(&changed), from_kept);
}

TEST(CpuBackend, ExpertIndicesAreChecked) {
  const int64_t tokens = 2, hidden = 3, inner = 2, experts = 3, k = 1;
  OneStep s;
  const uint32_t x = s.In({tokens, hidden}), gates = s.In({tokens, k}),
                 idx = s.InI32({tokens, k}, {1, 3}), w_in = s.In({experts, 2 * inner, hidden}),
                 w_out = s.In({experts, hidden, inner});
  const uint32_t out = s.Out({tokens, hidden});
  absl::Status status = s.Run("moe_experts.forward", {x, gates, idx, w_in, w_out}, {out},
                              {tokens, hidden, inner, experts, k, 0});
  ASSERT_FALSE(status.ok());
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("step 0 (moe_experts.forward): expert index 3 at position 1 is outside "
                        "[0, 3)"));
}

TEST(CpuBackend, CrossEntropy) {
  const int64_t tokens = 4, vocab = 5, ignore = -100;
  const std::vector<int32_t> targets = {1, -100, 4, 0};
  OneStep s;
  const uint32_t logits = s.In({tokens, vocab}, -3, 3), tg = s.InI32({tokens}, targets);
  const uint32_t loss_sum = s.Out({1}), count = s.Out({1});
  ASSERT_RUNS(s, "cross_entropy.forward", {logits, tg}, {loss_sum, count}, {tokens, vocab, ignore});
  float ls = 0, vc = 0;
  std::vector<float> lse(tokens);
  ASSERT_TRUE(cpu::cross_entropy_forward<float>(&ls, &vc, lse.data(), s.p(logits), targets.data(),
                                                tokens, vocab, ignore)
                  .ok());
  EXPECT_EQ(s.f32(loss_sum)[0], ls);
  EXPECT_EQ(s.f32(count)[0], 3.0f);

  OneStep g;
  const uint32_t dloss = g.InValues({1}, {0.25f}), glogits = g.In({tokens, vocab}, -3, 3),
                 gtg = g.InI32({tokens}, targets);
  const uint32_t dlogits = g.Out({tokens, vocab});
  ASSERT_RUNS(g, "cross_entropy.backward", {dloss, glogits, gtg}, {dlogits},
              {tokens, vocab, ignore});
  std::vector<float> lse2(tokens), want = g.Like(dlogits);
  ASSERT_TRUE(cpu::cross_entropy_forward<float>(&ls, &vc, lse2.data(), g.p(glogits), targets.data(),
                                                tokens, vocab, ignore)
                  .ok());
  const float dl = 0.25f;
  cpu::cross_entropy_backward<float>(want.data(), &dl, g.p(glogits), lse2.data(), targets.data(),
                                     tokens, vocab, ignore);
  EXPECT_EQ(g.f32(dlogits), want);
}

}  // namespace
}  // namespace hcp
