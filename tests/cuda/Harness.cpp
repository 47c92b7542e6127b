#include "tests/cuda/Harness.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <thread>

namespace hcp::cuda::test {

void die(const std::string& message) {
  std::fprintf(stderr, "test_kernels_cuda: %s\n", message.c_str());
  std::fflush(stdout);
  std::exit(2);
}

void check_cuda(cudaError_t error, const char* what) {
  if (error != cudaSuccess) die(std::string(what) + ": " + cudaGetErrorString(error));
}

void check(const Status& status) {
  if (!status.ok()) die(std::string(status.where()) + ": " + status.message());
}

uint16_t bf16_bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  if (std::isnan(value)) return 0x7fc0;
  const uint32_t rounding = 0x7fff + ((bits >> 16) & 1);  // to nearest, ties to even
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

float bf16_value(uint16_t bits) {
  const uint32_t word = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &word, 4);
  return value;
}

// ---------------------------------------------------------------------------------------------

namespace {

// splitmix64: a good 64-bit mix, used as a counter-based generator.
uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Uniform in (0, 1) from element i of stream `seed`.
double unit(uint64_t seed, uint64_t i) {
  return (static_cast<double>(mix(seed ^ mix(i)) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

}  // namespace

void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t grain) {
  const int64_t threads = std::max<int64_t>(
      1, std::min<int64_t>(std::thread::hardware_concurrency(), (n + grain - 1) / grain));
  if (threads == 1) {
    fn(0, n);
    return;
  }
  std::vector<std::thread> pool;
  for (int64_t t = 0; t < threads; t++) {
    const int64_t begin = n * t / threads, end = n * (t + 1) / threads;
    pool.emplace_back([&fn, begin, end] { fn(begin, end); });
  }
  for (std::thread& thread : pool) thread.join();
}

std::vector<float> randn(int64_t n, uint64_t seed, float stddev, bool bf16) {
  std::vector<float> v(n);
  parallel_for(n, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; i++) {
      // Box-Muller on two uniforms of this element.
      const double u1 = unit(seed, 2 * static_cast<uint64_t>(i));
      const double u2 = unit(seed, 2 * static_cast<uint64_t>(i) + 1);
      const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
      const float value = static_cast<float>(z * stddev);
      v[i] = bf16 ? round_bf16(value) : value;
    }
  });
  return v;
}

std::vector<float> randu(int64_t n, uint64_t seed, float lo, float hi, bool bf16) {
  std::vector<float> v(n);
  parallel_for(n, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; i++) {
      const float value = static_cast<float>(lo + (hi - lo) * unit(seed, static_cast<uint64_t>(i)));
      v[i] = bf16 ? round_bf16(value) : value;
    }
  });
  return v;
}

std::vector<int32_t> randint(int64_t n, uint64_t seed, int32_t lo, int32_t hi) {
  std::vector<int32_t> v(n);
  const uint64_t span = static_cast<uint64_t>(static_cast<int64_t>(hi) - lo);
  for (int64_t i = 0; i < n; i++) {
    v[i] = static_cast<int32_t>(lo + static_cast<int64_t>(mix(seed ^ mix(i)) % span));
  }
  return v;
}

std::vector<int32_t> packed_positions(int64_t batch, int64_t seq, uint64_t seed, int32_t max_length,
                                      int32_t continues) {
  std::vector<int32_t> positions(batch * seq);
  int64_t draw = 0;
  for (int64_t b = 0; b < batch; b++) {
    int32_t position = continues, left = 0;
    for (int64_t t = 0; t < seq; t++) {
      if (left == 0 && (t > 0 || continues == 0)) {
        // One document in four is 1 to 3 tokens long (shorter than the conv's window).
        const uint64_t r = mix(seed ^ mix(draw++));
        left = r % 4 == 0 ? 1 + static_cast<int32_t>((r >> 8) % 3)
                          : 1 + static_cast<int32_t>((r >> 8) % max_length);
        position = 0;
      } else if (left == 0) {
        left = max_length;  // the continued document runs on for a while
      }
      positions[b * seq + t] = position++;
      left--;
    }
  }
  return positions;
}

// ---------------------------------------------------------------------------------------------

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
}

double rel_rms(const std::vector<float>& out, const std::vector<float>& ref) {
  if (out.size() != ref.size()) die("rel_rms: size mismatch");
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < out.size(); i++) {
    if (!std::isfinite(out[i]) && std::isfinite(ref[i])) return kInf;
    const double d = static_cast<double>(out[i]) - static_cast<double>(ref[i]);
    diff += d * d;
    norm += static_cast<double>(ref[i]) * static_cast<double>(ref[i]);
  }
  if (norm == 0.0) return diff == 0.0 ? 0.0 : kInf;
  return std::sqrt(diff / norm);
}

double rel_rms_rows(const std::vector<float>& out, const std::vector<float>& ref_rows,
                    const std::vector<int64_t>& rows, int64_t cols) {
  std::vector<float> picked(rows.size() * cols);
  for (size_t r = 0; r < rows.size(); r++) {
    std::copy(out.begin() + rows[r] * cols, out.begin() + (rows[r] + 1) * cols,
              picked.begin() + static_cast<int64_t>(r) * cols);
  }
  return rel_rms(picked, ref_rows);
}

double nonfinite(const std::vector<float>& out) {
  for (float v : out) {
    if (!std::isfinite(v)) return kInf;
  }
  return 0.0;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double worst = 0.0;
  for (size_t i = 0; i < a.size(); i++) {
    const double d = std::fabs(double{a[i]} - double{b[i]});
    worst = std::max(worst, std::isnan(d) ? INFINITY : d);
  }
  return worst;
}

double mismatch(const std::vector<int32_t>& out, const std::vector<int32_t>& ref) {
  if (out.size() != ref.size()) die("mismatch: size mismatch");
  int64_t bad = 0;
  for (size_t i = 0; i < out.size(); i++) bad += out[i] != ref[i];
  return out.empty() ? 0.0 : static_cast<double>(bad) / static_cast<double>(out.size());
}

// ---------------------------------------------------------------------------------------------

Context::Context(Options options) : options_(std::move(options)) {
  check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  check(gemm_context_create(&gemm_));
}

Context::~Context() {
  gemm_context_destroy(gemm_);
  cudaStreamDestroy(stream_);
}

bool Context::wants(const std::string& kernel) const {
  return options_.filter.empty() || kernel.find(options_.filter) != std::string::npos;
}

void Context::sync() const {
  check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  check_cuda(cudaGetLastError(), "kernel");
}

double Context::time_ms(const std::function<void()>& fn) const {
  if (!options_.timing) return -1;
  for (int i = 0; i < 3; i++) fn();
  sync();
  cudaEvent_t start, stop;
  check_cuda(cudaEventCreate(&start), "cudaEventCreate");
  check_cuda(cudaEventCreate(&stop), "cudaEventCreate");
  std::vector<float> times;
  for (int i = 0; i < 10; i++) {
    check_cuda(cudaEventRecord(start, stream_), "cudaEventRecord");
    fn();
    check_cuda(cudaEventRecord(stop, stream_), "cudaEventRecord");
    check_cuda(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    times.push_back(ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  check_cuda(cudaGetLastError(), "timed kernel");
  std::sort(times.begin(), times.end());
  return 0.5 * (times[4] + times[5]);
}

void Context::report(const std::string& kernel, const std::string& shape,
                     const std::vector<Output>& outputs, double ms, const std::string& rate) {
  bool pass = true;
  std::string errors;
  for (const Output& o : outputs) {
    const bool ok = o.error <= o.tolerance;  // NaN and inf fail
    pass = pass && ok;
    char buf[128];
    std::snprintf(buf, sizeof(buf), "  %s %.2e%s%.0e", o.name.c_str(), o.error, ok ? "<=" : ">",
                  o.tolerance);
    errors += buf;
  }
  char timing[64] = "";
  if (ms >= 0) std::snprintf(timing, sizeof(timing), "  %9.3f ms  %s", ms, rate.c_str());
  std::printf("%s  %-34s %-26s%s%s\n", pass ? "PASS" : "FAIL", kernel.c_str(), shape.c_str(),
              errors.c_str(), timing);
  std::fflush(stdout);
  lines_++;
  if (!pass) failures_++;
}

std::string tbps(double bytes, double ms) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f TB/s", bytes / (ms * 1e-3) / 1e12);
  return buf;
}

std::string tflops(double flops, double ms) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f TFLOP/s", flops / (ms * 1e-3) / 1e12);
  return buf;
}

std::string shape_str(std::initializer_list<int64_t> dims) {
  std::string s;
  for (int64_t d : dims) {
    if (!s.empty()) s += 'x';
    s += std::to_string(d);
  }
  return s;
}

}  // namespace hcp::cuda::test
