// Mamba state passing between sequence segments, one segment at a time (CollectiveKernels.h).
// The forward is elementwise over (b, h, i); the backward needs a dot product per (b, h), so it
// runs one block per (b, h) and sums in double in a fixed order.
#include <cmath>

#include "runtime/kernels/cuda/CollectiveKernels.h"
#include "runtime/kernels/cuda/Common.cuh"

namespace hcp::cuda {
namespace {

using detail::launch_status;

__global__ void forward_kernel(float* s_in, float* run, const float* g, const float* s,
                               int64_t batch, int64_t segs, int64_t k, int64_t heads, int64_t pn) {
  const int64_t n = batch * heads * pn;
  for (int64_t m = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; m < n;
       m += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = m % pn, bh = m / pn, b = bh / heads, h = bh % heads;
    const int64_t gi = (b * segs + k) * heads + h;  // this segment's (b, h) in the local arrays
    const float r = run[m];
    if (s_in != nullptr) s_in[gi * pn + i] = r;
    run[m] = expf(g[gi]) * r + s[gi * pn + i];
  }
}

template <int kThreads>
__global__ void backward_kernel(float* dg, float* ds, float* run, const float* g,
                                const float* ds_in, const float* s_in, int64_t segs, int64_t k,
                                int64_t heads, int64_t pn) {
  __shared__ double scratch[32];
  const int64_t bh = blockIdx.x, b = bh / heads, h = bh % heads;
  const int64_t gi = (b * segs + k) * heads + h;
  float* r = run + bh * pn;
  const float decay = expf(g[gi]);
  if (s_in != nullptr) {
    double dot = 0.0;
    for (int64_t i = threadIdx.x; i < pn; i += kThreads) {
      dot += static_cast<double>(s_in[gi * pn + i]) * r[i];
      ds[gi * pn + i] = r[i];
    }
    dot = detail::block_sum(dot, scratch);
    if (threadIdx.x == 0) dg[gi] = static_cast<float>(static_cast<double>(decay) * dot);
  }
  // Each thread rewrites only the elements it read above: no barrier needed in between.
  for (int64_t i = threadIdx.x; i < pn; i += kThreads) r[i] = ds_in[gi * pn + i] + decay * r[i];
}

Status check(const char* name, int64_t batch, int64_t segs, int64_t k, int64_t heads, int64_t pn) {
  if (batch < 0 || segs < 1 || k < 0 || k >= segs || heads < 0 || pn < 0) {
    return Status(name, "bad sizes (negative, or segment k outside [0, segs))");
  }
  return Status();
}

}  // namespace

Status state_pass_forward(cudaStream_t stream, float* s_in, float* run, const float* g,
                          const float* s, int64_t batch, int64_t segs, int64_t k, int64_t heads,
                          int64_t pn) {
  if (Status st = check("state_pass_forward", batch, segs, k, heads, pn); !st.ok()) return st;
  const int64_t n = batch * heads * pn;
  if (n == 0) return Status();
  constexpr int kThreads = 256;
  forward_kernel<<<detail::grid_for(n, kThreads), kThreads, 0, stream>>>(s_in, run, g, s, batch,
                                                                         segs, k, heads, pn);
  return launch_status("state_pass_forward");
}

Status state_pass_backward(cudaStream_t stream, float* dg, float* ds, float* run, const float* g,
                           const float* ds_in, const float* s_in, int64_t batch, int64_t segs,
                           int64_t k, int64_t heads, int64_t pn) {
  if (Status st = check("state_pass_backward", batch, segs, k, heads, pn); !st.ok()) return st;
  if ((dg == nullptr) != (s_in == nullptr) || (ds == nullptr) != (s_in == nullptr)) {
    return Status("state_pass_backward", "dg, ds and s_in must be all given or all null");
  }
  if (batch * heads == 0) return Status();
  if (batch * heads > 0x7fffffff) return Status("state_pass_backward", "batch * heads too large");
  constexpr int kThreads = 256;
  backward_kernel<kThreads><<<static_cast<unsigned>(batch * heads), kThreads, 0, stream>>>(
      dg, ds, run, g, ds_in, s_in, segs, k, heads, pn);
  return launch_status("state_pass_backward");
}

}  // namespace hcp::cuda
