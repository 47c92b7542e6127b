// Self-checking test and benchmark of the CUDA sequence kernels (runtime/kernels/cuda/
// SequenceKernels.h): the Mamba2 SSD scan (and, for context parallelism, its state-only summary
// ssd_final_state and the initial-state correction ssd_add_initial_state) and causal GQA
// attention, forward and backward, against the CPU oracle (runtime/kernels/cpu, run in double on
// the same bf16-rounded inputs).
//
//   test_sequence_kernels [--seed N] [--no-timing] [--no-large] [--only ssd|ssd-init|attn]
//                         [--reps N] [--impl hopper|hopper-det|fa2]
//
// --only ssd runs every SSD case (the scan, ssd_final_state, ssd_add_initial_state); ssd-init the
// initial-state correction's cases and timing alone.
// --impl sets HCP_ATTN_IMPL (which attention kernels the library runs: the Hopper wgmma kernels
// with atomic dq, the Hopper kernels with the deterministic dq kernel, or the mma.sync kernels;
// unset = the library's default). The attention timing rows are tagged with it.
//
// Correctness: fresh random inputs every run (the seed is printed; --seed repeats a run), every
// output poisoned with NaN (all bytes 0xFF) before each launch, so an unwritten element shows up
// as NaN, which never passes. Metric: relative RMS error ||gpu - ref|| / ||ref|| per output.
// Tolerances (bf16 operands, fp32 accumulation; METHOD.md puts bf16 products at 1e-3..1e-2):
//   - bf16 outputs (y, dx, dB, dC, out, dq, dk, dv): the output rounding alone is ~2e-3 RMS
//     (unit roundoff 2^-9 = 2e-3, ~1/sqrt(3) of it on average), plus one or two bf16 roundings of
//     product operands (decayed SSD scores, P and dS in attention, fp32 states fed to the tensor
//     cores as bf16) that add in quadrature: ~3-6e-3 expected; tolerance 1.5e-2.
//   - fp32 outputs computed through bf16 operands (final_state, dinit, ddt, dA, dD): same
//     operand rounding without the output rounding, but ddt and dA are sums of terms of both
//     signs (cancellation amplifies relative error): tolerance 2e-2. dA, a sum over every
//     position of terms of both signs, is measured against the size of its terms rather than
//     against its sum: sum |dt_s g_s| for the scan (report_ssd_dA), sum_{b,t} |w_t| cum_t for the
//     initial-state correction's (see run_ssd_init_case).
//   - lse: fp32 throughout (scores from exact bf16 inputs): max |err| <= 2e-3 absolute, and -inf
//     exactly where the oracle has -inf (rows that see no key).
// The attention backward is checked given the GPU's own out and lse (what a training step feeds
// it), so its error is its own. At s = 8192 the attention oracle runs on slices (query rows near
// the end and in the middle against all keys, for out / lse / dq; key rows at the start and in the
// middle against all queries, for dk / dv: exact, since each of those depends only on its own row
// and the final lse); the SSD oracle runs per head on all CPU cores.
//
// Timing (unless --no-timing): the granite-4.0-h-tiny shapes at s = 8192 and 65536, batch 1 (and
// for the initial-state correction its context-parallel shape, 2 rows of s = 4096), with CUDA
// events, 3 warm-ups, the median of --reps (10) repetitions, inputs rotated over enough copies to
// exceed the 60 MB L2; printed as ms and TFLOP/s against the anchors of
// shared/reference/anchors.md. Exit status 0 iff every check passed.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "runtime/kernels/cpu/Kernels.h"
#include "runtime/kernels/cuda/SequenceKernels.h"

namespace {

using hcp::cuda::bf16;

#define CHECK_CUDA(expr)                                                        \
  do {                                                                          \
    cudaError_t err_ = (expr);                                                  \
    if (err_ != cudaSuccess) {                                                  \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #expr, \
                   cudaGetErrorString(err_));                                   \
      std::exit(2);                                                             \
    }                                                                           \
  } while (0)

#define CHECK_OK(expr)                                                                           \
  do {                                                                                           \
    hcp::cuda::Status st_ = (expr);                                                              \
    if (!st_.ok()) {                                                                             \
      std::fprintf(stderr, "%s:%d: %s failed: %s: %s\n", __FILE__, __LINE__, #expr, st_.where(), \
                   st_.message());                                                               \
      std::exit(2);                                                                              \
    }                                                                                            \
    CHECK_CUDA(cudaGetLastError());                                                              \
  } while (0)

// ---------------------------------------------------------------------------------------------
// Host helpers.
uint16_t f2bf_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);                     // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}
float bf_bits2f(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// A bf16 tensor on the host: bits for the device, the exact values as double for the oracle.
struct HostBf16 {
  std::vector<uint16_t> bits;
  std::vector<double> val;
  explicit HostBf16(size_t n = 0) : bits(n), val(n) {}
  size_t size() const { return bits.size(); }
  void set(size_t i, float f) {
    bits[i] = f2bf_bits(f);
    val[i] = bf_bits2f(bits[i]);
  }
};

struct Rng {
  std::mt19937_64 gen;
  explicit Rng(uint64_t seed) : gen(seed) {}
  double normal() { return std::normal_distribution<double>(0.0, 1.0)(gen); }
  double uniform(double a, double b) { return std::uniform_real_distribution<double>(a, b)(gen); }
};

HostBf16 random_bf16(Rng& rng, size_t n, double stddev) {
  HostBf16 t(n);
  for (size_t i = 0; i < n; i++) t.set(i, static_cast<float>(stddev * rng.normal()));
  return t;
}
std::vector<float> random_f32(Rng& rng, size_t n, double stddev) {
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(stddev * rng.normal());
  return v;
}
// position_ids [B, S] of packed documents: the first continued from `continues` tokens before
// the row, then documents of 1 .. max_length tokens (one in four of 1 to 3).
std::vector<int32_t> packed_positions(Rng& rng, int64_t B, int64_t S, int32_t max_length,
                                      int32_t continues) {
  std::vector<int32_t> positions(B * S);
  for (int64_t b = 0; b < B; b++) {
    int32_t position = continues;
    int64_t left = std::uniform_int_distribution<int64_t>(1, max_length)(rng.gen);
    for (int64_t t = 0; t < S; t++) {
      if (left == 0) {
        const bool short_one = std::uniform_int_distribution<int>(0, 3)(rng.gen) == 0;
        left = std::uniform_int_distribution<int64_t>(1, short_one ? 3 : max_length)(rng.gen);
        position = 0;
      }
      positions[b * S + t] = position++;
      left--;
    }
  }
  return positions;
}
std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

template <typename T>
struct DevBuf {
  T* ptr = nullptr;
  size_t n = 0;
  DevBuf() = default;
  explicit DevBuf(size_t count) : n(count) {
    CHECK_CUDA(cudaMalloc(&ptr, std::max<size_t>(1, n) * sizeof(T)));
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  DevBuf(DevBuf&& o) noexcept : ptr(o.ptr), n(o.n) { o.ptr = nullptr; }
  ~DevBuf() {
    if (ptr != nullptr) cudaFree(ptr);
  }
  void poison() { CHECK_CUDA(cudaMemset(ptr, 0xff, n * sizeof(T))); }
  template <typename U>
  void upload(const std::vector<U>& h) {
    static_assert(sizeof(U) == sizeof(T));
    CHECK_CUDA(cudaMemcpy(ptr, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> h(n);
    CHECK_CUDA(cudaMemcpy(h.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
};

std::vector<double> download_bf16(const DevBuf<bf16>& d) {
  std::vector<bf16> h = d.download();
  std::vector<double> out(h.size());
  for (size_t i = 0; i < h.size(); i++) {
    uint16_t b;
    std::memcpy(&b, &h[i], 2);
    out[i] = bf_bits2f(b);
  }
  return out;
}
std::vector<double> download_f32(const DevBuf<float>& d) { return to_double(d.download()); }

DevBuf<bf16> upload_bf16(const HostBf16& h) {
  DevBuf<bf16> d(h.size());
  d.upload(h.bits);
  return d;
}
DevBuf<float> upload_f32(const std::vector<float>& h) {
  DevBuf<float> d(h.size());
  d.upload(h);
  return d;
}
// Also for an empty h (a buffer of one element, not to be read).
DevBuf<int32_t> upload_i32(const std::vector<int32_t>& h) {
  DevBuf<int32_t> d(std::max<size_t>(h.size(), 1));
  if (!h.empty()) d.upload(h);
  return d;
}

// Runs fn(i) for i in [0, n) on all hardware threads.
void parallel_for(int64_t n, const std::function<void(int64_t)>& fn) {
  const int64_t workers =
      std::max<int64_t>(1, std::min<int64_t>(n, std::thread::hardware_concurrency()));
  std::atomic<int64_t> next{0};
  std::vector<std::thread> pool;
  for (int64_t w = 0; w < workers; w++) {
    pool.emplace_back([&] {
      for (int64_t i = next++; i < n; i = next++) fn(i);
    });
  }
  for (auto& t : pool) t.join();
}

// ---------------------------------------------------------------------------------------------
// Checks.
int g_passed = 0, g_failed = 0;

struct Err {
  double rel_rms = 0, max_abs = 0;
  size_t bad = 0;  // NaN / inf where the reference is finite, or a -inf mismatch
};

// got and ref of equal length (or ref indexed by a map); -inf in ref must be -inf in got.
Err compare(const std::vector<double>& got, const std::vector<double>& ref) {
  Err e;
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); i++) {
    const double r = ref[i], g = got[i];
    if (std::isinf(r)) {
      if (g != r) e.bad++;
      continue;
    }
    if (!std::isfinite(g)) {
      e.bad++;
      continue;
    }
    num += (g - r) * (g - r);
    den += r * r;
    e.max_abs = std::max(e.max_abs, std::fabs(g - r));
  }
  e.rel_rms = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return e;
}

void report(const std::string& what, const Err& e, double tol, bool abs_metric = false) {
  const double metric = abs_metric ? e.max_abs : e.rel_rms;
  const bool ok = e.bad == 0 && metric <= tol && std::isfinite(metric);
  (ok ? g_passed : g_failed)++;
  std::printf("  %-44s %s %.3e (tol %.0e)  max|err| %.3e  bad %zu  %s\n", what.c_str(),
              abs_metric ? "max_abs" : "rel_rms", metric, tol, e.max_abs, e.bad,
              ok ? "ok" : "FAIL");
}

constexpr double kTolBf16 = 1.5e-2;
constexpr double kTolF32 = 2e-2;
constexpr double kTolLse = 2e-3;

// ---------------------------------------------------------------------------------------------
// SSD.
// documents: packed documents of at most that many tokens (0: one document); the first of each
// row continued from before it when there is an initial state.
struct SsdCase {
  const char* name;
  int64_t batch, seq, heads, head_dim, groups;
  bool has_D, has_init, want_final, has_dfinal, want_dinit;
  int32_t documents = 0;
};

struct SsdInputs {
  hcp::cuda::SsdShape shape;
  HostBf16 x, Bm, Cm, dy;
  std::vector<float> dt, A, D, init, dfinal;
  std::vector<int32_t> positions;  // [B, S], empty without documents
};

SsdInputs make_ssd_inputs(Rng& rng, const hcp::cuda::SsdShape& s) {
  SsdInputs in;
  in.shape = s;
  const size_t nx = s.batch * s.seq * s.heads * s.head_dim;
  const size_t nbc = s.batch * s.seq * s.groups * s.state;
  const size_t nst = s.batch * s.heads * s.head_dim * s.state;
  in.x = random_bf16(rng, nx, 1.0);
  in.Bm = random_bf16(rng, nbc, 0.5);
  in.Cm = random_bf16(rng, nbc, 0.5);
  in.dy = random_bf16(rng, nx, 1.0);
  in.dt.resize(s.batch * s.seq * s.heads);
  for (auto& v : in.dt)
    v = static_cast<float>(std::exp(rng.uniform(std::log(1e-3), std::log(1e-1))));
  in.A.resize(s.heads);
  for (auto& v : in.A) v = static_cast<float>(-std::exp(rng.uniform(0.0, std::log(16.0))));
  in.D.resize(s.heads);
  for (auto& v : in.D) v = static_cast<float>(rng.uniform(0.5, 1.5));
  in.init = random_f32(rng, nst, 0.5);
  in.dfinal = random_f32(rng, nst, 0.2);
  return in;
}

struct SsdRef {
  std::vector<double> y, final_state, dx, ddt, dA, dB, dC, dD, dinit;
};

// The oracle per head (in double, on all cores), gathered back into the full layouts; dB and dC
// are sums over the heads of each group.
SsdRef ssd_reference(const SsdInputs& in, const SsdCase& c) {
  const auto& s = in.shape;
  const int64_t B = s.batch, S = s.seq, H = s.heads, P = s.head_dim, G = s.groups, N = s.state;
  const int64_t hg = H / G;
  SsdRef r;
  r.y.assign(B * S * H * P, 0);
  r.dx.assign(B * S * H * P, 0);
  r.final_state.assign(B * H * P * N, 0);
  r.dinit.assign(B * H * P * N, 0);
  r.ddt.assign(B * S * H, 0);
  r.dA.assign(H, 0);
  r.dD.assign(H, 0);
  std::vector<std::vector<double>> dB_h(H), dC_h(H);
  parallel_for(H, [&](int64_t h) {
    const int64_t g = h / hg;
    hcp::cpu::SsdShape hs{B, S, 1, P, 1, N, s.chunk};
    std::vector<double> x(B * S * P), dy(B * S * P), dt(B * S), Bm(B * S * N), Cm(B * S * N);
    std::vector<double> init(B * P * N), dfinal(B * P * N);
    for (int64_t b = 0; b < B; b++) {
      for (int64_t t = 0; t < S; t++) {
        for (int64_t p = 0; p < P; p++) {
          x[(b * S + t) * P + p] = in.x.val[((b * S + t) * H + h) * P + p];
          dy[(b * S + t) * P + p] = in.dy.val[((b * S + t) * H + h) * P + p];
        }
        dt[b * S + t] = in.dt[(b * S + t) * H + h];
        for (int64_t n = 0; n < N; n++) {
          Bm[(b * S + t) * N + n] = in.Bm.val[((b * S + t) * G + g) * N + n];
          Cm[(b * S + t) * N + n] = in.Cm.val[((b * S + t) * G + g) * N + n];
        }
      }
      for (int64_t i = 0; i < P * N; i++) {
        init[b * P * N + i] = in.init[(b * H + h) * P * N + i];
        dfinal[b * P * N + i] = in.dfinal[(b * H + h) * P * N + i];
      }
    }
    const double A = in.A[h], D = in.D[h];
    const double* Dp = c.has_D ? &D : nullptr;
    const double* initp = c.has_init ? init.data() : nullptr;
    const int32_t* positions = in.positions.empty() ? nullptr : in.positions.data();
    std::vector<double> y(B * S * P), fin(B * P * N);
    hcp::cpu::ssd_scan_forward<double>(y.data(), fin.data(), x.data(), dt.data(), &A, Bm.data(),
                                       Cm.data(), Dp, initp, hs, {}, positions);
    std::vector<double> dx(B * S * P), ddt(B * S), dBh(B * S * N), dCh(B * S * N), dinit(B * P * N);
    double dA = 0, dD = 0;
    hcp::cpu::ssd_scan_backward<double>(dx.data(), ddt.data(), &dA, dBh.data(), dCh.data(), &dD,
                                        dinit.data(), dy.data(),
                                        c.has_dfinal ? dfinal.data() : nullptr, x.data(), dt.data(),
                                        &A, Bm.data(), Cm.data(), Dp, initp, hs, {}, positions);
    for (int64_t b = 0; b < B; b++) {
      for (int64_t t = 0; t < S; t++) {
        for (int64_t p = 0; p < P; p++) {
          r.y[((b * S + t) * H + h) * P + p] = y[(b * S + t) * P + p];
          r.dx[((b * S + t) * H + h) * P + p] = dx[(b * S + t) * P + p];
        }
        r.ddt[(b * S + t) * H + h] = ddt[b * S + t];
      }
      for (int64_t i = 0; i < P * N; i++) {
        r.final_state[(b * H + h) * P * N + i] = fin[b * P * N + i];
        r.dinit[(b * H + h) * P * N + i] = dinit[b * P * N + i];
      }
    }
    r.dA[h] = dA;
    r.dD[h] = dD;
    dB_h[h] = std::move(dBh);
    dC_h[h] = std::move(dCh);
  });
  r.dB.assign(B * S * G * N, 0);
  r.dC.assign(B * S * G * N, 0);
  for (int64_t h = 0; h < H; h++) {
    const int64_t g = h / hg;
    for (int64_t b = 0; b < B; b++) {
      for (int64_t t = 0; t < S; t++) {
        for (int64_t n = 0; n < N; n++) {
          r.dB[((b * S + t) * G + g) * N + n] += dB_h[h][(b * S + t) * N + n];
          r.dC[((b * S + t) * G + g) * N + n] += dC_h[h][(b * S + t) * N + n];
        }
      }
    }
  }
  return r;
}

// dA_h = sum_{b,s} dt_s g_s with g_s = d loss / d(dt_s A_h), a sum of terms of both signs whose
// cancellation (packed documents cut most of them; a fast head keeps few) makes ||err|| / ||dA||
// swing with the draw. So dA's error is measured against the size of its terms,
// sum_{b,s} |dt_s g_s|, with g_s from the oracle: ddt_s = x_s . (dx_s - D dy_s) / dt_s + A_h g_s
// (dt enters only through dt A and dt x). The plain ratio is printed for information.
void report_ssd_dA(const std::string& what, const std::vector<double>& got, const SsdInputs& in,
                   const SsdRef& ref, bool has_D) {
  const auto& s = in.shape;
  const int64_t B = s.batch, S = s.seq, H = s.heads, P = s.head_dim;
  std::vector<double> scale(H, 0.0);
  for (int64_t b = 0; b < B; b++) {
    for (int64_t t = 0; t < S; t++) {
      for (int64_t h = 0; h < H; h++) {
        const int64_t row = (b * S + t) * H + h;
        const double dt = in.dt[row], D = has_D ? in.D[h] : 0.0;
        double explicit_part = 0;
        for (int64_t p = 0; p < P; p++) {
          explicit_part +=
              in.x.val[row * P + p] * (ref.dx[row * P + p] - D * in.dy.val[row * P + p]);
        }
        const double g = (ref.ddt[row] - explicit_part / dt) / in.A[h];
        scale[h] += std::fabs(dt * g);
      }
    }
  }
  Err e = compare(got, ref.dA);
  double num = 0, den = 0;
  for (int64_t h = 0; h < H; h++) {
    num += (got[h] - ref.dA[h]) * (got[h] - ref.dA[h]);
    den += scale[h] * scale[h];
  }
  std::printf("  (%s: ||err|| / ||dA|| = %.3e)\n", what.c_str(), e.rel_rms);
  e.rel_rms = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  report(what + " (error / sum |dt g|)", e, kTolF32);
}

void run_ssd_case(const SsdCase& c, uint64_t seed) {
  Rng rng(seed);
  hcp::cuda::SsdShape s{c.batch, c.seq, c.heads, c.head_dim, c.groups, 128, 256};
  std::printf(
      "SSD %s: B=%lld S=%lld H=%lld P=%lld G=%lld N=128 Q=256 D=%d init=%d final=%d "
      "dfinal=%d dinit=%d documents=%d\n",
      c.name, static_cast<long long>(s.batch), static_cast<long long>(s.seq),
      static_cast<long long>(s.heads), static_cast<long long>(s.head_dim),
      static_cast<long long>(s.groups), c.has_D, c.has_init, c.want_final, c.has_dfinal,
      c.want_dinit, c.documents);
  if (!hcp::cuda::ssd_supported(s)) {
    std::printf("  unsupported shape: FAIL\n");
    g_failed++;
    return;
  }
  SsdInputs in = make_ssd_inputs(rng, s);
  if (c.documents > 0) {
    in.positions = packed_positions(rng, s.batch, s.seq, c.documents, c.has_init ? 7 : 0);
  }
  const auto t_ref = std::chrono::steady_clock::now();
  const SsdRef ref = ssd_reference(in, c);
  const double ref_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_ref).count();

  auto x = upload_bf16(in.x), Bm = upload_bf16(in.Bm), Cm = upload_bf16(in.Cm),
       dy = upload_bf16(in.dy);
  auto dt = upload_f32(in.dt), A = upload_f32(in.A), D = upload_f32(in.D),
       init = upload_f32(in.init), dfinal = upload_f32(in.dfinal);
  auto positions = upload_i32(in.positions);
  const int32_t* positions_ptr = in.positions.empty() ? nullptr : positions.ptr;
  DevBuf<bf16> y(in.x.size()), dx(in.x.size()), dB(in.Bm.size()), dC(in.Cm.size());
  DevBuf<float> fin(in.init.size()), dinit(in.init.size()), ddt(in.dt.size()), dA(s.heads),
      dD(s.heads);
  DevBuf<unsigned char> ws(std::max(hcp::cuda::ssd_scan_forward_workspace_bytes(s),
                                    hcp::cuda::ssd_scan_backward_workspace_bytes(s)));
  ws.poison();
  for (auto* b : {&y, &dx, &dB, &dC}) b->poison();
  for (auto* b : {&fin, &dinit, &ddt, &dA, &dD}) b->poison();

  hcp::cuda::Workspace w{ws.ptr, ws.n};
  CHECK_OK(hcp::cuda::ssd_scan_forward(nullptr, y.ptr, c.want_final ? fin.ptr : nullptr, x.ptr,
                                       dt.ptr, A.ptr, Bm.ptr, Cm.ptr, c.has_D ? D.ptr : nullptr,
                                       c.has_init ? init.ptr : nullptr, s, w, positions_ptr));
  CHECK_CUDA(cudaDeviceSynchronize());
  ws.poison();
  CHECK_OK(hcp::cuda::ssd_scan_backward(
      nullptr, dx.ptr, ddt.ptr, dA.ptr, dB.ptr, dC.ptr, dD.ptr, c.want_dinit ? dinit.ptr : nullptr,
      dy.ptr, c.has_dfinal ? dfinal.ptr : nullptr, x.ptr, dt.ptr, A.ptr, Bm.ptr, Cm.ptr,
      c.has_D ? D.ptr : nullptr, c.has_init ? init.ptr : nullptr, s, w, positions_ptr));
  CHECK_CUDA(cudaDeviceSynchronize());
  std::printf("  (oracle %.1f s)\n", ref_s);

  report("y", compare(download_bf16(y), ref.y), kTolBf16);
  if (c.want_final) report("final_state", compare(download_f32(fin), ref.final_state), kTolF32);
  report("dx", compare(download_bf16(dx), ref.dx), kTolBf16);
  report("ddt", compare(download_f32(ddt), ref.ddt), kTolF32);
  report_ssd_dA("dA", download_f32(dA), in, ref, c.has_D);
  report("dB", compare(download_bf16(dB), ref.dB), kTolBf16);
  report("dC", compare(download_bf16(dC), ref.dC), kTolBf16);
  report("dD", compare(download_f32(dD), ref.dD), kTolF32);
  if (c.want_dinit) report("dinit_state", compare(download_f32(dinit), ref.dinit), kTolF32);
}

// The state-only summary of context parallelism: ssd_final_state_forward against the oracle
// scan's final state from a zero start, ssd_final_state_backward against the oracle backward with
// dy = 0 (and no D: with dy = 0 it plays no part, nor does C). Same tolerances as the scan's
// outputs; then bit-for-bit against the GPU scan kernels themselves.
struct SsdFinalStateCase {
  const char* name;
  int64_t batch, seq, heads, head_dim, groups;
  int32_t documents = 0;  // as SsdCase's (the first document of a row starts with it)
};

void run_ssd_final_state_case(const SsdFinalStateCase& c, uint64_t seed) {
  Rng rng(seed);
  hcp::cuda::SsdShape s{c.batch, c.seq, c.heads, c.head_dim, c.groups, 128, 256};
  std::printf("SSD final state %s: B=%lld S=%lld H=%lld P=%lld G=%lld N=128 Q=256\n", c.name,
              static_cast<long long>(s.batch), static_cast<long long>(s.seq),
              static_cast<long long>(s.heads), static_cast<long long>(s.head_dim),
              static_cast<long long>(s.groups));
  if (!hcp::cuda::ssd_supported(s)) {
    std::printf("  unsupported shape: FAIL\n");
    g_failed++;
    return;
  }
  SsdInputs in = make_ssd_inputs(rng, s);
  in.dy = HostBf16(in.x.size());  // all zero: the summary's y has no gradient
  if (c.documents > 0) in.positions = packed_positions(rng, s.batch, s.seq, c.documents, 0);
  auto positions = upload_i32(in.positions);
  const int32_t* positions_ptr = in.positions.empty() ? nullptr : positions.ptr;
  const SsdCase oracle_case{c.name,
                            c.batch,
                            c.seq,
                            c.heads,
                            c.head_dim,
                            c.groups,
                            /*has_D=*/false,
                            /*has_init=*/false,
                            /*want_final=*/true,
                            /*has_dfinal=*/true,
                            /*want_dinit=*/false,
                            c.documents};
  const SsdRef ref = ssd_reference(in, oracle_case);

  auto x = upload_bf16(in.x), Bm = upload_bf16(in.Bm);
  auto dt = upload_f32(in.dt), A = upload_f32(in.A), dfinal = upload_f32(in.dfinal);
  DevBuf<bf16> dx(in.x.size()), dB(in.Bm.size());
  DevBuf<float> fin(in.init.size()), ddt(in.dt.size()), dA(s.heads);
  DevBuf<unsigned char> ws(std::max(hcp::cuda::ssd_final_state_forward_workspace_bytes(s),
                                    hcp::cuda::ssd_final_state_backward_workspace_bytes(s)));
  ws.poison();
  for (auto* b : {&dx, &dB}) b->poison();
  for (auto* b : {&fin, &ddt, &dA}) b->poison();

  hcp::cuda::Workspace w{ws.ptr, ws.n};
  CHECK_OK(hcp::cuda::ssd_final_state_forward(nullptr, fin.ptr, x.ptr, dt.ptr, A.ptr, Bm.ptr, s, w,
                                              positions_ptr));
  CHECK_CUDA(cudaDeviceSynchronize());
  ws.poison();
  CHECK_OK(hcp::cuda::ssd_final_state_backward(nullptr, dx.ptr, ddt.ptr, dA.ptr, dB.ptr, dfinal.ptr,
                                               x.ptr, dt.ptr, A.ptr, Bm.ptr, s, w, positions_ptr));
  CHECK_CUDA(cudaDeviceSynchronize());

  report("final_state", compare(download_f32(fin), ref.final_state), kTolF32);
  report("dx (dy = 0)", compare(download_bf16(dx), ref.dx), kTolBf16);
  report("ddt (dy = 0)", compare(download_f32(ddt), ref.ddt), kTolF32);
  report_ssd_dA("dA (dy = 0)", download_f32(dA), in, ref, /*has_D=*/false);
  report("dB (dy = 0)", compare(download_bf16(dB), ref.dB), kTolBf16);

  // Against the GPU scan itself: the summary kernels are the scan's launches with the dy terms
  // left out, and with dy = 0 those terms are exact zeros, so the results must agree bit for bit
  // (max |difference| = 0) with ssd_scan_forward's final state and ssd_scan_backward's gradients
  // for a zero dy (C random: it must not matter).
  auto Cm = upload_bf16(in.Cm), zero_dy = upload_bf16(in.dy);
  DevBuf<bf16> scan_y(in.x.size()), scan_dx(in.x.size()), scan_dB(in.Bm.size()),
      scan_dC(in.Cm.size());
  DevBuf<float> scan_fin(in.init.size()), scan_ddt(in.dt.size()), scan_dA(s.heads),
      scan_dD(s.heads);
  DevBuf<unsigned char> scan_ws(std::max(hcp::cuda::ssd_scan_forward_workspace_bytes(s),
                                         hcp::cuda::ssd_scan_backward_workspace_bytes(s)));
  hcp::cuda::Workspace sw{scan_ws.ptr, scan_ws.n};
  CHECK_OK(hcp::cuda::ssd_scan_forward(nullptr, scan_y.ptr, scan_fin.ptr, x.ptr, dt.ptr, A.ptr,
                                       Bm.ptr, Cm.ptr, /*D=*/nullptr, /*init_state=*/nullptr, s, sw,
                                       positions_ptr));
  CHECK_OK(hcp::cuda::ssd_scan_backward(nullptr, scan_dx.ptr, scan_ddt.ptr, scan_dA.ptr,
                                        scan_dB.ptr, scan_dC.ptr, scan_dD.ptr,
                                        /*dinit_state=*/nullptr, zero_dy.ptr, dfinal.ptr, x.ptr,
                                        dt.ptr, A.ptr, Bm.ptr, Cm.ptr, /*D=*/nullptr,
                                        /*init_state=*/nullptr, s, sw, positions_ptr));
  CHECK_CUDA(cudaDeviceSynchronize());
  const bool abs_metric = true;
  report("final_state = the GPU scan's", compare(download_f32(fin), download_f32(scan_fin)), 0,
         abs_metric);
  report("dx = the GPU scan's with dy = 0", compare(download_bf16(dx), download_bf16(scan_dx)), 0,
         abs_metric);
  report("ddt = the GPU scan's with dy = 0", compare(download_f32(ddt), download_f32(scan_ddt)), 0,
         abs_metric);
  report("dA = the GPU scan's with dy = 0", compare(download_f32(dA), download_f32(scan_dA)), 0,
         abs_metric);
  report("dB = the GPU scan's with dy = 0", compare(download_bf16(dB), download_bf16(scan_dB)), 0,
         abs_metric);
}

// ---------------------------------------------------------------------------------------------
// SSD initial-state correction (ssd_add_initial_state_*): context parallelism adds a segment's
// entering state to the outputs scanned from a zero start. The entering state is a real one, the
// final state of a preceding random 512-position segment (ssd_final_state_forward on the GPU), so
// its magnitude is what the correction meets in training; y and dout ~ N(0, 1), C ~ N(0, 0.25).
// Against the oracle (per (b, h) on all cores): out with that y, the correction alone (y = 0: in
// out = y + correction the rounding of y to bf16 would hide most of a wrong correction), and the
// gradients. Then bit for bit: out in place (out == y) against out of place, and a second run of
// the backward against the first.
// With `documents` (the longest document; 0: one document), packed documents: each row's first
// document began before the segment (the entering state reaches it), later ones start inside.
struct SsdInitCase {
  const char* name;
  int64_t batch, seq, heads, head_dim, groups;
  int32_t documents = 0;
};

struct SsdInitRef {
  std::vector<double> corr, ddt, dA, dC, dinit;  // corr: out - y
};

SsdInitRef ssd_init_reference(const hcp::cuda::SsdShape& s, const HostBf16& dout,
                              const std::vector<float>& dt, const std::vector<float>& A,
                              const HostBf16& Cm, const std::vector<float>& init,
                              const std::vector<int32_t>& positions) {
  const int64_t B = s.batch, S = s.seq, H = s.heads, P = s.head_dim, G = s.groups, N = s.state;
  const int64_t hg = H / G;
  SsdInitRef r;
  r.corr.assign(B * S * H * P, 0);
  r.ddt.assign(B * S * H, 0);
  r.dA.assign(H, 0);
  r.dC.assign(B * S * G * N, 0);
  r.dinit.assign(B * H * P * N, 0);
  std::vector<std::vector<double>> dC_bh(B * H);
  std::vector<double> dA_bh(B * H);
  parallel_for(B * H, [&](int64_t bh) {
    const int64_t b = bh / H, h = bh % H, g = h / hg;
    const hcp::cpu::SsdShape one{1, S, 1, P, 1, N, s.chunk};
    std::vector<double> y0(S * P, 0.0), go(S * P), dth(S), Ch(S * N), Sh(P * N);
    for (int64_t t = 0; t < S; t++) {
      dth[t] = dt[(b * S + t) * H + h];
      for (int64_t p = 0; p < P; p++) go[t * P + p] = dout.val[((b * S + t) * H + h) * P + p];
      for (int64_t n = 0; n < N; n++) Ch[t * N + n] = Cm.val[((b * S + t) * G + g) * N + n];
    }
    for (int64_t i = 0; i < P * N; i++) Sh[i] = init[bh * P * N + i];
    const double a = A[h];
    std::vector<double> corr(S * P), ddt(S), dCh(S * N), dinit(P * N);
    double dA = 0;
    const int32_t* row_positions = positions.empty() ? nullptr : positions.data() + b * S;
    hcp::cpu::ssd_add_initial_state_forward<double>(corr.data(), y0.data(), dth.data(), &a,
                                                    Ch.data(), Sh.data(), one, row_positions);
    hcp::cpu::ssd_add_initial_state_backward<double>(ddt.data(), &dA, dCh.data(), dinit.data(),
                                                     go.data(), dth.data(), &a, Ch.data(),
                                                     Sh.data(), one, row_positions);
    for (int64_t t = 0; t < S; t++) {
      for (int64_t p = 0; p < P; p++) r.corr[((b * S + t) * H + h) * P + p] = corr[t * P + p];
      r.ddt[(b * S + t) * H + h] = ddt[t];
    }
    std::copy(dinit.begin(), dinit.end(), r.dinit.begin() + bh * P * N);
    dC_bh[bh] = std::move(dCh);
    dA_bh[bh] = dA;
  });
  for (int64_t bh = 0; bh < B * H; bh++) {
    const int64_t b = bh / H, h = bh % H, g = h / hg;
    r.dA[h] += dA_bh[bh];
    for (int64_t t = 0; t < S; t++) {
      for (int64_t n = 0; n < N; n++) r.dC[((b * S + t) * G + g) * N + n] += dC_bh[bh][t * N + n];
    }
    std::vector<double>().swap(dC_bh[bh]);
  }
  return r;
}

// Elements whose bits differ.
template <typename T>
size_t bit_diffs(const std::vector<T>& a, const std::vector<T>& b) {
  size_t n = 0;
  for (size_t i = 0; i < a.size(); i++) n += std::memcmp(&a[i], &b[i], sizeof(T)) != 0 ? 1 : 0;
  return n;
}
void report_bits(const std::string& what, size_t diffs, size_t total) {
  const bool ok = diffs == 0;
  (ok ? g_passed : g_failed)++;
  std::printf("  %-44s %zu of %zu elements differ  %s\n", what.c_str(), diffs, total,
              ok ? "ok" : "FAIL");
}

void run_ssd_init_case(const SsdInitCase& c, uint64_t seed) {
  Rng rng(seed);
  hcp::cuda::SsdShape s{c.batch, c.seq, c.heads, c.head_dim, c.groups, 128, 256};
  std::printf("SSD initial state %s: B=%lld S=%lld H=%lld P=%lld G=%lld N=128%s\n", c.name,
              static_cast<long long>(s.batch), static_cast<long long>(s.seq),
              static_cast<long long>(s.heads), static_cast<long long>(s.head_dim),
              static_cast<long long>(s.groups), c.documents > 0 ? " documents" : "");
  if (!hcp::cuda::ssd_supported(s)) {
    std::printf("  unsupported shape: FAIL\n");
    g_failed++;
    return;
  }
  const int64_t B = s.batch, S = s.seq, H = s.heads, P = s.head_dim, G = s.groups, N = s.state;
  const size_t ny = B * S * H * P, nc = B * S * G * N, nst = B * H * P * N, ndt = B * S * H;
  const HostBf16 y = random_bf16(rng, ny, 1.0), dout = random_bf16(rng, ny, 1.0);
  const HostBf16 Cm = random_bf16(rng, nc, 0.5);
  auto log_uniform_dt = [&](size_t n) {
    std::vector<float> v(n);
    for (auto& x : v) x = static_cast<float>(std::exp(rng.uniform(std::log(1e-3), std::log(1e-1))));
    return v;
  };
  const std::vector<float> dt = log_uniform_dt(ndt);
  std::vector<float> A(H);
  for (auto& v : A) v = static_cast<float>(-std::exp(rng.uniform(0.0, std::log(16.0))));
  std::vector<float> init;
  {
    // The final state of a preceding random segment, same heads and A.
    const hcp::cuda::SsdShape prev{B, 512, H, P, G, N, 256};
    auto x_d = upload_bf16(random_bf16(rng, B * 512 * H * P, 1.0));
    auto B_d = upload_bf16(random_bf16(rng, B * 512 * G * N, 0.5));
    auto dt_d = upload_f32(log_uniform_dt(B * 512 * H)), A_d = upload_f32(A);
    DevBuf<float> fin(nst);
    DevBuf<unsigned char> ws(hcp::cuda::ssd_final_state_forward_workspace_bytes(prev));
    CHECK_OK(hcp::cuda::ssd_final_state_forward(nullptr, fin.ptr, x_d.ptr, dt_d.ptr, A_d.ptr,
                                                B_d.ptr, prev, {ws.ptr, ws.n}));
    init = fin.download();
  }
  double init_ss = 0;
  for (float v : init) init_ss += static_cast<double>(v) * v;
  const std::vector<int32_t> positions =
      c.documents > 0 ? packed_positions(rng, B, S, c.documents, 5) : std::vector<int32_t>();
  auto positions_d = upload_i32(positions);
  const int32_t* positions_ptr = positions.empty() ? nullptr : positions_d.ptr;

  const auto t_ref = std::chrono::steady_clock::now();
  const SsdInitRef ref = ssd_init_reference(s, dout, dt, A, Cm, init, positions);
  const double ref_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_ref).count();
  std::printf("  (oracle %.1f s; init_state rms %.3g)\n", ref_s,
              std::sqrt(init_ss / static_cast<double>(nst)));

  auto y_d = upload_bf16(y), dout_d = upload_bf16(dout), C_d = upload_bf16(Cm);
  auto dt_d = upload_f32(dt), A_d = upload_f32(A), init_d = upload_f32(init);
  DevBuf<bf16> zero_y(ny), out(ny), out0(ny), inplace(ny), dC(nc);
  CHECK_CUDA(cudaMemset(zero_y.ptr, 0, ny * sizeof(bf16)));
  DevBuf<float> ddt(ndt), dA(H), dinit(nst);
  DevBuf<unsigned char> ws(std::max(hcp::cuda::ssd_add_initial_state_forward_workspace_bytes(s),
                                    hcp::cuda::ssd_add_initial_state_backward_workspace_bytes(s)));
  const hcp::cuda::Workspace w{ws.ptr, ws.n};

  auto forward = [&](bf16* o, const bf16* yy) {
    ws.poison();
    CHECK_OK(hcp::cuda::ssd_add_initial_state_forward(nullptr, o, yy, dt_d.ptr, A_d.ptr, C_d.ptr,
                                                      init_d.ptr, s, w, positions_ptr));
    CHECK_CUDA(cudaDeviceSynchronize());
  };
  out.poison();
  forward(out.ptr, y_d.ptr);
  out0.poison();
  forward(out0.ptr, zero_y.ptr);
  CHECK_CUDA(cudaMemcpy(inplace.ptr, y_d.ptr, ny * sizeof(bf16), cudaMemcpyDeviceToDevice));
  forward(inplace.ptr, inplace.ptr);

  struct Grads {
    std::vector<float> ddt, dA, dinit;
    std::vector<bf16> dC;
  };
  auto backward = [&]() {
    ws.poison();
    for (auto* b : {&ddt, &dA, &dinit}) b->poison();
    dC.poison();
    CHECK_OK(hcp::cuda::ssd_add_initial_state_backward(nullptr, ddt.ptr, dA.ptr, dC.ptr, dinit.ptr,
                                                       dout_d.ptr, dt_d.ptr, A_d.ptr, C_d.ptr,
                                                       init_d.ptr, s, w, positions_ptr));
    CHECK_CUDA(cudaDeviceSynchronize());
    return Grads{ddt.download(), dA.download(), dinit.download(), dC.download()};
  };
  const Grads g1 = backward();
  const std::vector<double> dC_got = download_bf16(dC);
  const Grads g2 = backward();

  std::vector<double> ref_out(ny);
  for (size_t i = 0; i < ny; i++) ref_out[i] = y.val[i] + ref.corr[i];
  report("out", compare(download_bf16(out), ref_out), kTolBf16);
  report("out with y = 0 (the correction alone)", compare(download_bf16(out0), ref.corr), kTolBf16);
  report("ddt", compare(to_double(g1.ddt), ref.ddt), kTolF32);
  {
    // dA_h sums w_t cum_t of both signs over few positions (the decay leaves a handful per row in
    // the fast heads), so ||err|| / ||dA|| swings with the luck of the cancellation. Measured
    // instead against the terms' own size, sum_{b,t} |w_t| cum_t (w_t from the oracle's ddt:
    // w_t = (ddt_t - ddt_{t+1}) / A_h); the plain ratio is printed for information.
    std::vector<double> scale(H, 0.0);
    for (int64_t b = 0; b < B; b++) {
      for (int64_t h = 0; h < H; h++) {
        double cum = 0;
        for (int64_t t = 0; t < S; t++) {
          cum += dt[(b * S + t) * H + h];
          const double next = t + 1 < S ? ref.ddt[(b * S + t + 1) * H + h] : 0.0;
          scale[h] += std::fabs((ref.ddt[(b * S + t) * H + h] - next) / A[h]) * cum;
        }
      }
    }
    const std::vector<double> got = to_double(g1.dA);
    Err e = compare(got, ref.dA);
    double num = 0, den = 0;
    for (int64_t h = 0; h < H; h++) {
      num += (got[h] - ref.dA[h]) * (got[h] - ref.dA[h]);
      den += scale[h] * scale[h];
    }
    std::printf("  (dA: ||err|| / ||dA|| = %.3e)\n", e.rel_rms);
    e.rel_rms = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
    report("dA (error / sum_t |w_t| cum_t)", e, kTolF32);
  }
  report("dC", compare(dC_got, ref.dC), kTolBf16);
  report("dinit_state", compare(to_double(g1.dinit), ref.dinit), kTolF32);
  report_bits("out in place = out of place", bit_diffs(inplace.download(), out.download()), ny);
  report_bits("backward twice: identical bits",
              bit_diffs(g1.ddt, g2.ddt) + bit_diffs(g1.dA, g2.dA) + bit_diffs(g1.dinit, g2.dinit) +
                  bit_diffs(g1.dC, g2.dC),
              ndt + H + nst + nc);
}

// ---------------------------------------------------------------------------------------------
// Attention.
struct AttnCase {
  const char* name;
  int64_t batch, q_len, kv_len, q_heads, kv_heads, head_dim;
  bool causal;
  int64_t q_pos0, k_pos0;
  double scale;  // 0: 1/sqrt(head_dim)
  bool sliced;   // oracle on slices (large shapes)
  // Packed documents of the query rows, of at most this many tokens (0: one document); the first
  // continued from 40 tokens before the block when q_pos0 >= 40.
  int32_t documents = 0;
};

// Rows [r0, r0 + n) of a [B, S] int32 tensor.
std::vector<int32_t> positions_rows_of(const std::vector<int32_t>& t, int64_t B, int64_t S,
                                       int64_t r0, int64_t n) {
  std::vector<int32_t> out(B * n);
  for (int64_t b = 0; b < B; b++) {
    std::copy(t.begin() + b * S + r0, t.begin() + b * S + r0 + n, out.begin() + b * n);
  }
  return out;
}

// Rows [r0, r0 + n) of a [B, S, H, D] tensor (double) as a [B, n, H, D] tensor.
std::vector<double> rows_of(const std::vector<double>& t, int64_t B, int64_t S, int64_t H,
                            int64_t D, int64_t r0, int64_t n) {
  std::vector<double> out(B * n * H * D);
  for (int64_t b = 0; b < B; b++) {
    std::copy(t.begin() + ((b * S + r0) * H) * D, t.begin() + ((b * S + r0 + n) * H) * D,
              out.begin() + (b * n * H) * D);
  }
  return out;
}
// Columns [r0, r0 + n) of a [B, H, S] tensor as [B, H, n].
std::vector<double> lse_rows_of(const std::vector<double>& t, int64_t B, int64_t H, int64_t S,
                                int64_t r0, int64_t n) {
  std::vector<double> out(B * H * n);
  for (int64_t bh = 0; bh < B * H; bh++) {
    std::copy(t.begin() + bh * S + r0, t.begin() + bh * S + r0 + n, out.begin() + bh * n);
  }
  return out;
}

void run_attn_case(const AttnCase& c, uint64_t seed) {
  Rng rng(seed);
  hcp::cuda::AttentionShape s{c.batch, c.q_len, c.kv_len, c.q_heads, c.kv_heads, c.head_dim};
  const double scale = c.scale > 0 ? c.scale : 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  std::printf(
      "attention %s: B=%lld Sq=%lld Sk=%lld Hq=%lld Hkv=%lld D=%lld causal=%d q_pos0=%lld "
      "k_pos0=%lld scale=%.5f documents=%d%s\n",
      c.name, static_cast<long long>(s.batch), static_cast<long long>(s.q_len),
      static_cast<long long>(s.kv_len), static_cast<long long>(s.q_heads),
      static_cast<long long>(s.kv_heads), static_cast<long long>(s.head_dim), c.causal,
      static_cast<long long>(c.q_pos0), static_cast<long long>(c.k_pos0), scale, c.documents,
      c.sliced ? " (oracle on slices)" : "");
  if (!hcp::cuda::attention_supported(s)) {
    std::printf("  unsupported shape: FAIL\n");
    g_failed++;
    return;
  }
  const int64_t B = s.batch, Sq = s.q_len, Sk = s.kv_len, Hq = s.q_heads, Hkv = s.kv_heads,
                D = s.head_dim;
  const HostBf16 q = random_bf16(rng, B * Sq * Hq * D, 1.0);
  const HostBf16 k = random_bf16(rng, B * Sk * Hkv * D, 1.0);
  const HostBf16 v = random_bf16(rng, B * Sk * Hkv * D, 1.0);
  const HostBf16 dout = random_bf16(rng, B * Sq * Hq * D, 1.0);
  const std::vector<int32_t> positions =
      c.documents > 0 ? packed_positions(rng, B, Sq, c.documents, c.q_pos0 >= 40 ? 40 : 0)
                      : std::vector<int32_t>();
  auto positions_d = upload_i32(positions);
  const int32_t* positions_ptr = positions.empty() ? nullptr : positions_d.ptr;

  auto q_d = upload_bf16(q), k_d = upload_bf16(k), v_d = upload_bf16(v), dout_d = upload_bf16(dout);
  DevBuf<bf16> out(q.size()), dq(q.size()), dk(k.size()), dv(v.size());
  DevBuf<float> lse(B * Hq * Sq);
  DevBuf<unsigned char> ws(hcp::cuda::attention_backward_workspace_bytes(s));
  for (auto* b : {&out, &dq, &dk, &dv}) b->poison();
  lse.poison();
  ws.poison();
  CHECK_OK(hcp::cuda::attention_forward(nullptr, out.ptr, lse.ptr, q_d.ptr, k_d.ptr, v_d.ptr, s,
                                        static_cast<float>(scale), c.causal, c.q_pos0, c.k_pos0,
                                        positions_ptr));
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_OK(hcp::cuda::attention_backward(
      nullptr, dq.ptr, dk.ptr, dv.ptr, dout_d.ptr, q_d.ptr, k_d.ptr, v_d.ptr, out.ptr, lse.ptr, s,
      static_cast<float>(scale), c.causal, c.q_pos0, c.k_pos0, {ws.ptr, ws.n}, positions_ptr));
  CHECK_CUDA(cudaDeviceSynchronize());
  const std::vector<double> out_g = download_bf16(out), lse_g = download_f32(lse),
                            dq_g = download_bf16(dq), dk_g = download_bf16(dk),
                            dv_g = download_bf16(dv);
  {
    // Run-to-run reproducibility of the backward (information only: the atomic-dq Hopper path
    // is not bit-reproducible by design).
    CHECK_OK(hcp::cuda::attention_backward(
        nullptr, dq.ptr, dk.ptr, dv.ptr, dout_d.ptr, q_d.ptr, k_d.ptr, v_d.ptr, out.ptr, lse.ptr, s,
        static_cast<float>(scale), c.causal, c.q_pos0, c.k_pos0, {ws.ptr, ws.n}, positions_ptr));
    CHECK_CUDA(cudaDeviceSynchronize());
    const std::vector<double> dq2 = download_bf16(dq), dk2 = download_bf16(dk);
    size_t ndiff = 0;
    double maxd = 0;
    for (size_t i = 0; i < dq2.size(); i++) {
      if (dq2[i] != dq_g[i]) ndiff++;
      maxd = std::max(maxd, std::fabs(dq2[i] - dq_g[i]));
    }
    for (size_t i = 0; i < dk2.size(); i++) {
      if (dk2[i] != dk_g[i]) ndiff++;
    }
    std::printf("  (backward run twice: %zu elements of dq/dk differ, max |dq diff| %.3e)\n", ndiff,
                maxd);
  }

  const auto t_ref = std::chrono::steady_clock::now();
  // Query-row slices (out, lse, dq) and key-row slices (dk, dv).
  std::vector<std::pair<int64_t, int64_t>> qs, ks;
  if (c.sliced) {
    qs = {{Sq - 96, 96}, {Sq / 2 - 17, 64}};
    ks = {{0, 96}, {Sk / 2 + 5, 64}};
  } else {
    qs = {{0, Sq}};
    ks = {{0, Sk}};
  }
  struct Piece {
    std::vector<double> out_ref, lse_ref, dq_ref, out_got, lse_got, dq_got;
    std::vector<double> dk_ref, dv_ref, dk_got, dv_got;
  };
  std::vector<Piece> pieces(qs.size() + ks.size());
  const double sc = scale;
  parallel_for(static_cast<int64_t>(pieces.size()), [&](int64_t pi) {
    Piece& p = pieces[pi];
    if (pi < static_cast<int64_t>(qs.size())) {
      const auto [r0, n] = qs[pi];
      hcp::cpu::AttentionShape sub{B, n, Sk, Hq, Hkv, D};
      const auto qsub = rows_of(q.val, B, Sq, Hq, D, r0, n);
      const std::vector<int32_t> psub =
          positions.empty() ? positions : positions_rows_of(positions, B, Sq, r0, n);
      const int32_t* pp = psub.empty() ? nullptr : psub.data();
      p.out_ref.resize(B * n * Hq * D);
      p.lse_ref.resize(B * Hq * n);
      hcp::cpu::attention_forward<double>(p.out_ref.data(), p.lse_ref.data(), qsub.data(),
                                          k.val.data(), v.val.data(), sub, sc, c.causal,
                                          c.q_pos0 + r0, c.k_pos0, pp);
      p.out_got = rows_of(out_g, B, Sq, Hq, D, r0, n);
      p.lse_got = lse_rows_of(lse_g, B, Hq, Sq, r0, n);
      p.dq_got = rows_of(dq_g, B, Sq, Hq, D, r0, n);
      const auto gsub = rows_of(dout.val, B, Sq, Hq, D, r0, n);
      std::vector<double> dk_tmp(k.size()), dv_tmp(v.size());
      p.dq_ref.resize(qsub.size());
      hcp::cpu::attention_backward<double>(p.dq_ref.data(), dk_tmp.data(), dv_tmp.data(),
                                           gsub.data(), qsub.data(), k.val.data(), v.val.data(),
                                           p.out_got.data(), p.lse_got.data(), sub, sc, c.causal,
                                           c.q_pos0 + r0, c.k_pos0, pp);
    } else {
      const auto [c0, n] = ks[pi - qs.size()];
      hcp::cpu::AttentionShape sub{B, Sq, n, Hq, Hkv, D};
      const auto ksub = rows_of(k.val, B, Sk, Hkv, D, c0, n);
      const auto vsub = rows_of(v.val, B, Sk, Hkv, D, c0, n);
      std::vector<double> dq_tmp(q.size());
      p.dk_ref.resize(ksub.size());
      p.dv_ref.resize(vsub.size());
      hcp::cpu::attention_backward<double>(
          dq_tmp.data(), p.dk_ref.data(), p.dv_ref.data(), dout.val.data(), q.val.data(),
          ksub.data(), vsub.data(), out_g.data(), lse_g.data(), sub, sc, c.causal, c.q_pos0,
          c.k_pos0 + c0, positions.empty() ? nullptr : positions.data());
      p.dk_got = rows_of(dk_g, B, Sk, Hkv, D, c0, n);
      p.dv_got = rows_of(dv_g, B, Sk, Hkv, D, c0, n);
    }
  });
  const double ref_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_ref).count();
  std::printf("  (oracle %.1f s)\n", ref_s);
  std::vector<double> og, orf, lg, lr, qg, qr, kg, kr, vg, vr;
  auto append = [](std::vector<double>& a, const std::vector<double>& b) {
    a.insert(a.end(), b.begin(), b.end());
  };
  for (const Piece& p : pieces) {
    append(og, p.out_got);
    append(orf, p.out_ref);
    append(lg, p.lse_got);
    append(lr, p.lse_ref);
    append(qg, p.dq_got);
    append(qr, p.dq_ref);
    append(kg, p.dk_got);
    append(kr, p.dk_ref);
    append(vg, p.dv_got);
    append(vr, p.dv_ref);
  }
  report("out", compare(og, orf), kTolBf16);
  report("lse", compare(lg, lr), kTolLse, true);
  report("dq", compare(qg, qr), kTolBf16);
  report("dk", compare(kg, kr), kTolBf16);
  report("dv", compare(vg, vr), kTolBf16);
}

// ---------------------------------------------------------------------------------------------
// Timing.
double median_ms(int reps, const std::function<void(int)>& fn) {
  for (int i = 0; i < 3; i++) fn(i);
  CHECK_CUDA(cudaDeviceSynchronize());
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  std::vector<float> ms(reps);
  for (int i = 0; i < reps; i++) {
    CHECK_CUDA(cudaEventRecord(a));
    fn(i);
    CHECK_CUDA(cudaEventRecord(b));
    CHECK_CUDA(cudaEventSynchronize(b));
    CHECK_CUDA(cudaEventElapsedTime(&ms[i], a, b));
  }
  CHECK_CUDA(cudaEventDestroy(a));
  CHECK_CUDA(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return reps % 2 ? ms[reps / 2] : 0.5 * (ms[reps / 2 - 1] + ms[reps / 2]);
}

struct TimingRow {
  std::string what;
  double ms, tflops, anchor_ms;
};
std::vector<TimingRow> g_rows;
std::string g_impl_tag;  // " [impl]" when --impl was given

void add_row(const std::string& what, double ms, double flop, double anchor_ms) {
  g_rows.push_back({what, ms, flop / (ms * 1e-3) / 1e12, anchor_ms});
  std::printf("  %-34s %9.3f ms  %6.1f TFLOP/s  anchor %8.3f ms  (%.2fx the anchor's speed)\n",
              what.c_str(), ms, flop / (ms * 1e-3) / 1e12, anchor_ms, anchor_ms / ms);
}

// Device-side pseudo-random fills for the timing inputs (hundreds of MB: generating them on the
// host would cost minutes of device time). Counter-based: splitmix64 -> Box-Muller.
__device__ uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
__device__ float normal_at(uint64_t seed, size_t i) {
  const uint64_t r = splitmix64(seed ^ splitmix64(i));
  const float u1 = (static_cast<float>(r >> 40) + 1.f) * (1.f / 16777216.f);  // (0, 1]
  const float u2 = static_cast<float>((r >> 16) & 0xffffff) * (1.f / 16777216.f);
  return sqrtf(-2.f * logf(u1)) * cospif(2.f * u2);
}
__global__ void fill_normal_bf16(bf16* p, size_t n, uint64_t seed, float stddev) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    p[i] = __float2bfloat16(stddev * normal_at(seed, i));
  }
}
// dt log-uniform in [1e-3, 1e-1].
__global__ void fill_dt(float* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    const float u = static_cast<float>(splitmix64(seed ^ splitmix64(i)) >> 40) / 16777216.f;
    p[i] = expf(logf(1e-3f) + u * (logf(1e-1f) - logf(1e-3f)));
  }
}
void fill_random_bf16(DevBuf<bf16>& d, Rng& rng, double stddev) {
  fill_normal_bf16<<<1024, 256>>>(d.ptr, d.n, rng.gen(), static_cast<float>(stddev));
  CHECK_CUDA(cudaGetLastError());
}

// 48 heads of head_dim (tiny: 64, 350m: 32), one group; anchor times 0 where there is none.
void time_ssd(int64_t seq, int64_t head_dim, double anchor_fwd, double anchor_fb, int reps,
              Rng& rng) {
  hcp::cuda::SsdShape s{1, seq, 48, head_dim, 1, 128, 256};
  const size_t nx = seq * 48 * head_dim, nbc = seq * 128, nst = 48 * head_dim * 128;
  const size_t set_bytes = 2 * nx * 2 + 2 * nbc * 2 + seq * 48 * 4;
  const int sets =
      static_cast<int>(std::min<size_t>(4, std::max<size_t>(1, (240u << 20) / set_bytes + 1)));
  struct Set {
    DevBuf<bf16> x, Bm, Cm, dy;
    DevBuf<float> dt;
  };
  std::vector<Set> in;
  for (int i = 0; i < sets; i++) {
    Set st{DevBuf<bf16>(nx), DevBuf<bf16>(nbc), DevBuf<bf16>(nbc), DevBuf<bf16>(nx),
           DevBuf<float>(seq * 48)};
    fill_random_bf16(st.x, rng, 1.0);
    fill_random_bf16(st.Bm, rng, 0.5);
    fill_random_bf16(st.Cm, rng, 0.5);
    fill_random_bf16(st.dy, rng, 1.0);
    fill_dt<<<1024, 256>>>(st.dt.ptr, st.dt.n, rng.gen());
    CHECK_CUDA(cudaGetLastError());
    in.push_back(std::move(st));
  }
  std::vector<float> A(48), D(48);
  for (auto& v : A) v = static_cast<float>(-std::exp(rng.uniform(0.0, std::log(16.0))));
  for (auto& v : D) v = static_cast<float>(rng.uniform(0.5, 1.5));
  auto dA_in = upload_f32(A), dD_in = upload_f32(D);
  DevBuf<bf16> y(nx), dx(nx), dB(nbc), dC(nbc);
  DevBuf<float> fin(nst), ddt(seq * 48), dA(48), dD(48), dinit(nst);
  DevBuf<unsigned char> ws(std::max(hcp::cuda::ssd_scan_forward_workspace_bytes(s),
                                    hcp::cuda::ssd_scan_backward_workspace_bytes(s)));
  hcp::cuda::Workspace w{ws.ptr, ws.n};
  auto fwd = [&](int i) {
    const Set& st = in[i % sets];
    CHECK_OK(hcp::cuda::ssd_scan_forward(nullptr, y.ptr, fin.ptr, st.x.ptr, st.dt.ptr, dA_in.ptr,
                                         st.Bm.ptr, st.Cm.ptr, dD_in.ptr, nullptr, s, w));
  };
  auto fb = [&](int i) {
    fwd(i);
    const Set& st = in[i % sets];
    CHECK_OK(hcp::cuda::ssd_scan_backward(
        nullptr, dx.ptr, ddt.ptr, dA.ptr, dB.ptr, dC.ptr, dD.ptr, dinit.ptr, st.dy.ptr, nullptr,
        st.x.ptr, st.dt.ptr, dA_in.ptr, st.Bm.ptr, st.Cm.ptr, dD_in.ptr, nullptr, s, w));
  };
  // FLOPs of the chunked algorithm (causal halves counted once): scores Q^2/2 N, intra Q^2/2 P,
  // incoming state Q P N, chunk state Q P N, per head and chunk, 2 per multiply-add. The backward
  // is counted as 2x the forward (the usual convention); the anchors are times, compare those.
  const double nc = static_cast<double>((seq + 255) / 256);
  const double fwd_flop =
      2.0 * 48 * nc *
      (256.0 * 256 / 2 * 128 + 256.0 * 256 / 2 * head_dim + 2 * 256.0 * head_dim * 128);
  const std::string tag =
      "SSD s=" + std::to_string(seq) + (head_dim == 64 ? "" : " P=" + std::to_string(head_dim));
  add_row(tag + " fwd", median_ms(reps, fwd), fwd_flop, anchor_fwd);
  const double fb_ms = median_ms(reps, fb);
  add_row(tag + " fwd+bwd", fb_ms, 3 * fwd_flop, anchor_fb);

  // The context-parallel summary, ssd_final_state forward + backward, against this scan's
  // fwd+bwd (the anchor column holds that time here). FLOPs: the chunk states (Q P N per head and
  // chunk) forward, and the state terms of dx and dB backward.
  DevBuf<unsigned char> ws_final(std::max(hcp::cuda::ssd_final_state_forward_workspace_bytes(s),
                                          hcp::cuda::ssd_final_state_backward_workspace_bytes(s)));
  hcp::cuda::Workspace wf{ws_final.ptr, ws_final.n};
  auto final_fb = [&](int i) {
    const Set& st = in[i % sets];
    CHECK_OK(hcp::cuda::ssd_final_state_forward(nullptr, fin.ptr, st.x.ptr, st.dt.ptr, dA_in.ptr,
                                                st.Bm.ptr, s, wf));
    CHECK_OK(hcp::cuda::ssd_final_state_backward(nullptr, dx.ptr, ddt.ptr, dA.ptr, dB.ptr, fin.ptr,
                                                 st.x.ptr, st.dt.ptr, dA_in.ptr, st.Bm.ptr, s, wf));
  };
  const double final_flop = 3 * 2.0 * 48 * nc * (256.0 * head_dim * 128);
  add_row(tag + " final_state fwd+bwd", median_ms(reps, final_fb), final_flop, fb_ms);
}

// The initial-state correction at granite-4.0-h-tiny with context parallelism 2 (B = 2 segments
// of s = 4096 as rows, 48 heads x 64, one group). The anchor column holds the targets (forward
// 0.040 ms, backward 0.120 ms; it replaces a ~0.45 ms summary pass per layer). FLOPs: the
// products only, 2 B S H P N forward (C S^T) and twice that backward (dout S and dout^T C).
void time_ssd_init(int reps, Rng& rng) {
  const hcp::cuda::SsdShape s{2, 4096, 48, 64, 1, 128, 256};
  const size_t ny = 2 * 4096 * 48 * 64, nc = 2 * 4096 * 128, nst = 2 * 48 * 64 * 128;
  const size_t ndt = 2 * 4096 * 48;
  const size_t set_bytes = ny * 2 + nc * 2 + ndt * 4 + nst * 4;
  const int sets =
      static_cast<int>(std::min<size_t>(4, std::max<size_t>(1, (240u << 20) / set_bytes + 1)));
  struct Set {
    DevBuf<bf16> yd, Cm;  // yd: y (forward) and dout (backward)
    DevBuf<float> dt, init;
  };
  std::vector<Set> in;
  for (int i = 0; i < sets; i++) {
    Set st{DevBuf<bf16>(ny), DevBuf<bf16>(nc), DevBuf<float>(ndt),
           upload_f32(random_f32(rng, nst, 0.05))};
    fill_random_bf16(st.yd, rng, 1.0);
    fill_random_bf16(st.Cm, rng, 0.5);
    fill_dt<<<1024, 256>>>(st.dt.ptr, st.dt.n, rng.gen());
    CHECK_CUDA(cudaGetLastError());
    in.push_back(std::move(st));
  }
  std::vector<float> A(48);
  for (auto& v : A) v = static_cast<float>(-std::exp(rng.uniform(0.0, std::log(16.0))));
  auto A_d = upload_f32(A);
  DevBuf<bf16> out(ny), dC(nc);
  DevBuf<float> ddt(ndt), dA(48), dinit(nst);
  DevBuf<unsigned char> ws(std::max(hcp::cuda::ssd_add_initial_state_forward_workspace_bytes(s),
                                    hcp::cuda::ssd_add_initial_state_backward_workspace_bytes(s)));
  const hcp::cuda::Workspace w{ws.ptr, ws.n};
  std::printf("  (initial-state correction workspace: forward %zu bytes, backward %zu bytes)\n",
              hcp::cuda::ssd_add_initial_state_forward_workspace_bytes(s),
              hcp::cuda::ssd_add_initial_state_backward_workspace_bytes(s));
  auto fwd = [&](int i) {
    const Set& st = in[i % sets];
    CHECK_OK(hcp::cuda::ssd_add_initial_state_forward(nullptr, out.ptr, st.yd.ptr, st.dt.ptr,
                                                      A_d.ptr, st.Cm.ptr, st.init.ptr, s, w));
  };
  auto fwd_in_place = [&](int i) {
    const Set& st = in[i % sets];
    CHECK_OK(hcp::cuda::ssd_add_initial_state_forward(nullptr, st.yd.ptr, st.yd.ptr, st.dt.ptr,
                                                      A_d.ptr, st.Cm.ptr, st.init.ptr, s, w));
  };
  auto bwd = [&](int i) {
    const Set& st = in[i % sets];
    CHECK_OK(hcp::cuda::ssd_add_initial_state_backward(nullptr, ddt.ptr, dA.ptr, dC.ptr, dinit.ptr,
                                                       st.yd.ptr, st.dt.ptr, A_d.ptr, st.Cm.ptr,
                                                       st.init.ptr, s, w));
  };
  const double flop = 2.0 * 2 * 4096 * 48 * 64 * 128;
  add_row("SSD init-state cp=2 fwd", median_ms(reps, fwd), flop, 0.040);
  add_row("SSD init-state cp=2 fwd in place", median_ms(reps, fwd_in_place), flop, 0.040);
  add_row("SSD init-state cp=2 bwd", median_ms(reps, bwd), 2 * flop, 0.120);
}

// documents > 0: the rows packed with documents of that many tokens each.
void time_attn(int64_t seq, double anchor_fwd, double anchor_fb, int reps, Rng& rng,
               int32_t documents = 0) {
  hcp::cuda::AttentionShape s{1, seq, seq, 12, 4, 128};
  std::vector<int32_t> positions;
  for (int64_t t = 0; documents > 0 && t < seq; t++) positions.push_back(t % documents);
  auto positions_d = upload_i32(positions);
  const int32_t* positions_ptr = positions.empty() ? nullptr : positions_d.ptr;
  const size_t nq = seq * 12 * 128, nk = seq * 4 * 128;
  const size_t set_bytes = (2 * nq + 2 * nk) * 2;
  const int sets =
      static_cast<int>(std::min<size_t>(4, std::max<size_t>(1, (240u << 20) / set_bytes + 1)));
  struct Set {
    DevBuf<bf16> q, k, v, dout;
  };
  std::vector<Set> in;
  for (int i = 0; i < sets; i++) {
    Set st{DevBuf<bf16>(nq), DevBuf<bf16>(nk), DevBuf<bf16>(nk), DevBuf<bf16>(nq)};
    fill_random_bf16(st.q, rng, 1.0);
    fill_random_bf16(st.k, rng, 1.0);
    fill_random_bf16(st.v, rng, 1.0);
    fill_random_bf16(st.dout, rng, 1.0);
    in.push_back(std::move(st));
  }
  DevBuf<bf16> out(nq), dq(nq), dk(nk), dv(nk);
  DevBuf<float> lse(12 * seq);
  DevBuf<unsigned char> ws(hcp::cuda::attention_backward_workspace_bytes(s));
  const float scale = 1.0f / 128.0f;  // granite's attention_multiplier
  auto fwd = [&](int i) {
    const Set& st = in[i % sets];
    CHECK_OK(hcp::cuda::attention_forward(nullptr, out.ptr, lse.ptr, st.q.ptr, st.k.ptr, st.v.ptr,
                                          s, scale, true, 0, 0, positions_ptr));
  };
  auto bwd = [&](int i) {
    const Set& st = in[i % sets];
    CHECK_OK(hcp::cuda::attention_backward(nullptr, dq.ptr, dk.ptr, dv.ptr, st.dout.ptr, st.q.ptr,
                                           st.k.ptr, st.v.ptr, out.ptr, lse.ptr, s, scale, true, 0,
                                           0, {ws.ptr, ws.n}, positions_ptr));
  };
  auto fb = [&](int i) {
    fwd(i);
    bwd(i);
  };
  // Flash-attention convention: forward 4 S^2 D H / 2 (causal), backward 2.5x the forward.
  const double fwd_flop = 4.0 * seq * seq * 128 * 12 / 2;
  const std::string tag = "attn" + g_impl_tag + " s=" + std::to_string(seq) +
                          (documents > 0 ? " docs=" + std::to_string(documents) : "");
  add_row(tag + " fwd", median_ms(reps, fwd), fwd_flop, anchor_fwd);
  fwd(0);  // out / lse for the backward-only timing (inputs of set 0; the timing is what counts)
  add_row(tag + " bwd", median_ms(reps, bwd), 2.5 * fwd_flop, anchor_fb - anchor_fwd);
  add_row(tag + " fwd+bwd", median_ms(reps, fb), 3.5 * fwd_flop, anchor_fb);
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t seed =
      static_cast<uint64_t>(std::chrono::high_resolution_clock::now().time_since_epoch().count());
  bool timing = true, large = true;
  std::string only;
  int reps = 10;
  for (int i = 1; i < argc; i++) {
    const std::string a = argv[i];
    if (a == "--seed" && i + 1 < argc) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--no-timing") {
      timing = false;
    } else if (a == "--no-large") {
      large = false;
    } else if (a == "--only" && i + 1 < argc) {
      only = argv[++i];
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--impl" && i + 1 < argc) {
      const std::string impl = argv[++i];
      setenv("HCP_ATTN_IMPL", impl.c_str(), 1);
      g_impl_tag = " [" + impl + "]";
    } else {
      std::fprintf(stderr,
                   "usage: %s [--seed N] [--no-timing] [--no-large] [--only ssd|ssd-init|attn] "
                   "[--reps N] [--impl hopper|hopper-det|fa2]\n",
                   argv[0]);
      return 2;
    }
  }
  int dev = 0;
  CHECK_CUDA(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, dev));
  std::printf("device: %s, %d SMs, L2 %d MB, cc %d.%d; seed %llu (rerun with --seed %llu)\n",
              prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20, prop.major, prop.minor,
              static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed));
  std::printf("host threads for the oracle: %u\n", std::thread::hardware_concurrency());
  {
    const char* impl = std::getenv("HCP_ATTN_IMPL");
    std::printf("attention implementation (HCP_ATTN_IMPL): %s\n",
                impl != nullptr ? impl : "(unset: library default)");
  }

  uint64_t case_seed = seed;
  if (only.empty() || only == "ssd") {
    const SsdCase cases[] = {
        // name, B, S, H, P, G, D, init, final, dfinal, dinit
        {"seq<chunk", 1, 100, 2, 64, 1, true, true, true, true, true},
        {"partial-chunk,groups=2", 2, 300, 4, 64, 2, true, false, true, false, true},
        {"groups=heads,P=32,no-D", 1, 549, 3, 32, 3, false, true, false, true, false},
        {"4-chunks", 1, 1024, 6, 64, 2, true, true, true, true, true},
        {"exact-chunk,no-states", 1, 256, 2, 64, 1, true, false, false, false, false},
        {"tiny s=8192", 1, 8192, 48, 64, 1, true, true, true, true, true},
        // Enough blocks that chunk_outer's serve several heads each (2 on 132 SMs).
        {"48 heads, 8 chunks", 1, 2048, 48, 64, 1, true, true, true, true, true},
        // granite-4.0-h-350m's heads (P = 32, one group), and P = 32 with groups of two heads.
        {"350m: 48 heads, P=32", 1, 2048, 48, 32, 1, true, true, true, true, true},
        {"documents: 6 heads, P=32, groups=3", 1, 700, 6, 32, 3, true, true, true, true, true, 90},
        {"documents: 48 heads, groups=2", 1, 2048, 48, 64, 2, true, true, true, true, true, 500},
        // Packed documents: starts anywhere in a chunk, documents across chunks, of 1 to 3 tokens,
        // the first continued from before the row (with an initial state) or not.
        {"documents", 2, 1000, 4, 64, 2, true, true, true, true, true, 300},
        {"documents: short, P=32", 1, 700, 3, 32, 3, true, false, true, true, false, 40},
        {"documents: long, groups=2", 1, 2048, 6, 64, 2, true, true, true, true, true, 900},
    };
    for (const auto& c : cases) {
      if (!large && c.seq > 2048) continue;
      run_ssd_case(c, case_seed++);
    }
    const SsdFinalStateCase final_cases[] = {
        // name, B, S, H, P, G
        {"seq<chunk", 1, 100, 2, 64, 1},
        {"partial-chunk,groups=2", 2, 300, 4, 64, 2},
        {"partial-chunk,groups=heads,P=32", 1, 549, 3, 32, 3},
        {"4-chunks", 1, 1024, 6, 64, 2},
        {"tiny s=8192", 1, 8192, 48, 64, 1},
        {"documents", 2, 1000, 4, 64, 2, 300},
        {"documents: short, P=32", 1, 549, 3, 32, 3, 40},
    };
    for (const auto& c : final_cases) {
      if (!large && c.seq > 2048) continue;
      run_ssd_final_state_case(c, case_seed++);
    }
  }
  if (only.empty() || only == "ssd" || only == "ssd-init") {
    const SsdInitCase init_cases[] = {
        // name, B, S, H, P, G
        {"seq<chunk, partial tile", 1, 100, 2, 64, 1},
        {"groups=2, P=32", 1, 300, 8, 32, 2},
        {"groups=heads, B=2", 2, 200, 3, 64, 3},
        {"B=2, P=32, 4 chunks", 2, 1000, 6, 32, 2},
        {"heads not split, B=3, groups=2", 3, 1500, 4, 64, 2},
        {"48 heads, several tiles per range", 1, 2000, 48, 64, 1},
        {"granite cp=2: B=2 s=4096 48 heads", 2, 4096, 48, 64, 1},
        // Packed documents: the term stops at each row's first document start (anywhere in a
        // tile), or never inside the segment.
        {"documents: B=2, P=32, groups=2", 2, 1000, 6, 32, 2, 150},
        {"documents: 48 heads, B=2", 2, 2000, 48, 64, 1, 700},
        {"documents: one continued through the segment", 1, 300, 4, 64, 1, 100000},
    };
    for (const auto& c : init_cases) {
      if (!large && c.seq > 2048) continue;
      run_ssd_init_case(c, case_seed++);
    }
  }
  if (only.empty() || only == "attn") {
    const AttnCase cases[] = {
        // name, B, Sq, Sk, Hq, Hkv, D, causal, q_pos0, k_pos0, scale, sliced
        {"causal 4/4 d64", 1, 100, 100, 4, 4, 64, true, 0, 0, 0, false},
        {"causal GQA 12/4 d128 B=2", 2, 300, 300, 12, 4, 128, true, 0, 0, 0, false},
        {"ring: block fully visible", 1, 256, 256, 12, 4, 128, true, 256, 0, 1.0 / 128, false},
        {"ring: diagonal band off=100", 1, 200, 333, 12, 4, 128, true, 1000, 900, 0, false},
        {"ring: rows that see nothing", 1, 130, 120, 4, 4, 128, true, 0, 50, 0, false},
        {"ring: block fully masked", 1, 64, 64, 4, 2, 64, true, 0, 64, 0, false},
        {"non-causal 12/4 d64", 1, 77, 190, 12, 4, 64, false, 0, 0, 0, false},
        {"non-causal 12/4 d128", 1, 77, 190, 12, 4, 128, false, 0, 0, 0, false},
        {"causal 6/2 d128 s=1000 B=2", 2, 1000, 1000, 6, 2, 128, true, 0, 0, 1.0 / 128, false},
        {"ring: first rows see nothing off=-300", 1, 500, 900, 4, 2, 128, true, 0, 300, 0, false},
        {"ring: band off=37, Sq > Sk", 1, 450, 200, 4, 1, 128, true, 537, 500, 0, false},
        {"tiny s=8192 12/4 d128", 1, 8192, 8192, 12, 4, 128, true, 0, 0, 1.0 / 128, true},
        // Packed documents (key blocks no row sees are skipped; head_dim 128 on the Hopper
        // kernels, as the others, unless HCP_ATTN_IMPL=fa2): one rank's rows, and ring blocks
        // whose rows continue a document from an earlier rank.
        {"documents 12/4 d128 B=2", 2, 700, 700, 12, 4, 128, true, 0, 0, 0, false, 150},
        {"documents 6/2 d128 B=2, long", 2, 1000, 1000, 6, 2, 128, true, 0, 0, 0, false, 700},
        {"ring documents: first rows see nothing", 1, 500, 900, 4, 2, 128, true, 0, 300, 0, false,
         400},
        {"documents 4/2 d64, short", 1, 300, 300, 4, 2, 64, true, 0, 0, 0, false, 20},
        {"ring documents: band off=100", 1, 400, 333, 12, 4, 128, true, 1000, 900, 0, false, 120},
        {"ring documents: block fully visible", 1, 256, 256, 12, 4, 128, true, 256, 0, 0, false,
         200},
        {"documents s=8192, up to 1024", 1, 8192, 8192, 12, 4, 128, true, 0, 0, 1.0 / 128, true,
         1024},
    };
    for (const auto& c : cases) {
      if (!large && c.q_len > 2048) continue;
      run_attn_case(c, case_seed++);
    }
  }

  if (timing) {
    Rng rng(seed ^ 0x9e3779b97f4a7c15ull);
    std::printf("timing (median of %d, after 3 warm-ups):\n", reps);
    if (only.empty() || only == "ssd") {
      time_ssd(8192, 64, 0.746, 5.62, reps, rng);
      time_ssd(65536, 64, 2.05, 8.71, reps, rng);
      time_ssd(8192, 32, 0, 0, reps, rng);  // granite-4.0-h-350m's heads
    }
    if (only.empty() || only == "ssd" || only == "ssd-init") time_ssd_init(reps, rng);
    if (only.empty() || only == "attn") {
      time_attn(8192, 0.413, 1.584, reps, rng);
      time_attn(65536, 22.1, 79.5, reps, rng);
      // 64 documents of 1,024 tokens (its times against the one-document rows just above: packed
      // documents are to cost at most 1/16 of one document's attention).
      time_attn(65536, 22.1, 79.5, reps, rng, 1024);
    }
    std::printf("\n%-34s %10s %10s %12s %8s\n", "kernel", "ms", "TFLOP/s", "anchor ms", "speed");
    for (const auto& r : g_rows) {
      if (r.anchor_ms > 0) {
        std::printf("%-34s %10.3f %10.1f %12.3f %7.2fx\n", r.what.c_str(), r.ms, r.tflops,
                    r.anchor_ms, r.anchor_ms / r.ms);
      } else {  // no anchor for this shape
        std::printf("%-34s %10.3f %10.1f %12s %8s\n", r.what.c_str(), r.ms, r.tflops, "-", "-");
      }
    }
    std::printf(
        "targets: SSD fwd+bwd s=65536 <= 8.71 ms; SSD init-state cp=2 fwd <= 0.040 ms, bwd <= "
        "0.120 ms; attention fwd+bwd s=65536 <= 99 ms\n");
  }
  std::printf("\n%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
