// test_kernels_cuda: every CUDA kernel of runtime/kernels/cuda against the CPU oracle
// (runtime/kernels/cpu), on fresh random data, plus timings of the real shapes.
//   test_kernels_cuda [--seed N] [--small] [--no-timing] [--filter NAME]
// One line per kernel and shape: PASS/FAIL, name, shape, each output's relative RMS error against
// its tolerance, and (large shapes) the median time and achieved rate. Exit status 1 if any line
// failed, 2 if a call failed outright.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "tests/cuda/Harness.h"

using namespace hcp::cuda::test;

int main(int argc, char** argv) {
  Options options;
  options.seed =
      static_cast<uint64_t>(std::chrono::high_resolution_clock::now().time_since_epoch().count());
  for (int i = 1; i < argc; i++) {
    const std::string arg = argv[i];
    if (arg == "--seed" && i + 1 < argc) {
      options.seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (arg == "--small") {
      options.big = false;
    } else if (arg == "--no-timing") {
      options.timing = false;
    } else if (arg == "--filter" && i + 1 < argc) {
      options.filter = argv[++i];
    } else {
      std::fprintf(stderr,
                   "usage: test_kernels_cuda [--seed N] [--small] [--no-timing] [--filter NAME]\n");
      return 2;
    }
  }
  int device = 0;
  cudaDeviceProp prop;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  std::printf("test_kernels_cuda: seed %llu (repeat with --seed %llu); %s, %d SMs, %.0f GiB\n",
              static_cast<unsigned long long>(options.seed),
              static_cast<unsigned long long>(options.seed), prop.name, prop.multiProcessorCount,
              prop.totalGlobalMem / 1073741824.0);
  std::printf(
      "errors are relative RMS against the CPU oracle (name err<=tol); times are medians "
      "of 10 runs\n");
  Context ctx(options);
  const auto start = std::chrono::steady_clock::now();
  test_gemm(ctx);
  test_elementwise(ctx);
  test_norms(ctx);
  test_embedding(ctx);
  test_conv(ctx);
  test_moe(ctx);
  test_cross_entropy(ctx);
  test_adamw(ctx);
  test_ssd_log_decay(ctx);
  test_collective_kernels(ctx);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("test_kernels_cuda: %d lines, %d failed, %.0f s (seed %llu)\n", ctx.lines(),
              ctx.failures(), seconds, static_cast<unsigned long long>(options.seed));
  return ctx.failures() == 0 ? 0 : 1;
}
