// AdamW on fp32 master weights (hcp::train::AdamWKernel, element for element) and the sum of
// squares behind the global gradient norm.
//
// The per-step scalars are computed on the host in double and rounded to float exactly as the
// CPU kernel does; the element math uses explicitly rounded operations (__fmul_rn, __fadd_rn,
// __fsqrt_rn, __fdiv_rn) so that nvcc cannot contract them into fused multiply-adds, which the
// CPU (x86-64 without -mfma) does not use either: the results are bit-identical.
#include <cmath>

#include "runtime/kernels/cuda/Common.cuh"

namespace hcp::cuda {
namespace {

using namespace detail;

constexpr int kThreads = 256;
constexpr int kSumBlocks = 1024;

struct AdamWScalars {
  float beta1, beta2, one_minus_beta1, one_minus_beta2, clip, decay_factor, step_size, inv_sqrt_bc2,
      eps;
};

template <typename G>
__global__ void adamw_kernel(float* master, bf16* param, const G* grad, float* m, float* v,
                             int64_t n, AdamWScalars s) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float g = __fmul_rn(to_float(grad[i]), s.clip);
    const float mi = __fadd_rn(__fmul_rn(s.beta1, m[i]), __fmul_rn(s.one_minus_beta1, g));
    const float vi =
        __fadd_rn(__fmul_rn(s.beta2, v[i]), __fmul_rn(__fmul_rn(s.one_minus_beta2, g), g));
    const float denom = __fadd_rn(__fmul_rn(__fsqrt_rn(vi), s.inv_sqrt_bc2), s.eps);
    const float p = __fadd_rn(__fmul_rn(master[i], s.decay_factor),
                              -__fmul_rn(s.step_size, __fdiv_rn(mi, denom)));
    m[i] = mi;
    v[i] = vi;
    master[i] = p;
    if (param != nullptr) param[i] = __float2bfloat16_rn(p);
  }
}

// Per-block sums of squares (fp32 per group of 8, double across groups), then one block sums
// the block sums in order.
template <typename T>
__global__ void squares_kernel(double* partials, const T* x, int64_t n, bool vec) {
  __shared__ double scratch[32];
  double acc = 0.0;
  const int64_t groups = (n + 7) / 8;
  for (int64_t g = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; g < groups;
       g += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = g * 8;
    float v[8];
    load8_any(v, x + i, static_cast<int>(min(int64_t{8}, n - i)), vec);
    float s = 0.f;
#pragma unroll
    for (int e = 0; e < 8; e++) s += v[e] * v[e];
    acc += static_cast<double>(s);
  }
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

__global__ void sum_blocks_kernel(double* out, const double* partials, int64_t count) {
  __shared__ double scratch[32];
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) acc += partials[i];
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) *out = acc;
}

}  // namespace

template <typename G>
Status adamw_update(cudaStream_t stream, float* master, bf16* param, const G* grad, float* m,
                    float* v, int64_t n, const AdamWStep& step) {
  const char* name = "adamw_update";
  if (n < 0 || step.t < 1) return Status(name, "need n >= 0 and t >= 1");
  if (n == 0) return Status();
  // As hcp::train::AdamWKernel computes them.
  const double t = static_cast<double>(step.t);
  AdamWScalars s;
  s.beta1 = static_cast<float>(step.beta1);
  s.beta2 = static_cast<float>(step.beta2);
  s.one_minus_beta1 = static_cast<float>(1.0 - step.beta1);
  s.one_minus_beta2 = static_cast<float>(1.0 - step.beta2);
  s.clip = static_cast<float>(step.clip_coef);
  s.decay_factor = static_cast<float>(1.0 - step.lr * (step.decay ? step.weight_decay : 0.0));
  s.step_size = static_cast<float>(step.lr / (1.0 - std::pow(step.beta1, t)));
  s.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(step.beta2, t)));
  s.eps = static_cast<float>(step.eps);
  adamw_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(master, param, grad, m, v, n, s);
  return launch_status(name);
}

template Status adamw_update<float>(cudaStream_t, float*, bf16*, const float*, float*, float*,
                                    int64_t, const AdamWStep&);
template Status adamw_update<bf16>(cudaStream_t, float*, bf16*, const bf16*, float*, float*,
                                   int64_t, const AdamWStep&);

size_t sum_of_squares_workspace_bytes(int64_t) { return sizeof(double) * kSumBlocks; }

template <typename T>
Status sum_of_squares(cudaStream_t stream, double* out, const T* x, int64_t n,
                      Workspace workspace) {
  const char* name = "sum_of_squares";
  if (n < 0) return Status(name, "negative size");
  if (workspace.ptr == nullptr || workspace.bytes < sum_of_squares_workspace_bytes(n)) {
    return Status(name, "workspace too small");
  }
  double* partials = static_cast<double*>(workspace.ptr);
  // A fixed grid: the summation order does not depend on the GPU.
  const int64_t blocks =
      std::max<int64_t>(1, std::min<int64_t>(kSumBlocks, ceil_div(n, 8 * kThreads)));
  squares_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(partials, x, n,
                                                                         aligned16(x));
  if (Status s = launch_status(name); !s.ok()) return s;
  sum_blocks_kernel<<<1, kThreads, 0, stream>>>(out, partials, blocks);
  return launch_status(name);
}

template Status sum_of_squares<float>(cudaStream_t, double*, const float*, int64_t, Workspace);
template Status sum_of_squares<bf16>(cudaStream_t, double*, const bf16*, int64_t, Workspace);

}  // namespace hcp::cuda
