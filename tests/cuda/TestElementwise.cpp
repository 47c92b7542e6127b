// Elementwise ops, broadcasts, column slices and column sums against runtime/kernels/cpu (and,
// for mul/div/fill/copy, the plain loops the CPU backend uses as their reference).
#include <cmath>
#include <string>
#include <type_traits>

#include "runtime/kernels/cpu/Kernels.h"
#include "tests/cuda/Harness.h"

namespace hcp::cuda::test {
namespace {

template <typename T>
constexpr bool kBf16 = std::is_same_v<T, bf16>;
template <typename T>
const char* type_name() {
  return kBf16<T> ? "bf16" : "f32";
}

// bf16 out: one rounding of an fp32 result (8 significant bits: at most 2^-9 relative, RMS
// ~1.1e-3). fp32 out: the same fp32 formula as the oracle, up to a few ulp in exp/log.
template <typename T>
constexpr double kTolRounded = kBf16<T> ? 4e-3 : 1e-5;
// Sums over rows in fp32 (fp32 out: the summation order differs from the oracle's double).
template <typename T>
constexpr double kTolColumnSum = kBf16<T> ? 4e-3 : 1e-4;
// Pure data movement: exact.
constexpr double kExact = 0.0;

// A device array of n elements, optionally starting one element past an aligned address so that
// the kernels' element-wise (non-vector) path runs.
template <typename T>
class Buf {
 public:
  Buf(int64_t n, bool misalign) : dev_(n + (misalign ? 1 : 0)), off_(misalign ? 1 : 0), n_(n) {}
  T* get() const { return dev_.get() + off_; }
  void set(const std::vector<float>& host) {
    std::vector<float> full(n_ + off_, 0.f);
    std::copy(host.begin(), host.end(), full.begin() + off_);
    dev_.upload(full);
  }
  std::vector<float> host() const {
    std::vector<float> full = dev_.download();
    return std::vector<float>(full.begin() + off_, full.end());
  }
  void poison() { dev_.poison(); }

 private:
  Dev<T> dev_;
  int64_t off_;
  int64_t n_;
};

template <typename T>
std::vector<float> rounded(std::vector<float> v) {
  if constexpr (kBf16<T>) {
    for (float& x : v) x = round_bf16(x);
  }
  return v;
}

std::string with_type(const std::string& name, const char* type) { return name + "." + type; }

// y = f(inputs...): one or two inputs of n elements (the second may be shorter: rhs_n).
template <typename T>
void map_case(Context& ctx, const std::string& name, const std::string& shape, int64_t n,
              bool misalign, const std::vector<std::vector<float>>& inputs, double tol,
              const std::function<Status(T*, const std::vector<const T*>&)>& gpu,
              const std::function<void(float*, const std::vector<const float*>&)>& ref, bool time) {
  std::vector<Buf<T>> bufs;
  std::vector<const T*> ptrs;
  std::vector<const float*> host_ptrs;
  for (const std::vector<float>& in : inputs) {
    bufs.emplace_back(static_cast<int64_t>(in.size()), misalign);
    bufs.back().set(in);
  }
  for (size_t i = 0; i < inputs.size(); i++) {
    ptrs.push_back(bufs[i].get());
    host_ptrs.push_back(inputs[i].data());
  }
  Buf<T> y(n, misalign);
  y.poison();
  check(gpu(y.get(), ptrs));
  ctx.sync();
  std::vector<float> expect(n);
  ref(expect.data(), host_ptrs);
  const double error = rel_rms(y.host(), rounded<T>(expect));
  double ms = -1;
  std::string rate;
  if (time) {
    ms = ctx.time_ms([&] { check(gpu(y.get(), ptrs)); });
    double bytes = static_cast<double>(n) * sizeof(T);
    for (const std::vector<float>& in : inputs) bytes += static_cast<double>(in.size()) * sizeof(T);
    rate = tbps(bytes, ms);
  }
  ctx.report(with_type(name, type_name<T>()), shape, {{"y", error, tol}}, ms, rate);
}

template <typename T>
void elementwise_for(Context& ctx, int64_t rows, int64_t cols, bool misalign, bool time) {
  using Ptrs = std::vector<const T*>;
  using HostPtrs = std::vector<const float*>;
  const int64_t n = rows * cols;
  const std::string shape = shape_str({rows, cols}) + (misalign ? " misaligned" : "");
  cudaStream_t s = ctx.stream();
  const bool b = kBf16<T>;
  auto x = [&](float stddev) { return randn(n, ctx.seed(), stddev, b); };

  if (ctx.wants("fill")) {
    map_case<T>(
        ctx, "fill", shape, n, misalign, {}, kExact,
        [&](T* y, const Ptrs&) { return fill(s, y, 0.37f, n); },
        [&](float* y, const HostPtrs&) { std::fill(y, y + n, 0.37f); }, time);
  }
  if (ctx.wants("copy")) {
    map_case<T>(
        ctx, "copy", shape, n, misalign, {x(1.f)}, kExact,
        [&](T* y, const Ptrs& in) { return copy(s, y, in[0], n); },
        [&](float* y, const HostPtrs& in) { std::copy(in[0], in[0] + n, y); }, time);
  }
  if (ctx.wants("scale")) {
    map_case<T>(
        ctx, "scale", shape, n, misalign, {x(1.f)}, kTolRounded<T>,
        [&](T* y, const Ptrs& in) { return scale(s, y, in[0], 0.22f, n); },
        [&](float* y, const HostPtrs& in) { cpu::scale<float>(y, in[0], 0.22f, n); }, time);
  }
  // add / mul / div, plain (rhs_n = n) and broadcast over rows (rhs_n = cols).
  for (const int64_t rhs_n : {n, cols}) {
    const std::string tag = rhs_n == n ? "" : " bcast";
    const std::vector<float> a = x(1.f);
    std::vector<float> rhs = randu(rhs_n, ctx.seed(), 0.5f, 2.f, b);
    for (size_t i = 0; i < rhs.size(); i += 2) rhs[i] = -rhs[i];  // both signs, away from 0
    if (ctx.wants("add")) {
      map_case<T>(
          ctx, "add" + tag, shape, n, misalign, {a, rhs}, kTolRounded<T>,
          [&](T* y, const Ptrs& in) {
            return binary(s, BinaryOp::kAdd, y, in[0], in[1], n, rhs_n);
          },
          [&](float* y, const HostPtrs& in) {
            if (rhs_n == n) {
              cpu::add<float>(y, in[0], in[1], n);
            } else {
              cpu::bias_add_forward<float>(y, in[0], in[1], n / rhs_n, rhs_n);
            }
          },
          time);
    }
    if (ctx.wants("mul")) {
      map_case<T>(
          ctx, "mul" + tag, shape, n, misalign, {a, rhs}, kTolRounded<T>,
          [&](T* y, const Ptrs& in) {
            return binary(s, BinaryOp::kMul, y, in[0], in[1], n, rhs_n);
          },
          [&](float* y, const HostPtrs& in) {
            for (int64_t i = 0; i < n; i++) y[i] = in[0][i] * in[1][i % rhs_n];
          },
          time);
    }
    if (ctx.wants("div")) {
      map_case<T>(
          ctx, "div" + tag, shape, n, misalign, {a, rhs}, kTolRounded<T>,
          [&](T* y, const Ptrs& in) {
            return binary(s, BinaryOp::kDiv, y, in[0], in[1], n, rhs_n);
          },
          [&](float* y, const HostPtrs& in) {
            for (int64_t i = 0; i < n; i++) y[i] = in[0][i] / in[1][i % rhs_n];
          },
          time);
    }
  }
  if (ctx.wants("silu")) {
    map_case<T>(
        ctx, "silu.forward", shape, n, misalign, {x(3.f)}, kTolRounded<T>,
        [&](T* y, const Ptrs& in) { return silu_forward(s, y, in[0], n); },
        [&](float* y, const HostPtrs& in) { cpu::silu_forward<float>(y, in[0], n); }, time);
    map_case<T>(
        ctx, "silu.backward", shape, n, misalign, {x(1.f), x(3.f)}, kTolRounded<T>,
        [&](T* y, const Ptrs& in) { return silu_backward(s, y, in[0], in[1], n); },
        [&](float* y, const HostPtrs& in) { cpu::silu_backward<float>(y, in[0], in[1], n); }, time);
  }
  if (ctx.wants("softplus")) {
    // Standard deviation 10: many inputs above the threshold 20 and far below 0.
    map_case<T>(
        ctx, "softplus.forward", shape, n, misalign, {x(10.f)}, kTolRounded<T>,
        [&](T* y, const Ptrs& in) { return softplus_forward(s, y, in[0], n); },
        [&](float* y, const HostPtrs& in) { cpu::softplus_forward<float>(y, in[0], n); }, time);
    map_case<T>(
        ctx, "softplus.backward", shape, n, misalign, {x(1.f), x(10.f)}, kTolRounded<T>,
        [&](T* y, const Ptrs& in) { return softplus_backward(s, y, in[0], in[1], n); },
        [&](float* y, const HostPtrs& in) { cpu::softplus_backward<float>(y, in[0], in[1], n); },
        time);
  }
  if (ctx.wants("neg_exp")) {
    map_case<T>(
        ctx, "neg_exp.forward", shape, n, misalign, {x(1.f)}, kTolRounded<T>,
        [&](T* y, const Ptrs& in) { return neg_exp_forward(s, y, in[0], n); },
        [&](float* y, const HostPtrs& in) { cpu::neg_exp_forward<float>(y, in[0], n); }, time);
    std::vector<float> saved(n);
    cpu::neg_exp_forward<float>(saved.data(), x(1.f).data(), n);
    map_case<T>(
        ctx, "neg_exp.backward", shape, n, misalign, {x(1.f), rounded<T>(saved)}, kTolRounded<T>,
        [&](T* y, const Ptrs& in) { return neg_exp_backward(s, y, in[0], in[1], n); },
        [&](float* y, const HostPtrs& in) { cpu::neg_exp_backward<float>(y, in[0], in[1], n); },
        time);
  }
}

// SwiGLU: x [rows, 2*inner] -> y [rows, inner], and its backward (two outputs in one dx).
template <typename T>
void swiglu_for(Context& ctx, int64_t rows, int64_t inner, bool misalign, bool time) {
  using Ptrs = std::vector<const T*>;
  using HostPtrs = std::vector<const float*>;
  if (!ctx.wants("swiglu")) return;
  const bool b = kBf16<T>;
  const std::string shape = shape_str({rows, inner}) + (misalign ? " misaligned" : "");
  cudaStream_t s = ctx.stream();
  const std::vector<float> x = randn(rows * 2 * inner, ctx.seed(), 2.f, b);
  map_case<T>(
      ctx, "swiglu.forward", shape, rows * inner, misalign, {x}, kTolRounded<T>,
      [&](T* y, const Ptrs& in) { return swiglu_forward(s, y, in[0], rows, inner); },
      [&](float* y, const HostPtrs& in) { cpu::swiglu_forward<float>(y, in[0], rows, inner); },
      time);
  map_case<T>(
      ctx, "swiglu.backward", shape, rows * 2 * inner, misalign,
      {randn(rows * inner, ctx.seed(), 1.f, b), x}, kTolRounded<T>,
      [&](T* y, const Ptrs& in) { return swiglu_backward(s, y, in[0], in[1], rows, inner); },
      [&](float* y, const HostPtrs& in) {
        cpu::swiglu_backward<float>(y, in[0], in[1], rows, inner);
      },
      time);
}

// slice_columns and insert_columns (which must leave the other columns untouched).
template <typename T>
void columns_for(Context& ctx, int64_t rows, int64_t cols, int64_t offset, int64_t width,
                 bool misalign, bool time) {
  using Ptrs = std::vector<const T*>;
  using HostPtrs = std::vector<const float*>;
  const bool b = kBf16<T>;
  const std::string shape = shape_str({rows, cols}) + " [" + std::to_string(offset) + ":+" +
                            std::to_string(width) + "]" + (misalign ? " misaligned" : "");
  cudaStream_t s = ctx.stream();
  if (ctx.wants("slice_columns")) {
    map_case<T>(
        ctx, "slice_columns", shape, rows * width, misalign,
        {randn(rows * cols, ctx.seed(), 1.f, b)}, kExact,
        [&](T* y, const Ptrs& in) { return slice_columns(s, y, in[0], rows, cols, offset, width); },
        [&](float* y, const HostPtrs& in) {
          cpu::slice_columns<float>(y, in[0], rows, cols, offset, width);
        },
        time);
  }
  if (ctx.wants("insert_columns")) {
    const std::vector<float> before = randn(rows * cols, ctx.seed(), 1.f, b);
    const std::vector<float> in = randn(rows * width, ctx.seed(), 1.f, b);
    Buf<T> out(rows * cols, misalign), src(rows * width, misalign);
    out.set(before);
    src.set(in);
    auto launch = [&] {
      check(insert_columns(s, out.get(), src.get(), rows, cols, offset, width));
    };
    launch();
    ctx.sync();
    std::vector<float> expect = before;
    cpu::slice_columns_backward<float>(expect.data(), in.data(), rows, cols, offset, width);
    const double error = rel_rms(out.host(), expect);
    double ms = -1;
    std::string rate;
    if (time) {
      ms = ctx.time_ms(launch);
      rate = tbps(2.0 * rows * width * sizeof(T), ms);
    }
    ctx.report(with_type("insert_columns", type_name<T>()), shape, {{"out", error, kExact}}, ms,
               rate);
  }
}

template <typename T>
void column_sum_for(Context& ctx, int64_t rows, int64_t cols, bool misalign, bool time) {
  if (!ctx.wants("column_sum")) return;
  const std::vector<float> x = randn(rows * cols, ctx.seed(), 1.f, kBf16<T>);
  Buf<T> dx(rows * cols, misalign), y(cols, misalign);
  dx.set(x);
  y.poison();
  Dev<uint8_t> ws = scratch(column_sum_workspace_bytes(rows, cols));
  auto launch = [&] {
    check(column_sum(ctx.stream(), y.get(), dx.get(), rows, cols, ws.workspace()));
  };
  launch();
  ctx.sync();
  std::vector<float> expect(cols);
  cpu::column_sum<float>(expect.data(), x.data(), rows, cols);
  const double error = rel_rms(y.host(), rounded<T>(expect));
  double ms = -1;
  std::string rate;
  if (time) {
    ms = ctx.time_ms(launch);
    rate = tbps(static_cast<double>(rows * cols + cols) * sizeof(T), ms);
  }
  ctx.report(with_type("column_sum", type_name<T>()),
             shape_str({rows, cols}) + (misalign ? " misaligned" : ""),
             {{"y", error, kTolColumnSum<T>}}, ms, rate);
}

void cast_case(Context& ctx, int64_t n, bool misalign, bool time) {
  if (!ctx.wants("cast")) return;
  const std::string shape = shape_str({n}) + (misalign ? " misaligned" : "");
  // f32 -> bf16 rounds to nearest even, exactly like the host's conversion.
  const std::vector<float> x = randn(n, ctx.seed(), 1.f, false);
  {
    Buf<float> in(n, misalign);
    Buf<bf16> out(n, misalign);
    in.set(x);
    out.poison();
    auto launch = [&] { check(cast(ctx.stream(), out.get(), in.get(), n)); };
    launch();
    ctx.sync();
    const double error = rel_rms(out.host(), rounded<bf16>(x));
    const double ms = time ? ctx.time_ms(launch) : -1;
    ctx.report("cast.f32->bf16", shape, {{"y", error, kExact}}, ms, time ? tbps(6.0 * n, ms) : "");
  }
  {
    Buf<bf16> in(n, misalign);
    Buf<float> out(n, misalign);
    in.set(rounded<bf16>(x));
    out.poison();
    auto launch = [&] { check(cast(ctx.stream(), out.get(), in.get(), n)); };
    launch();
    ctx.sync();
    const double error = rel_rms(out.host(), rounded<bf16>(x));
    const double ms = time ? ctx.time_ms(launch) : -1;
    ctx.report("cast.bf16->f32", shape, {{"y", error, kExact}}, ms, time ? tbps(6.0 * n, ms) : "");
  }
}

template <typename T>
void family_for(Context& ctx) {
  // Odd sizes (no multiple of 8 anywhere) on misaligned pointers: the element-wise paths.
  elementwise_for<T>(ctx, 37, 111, true, false);
  swiglu_for<T>(ctx, 37, 45, true, false);
  columns_for<T>(ctx, 37, 53, 7, 19, true, false);
  column_sum_for<T>(ctx, 37, 53, true, false);
  // Small aligned: the vector paths with a partial last group.
  elementwise_for<T>(ctx, 3, 1000, false, false);
  column_sum_for<T>(ctx, 1000, 24, false, false);
  if (!ctx.options().big) return;
  // granite-4.0-h-tiny, 8192 tokens: d_in-wide activations; the hidden-wide bias broadcast.
  elementwise_for<T>(ctx, 8192, 3072, false, true);
  swiglu_for<T>(ctx, 8192, 1024, false, true);  // shared MLP
  swiglu_for<T>(ctx, 49152, 512, false, true);  // the experts' rows (8192 tokens x top-6)
  // Mamba in_proj output [8192, 6448] split into z, xBC, dt.
  columns_for<T>(ctx, 8192, 6448, 0, 3072, false, true);
  columns_for<T>(ctx, 8192, 6448, 3072, 3328, false, true);
  columns_for<T>(ctx, 8192, 6448, 6400, 48, false, true);
  column_sum_for<T>(ctx, 8192, 3328, false, true);  // conv bias-sized
}

}  // namespace

void test_elementwise(Context& ctx) {
  family_for<bf16>(ctx);
  family_for<float>(ctx);
  cast_case(ctx, 4099, true, false);
  if (ctx.options().big) cast_case(ctx, 8192 * 3072, false, true);
}

}  // namespace hcp::cuda::test
