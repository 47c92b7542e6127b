// A Mamba segment's total log-decay and its gradients (the CPU ssd_log_decay and
// ssd_log_decay_backward): g[b,h] = sum_t dt[b,t,h] A[h]; ddt[b,t,h] = dg[b,h] A[h];
// dA[h] = sum_{b,t} dg[b,h] dt[b,t,h]. Every product and sum is in double, as the CPU's. With
// packed documents, g is -infinity for a row whose last document starts in the segment.
//
// Both sums run over the sequence with stride `heads`, so a block reads 32 consecutive heads of 8
// rows at a time (coalesced) and sums one slab of kSlabRows rows: each thread sums every 8th row
// of its head, the block adds its 8 row-partials in order, and a second kernel adds the slabs in
// order. Fixed grid and fixed order: bit-reproducible, no atomics. The slab partials (double)
// live in the caller's workspace.
#include "runtime/kernels/cuda/Common.cuh"

namespace hcp::cuda {
namespace {

using detail::ceil_div;
using detail::launch_status;

constexpr int kHeadsPerBlock = 32;  // threadIdx.x: consecutive heads (coalesced)
constexpr int kRowsPerBlock = 8;    // threadIdx.y: interleaved rows of the slab
constexpr int64_t kSlabRows = 1024;

int64_t slabs_of(int64_t seq) { return std::max<int64_t>(1, ceil_div(seq, kSlabRows)); }

// partial[(b * slabs + s) * heads + h] = sum over the slab's rows t of dt[b,t,h] * coef, with
// coef = A[h] (forward) or dg[b,h] (backward, which also writes ddt[b,t,h] = dg[b,h] * A[h]).
template <bool kBackward>
__global__ void slab_kernel(double* partial, float* ddt, const float* dt, const float* A,
                            const float* dg, int64_t seq, int64_t heads) {
  __shared__ double rows[kRowsPerBlock][kHeadsPerBlock];
  const int64_t h = int64_t{blockIdx.x} * kHeadsPerBlock + threadIdx.x;
  const int64_t slab = blockIdx.y, b = blockIdx.z, slabs = gridDim.y;
  const int64_t t0 = slab * kSlabRows, t1 = min(seq, t0 + kSlabRows);
  double acc = 0.0;
  if (h < heads) {
    const double a = static_cast<double>(A[h]);
    const double coef = kBackward ? static_cast<double>(dg[b * heads + h]) : a;
    const float d = kBackward ? static_cast<float>(coef * a) : 0.f;
    for (int64_t t = t0 + threadIdx.y; t < t1; t += kRowsPerBlock) {
      const int64_t i = (b * seq + t) * heads + h;
      acc += static_cast<double>(dt[i]) * coef;
      if constexpr (kBackward) ddt[i] = d;
    }
  }
  rows[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && h < heads) {
    double total = 0.0;
#pragma unroll
    for (int r = 0; r < kRowsPerBlock; r++) total += rows[r][threadIdx.x];
    partial[(b * slabs + slab) * heads + h] = total;
  }
}

// g[b,h] = sum over slabs of partial[b, slab, h], in slab order; -infinity where the row's last
// token's document starts in it (positions[last] < seq).
__global__ void forward_total_kernel(float* g, const double* partial, const int32_t* positions,
                                     int64_t batch, int64_t seq, int64_t slabs, int64_t heads) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= batch * heads) return;
  const int64_t b = i / heads, h = i % heads;
  if (positions != nullptr && seq > 0 && positions[b * seq + seq - 1] < seq) {
    g[i] = -INFINITY;
    return;
  }
  double total = 0.0;
  for (int64_t s = 0; s < slabs; s++) total += partial[(b * slabs + s) * heads + h];
  g[i] = static_cast<float>(total);
}

// dA[h] = sum over batch rows, then slabs, of partial[b, slab, h] (the CPU's b-then-t order).
__global__ void backward_total_kernel(float* dA, const double* partial, int64_t batch,
                                      int64_t slabs, int64_t heads) {
  const int64_t h = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (h >= heads) return;
  double total = 0.0;
  for (int64_t i = 0; i < batch * slabs; i++) total += partial[i * heads + h];
  dA[h] = static_cast<float>(total);
}

Status check_shape(const char* name, int64_t batch, int64_t seq, int64_t heads,
                   Workspace workspace) {
  if (batch < 0 || seq < 0 || heads < 0) return Status(name, "negative size");
  if (batch > 65535 || slabs_of(seq) > 65535) {
    return Status(name, "batch above 65535 or seq above 65535 * 1024 is not supported");
  }
  if (workspace.ptr == nullptr ||
      workspace.bytes < ssd_log_decay_workspace_bytes(batch, seq, heads)) {
    return Status(name, "workspace too small");
  }
  return Status();
}

}  // namespace

size_t ssd_log_decay_workspace_bytes(int64_t batch, int64_t seq, int64_t heads) {
  return sizeof(double) * static_cast<size_t>(std::max<int64_t>(1, batch * slabs_of(seq) * heads));
}

Status ssd_log_decay_forward(cudaStream_t stream, float* g, const float* dt, const float* A,
                             int64_t batch, int64_t seq, int64_t heads, Workspace workspace,
                             const int32_t* positions) {
  const char* name = "ssd_log_decay.forward";
  if (Status s = check_shape(name, batch, seq, heads, workspace); !s.ok()) return s;
  if (batch == 0 || heads == 0) return Status();
  auto* partial = static_cast<double*>(workspace.ptr);
  const int64_t slabs = slabs_of(seq);
  const dim3 grid(static_cast<unsigned>(ceil_div(heads, kHeadsPerBlock)),
                  static_cast<unsigned>(slabs), static_cast<unsigned>(batch));
  slab_kernel<false><<<grid, dim3(kHeadsPerBlock, kRowsPerBlock), 0, stream>>>(
      partial, nullptr, dt, A, nullptr, seq, heads);
  if (Status s = launch_status(name); !s.ok()) return s;
  forward_total_kernel<<<static_cast<unsigned>(ceil_div(batch * heads, 256)), 256, 0, stream>>>(
      g, partial, positions, batch, seq, slabs, heads);
  return launch_status(name);
}

Status ssd_log_decay_backward(cudaStream_t stream, float* ddt, float* dA, const float* dg,
                              const float* dt, const float* A, int64_t batch, int64_t seq,
                              int64_t heads, Workspace workspace) {
  const char* name = "ssd_log_decay.backward";
  if (Status s = check_shape(name, batch, seq, heads, workspace); !s.ok()) return s;
  if (heads == 0) return Status();
  auto* partial = static_cast<double*>(workspace.ptr);
  const int64_t slabs = slabs_of(seq);
  if (batch > 0) {
    const dim3 grid(static_cast<unsigned>(ceil_div(heads, kHeadsPerBlock)),
                    static_cast<unsigned>(slabs), static_cast<unsigned>(batch));
    slab_kernel<true><<<grid, dim3(kHeadsPerBlock, kRowsPerBlock), 0, stream>>>(partial, ddt, dt, A,
                                                                                dg, seq, heads);
    if (Status s = launch_status(name); !s.ok()) return s;
  }
  // With batch == 0 the sum is empty: dA = 0, as the CPU's.
  backward_total_kernel<<<static_cast<unsigned>(ceil_div(heads, 256)), 256, 0, stream>>>(
      dA, partial, batch, slabs, heads);
  return launch_status(name);
}

}  // namespace hcp::cuda
