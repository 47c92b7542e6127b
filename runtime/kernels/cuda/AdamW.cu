// AdamW on fp32 master weights (hcp::train::AdamWKernel, element for element) and the sum of
// squares behind the global gradient norm.
//
// The per-step scalars are computed on the host in double and rounded to float exactly as the
// CPU kernel does; the element math uses explicitly rounded operations (__fmul_rn, __fadd_rn,
// __fsqrt_rn, __fdiv_rn) so that nvcc cannot contract them into fused multiply-adds, which the
// CPU (x86-64 without -mfma) does not use either: the results are bit-identical.
//
// AdamW moves 28 bytes an element and does little arithmetic: its speed is the memory's. So
// every parameter is updated in one launch (adamw_update_many), the tensors cut into chunks of
// kAdamWChunk elements, a block each, with 16-byte loads and stores where the arrays allow,
// several of them in flight per thread; the sums of squares likewise (sum_of_squares_many). A
// block finds its tensor in the table of tensors by its chunk's number, so a step copies one
// entry a tensor to the device, not one a chunk (tiny has ~100,000 chunks).
#include <cmath>
#include <type_traits>
#include <vector>

#include "runtime/kernels/cuda/ChunkTable.h"
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

// One element: the explicitly rounded operations of the CPU kernel, in its order.
__device__ __forceinline__ float adamw_element(float master, float grad, float& m, float& v,
                                               const AdamWScalars& s) {
  const float g = __fmul_rn(grad, s.clip);
  m = __fadd_rn(__fmul_rn(s.beta1, m), __fmul_rn(s.one_minus_beta1, g));
  v = __fadd_rn(__fmul_rn(s.beta2, v), __fmul_rn(__fmul_rn(s.one_minus_beta2, g), g));
  const float denom = __fadd_rn(__fmul_rn(__fsqrt_rn(v), s.inv_sqrt_bc2), s.eps);
  return __fadd_rn(__fmul_rn(master, s.decay_factor), -__fmul_rn(s.step_size, __fdiv_rn(m, denom)));
}

template <typename G>
__device__ __forceinline__ void adamw_one(float* master, bf16* param, const G* grad, float* m,
                                          float* v, int64_t i, const AdamWScalars& s) {
  float mi = m[i], vi = v[i];
  const float p = adamw_element(master[i], to_float(grad[i]), mi, vi, s);
  m[i] = mi;
  v[i] = vi;
  master[i] = p;
  if (param != nullptr) param[i] = __float2bfloat16_rn(p);
}

// Four gradient elements as one load: 8 bytes of bf16 or 16 of fp32.
struct alignas(8) Bf16x4 {
  bf16 x[4];
};
template <typename G>
using GradVec = std::conditional_t<std::is_same_v<G, bf16>, Bf16x4, float4>;

__device__ __forceinline__ float4 to_float4(const float4& g) { return g; }
__device__ __forceinline__ float4 to_float4(const Bf16x4& g) {
  return make_float4(to_float(g.x[0]), to_float(g.x[1]), to_float(g.x[2]), to_float(g.x[3]));
}

// adamw_update_many's table: per tensor its arrays, where its groups of four start (head, -1:
// none), its decay factor and its first chunk (the blocks find their tensor by it).
struct ManyTensor {
  float* master;
  bf16* param;
  const void* grad;
  float* m;
  float* v;
  int64_t n;
  int64_t head;
  int64_t first_chunk;
  float decay_factor;
  int grad_is_bf16;
};

// Elements [lo, hi) of one tensor by one block: groups of four from the first index at or after
// lo that is head plus a multiple of four, single elements before and after them. A thread loads
// kAdamWUnroll groups before it computes and stores them: the loads of several groups are in
// flight together, which the memory's latency needs.
constexpr int kAdamWUnroll = 2;
template <typename G>
__device__ void adamw_block_range(const ManyTensor& t, int64_t lo, int64_t hi, AdamWScalars s) {
  s.decay_factor = t.decay_factor;
  float* __restrict__ master = t.master;
  bf16* __restrict__ param = t.param;
  const G* __restrict__ grad = static_cast<const G*>(t.grad);
  float* __restrict__ m = t.m;
  float* __restrict__ v = t.v;
  int64_t vlo = hi, vectors = 0;
  if (t.head >= 0) {
    vlo = lo + ((t.head - lo) % 4 + 4) % 4;
    if (vlo > hi) vlo = hi;
    vectors = (hi - vlo) / 4;
  }
  for (int64_t j = threadIdx.x; j < vectors; j += int64_t{kThreads} * kAdamWUnroll) {
    float4 w[kAdamWUnroll], g[kAdamWUnroll], mv[kAdamWUnroll], vv[kAdamWUnroll];
#pragma unroll
    for (int u = 0; u < kAdamWUnroll; ++u) {
      const int64_t i = vlo + 4 * (j + u * kThreads);
      if (j + u * kThreads >= vectors) break;
      w[u] = *reinterpret_cast<const float4*>(master + i);
      g[u] = to_float4(*reinterpret_cast<const GradVec<G>*>(grad + i));
      mv[u] = *reinterpret_cast<const float4*>(m + i);
      vv[u] = *reinterpret_cast<const float4*>(v + i);
    }
#pragma unroll
    for (int u = 0; u < kAdamWUnroll; ++u) {
      const int64_t i = vlo + 4 * (j + u * kThreads);
      if (j + u * kThreads >= vectors) break;
      float4 p;
      p.x = adamw_element(w[u].x, g[u].x, mv[u].x, vv[u].x, s);
      p.y = adamw_element(w[u].y, g[u].y, mv[u].y, vv[u].y, s);
      p.z = adamw_element(w[u].z, g[u].z, mv[u].z, vv[u].z, s);
      p.w = adamw_element(w[u].w, g[u].w, mv[u].w, vv[u].w, s);
      *reinterpret_cast<float4*>(m + i) = mv[u];
      *reinterpret_cast<float4*>(v + i) = vv[u];
      *reinterpret_cast<float4*>(master + i) = p;
      if (param != nullptr) {
        Bf16x4 out;
        out.x[0] = __float2bfloat16_rn(p.x);
        out.x[1] = __float2bfloat16_rn(p.y);
        out.x[2] = __float2bfloat16_rn(p.z);
        out.x[3] = __float2bfloat16_rn(p.w);
        *reinterpret_cast<Bf16x4*>(param + i) = out;
      }
    }
  }
  const int64_t before = vlo - lo, tail = vlo + 4 * vectors;
  for (int64_t k = threadIdx.x; k < before + (hi - tail); k += kThreads) {
    adamw_one(master, param, grad, m, v, k < before ? lo + k : tail + (k - before), s);
  }
}

// One tensor (adamw_update): its chunks, a block each, as adamw_many_kernel's.
template <typename G>
__global__ void __launch_bounds__(kThreads) adamw_kernel(ManyTensor t, AdamWScalars s) {
  const int64_t begin = blockIdx.x * kAdamWChunk;
  adamw_block_range<G>(t, begin, min(begin + kAdamWChunk, t.n), s);
}

__global__ void __launch_bounds__(kThreads)
    adamw_many_kernel(const ManyTensor* tensors, int64_t count, AdamWScalars s) {
  const int64_t c = blockIdx.x;
  const ManyTensor t = tensors[tensor_of_chunk(tensors, count, c)];  // in registers, read once
  const int64_t begin = (c - t.first_chunk) * kAdamWChunk;
  const int64_t hi = min(begin + kAdamWChunk, t.n);
  if (t.grad_is_bf16) {
    adamw_block_range<bf16>(t, begin, hi, s);
  } else {
    adamw_block_range<float>(t, begin, hi, s);
  }
}

// Where the groups of four can start: the first element from which master, m, v (16 bytes),
// the gradient (4 elements) and the compute copy (8 bytes) are all aligned; -1 if there is none
// (the arrays' alignments disagree).
template <typename G>
int64_t aligned_head(const float* master, const bf16* param, const G* grad, const float* m,
                     const float* v) {
  const auto address = [](const void* p) { return reinterpret_cast<uintptr_t>(p); };
  for (int64_t head = 0; head < 4; ++head) {
    const bool ok = address(master + head) % 16 == 0 && address(m + head) % 16 == 0 &&
                    address(v + head) % 16 == 0 && address(grad + head) % (4 * sizeof(G)) == 0 &&
                    (param == nullptr || address(param + head) % 8 == 0);
    if (ok) return head;
  }
  return -1;
}

// The fp32 sum of the squares of 8 values, in a fixed order.
__device__ __forceinline__ float squares_of(const float (&v)[8]) {
  float s = 0.f;
#pragma unroll
  for (int e = 0; e < 8; e++) s += v[e] * v[e];
  return s;
}

// The same of up to 8 values at x (valid of them).
template <typename T>
__device__ __forceinline__ float squares8(const T* x, int valid, bool vec) {
  float v[8];
  load8_any(v, x, valid, vec);
  return squares_of(v);
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
    acc += static_cast<double>(squares8(x + i, static_cast<int>(min(int64_t{8}, n - i)), vec));
  }
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// sum_of_squares_many's table: per tensor its data and its first chunk (and one more entry: the
// chunks' count).
struct SquaresEntry {
  const void* x;
  int64_t n;
  int64_t first_chunk;
  int is_bf16;
};

// Elements [begin, end) by one block: a thread's groups of 8 in order, kSquaresUnroll groups
// loaded before they are summed where they are all whole and aligned.
constexpr int kSquaresUnroll = 4;
template <typename T>
__device__ double chunk_squares(const T* x, int64_t begin, int64_t end, bool vec, double* scratch) {
  constexpr int64_t stride = 8 * int64_t{kThreads};
  double acc = 0.0;
  int64_t i = begin + 8 * int64_t{threadIdx.x};
  if (vec) {
    for (; i + (kSquaresUnroll - 1) * stride + 8 <= end; i += kSquaresUnroll * stride) {
      float v[kSquaresUnroll][8];
#pragma unroll
      for (int u = 0; u < kSquaresUnroll; ++u) load8(v[u], x + i + u * stride);
#pragma unroll
      for (int u = 0; u < kSquaresUnroll; ++u) acc += static_cast<double>(squares_of(v[u]));
    }
  }
  for (; i < end; i += stride) {
    acc += static_cast<double>(squares8(x + i, static_cast<int>(min(int64_t{8}, end - i)), vec));
  }
  return block_sum(acc, scratch);
}

__global__ void __launch_bounds__(kThreads)
    squares_many_kernel(double* partials, const SquaresEntry* tensors, int64_t count) {
  __shared__ double scratch[32];
  const int64_t c = blockIdx.x;
  const SquaresEntry& t = tensors[tensor_of_chunk(tensors, count, c)];
  const int64_t begin = (c - t.first_chunk) * kAdamWChunk;
  const int64_t end = min(begin + kAdamWChunk, t.n);
  const bool vec = (reinterpret_cast<uintptr_t>(t.x) & 15) == 0;
  const double sum = t.is_bf16
                         ? chunk_squares(static_cast<const bf16*>(t.x), begin, end, vec, scratch)
                         : chunk_squares(static_cast<const float*>(t.x), begin, end, vec, scratch);
  if (threadIdx.x == 0) partials[c] = sum;
}

// One thread a tensor: its chunks' sums in order.
__global__ void squares_many_sum_kernel(double* out, const double* partials,
                                        const SquaresEntry* tensors, int64_t count) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= count) return;
  double acc = 0.0;
  for (int64_t c = tensors[i].first_chunk; c < tensors[i + 1].first_chunk; ++c) acc += partials[c];
  out[i] = acc;
}

__global__ void sum_blocks_kernel(double* out, const double* partials, int64_t count) {
  __shared__ double scratch[32];
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) acc += partials[i];
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) *out = acc;
}

// As hcp::train::AdamWKernel computes them.
AdamWScalars scalars_of(const AdamWStep& step) {
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
  return s;
}

int64_t chunks_of(int64_t n) { return ceil_div(n, kAdamWChunk); }
}  // namespace

template <typename G>
Status adamw_update(cudaStream_t stream, float* master, bf16* param, const G* grad, float* m,
                    float* v, int64_t n, const AdamWStep& step) {
  const char* name = "adamw_update";
  if (n < 0 || step.t < 1) return Status(name, "need n >= 0 and t >= 1");
  if (n == 0) return Status();
  const AdamWScalars s = scalars_of(step);
  const ManyTensor t{master,
                     param,
                     grad,
                     m,
                     v,
                     n,
                     aligned_head(master, param, grad, m, v),
                     0,
                     s.decay_factor,
                     std::is_same_v<G, bf16> ? 1 : 0};
  adamw_kernel<G><<<static_cast<unsigned>(chunks_of(n)), kThreads, 0, stream>>>(t, s);
  return launch_status(name);
}

template Status adamw_update<float>(cudaStream_t, float*, bf16*, const float*, float*, float*,
                                    int64_t, const AdamWStep&);
template Status adamw_update<bf16>(cudaStream_t, float*, bf16*, const bf16*, float*, float*,
                                   int64_t, const AdamWStep&);

size_t adamw_update_many_workspace_bytes(std::span<const int64_t> sizes) {
  WorkspaceCarver carve(Workspace{});  // sizes only
  carve.take<ManyTensor>(static_cast<int64_t>(sizes.size()));
  return carve.used();
}

Status adamw_update_many(cudaStream_t stream, std::span<const AdamWTensor> tensors,
                         const AdamWStep& step, Workspace workspace) {
  const char* name = "adamw_update_many";
  if (step.t < 1) return Status(name, "need t >= 1");
  std::vector<int64_t> sizes;
  std::vector<ManyTensor> table;
  int64_t chunks = 0;
  for (const AdamWTensor& t : tensors) {
    if (t.n < 0) return Status(name, "a tensor of negative size");
    sizes.push_back(t.n);
    AdamWStep own = step;
    own.decay = t.decay;
    const int64_t head =
        t.grad_is_bf16
            ? aligned_head(t.master, t.param, static_cast<const bf16*>(t.grad), t.m, t.v)
            : aligned_head(t.master, t.param, static_cast<const float*>(t.grad), t.m, t.v);
    table.push_back(ManyTensor{t.master, t.param, t.grad, t.m, t.v, t.n, head, chunks,
                               scalars_of(own).decay_factor, t.grad_is_bf16 ? 1 : 0});
    chunks += chunks_of(t.n);
  }
  if (chunks == 0) return Status();
  if (workspace.ptr == nullptr || workspace.bytes < adamw_update_many_workspace_bytes(sizes)) {
    return Status(name, "workspace too small");
  }
  WorkspaceCarver carve(workspace);
  auto* d_table = carve.take<ManyTensor>(static_cast<int64_t>(table.size()));
  // From pageable memory: the copy is staged before the call returns.
  const cudaError_t err = cudaMemcpyAsync(d_table, table.data(), sizeof(ManyTensor) * table.size(),
                                          cudaMemcpyHostToDevice, stream);
  if (err != cudaSuccess) return Status::Cuda(name, err);
  adamw_many_kernel<<<static_cast<unsigned>(chunks), kThreads, 0, stream>>>(
      d_table, static_cast<int64_t>(table.size()), scalars_of(step));
  return launch_status(name);
}

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

size_t sum_of_squares_many_workspace_bytes(std::span<const int64_t> sizes) {
  int64_t chunks = 0;
  for (int64_t n : sizes) chunks += chunks_of(n);
  WorkspaceCarver carve(Workspace{});  // sizes only
  carve.take<SquaresEntry>(static_cast<int64_t>(sizes.size()) + 1);
  carve.take<double>(chunks);
  return carve.used();
}

Status sum_of_squares_many(cudaStream_t stream, double* out, std::span<const SquaresTensor> tensors,
                           Workspace workspace) {
  const char* name = "sum_of_squares_many";
  std::vector<int64_t> sizes;
  std::vector<SquaresEntry> table;
  int64_t chunks = 0;
  for (const SquaresTensor& t : tensors) {
    if (t.n < 0) return Status(name, "a tensor of negative size");
    sizes.push_back(t.n);
    table.push_back(SquaresEntry{t.x, t.n, chunks, t.is_bf16 ? 1 : 0});
    chunks += chunks_of(t.n);
  }
  if (tensors.empty()) return Status();
  table.push_back(SquaresEntry{nullptr, 0, chunks, 0});
  if (workspace.ptr == nullptr || workspace.bytes < sum_of_squares_many_workspace_bytes(sizes)) {
    return Status(name, "workspace too small");
  }
  WorkspaceCarver carve(workspace);
  auto* d_table = carve.take<SquaresEntry>(static_cast<int64_t>(table.size()));
  auto* partials = carve.take<double>(chunks);
  // From pageable memory: the copy is staged before the call returns.
  const cudaError_t err = cudaMemcpyAsync(
      d_table, table.data(), sizeof(SquaresEntry) * table.size(), cudaMemcpyHostToDevice, stream);
  if (err != cudaSuccess) return Status::Cuda(name, err);
  const int64_t count = static_cast<int64_t>(tensors.size());
  if (chunks > 0) {
    squares_many_kernel<<<static_cast<unsigned>(chunks), kThreads, 0, stream>>>(partials, d_table,
                                                                                count);
    if (Status s = launch_status(name); !s.ok()) return s;
  }
  squares_many_sum_kernel<<<static_cast<unsigned>(ceil_div(count, kThreads)), kThreads, 0,
                            stream>>>(out, partials, d_table, count);
  return launch_status(name);
}

template Status sum_of_squares<float>(cudaStream_t, double*, const float*, int64_t, Workspace);
template Status sum_of_squares<bf16>(cudaStream_t, double*, const bf16*, int64_t, Workspace);

}  // namespace hcp::cuda
