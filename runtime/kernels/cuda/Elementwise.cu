// Elementwise ops, broadcasts, column slices and column sums. Every kernel walks its tensor in
// groups of 8 consecutive elements (one 16-byte access for bf16) with a grid-stride loop, in fp32;
// a group that is partial or misaligned falls back to element-wise access.
#include <cmath>

#include "runtime/kernels/cuda/Common.cuh"

namespace hcp::cuda {
namespace detail {

int sm_count() {
  static int cache[64] = {};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 64) return 132;
  if (cache[device] == 0) {
    int count = 0;
    if (cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
      count = 132;
    }
    cache[device] = count;
  }
  return cache[device];
}

namespace {

constexpr int kThreads = 256;

// y = f(x), element by element.
template <typename TI, typename TO, typename F>
__global__ void map1_kernel(TO* y, const TI* x, int64_t n, bool vec, F f) {
  const int64_t groups = (n + 7) / 8;
  for (int64_t g = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; g < groups;
       g += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = g * 8;
    const int valid = static_cast<int>(min(int64_t{8}, n - i));
    float v[8];
    load8_any(v, x + i, valid, vec);
#pragma unroll
    for (int e = 0; e < 8; e++) v[e] = f(v[e]);
    store8_any(y + i, v, valid, vec);
  }
}

// y = f(a, b), element by element.
template <typename T, typename F>
__global__ void map2_kernel(T* y, const T* a, const T* b, int64_t n, bool vec, F f) {
  const int64_t groups = (n + 7) / 8;
  for (int64_t g = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; g < groups;
       g += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = g * 8;
    const int valid = static_cast<int>(min(int64_t{8}, n - i));
    float va[8], vb[8];
    load8_any(va, a + i, valid, vec);
    load8_any(vb, b + i, valid, vec);
#pragma unroll
    for (int e = 0; e < 8; e++) va[e] = f(va[e], vb[e]);
    store8_any(y + i, va, valid, vec);
  }
}

// y[i] = f(a[i], b[i % rhs_n]). `bvec`: rhs_n is a multiple of 8 and b aligned, so a full group
// of a maps onto a full aligned group of b.
template <typename T, typename F>
__global__ void broadcast_kernel(T* y, const T* a, const T* b, int64_t n, int64_t rhs_n, bool vec,
                                 bool bvec, F f) {
  const int64_t groups = (n + 7) / 8;
  for (int64_t g = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; g < groups;
       g += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = g * 8;
    const int valid = static_cast<int>(min(int64_t{8}, n - i));
    float va[8], vb[8];
    load8_any(va, a + i, valid, vec);
    if (bvec && valid == 8) {
      load8(vb, b + i % rhs_n);
    } else {
#pragma unroll
      for (int e = 0; e < 8; e++) vb[e] = e < valid ? to_float(b[(i + e) % rhs_n]) : 0.f;
    }
#pragma unroll
    for (int e = 0; e < 8; e++) va[e] = f(va[e], vb[e]);
    store8_any(y + i, va, valid, vec);
  }
}

template <typename T>
__global__ void fill_kernel(T* y, float value, int64_t n, bool vec) {
  const int64_t groups = (n + 7) / 8;
  float v[8];
#pragma unroll
  for (int e = 0; e < 8; e++) v[e] = value;
  for (int64_t g = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; g < groups;
       g += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = g * 8;
    store8_any(y + i, v, static_cast<int>(min(int64_t{8}, n - i)), vec);
  }
}

// SwiGLU over rows: x [rows, 2*inner] = [a | b], y [rows, inner].
template <typename T>
__global__ void swiglu_forward_kernel(T* y, const T* x, int64_t rows, int64_t inner, bool vec) {
  const int64_t per_row = (inner + 7) / 8, groups = rows * per_row;
  for (int64_t g = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; g < groups;
       g += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = g / per_row, c = (g % per_row) * 8;
    const int valid = static_cast<int>(min(int64_t{8}, inner - c));
    const T* a = x + r * 2 * inner + c;
    float va[8], vb[8];
    load8_any(va, a, valid, vec);
    load8_any(vb, a + inner, valid, vec);
#pragma unroll
    for (int e = 0; e < 8; e++) va[e] = va[e] * sigmoidf(va[e]) * vb[e];
    store8_any(y + r * inner + c, va, valid, vec);
  }
}

template <typename T>
__global__ void swiglu_backward_kernel(T* dx, const T* dy, const T* x, int64_t rows, int64_t inner,
                                       bool vec) {
  const int64_t per_row = (inner + 7) / 8, groups = rows * per_row;
  for (int64_t g = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; g < groups;
       g += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = g / per_row, c = (g % per_row) * 8;
    const int valid = static_cast<int>(min(int64_t{8}, inner - c));
    const T* a = x + r * 2 * inner + c;
    float va[8], vb[8], vg[8], da[8], db[8];
    load8_any(va, a, valid, vec);
    load8_any(vb, a + inner, valid, vec);
    load8_any(vg, dy + r * inner + c, valid, vec);
#pragma unroll
    for (int e = 0; e < 8; e++) {
      da[e] = vg[e] * vb[e] * silu_grad(va[e]);
      db[e] = vg[e] * va[e] * sigmoidf(va[e]);
    }
    T* d = dx + r * 2 * inner + c;
    store8_any(d, da, valid, vec);
    store8_any(d + inner, db, valid, vec);
  }
}

// dst[r, dst_off + c] = src[r, src_off + c] for c < width.
template <typename T>
__global__ void copy_columns_kernel(T* dst, int64_t dst_cols, int64_t dst_off, const T* src,
                                    int64_t src_cols, int64_t src_off, int64_t rows, int64_t width,
                                    bool vec) {
  const int64_t per_row = (width + 7) / 8, groups = rows * per_row;
  for (int64_t g = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; g < groups;
       g += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = g / per_row, c = (g % per_row) * 8;
    const int valid = static_cast<int>(min(int64_t{8}, width - c));
    float v[8];
    load8_any(v, src + r * src_cols + src_off + c, valid, vec);
    store8_any(dst + r * dst_cols + dst_off + c, v, valid, vec);
  }
}

// Column sums, stage 1: block (32, 8) covers 256 columns (32 groups of 8) of one row chunk; the 8
// row lanes stride over the chunk's rows, then combine in shared memory.
constexpr int kColumnTile = 256;
constexpr int kColumnRowLanes = 8;
constexpr int64_t kColumnMaxChunks = 128;
constexpr int64_t kColumnMinRowsPerChunk = 32;

int64_t column_chunks(int64_t rows) {
  return std::max<int64_t>(1, std::min(kColumnMaxChunks, ceil_div(rows, kColumnMinRowsPerChunk)));
}

template <typename T>
__global__ void column_partials_kernel(float* partials, const T* x, int64_t rows, int64_t cols,
                                       int64_t rows_per_chunk, bool vec) {
  __shared__ float acc_s[kColumnRowLanes][kColumnTile + 8];
  const int64_t c = blockIdx.x * int64_t{kColumnTile} + threadIdx.x * 8;
  const int valid = static_cast<int>(max(int64_t{0}, min(int64_t{8}, cols - c)));
  const int64_t r0 = blockIdx.y * rows_per_chunk, r1 = min(rows, r0 + rows_per_chunk);
  float acc[8] = {};
  if (valid > 0) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kColumnRowLanes) {
      float v[8];
      load8_any(v, x + r * cols + c, valid, vec);
#pragma unroll
      for (int e = 0; e < 8; e++) acc[e] += v[e];
    }
  }
#pragma unroll
  for (int e = 0; e < 8; e++) acc_s[threadIdx.y][threadIdx.x * 8 + e] = acc[e];
  __syncthreads();
  // 256 threads, one column each, sum the 8 lanes in order.
  const int t = threadIdx.y * 32 + threadIdx.x;
  const int64_t col = blockIdx.x * int64_t{kColumnTile} + t;
  if (col < cols) {
    float s = 0.f;
#pragma unroll
    for (int l = 0; l < kColumnRowLanes; l++) s += acc_s[l][t];
    partials[blockIdx.y * cols + col] = s;
  }
}

// Stage 2 (also used by the norms and the conv): block (32, 8) covers 32 columns; lane y sums
// chunks y, y + 8, ... in order, then lane 0 adds the 8 lane sums in order.
template <typename T>
__global__ void sum_partials_kernel(T* out, const float* partials, int64_t chunks, int64_t cols) {
  __shared__ float lanes[kColumnRowLanes][33];
  const int64_t c = blockIdx.x * int64_t{32} + threadIdx.x;
  float s = 0.f;
  if (c < cols) {
    for (int64_t k = threadIdx.y; k < chunks; k += kColumnRowLanes) s += partials[k * cols + c];
  }
  lanes[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float total = 0.f;
#pragma unroll
    for (int l = 0; l < kColumnRowLanes; l++) total += lanes[l][threadIdx.x];
    out[c] = from_float<T>(total);
  }
}

// Functors (fp32 in, fp32 out).
struct Scale {
  float factor;
  __device__ float operator()(float x) const { return x * factor; }
};
struct Silu {
  __device__ float operator()(float x) const { return x * sigmoidf(x); }
};
struct SiluGrad {
  __device__ float operator()(float dy, float x) const { return dy * silu_grad(x); }
};
// torch.nn.functional.softplus(beta=1, threshold=20).
struct Softplus {
  __device__ float operator()(float x) const { return x > 20.f ? x : log1pf(expf(x)); }
};
struct SoftplusGrad {
  __device__ float operator()(float dy, float x) const { return x > 20.f ? dy : dy * sigmoidf(x); }
};
struct NegExp {
  __device__ float operator()(float x) const { return -expf(x); }
};
struct Mul {
  __device__ float operator()(float a, float b) const { return a * b; }
};
struct Add {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct Div {
  __device__ float operator()(float a, float b) const { return a / b; }
};
struct Identity {
  __device__ float operator()(float x) const { return x; }
};

template <typename TI, typename TO, typename F>
Status map1(cudaStream_t stream, const char* name, TO* y, const TI* x, int64_t n, F f) {
  if (n < 0) return Status(name, "negative size");
  if (n == 0) return Status();
  const bool vec = aligned16(y) && aligned16(x);
  map1_kernel<<<grid_for(ceil_div(n, 8), kThreads), kThreads, 0, stream>>>(y, x, n, vec, f);
  return launch_status(name);
}

template <typename T, typename F>
Status map2(cudaStream_t stream, const char* name, T* y, const T* a, const T* b, int64_t n, F f) {
  if (n < 0) return Status(name, "negative size");
  if (n == 0) return Status();
  const bool vec = aligned16(y) && aligned16(a) && aligned16(b);
  map2_kernel<<<grid_for(ceil_div(n, 8), kThreads), kThreads, 0, stream>>>(y, a, b, n, vec, f);
  return launch_status(name);
}

template <typename T, typename F>
Status broadcast(cudaStream_t stream, const char* name, T* y, const T* a, const T* b, int64_t n,
                 int64_t rhs_n, F f) {
  if (n < 0 || rhs_n <= 0 || n % rhs_n != 0) {
    return Status(name, "rhs_n must be positive and divide n");
  }
  if (n == 0) return Status();
  if (rhs_n == n) return map2(stream, name, y, a, b, n, f);
  const bool vec = aligned16(y) && aligned16(a);
  const bool bvec = aligned16(b) && rhs_n % 8 == 0;
  broadcast_kernel<<<grid_for(ceil_div(n, 8), kThreads), kThreads, 0, stream>>>(y, a, b, n, rhs_n,
                                                                                vec, bvec, f);
  return launch_status(name);
}

}  // namespace

template <typename T>
Status sum_partials(cudaStream_t stream, T* out, const float* partials, int64_t chunks,
                    int64_t cols) {
  if (cols == 0) return Status();
  sum_partials_kernel<<<static_cast<unsigned>(ceil_div(cols, 32)), dim3(32, kColumnRowLanes), 0,
                        stream>>>(out, partials, chunks, cols);
  return launch_status("sum_partials");
}
template Status sum_partials<float>(cudaStream_t, float*, const float*, int64_t, int64_t);
template Status sum_partials<bf16>(cudaStream_t, bf16*, const float*, int64_t, int64_t);

}  // namespace detail

using namespace detail;

template <typename T>
Status fill(cudaStream_t stream, T* y, float value, int64_t n) {
  if (n < 0) return Status("fill", "negative size");
  if (n == 0) return Status();
  fill_kernel<<<grid_for(ceil_div(n, 8), kThreads), kThreads, 0, stream>>>(y, value, n,
                                                                           aligned16(y));
  return launch_status("fill");
}

template <typename T>
Status copy(cudaStream_t stream, T* y, const T* x, int64_t n) {
  if (n < 0) return Status("copy", "negative size");
  if (n == 0 || y == x) return Status();
  cudaError_t error = cudaMemcpyAsync(y, x, sizeof(T) * n, cudaMemcpyDeviceToDevice, stream);
  return error == cudaSuccess ? Status() : Status::Cuda("copy", error);
}

Status cast(cudaStream_t stream, bf16* y, const float* x, int64_t n) {
  return map1(stream, "cast", y, x, n, Identity{});
}
Status cast(cudaStream_t stream, float* y, const bf16* x, int64_t n) {
  return map1(stream, "cast", y, x, n, Identity{});
}

template <typename T>
Status scale(cudaStream_t stream, T* y, const T* x, float factor, int64_t n) {
  return map1(stream, "scale", y, x, n, Scale{factor});
}

template <typename T>
Status binary(cudaStream_t stream, BinaryOp op, T* y, const T* a, const T* b, int64_t n,
              int64_t rhs_n) {
  switch (op) {
    case BinaryOp::kAdd:
      return broadcast(stream, "add", y, a, b, n, rhs_n, Add{});
    case BinaryOp::kMul:
      return broadcast(stream, "mul", y, a, b, n, rhs_n, Mul{});
    case BinaryOp::kDiv:
      return broadcast(stream, "div", y, a, b, n, rhs_n, Div{});
  }
  return Status("binary", "unknown op");
}

template <typename T>
Status silu_forward(cudaStream_t stream, T* y, const T* x, int64_t n) {
  return map1(stream, "silu.forward", y, x, n, Silu{});
}
template <typename T>
Status silu_backward(cudaStream_t stream, T* dx, const T* dy, const T* x, int64_t n) {
  return map2(stream, "silu.backward", dx, dy, x, n, SiluGrad{});
}
template <typename T>
Status softplus_forward(cudaStream_t stream, T* y, const T* x, int64_t n) {
  return map1(stream, "softplus.forward", y, x, n, Softplus{});
}
template <typename T>
Status softplus_backward(cudaStream_t stream, T* dx, const T* dy, const T* x, int64_t n) {
  return map2(stream, "softplus.backward", dx, dy, x, n, SoftplusGrad{});
}
template <typename T>
Status neg_exp_forward(cudaStream_t stream, T* y, const T* x, int64_t n) {
  return map1(stream, "neg_exp.forward", y, x, n, NegExp{});
}
template <typename T>
Status neg_exp_backward(cudaStream_t stream, T* dx, const T* dy, const T* y, int64_t n) {
  return map2(stream, "neg_exp.backward", dx, dy, y, n, Mul{});
}

template <typename T>
Status swiglu_forward(cudaStream_t stream, T* y, const T* x, int64_t rows, int64_t inner) {
  if (rows < 0 || inner < 0) return Status("swiglu.forward", "negative size");
  if (rows == 0 || inner == 0) return Status();
  const bool vec = inner % 8 == 0 && aligned16(y) && aligned16(x);
  swiglu_forward_kernel<<<grid_for(rows * ceil_div(inner, 8), kThreads), kThreads, 0, stream>>>(
      y, x, rows, inner, vec);
  return launch_status("swiglu.forward");
}

template <typename T>
Status swiglu_backward(cudaStream_t stream, T* dx, const T* dy, const T* x, int64_t rows,
                       int64_t inner) {
  if (rows < 0 || inner < 0) return Status("swiglu.backward", "negative size");
  if (rows == 0 || inner == 0) return Status();
  const bool vec = inner % 8 == 0 && aligned16(dx) && aligned16(dy) && aligned16(x);
  swiglu_backward_kernel<<<grid_for(rows * ceil_div(inner, 8), kThreads), kThreads, 0, stream>>>(
      dx, dy, x, rows, inner, vec);
  return launch_status("swiglu.backward");
}

namespace {
template <typename T>
Status copy_columns(cudaStream_t stream, const char* name, T* dst, int64_t dst_cols,
                    int64_t dst_off, const T* src, int64_t src_cols, int64_t src_off, int64_t rows,
                    int64_t width) {
  if (rows < 0 || width < 0 || dst_off < 0 || src_off < 0 || dst_off + width > dst_cols ||
      src_off + width > src_cols) {
    return Status(name, "column range outside the matrix");
  }
  if (rows == 0 || width == 0) return Status();
  const bool vec = aligned16(dst) && aligned16(src) && dst_cols % 8 == 0 && dst_off % 8 == 0 &&
                   src_cols % 8 == 0 && src_off % 8 == 0;
  copy_columns_kernel<<<grid_for(rows * ceil_div(width, 8), kThreads), kThreads, 0, stream>>>(
      dst, dst_cols, dst_off, src, src_cols, src_off, rows, width, vec);
  return launch_status(name);
}
}  // namespace

template <typename T>
Status slice_columns(cudaStream_t stream, T* out, const T* in, int64_t rows, int64_t in_cols,
                     int64_t offset, int64_t width) {
  return copy_columns(stream, "slice_columns", out, width, 0, in, in_cols, offset, rows, width);
}

template <typename T>
Status insert_columns(cudaStream_t stream, T* out, const T* in, int64_t rows, int64_t out_cols,
                      int64_t offset, int64_t width) {
  return copy_columns(stream, "insert_columns", out, out_cols, offset, in, width, 0, rows, width);
}

size_t column_sum_workspace_bytes(int64_t rows, int64_t cols) {
  return sizeof(float) * column_chunks(rows) * std::max<int64_t>(cols, 0);
}

template <typename T>
Status column_sum(cudaStream_t stream, T* y, const T* x, int64_t rows, int64_t cols,
                  Workspace workspace) {
  if (rows < 0 || cols < 0) return Status("column_sum", "negative size");
  if (cols == 0) return Status();
  if (rows == 0) return fill(stream, y, 0.f, cols);
  if (workspace.bytes < column_sum_workspace_bytes(rows, cols) || workspace.ptr == nullptr) {
    return Status("column_sum", "workspace too small");
  }
  const int64_t chunks = column_chunks(rows);
  const int64_t rows_per_chunk = ceil_div(rows, chunks);
  float* partials = static_cast<float*>(workspace.ptr);
  const bool vec = cols % 8 == 0 && aligned16(x);
  const dim3 grid(static_cast<unsigned>(ceil_div(cols, kColumnTile)),
                  static_cast<unsigned>(ceil_div(rows, rows_per_chunk)));
  column_partials_kernel<<<grid, dim3(32, kColumnRowLanes), 0, stream>>>(partials, x, rows, cols,
                                                                         rows_per_chunk, vec);
  Status status = launch_status("column_sum");
  if (!status.ok()) return status;
  return sum_partials(stream, y, partials, grid.y, cols);
}

#define HCP_INSTANTIATE(T)                                                                     \
  template Status fill<T>(cudaStream_t, T*, float, int64_t);                                   \
  template Status copy<T>(cudaStream_t, T*, const T*, int64_t);                                \
  template Status scale<T>(cudaStream_t, T*, const T*, float, int64_t);                        \
  template Status binary<T>(cudaStream_t, BinaryOp, T*, const T*, const T*, int64_t, int64_t); \
  template Status silu_forward<T>(cudaStream_t, T*, const T*, int64_t);                        \
  template Status silu_backward<T>(cudaStream_t, T*, const T*, const T*, int64_t);             \
  template Status softplus_forward<T>(cudaStream_t, T*, const T*, int64_t);                    \
  template Status softplus_backward<T>(cudaStream_t, T*, const T*, const T*, int64_t);         \
  template Status neg_exp_forward<T>(cudaStream_t, T*, const T*, int64_t);                     \
  template Status neg_exp_backward<T>(cudaStream_t, T*, const T*, const T*, int64_t);          \
  template Status swiglu_forward<T>(cudaStream_t, T*, const T*, int64_t, int64_t);             \
  template Status swiglu_backward<T>(cudaStream_t, T*, const T*, const T*, int64_t, int64_t);  \
  template Status slice_columns<T>(cudaStream_t, T*, const T*, int64_t, int64_t, int64_t,      \
                                   int64_t);                                                   \
  template Status insert_columns<T>(cudaStream_t, T*, const T*, int64_t, int64_t, int64_t,     \
                                    int64_t);                                                  \
  template Status column_sum<T>(cudaStream_t, T*, const T*, int64_t, int64_t, Workspace);
HCP_INSTANTIATE(float)
HCP_INSTANTIATE(bf16)
#undef HCP_INSTANTIATE

}  // namespace hcp::cuda
