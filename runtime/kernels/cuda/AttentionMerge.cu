// Ring attention's merge by log-sum-exp and its fp32 gradient sums (CollectiveKernels.h).
#include <cmath>

#include "runtime/kernels/cuda/CollectiveKernels.h"
#include "runtime/kernels/cuda/Common.cuh"

namespace hcp::cuda {
namespace {

using detail::ceil_div;
using detail::launch_status;

constexpr int kMaxDim = 256;

// One warp per (row, head); each lane holds dim / 32 (at most 8) elements.
__global__ void merge_kernel(float* acc_out, float* acc_lse, int64_t acc_lse_stride,
                             const bf16* part_out, const float* part_lse, int64_t len,
                             int64_t heads, int64_t dim) {
  const int64_t pair = int64_t{blockIdx.x} * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (pair >= len * heads) return;
  const int64_t i = pair / heads, h = pair % heads;
  const float p = part_lse[h * len + i];
  if (p == -INFINITY) return;  // no visible key in this block: nothing to fold in
  float* a_lse = acc_lse + h * acc_lse_stride + i;
  const float a = *a_lse;
  const float top = fmaxf(a, p);
  const float merged = top + logf(expf(a - top) + expf(p - top));
  const float wa = expf(a - merged), wp = expf(p - merged);
  float* out = acc_out + (i * heads + h) * dim;
  const bf16* part = part_out + (i * heads + h) * dim;
  for (int64_t d = lane; d < dim; d += 32) {
    out[d] = out[d] * wa + __bfloat162float(part[d]) * wp;
  }
  __syncwarp();  // every lane has read *a_lse (through `a`) before it changes
  if (lane == 0) *a_lse = merged;
}

__global__ void accumulate_kernel(float* y, const bf16* x, int64_t n) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    y[i] += __bfloat162float(x[i]);
  }
}

}  // namespace

Status attention_merge(cudaStream_t stream, float* acc_out, float* acc_lse, int64_t acc_lse_stride,
                       const bf16* part_out, const float* part_lse, int64_t len, int64_t heads,
                       int64_t dim) {
  if (len < 0 || heads < 0 || dim < 0 || acc_lse_stride < len) {
    return Status("attention_merge", "bad sizes (negative, or lse stride below the rows)");
  }
  if (dim > kMaxDim) return Status("attention_merge", "head dim above 256 is not supported");
  if (len * heads == 0) return Status();
  constexpr int kThreads = 256;
  const int64_t blocks = ceil_div(len * heads, kThreads / 32);
  merge_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      acc_out, acc_lse, acc_lse_stride, part_out, part_lse, len, heads, dim);
  return launch_status("attention_merge");
}

Status accumulate(cudaStream_t stream, float* y, const bf16* x, int64_t n) {
  if (n < 0) return Status("accumulate", "negative size");
  if (n == 0) return Status();
  constexpr int kThreads = 256;
  accumulate_kernel<<<detail::grid_for(n, kThreads), kThreads, 0, stream>>>(y, x, n);
  return launch_status("accumulate");
}

}  // namespace hcp::cuda
