// The GPU kernel test's harness: device arrays, random data, comparisons with the CPU oracle,
// timing and the report.
//
// Method (the workplace's METHOD.md): fresh random inputs every run (the seed is printed; pass
// --seed to repeat a run), outputs poisoned with NaN bytes before each launch so that an unwritten
// element fails, relative RMS error ||out - ref|| / ||ref|| against runtime/kernels/cpu (the
// oracle), every CUDA call checked, times as the median of 10 event-timed runs after warm-up.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "runtime/kernels/cuda/Kernels.h"

namespace hcp::cuda::test {

// ---------------------------------------------------------------------------------------------
// Failing hard: a broken call ends the program with the reason (a test, not a library).
[[noreturn]] void die(const std::string& message);
void check_cuda(cudaError_t error, const char* what);
void check(const Status& status);

// bf16 on the host, as bits: round to nearest even, and back.
uint16_t bf16_bits(float value);
float bf16_value(uint16_t bits);
inline float round_bf16(float value) { return bf16_value(bf16_bits(value)); }

// ---------------------------------------------------------------------------------------------
// A device array of T (float, bf16, int32_t, double, uint8_t), uploaded from and downloaded to
// host vectors of float (float, bf16) or of T itself.
//
// Every transfer and the poison are complete, device-wide, when the call returns, and a download
// waits for all work already queued: cudaMemset and cudaMemcpy run on the legacy default stream,
// which does not order against the context's non-blocking stream, and both may return before the
// device has finished them (a memset of device memory, and an upload from pageable memory). Without
// the waits, a poison could land after the kernel under test has written its output (the NaN then
// reads as an unwritten element: the first H200 run's fill.bf16 8192x3072, y inf), or a kernel
// could read an input not yet uploaded.
template <typename T>
class Dev {
 public:
  Dev() = default;
  explicit Dev(int64_t n) : n_(n) {
    check_cuda(cudaMalloc(reinterpret_cast<void**>(&ptr_), std::max<size_t>(bytes(), 256)),
               "cudaMalloc");
  }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  Dev(Dev&& other) noexcept : ptr_(other.ptr_), n_(other.n_) { other.ptr_ = nullptr; }
  Dev& operator=(Dev&& other) noexcept {
    std::swap(ptr_, other.ptr_);
    std::swap(n_, other.n_);
    return *this;
  }
  ~Dev() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }

  T* get() const { return ptr_; }
  int64_t size() const { return n_; }
  size_t bytes() const { return sizeof(T) * static_cast<size_t>(n_); }
  Workspace workspace() const { return Workspace{ptr_, bytes()}; }

  // Every byte 0xFF: NaN for float and bf16, -1 for int32.
  void poison() {
    check_cuda(cudaMemset(ptr_, 0xFF, bytes()), "cudaMemset");
    check_cuda(cudaDeviceSynchronize(), "cudaMemset (wait)");
  }

  void upload(const std::vector<float>& host) {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, bf16>);
    if (static_cast<int64_t>(host.size()) != n_) die("upload: size mismatch");
    if constexpr (std::is_same_v<T, float>) {
      check_cuda(cudaMemcpy(ptr_, host.data(), bytes(), cudaMemcpyHostToDevice), "upload");
    } else {
      std::vector<uint16_t> bits(host.size());
      for (size_t i = 0; i < host.size(); i++) bits[i] = bf16_bits(host[i]);
      check_cuda(cudaMemcpy(ptr_, bits.data(), bytes(), cudaMemcpyHostToDevice), "upload");
    }
    check_cuda(cudaDeviceSynchronize(), "upload (wait)");
  }
  void upload_raw(const std::vector<T>& host) {
    if (static_cast<int64_t>(host.size()) != n_) die("upload: size mismatch");
    check_cuda(cudaMemcpy(ptr_, host.data(), bytes(), cudaMemcpyHostToDevice), "upload");
    check_cuda(cudaDeviceSynchronize(), "upload (wait)");
  }
  std::vector<float> download() const {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, bf16>);
    check_cuda(cudaDeviceSynchronize(), "download (wait)");
    std::vector<float> host(n_);
    if constexpr (std::is_same_v<T, float>) {
      check_cuda(cudaMemcpy(host.data(), ptr_, bytes(), cudaMemcpyDeviceToHost), "download");
    } else {
      std::vector<uint16_t> bits(n_);
      check_cuda(cudaMemcpy(bits.data(), ptr_, bytes(), cudaMemcpyDeviceToHost), "download");
      for (size_t i = 0; i < bits.size(); i++) host[i] = bf16_value(bits[i]);
    }
    return host;
  }
  std::vector<T> download_raw() const {
    check_cuda(cudaDeviceSynchronize(), "download (wait)");
    std::vector<T> host(n_);
    check_cuda(cudaMemcpy(host.data(), ptr_, bytes(), cudaMemcpyDeviceToHost), "download");
    return host;
  }

 private:
  T* ptr_ = nullptr;
  int64_t n_ = 0;
};

// A device array holding `host`.
template <typename T>
Dev<T> to_device(const std::vector<float>& host) {
  Dev<T> d(static_cast<int64_t>(host.size()));
  d.upload(host);
  return d;
}
inline Dev<int32_t> to_device_i32(const std::vector<int32_t>& host) {
  Dev<int32_t> d(static_cast<int64_t>(host.size()));
  d.upload_raw(host);
  return d;
}
// Scratch of `bytes` (at least 256).
inline Dev<uint8_t> scratch(size_t bytes) { return Dev<uint8_t>(static_cast<int64_t>(bytes)); }

// ---------------------------------------------------------------------------------------------
// Random data: counter-based, split into chunks filled in parallel, so a seed gives the same
// data on any machine. `bf16`: values rounded to bf16 (the inputs of a bf16 kernel, exactly
// representable so the oracle sees the same numbers).
std::vector<float> randn(int64_t n, uint64_t seed, float stddev, bool bf16 = true);
std::vector<float> randu(int64_t n, uint64_t seed, float lo, float hi, bool bf16 = true);
std::vector<int32_t> randint(int64_t n, uint64_t seed, int32_t lo, int32_t hi);

// Packed documents' position_ids [batch, seq] (0 at each document's first token, then counting
// up): random document lengths in [1, max_length], a few of 1 to 3 tokens; with
// `continues`, each row's first document started `continues` tokens before the row (a segment
// of a longer sequence, as under context parallelism).
std::vector<int32_t> packed_positions(int64_t batch, int64_t seq, uint64_t seed, int32_t max_length,
                                      int32_t continues = 0);

// fn(begin, end) over [0, n) split over the hardware threads, at least `grain` items each.
void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t grain = 4096);

// ---------------------------------------------------------------------------------------------
// Errors.

// ||out - ref|| / ||ref|| over all elements (or over `rows` of `cols` columns each); +inf when
// out has a non-finite element where ref is finite (unwritten, or NaN). 0 when both are zero.
double rel_rms(const std::vector<float>& out, const std::vector<float>& ref);
double rel_rms_rows(const std::vector<float>& out, const std::vector<float>& ref_rows,
                    const std::vector<int64_t>& rows, int64_t cols);
// +inf when any element is not finite (for outputs checked only on a sample), else 0.
double nonfinite(const std::vector<float>& out);
// The largest |a - b| over the elements (two runs that must give the same bits: 0); +inf for a
// NaN difference or different sizes.
double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b);
// Fraction of mismatching elements.
double mismatch(const std::vector<int32_t>& out, const std::vector<int32_t>& ref);

// ---------------------------------------------------------------------------------------------
// The run: options, the stream and GEMM context, the report.
struct Options {
  uint64_t seed = 0;
  bool big = true;     // the real (large) shapes; off: only the small odd ones
  bool timing = true;  // time the large shapes
  std::string filter;  // run only kernels whose name contains it
};

struct Output {
  std::string name;
  double error;
  double tolerance;
};

class Context {
 public:
  explicit Context(Options options);
  ~Context();

  const Options& options() const { return options_; }
  cudaStream_t stream() const { return stream_; }
  GemmContext* gemm() const { return gemm_; }
  // A fresh seed for one input array.
  uint64_t seed() { return options_.seed * 0x9E3779B97F4A7C15ull + ++seed_counter_; }
  bool wants(const std::string& kernel) const;
  void sync() const;

  // Median milliseconds of 10 runs of fn after 3 warm-up runs (0 when timing is off).
  double time_ms(const std::function<void()>& fn) const;
  // One report line; ms < 0: not timed. rate: "1.23 TB/s" and the like.
  void report(const std::string& kernel, const std::string& shape,
              const std::vector<Output>& outputs, double ms = -1, const std::string& rate = "");
  int failures() const { return failures_; }
  int lines() const { return lines_; }

 private:
  Options options_;
  cudaStream_t stream_ = nullptr;
  GemmContext* gemm_ = nullptr;
  uint64_t seed_counter_ = 0;
  int failures_ = 0;
  int lines_ = 0;
};

// "3.21 TB/s" for bytes moved in ms; "612.0 TFLOP/s" for flops.
std::string tbps(double bytes, double ms);
std::string tflops(double flops, double ms);
std::string shape_str(std::initializer_list<int64_t> dims);

// The kernel families (one file each).
void test_gemm(Context& ctx);
void test_elementwise(Context& ctx);
void test_norms(Context& ctx);
void test_embedding(Context& ctx);
void test_conv(Context& ctx);
void test_moe(Context& ctx);
void test_cross_entropy(Context& ctx);
void test_adamw(Context& ctx);
void test_ssd_log_decay(Context& ctx);
void test_collective_kernels(Context& ctx);

}  // namespace hcp::cuda::test
