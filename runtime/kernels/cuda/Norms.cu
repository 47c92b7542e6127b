// RMSNorm and Mamba2's gated RMSNorm (gate before the norm), forward and backward.
//
// One block per row (a grid-stride loop over rows). Each thread owns VPT groups of 8 columns,
// c = (threadIdx.x + v * blockDim.x) * 8. The forwards keep the row's inputs in registers as raw
// bf16 (one uint4 per group) between the row reduction and the write; the backwards, which hold
// more, read their row a second time after the reduction (the same thread's recent loads: L1/L2
// hits, not memory traffic), which keeps registers low enough for full occupancy. The backward's
// weight gradient accumulates per thread over the rows its block
// visits; the kNormPartials blocks write fp32 partials [blocks, dim], summed in block order by a
// second kernel (fixed grid: the result does not depend on the GPU).
#include <cmath>

#include "runtime/kernels/cuda/Common.cuh"

namespace hcp::cuda {
namespace {

using namespace detail;

constexpr int64_t kMaxDim = 32768;
constexpr int64_t kNormPartials = 1024;

// bf16 bits <-> fp32: the high half of the fp32 word.
__device__ __forceinline__ void unpack8(float (&v)[8], uint4 raw) {
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; i++) {
    v[2 * i] = __uint_as_float(words[i] << 16);
    v[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
  }
}

__device__ __forceinline__ uint32_t pair_bits(const bf16* p, int i, int valid) {
  const uint32_t lo = i < valid ? __bfloat16_as_ushort(p[i]) : 0u;
  const uint32_t hi = i + 1 < valid ? __bfloat16_as_ushort(p[i + 1]) : 0u;
  return lo | (hi << 16);
}

// Up to 8 bf16 at p as raw bits; missing elements are +0.
__device__ __forceinline__ uint4 load_raw(const bf16* p, int valid, bool vec) {
  if (valid <= 0) return make_uint4(0, 0, 0, 0);
  if (vec && valid == 8) return *reinterpret_cast<const uint4*>(p);
  return make_uint4(pair_bits(p, 0, valid), pair_bits(p, 2, valid), pair_bits(p, 4, valid),
                    pair_bits(p, 6, valid));
}

__device__ __forceinline__ float fast_sigmoid(float x) { return 1.f / (1.f + __expf(-x)); }

// Group v of this thread: its first column and how many of its 8 columns exist.
__device__ __forceinline__ int group_col(int v) { return (threadIdx.x + v * blockDim.x) * 8; }
__device__ __forceinline__ int group_valid(int c, int dim) { return max(0, min(8, dim - c)); }

template <int VPT>
__global__ void __launch_bounds__(1024)
    rms_norm_forward_kernel(bf16* y, float* rstd, const bf16* x, const bf16* w, int64_t rows,
                            int dim, float eps, bool vec) {
  __shared__ float scratch[32];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const bf16* xr = x + row * dim;
    uint4 raw[VPT];
    float ss = 0.f;
#pragma unroll
    for (int v = 0; v < VPT; v++) {
      const int c = group_col(v);
      raw[v] = load_raw(xr + c, group_valid(c, dim), vec);
      float f[8];
      unpack8(f, raw[v]);
#pragma unroll
      for (int e = 0; e < 8; e++) ss += f[e] * f[e];
    }
    ss = block_sum(ss, scratch);
    const float r = 1.f / sqrtf(ss / static_cast<float>(dim) + eps);
    if (rstd != nullptr && threadIdx.x == 0) rstd[row] = r;
#pragma unroll
    for (int v = 0; v < VPT; v++) {
      const int c = group_col(v), valid = group_valid(c, dim);
      if (valid == 0) continue;
      float f[8], wv[8];
      unpack8(f, raw[v]);
      unpack8(wv, load_raw(w + c, valid, vec));
#pragma unroll
      for (int e = 0; e < 8; e++) f[e] = f[e] * r * wv[e];
      store8_any(y + row * dim + c, f, valid, vec);
    }
  }
}

// du = r (g w - u r^2 mean(g w u)); dw += g u r (the CPU's rms_row_backward).
template <int VPT>
__global__ void __launch_bounds__(1024)
    rms_norm_backward_kernel(bf16* dx, float* partials, const bf16* dy, const bf16* x,
                             const bf16* w, const float* rstd, int64_t rows, int dim, float eps,
                             bool vec) {
  __shared__ float scratch[32];
  float acc[VPT][8] = {};
  uint4 wraw[VPT];
#pragma unroll
  for (int v = 0; v < VPT; v++) {
    const int c = group_col(v);
    wraw[v] = load_raw(w + c, group_valid(c, dim), vec);
  }
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    float dot = 0.f, ss = 0.f;
#pragma unroll
    for (int v = 0; v < VPT; v++) {
      const int c = group_col(v), valid = group_valid(c, dim);
      float u[8], g[8], wv[8];
      unpack8(u, load_raw(x + row * dim + c, valid, vec));
      unpack8(g, load_raw(dy + row * dim + c, valid, vec));
      unpack8(wv, wraw[v]);
#pragma unroll
      for (int e = 0; e < 8; e++) {
        dot += g[e] * wv[e] * u[e];
        ss += u[e] * u[e];
      }
    }
    dot = block_sum(dot, scratch);
    float r;
    if (rstd != nullptr) {
      r = rstd[row];
    } else {
      ss = block_sum(ss, scratch);
      r = 1.f / sqrtf(ss / static_cast<float>(dim) + eps);
    }
    const float k = r * r * (dot / static_cast<float>(dim));
#pragma unroll
    for (int v = 0; v < VPT; v++) {
      const int c = group_col(v), valid = group_valid(c, dim);
      if (valid == 0) continue;
      float u[8], g[8], wv[8], du[8];
      unpack8(u, load_raw(x + row * dim + c, valid, vec));
      unpack8(g, load_raw(dy + row * dim + c, valid, vec));
      unpack8(wv, wraw[v]);
#pragma unroll
      for (int e = 0; e < 8; e++) {
        du[e] = r * (g[e] * wv[e] - u[e] * k);
        acc[v][e] += g[e] * u[e] * r;
      }
      store8_any(dx + row * dim + c, du, valid, vec);
    }
  }
#pragma unroll
  for (int v = 0; v < VPT; v++) {
    const int c = group_col(v), valid = group_valid(c, dim);
    store8_masked(partials + blockIdx.x * int64_t{dim} + c, acc[v], valid);
  }
}

// u = y * silu(z), the gated input, recomputed where needed.
__device__ __forceinline__ void gate8(float (&u)[8], uint4 yraw, uint4 zraw) {
  float yv[8], zv[8];
  unpack8(yv, yraw);
  unpack8(zv, zraw);
#pragma unroll
  for (int e = 0; e < 8; e++) u[e] = yv[e] * zv[e] * fast_sigmoid(zv[e]);
}

template <int VPT>
__global__ void __launch_bounds__(1024)
    gated_rms_norm_forward_kernel(bf16* out, float* rstd, const bf16* y, const bf16* z,
                                  const bf16* w, int64_t rows, int dim, float eps, bool vec) {
  __shared__ float scratch[32];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    uint4 yraw[VPT], zraw[VPT];
    float ss = 0.f;
#pragma unroll
    for (int v = 0; v < VPT; v++) {
      const int c = group_col(v), valid = group_valid(c, dim);
      yraw[v] = load_raw(y + row * dim + c, valid, vec);
      zraw[v] = load_raw(z + row * dim + c, valid, vec);
      float u[8];
      gate8(u, yraw[v], zraw[v]);
#pragma unroll
      for (int e = 0; e < 8; e++) ss += u[e] * u[e];
    }
    ss = block_sum(ss, scratch);
    const float r = 1.f / sqrtf(ss / static_cast<float>(dim) + eps);
    if (rstd != nullptr && threadIdx.x == 0) rstd[row] = r;
#pragma unroll
    for (int v = 0; v < VPT; v++) {
      const int c = group_col(v), valid = group_valid(c, dim);
      if (valid == 0) continue;
      float u[8], wv[8];
      gate8(u, yraw[v], zraw[v]);
      unpack8(wv, load_raw(w + c, valid, vec));
#pragma unroll
      for (int e = 0; e < 8; e++) u[e] = u[e] * r * wv[e];
      store8_any(out + row * dim + c, u, valid, vec);
    }
  }
}

template <int VPT>
__global__ void __launch_bounds__(1024)
    gated_rms_norm_backward_kernel(bf16* dy, bf16* dz, float* partials, const bf16* dout,
                                   const bf16* y, const bf16* z, const bf16* w, const float* rstd,
                                   int64_t rows, int dim, float eps, bool vec) {
  __shared__ float scratch[32];
  float acc[VPT][8] = {};
  uint4 wraw[VPT];
#pragma unroll
  for (int v = 0; v < VPT; v++) {
    const int c = group_col(v);
    wraw[v] = load_raw(w + c, group_valid(c, dim), vec);
  }
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    float dot = 0.f, ss = 0.f;
#pragma unroll
    for (int v = 0; v < VPT; v++) {
      const int c = group_col(v), valid = group_valid(c, dim);
      float u[8], g[8], wv[8];
      gate8(u, load_raw(y + row * dim + c, valid, vec), load_raw(z + row * dim + c, valid, vec));
      unpack8(g, load_raw(dout + row * dim + c, valid, vec));
      unpack8(wv, wraw[v]);
#pragma unroll
      for (int e = 0; e < 8; e++) {
        dot += g[e] * wv[e] * u[e];
        ss += u[e] * u[e];
      }
    }
    dot = block_sum(dot, scratch);
    float r;
    if (rstd != nullptr) {
      r = rstd[row];
    } else {
      ss = block_sum(ss, scratch);
      r = 1.f / sqrtf(ss / static_cast<float>(dim) + eps);
    }
    const float k = r * r * (dot / static_cast<float>(dim));
#pragma unroll
    for (int v = 0; v < VPT; v++) {
      const int c = group_col(v), valid = group_valid(c, dim);
      if (valid == 0) continue;
      float yv[8], zv[8], g[8], wv[8], dyv[8], dzv[8];
      unpack8(yv, load_raw(y + row * dim + c, valid, vec));
      unpack8(zv, load_raw(z + row * dim + c, valid, vec));
      unpack8(g, load_raw(dout + row * dim + c, valid, vec));
      unpack8(wv, wraw[v]);
#pragma unroll
      for (int e = 0; e < 8; e++) {
        const float s = fast_sigmoid(zv[e]);
        const float silu = zv[e] * s;
        const float u = yv[e] * silu;
        const float du = r * (g[e] * wv[e] - u * k);
        acc[v][e] += g[e] * u * r;
        dyv[e] = du * silu;
        dzv[e] = du * yv[e] * (s * (1.f + zv[e] * (1.f - s)));
      }
      store8_any(dy + row * dim + c, dyv, valid, vec);
      store8_any(dz + row * dim + c, dzv, valid, vec);
    }
  }
#pragma unroll
  for (int v = 0; v < VPT; v++) {
    const int c = group_col(v), valid = group_valid(c, dim);
    store8_masked(partials + blockIdx.x * int64_t{dim} + c, acc[v], valid);
  }
}

// Groups per thread and threads per block for a row of `dim` columns.
struct RowShape {
  int vpt;
  int threads;
};
RowShape row_shape(int64_t dim) {
  const int64_t groups = ceil_div(dim, 8);
  int vpt = groups <= 1024 ? 1 : groups <= 2048 ? 2 : 4;
  return {vpt, static_cast<int>(std::max<int64_t>(32, round_up(ceil_div(groups, vpt), 32)))};
}

Status check_shape(const char* name, int64_t rows, int64_t dim) {
  if (rows < 0 || dim <= 0) return Status(name, "rows must be >= 0 and dim > 0");
  if (dim > kMaxDim) return Status(name, "dim above 32768 is not supported");
  return Status();
}

unsigned forward_grid(int64_t rows) {
  return static_cast<unsigned>(std::min<int64_t>(rows, int64_t{sm_count()} * 32));
}
unsigned backward_grid(int64_t rows) {
  return static_cast<unsigned>(std::min<int64_t>(rows, kNormPartials));
}

}  // namespace

Status rms_norm_forward(cudaStream_t stream, bf16* y, float* rstd, const bf16* x, const bf16* w,
                        int64_t rows, int64_t dim, float eps) {
  const char* name = "rms_norm.forward";
  if (Status s = check_shape(name, rows, dim); !s.ok()) return s;
  if (rows == 0) return Status();
  const bool vec = dim % 8 == 0 && aligned16(y) && aligned16(x) && aligned16(w);
  const RowShape shape = row_shape(dim);
  const int d = static_cast<int>(dim);
  const unsigned grid = forward_grid(rows);
  switch (shape.vpt) {
    case 1:
      rms_norm_forward_kernel<1>
          <<<grid, shape.threads, 0, stream>>>(y, rstd, x, w, rows, d, eps, vec);
      break;
    case 2:
      rms_norm_forward_kernel<2>
          <<<grid, shape.threads, 0, stream>>>(y, rstd, x, w, rows, d, eps, vec);
      break;
    default:
      rms_norm_forward_kernel<4>
          <<<grid, shape.threads, 0, stream>>>(y, rstd, x, w, rows, d, eps, vec);
  }
  return launch_status(name);
}

size_t rms_norm_backward_workspace_bytes(int64_t rows, int64_t dim) {
  return sizeof(float) * std::min<int64_t>(std::max<int64_t>(rows, 1), kNormPartials) *
         std::max<int64_t>(dim, 0);
}

Status rms_norm_backward(cudaStream_t stream, bf16* dx, bf16* dw, const bf16* dy, const bf16* x,
                         const bf16* w, const float* rstd, int64_t rows, int64_t dim, float eps,
                         Workspace workspace) {
  const char* name = "rms_norm.backward";
  if (Status s = check_shape(name, rows, dim); !s.ok()) return s;
  if (rows == 0) return fill(stream, dw, 0.f, dim);
  if (workspace.ptr == nullptr || workspace.bytes < rms_norm_backward_workspace_bytes(rows, dim)) {
    return Status(name, "workspace too small");
  }
  float* partials = static_cast<float*>(workspace.ptr);
  const bool vec = dim % 8 == 0 && aligned16(dx) && aligned16(dy) && aligned16(x) && aligned16(w);
  const RowShape shape = row_shape(dim);
  const int d = static_cast<int>(dim);
  const unsigned grid = backward_grid(rows);
  switch (shape.vpt) {
    case 1:
      rms_norm_backward_kernel<1>
          <<<grid, shape.threads, 0, stream>>>(dx, partials, dy, x, w, rstd, rows, d, eps, vec);
      break;
    case 2:
      rms_norm_backward_kernel<2>
          <<<grid, shape.threads, 0, stream>>>(dx, partials, dy, x, w, rstd, rows, d, eps, vec);
      break;
    default:
      rms_norm_backward_kernel<4>
          <<<grid, shape.threads, 0, stream>>>(dx, partials, dy, x, w, rstd, rows, d, eps, vec);
  }
  if (Status s = launch_status(name); !s.ok()) return s;
  return sum_partials(stream, dw, partials, grid, dim);
}

Status gated_rms_norm_forward(cudaStream_t stream, bf16* out, float* rstd, const bf16* y,
                              const bf16* z, const bf16* w, int64_t rows, int64_t dim, float eps) {
  const char* name = "gated_rms_norm.forward";
  if (Status s = check_shape(name, rows, dim); !s.ok()) return s;
  if (rows == 0) return Status();
  const bool vec = dim % 8 == 0 && aligned16(out) && aligned16(y) && aligned16(z) && aligned16(w);
  const RowShape shape = row_shape(dim);
  const int d = static_cast<int>(dim);
  const unsigned grid = forward_grid(rows);
  switch (shape.vpt) {
    case 1:
      gated_rms_norm_forward_kernel<1>
          <<<grid, shape.threads, 0, stream>>>(out, rstd, y, z, w, rows, d, eps, vec);
      break;
    case 2:
      gated_rms_norm_forward_kernel<2>
          <<<grid, shape.threads, 0, stream>>>(out, rstd, y, z, w, rows, d, eps, vec);
      break;
    default:
      gated_rms_norm_forward_kernel<4>
          <<<grid, shape.threads, 0, stream>>>(out, rstd, y, z, w, rows, d, eps, vec);
  }
  return launch_status(name);
}

size_t gated_rms_norm_backward_workspace_bytes(int64_t rows, int64_t dim) {
  return rms_norm_backward_workspace_bytes(rows, dim);
}

Status gated_rms_norm_backward(cudaStream_t stream, bf16* dy, bf16* dz, bf16* dw, const bf16* dout,
                               const bf16* y, const bf16* z, const bf16* w, const float* rstd,
                               int64_t rows, int64_t dim, float eps, Workspace workspace) {
  const char* name = "gated_rms_norm.backward";
  if (Status s = check_shape(name, rows, dim); !s.ok()) return s;
  if (rows == 0) return fill(stream, dw, 0.f, dim);
  if (workspace.ptr == nullptr ||
      workspace.bytes < gated_rms_norm_backward_workspace_bytes(rows, dim)) {
    return Status(name, "workspace too small");
  }
  float* partials = static_cast<float*>(workspace.ptr);
  const bool vec = dim % 8 == 0 && aligned16(dy) && aligned16(dz) && aligned16(dout) &&
                   aligned16(y) && aligned16(z) && aligned16(w);
  const RowShape shape = row_shape(dim);
  const int d = static_cast<int>(dim);
  const unsigned grid = backward_grid(rows);
  switch (shape.vpt) {
    case 1:
      gated_rms_norm_backward_kernel<1><<<grid, shape.threads, 0, stream>>>(
          dy, dz, partials, dout, y, z, w, rstd, rows, d, eps, vec);
      break;
    case 2:
      gated_rms_norm_backward_kernel<2><<<grid, shape.threads, 0, stream>>>(
          dy, dz, partials, dout, y, z, w, rstd, rows, d, eps, vec);
      break;
    default:
      gated_rms_norm_backward_kernel<4><<<grid, shape.threads, 0, stream>>>(
          dy, dz, partials, dout, y, z, w, rstd, rows, d, eps, vec);
  }
  if (Status s = launch_status(name); !s.ok()) return s;
  return sum_partials(stream, dw, partials, grid, dim);
}

}  // namespace hcp::cuda
