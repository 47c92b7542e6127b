// Causal depthwise conv1d (Mamba2's, width 4) with an optional halo, forward and backward.
//
// Thread layout: each thread owns 8 consecutive channels of one batch row and a slab of
// consecutive time steps, which it walks in order with a sliding window of the last `W` input
// rows held in registers, so every input row is read once. A warp covers 256 consecutive
// channels (coalesced 16-byte accesses). The slab partition depends only on the shape, so the
// backward's weight and bias sums (fp32 per slab, then the slabs summed in order) are the same
// on every GPU.
#include "runtime/kernels/cuda/Common.cuh"

namespace hcp::cuda {
namespace {

using namespace detail;

constexpr int kThreads = 64;
constexpr int kMaxWidth = 8;
// Slabs of kSlab time steps (more for long sequences, so that the backward's per-slab partial
// sums stay at most kMaxSlabsPerRow per batch row).
constexpr int64_t kSlab = 32;
constexpr int64_t kMaxSlabsPerRow = 256;

// Time steps per slab and slabs per batch row (shape-only).
struct Slabs {
  int64_t length;
  int64_t count;
};
Slabs slabs_for(int64_t seq) {
  const int64_t length = std::max(kSlab, ceil_div(seq, kMaxSlabsPerRow));
  return {length, ceil_div(seq, length)};
}

// Input row p of batch b at channels [c, c + valid): x for p >= 0, the halo (or zeros) before.
__device__ __forceinline__ void input_row(float (&v)[8], const bf16* x, const bf16* halo, int64_t b,
                                          int64_t p, int64_t c, int valid, int64_t seq,
                                          int64_t channels, int width, bool vec) {
  if (p >= 0) {
    load8_any(v, x + (b * seq + p) * channels + c, valid, vec);
  } else if (halo != nullptr) {
    load8_any(v, halo + (b * (width - 1) + (width - 1) + p) * channels + c, valid, vec);
  } else {
#pragma unroll
    for (int e = 0; e < 8; e++) v[e] = 0.f;
  }
}

// w [channels, W] for this thread's 8 channels, as wv[j][e].
template <int W>
__device__ __forceinline__ void load_weights(float (&wv)[W][8], const bf16* w, int64_t c,
                                             int valid) {
#pragma unroll
  for (int e = 0; e < 8; e++) {
#pragma unroll
    for (int j = 0; j < W; j++) wv[j][e] = e < valid ? __bfloat162float(w[(c + e) * W + j]) : 0.f;
  }
}

// y[t] = bias + sum_j w[j] x[t - (W-1) + j].
template <int W>
__global__ void conv_forward_kernel(bf16* y, const bf16* x, const bf16* halo, const bf16* w,
                                    const bf16* bias, int64_t seq, int64_t channels,
                                    int64_t slab_length, bool vec) {
  const int64_t c = (blockIdx.x * int64_t{kThreads} + threadIdx.x) * 8;
  if (c >= channels) return;
  const int valid = static_cast<int>(min(int64_t{8}, channels - c));
  const int64_t b = blockIdx.z;
  const int64_t t0 = blockIdx.y * slab_length, t1 = min(seq, t0 + slab_length);
  float wv[W][8], bv[8], win[W][8];
  load_weights<W>(wv, w, c, valid);
#pragma unroll
  for (int e = 0; e < 8; e++)
    bv[e] = bias != nullptr && e < valid ? __bfloat162float(bias[c + e]) : 0.f;
#pragma unroll
  for (int j = 0; j < W - 1; j++) {
    input_row(win[j], x, halo, b, t0 - (W - 1) + j, c, valid, seq, channels, W, vec);
  }
#pragma unroll 4
  for (int64_t t = t0; t < t1; t++) {
    load8_any(win[W - 1], x + (b * seq + t) * channels + c, valid, vec);
    float out[8];
#pragma unroll
    for (int e = 0; e < 8; e++) {
      float acc = bv[e];
#pragma unroll
      for (int j = 0; j < W; j++) acc += wv[j][e] * win[j][e];
      out[e] = acc;
    }
    store8_any(y + (b * seq + t) * channels + c, out, valid, vec);
#pragma unroll
    for (int j = 0; j < W - 1; j++) {
#pragma unroll
      for (int e = 0; e < 8; e++) win[j][e] = win[j + 1][e];
    }
  }
}

// dx[p] = sum_j w[j] dy[p + (W-1) - j]; dw[j] += dy[p] x[p - (W-1) + j]; dbias += dy[p].
// Windows: g[j] = dy[p + j] (zero past the end), in[j] = input row p - (W-1) + j.
template <int W>
__global__ void conv_backward_kernel(bf16* dx, float* partial_w, float* partial_b, const bf16* dy,
                                     const bf16* x, const bf16* halo, const bf16* w, int64_t seq,
                                     int64_t channels, int64_t slab_length, bool vec) {
  const int64_t c = (blockIdx.x * int64_t{kThreads} + threadIdx.x) * 8;
  if (c >= channels) return;
  const int valid = static_cast<int>(min(int64_t{8}, channels - c));
  const int64_t b = blockIdx.z;
  const int64_t t0 = blockIdx.y * slab_length, t1 = min(seq, t0 + slab_length);
  float wv[W][8], g[W][8], in[W][8], acc_w[W][8] = {}, acc_b[8] = {};
  load_weights<W>(wv, w, c, valid);
#pragma unroll
  for (int j = 0; j < W; j++) {
    if (t0 + j < seq) {
      load8_any(g[j], dy + (b * seq + t0 + j) * channels + c, valid, vec);
    } else {
#pragma unroll
      for (int e = 0; e < 8; e++) g[j][e] = 0.f;
    }
  }
#pragma unroll
  for (int j = 0; j < W - 1; j++) {
    input_row(in[j], x, halo, b, t0 - (W - 1) + j, c, valid, seq, channels, W, vec);
  }
  for (int64_t p = t0; p < t1; p++) {
    load8_any(in[W - 1], x + (b * seq + p) * channels + c, valid, vec);
    float out[8];
#pragma unroll
    for (int e = 0; e < 8; e++) {
      float acc = 0.f;
#pragma unroll
      for (int j = 0; j < W; j++) {
        acc += wv[j][e] * g[W - 1 - j][e];
        acc_w[j][e] += g[0][e] * in[j][e];
      }
      acc_b[e] += g[0][e];
      out[e] = acc;
    }
    store8_any(dx + (b * seq + p) * channels + c, out, valid, vec);
#pragma unroll
    for (int j = 0; j < W - 1; j++) {
#pragma unroll
      for (int e = 0; e < 8; e++) {
        g[j][e] = g[j + 1][e];
        in[j][e] = in[j + 1][e];
      }
    }
    if (p + W < seq) {
      load8_any(g[W - 1], dy + (b * seq + p + W) * channels + c, valid, vec);
    } else {
#pragma unroll
      for (int e = 0; e < 8; e++) g[W - 1][e] = 0.f;
    }
  }
  const int64_t chunk = b * gridDim.y + blockIdx.y;
  float* pw = partial_w + chunk * channels * W + c * W;
#pragma unroll
  for (int e = 0; e < 8; e++) {
    if (e >= valid) continue;
#pragma unroll
    for (int j = 0; j < W; j++) pw[e * W + j] = acc_w[j][e];
    partial_b[chunk * channels + c + e] = acc_b[e];
  }
}

// dhalo[b, h, c] = sum_j w[c, j] dy[b, h - j, c] over 0 <= h - j < seq.
__global__ void conv_dhalo_kernel(bf16* dhalo, const bf16* dy, const bf16* w, int64_t batch,
                                  int64_t seq, int64_t channels, int width) {
  const int64_t total = batch * (width - 1) * channels;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t c = i % channels, h = (i / channels) % (width - 1),
                  b = i / (channels * (width - 1));
    float acc = 0.f;
    for (int j = 0; j < width; j++) {
      const int64_t t = h - j;
      if (t < 0 || t >= seq) continue;
      acc +=
          __bfloat162float(w[c * width + j]) * __bfloat162float(dy[(b * seq + t) * channels + c]);
    }
    dhalo[i] = __float2bfloat16_rn(acc);
  }
}

template <int W>
void launch_forward(cudaStream_t stream, dim3 grid, bf16* y, const bf16* x, const bf16* halo,
                    const bf16* w, const bf16* bias, int64_t seq, int64_t channels,
                    int64_t slab_length, bool vec) {
  conv_forward_kernel<W>
      <<<grid, kThreads, 0, stream>>>(y, x, halo, w, bias, seq, channels, slab_length, vec);
}

template <int W>
void launch_backward(cudaStream_t stream, dim3 grid, bf16* dx, float* partial_w, float* partial_b,
                     const bf16* dy, const bf16* x, const bf16* halo, const bf16* w, int64_t seq,
                     int64_t channels, int64_t slab_length, bool vec) {
  conv_backward_kernel<W><<<grid, kThreads, 0, stream>>>(dx, partial_w, partial_b, dy, x, halo, w,
                                                         seq, channels, slab_length, vec);
}

Status check_shape(const char* name, int64_t batch, int64_t seq, int64_t channels, int64_t width) {
  if (batch < 0 || seq < 0 || channels < 0) return Status(name, "negative size");
  if (width < 1 || width > kMaxWidth) return Status(name, "width must be in [1, 8]");
  if (batch > 65535) return Status(name, "batch above 65535 is not supported");
  return Status();
}

}  // namespace

Status causal_conv1d_forward(cudaStream_t stream, bf16* y, const bf16* x, const bf16* halo,
                             const bf16* w, const bf16* bias, int64_t batch, int64_t seq,
                             int64_t channels, int64_t width) {
  const char* name = "causal_conv1d.forward";
  if (Status s = check_shape(name, batch, seq, channels, width); !s.ok()) return s;
  if (batch == 0 || seq == 0 || channels == 0) return Status();
  const bool vec =
      channels % 8 == 0 && aligned16(y) && aligned16(x) && (halo == nullptr || aligned16(halo));
  const Slabs slabs = slabs_for(seq);
  const dim3 grid(static_cast<unsigned>(ceil_div(ceil_div(channels, 8), kThreads)),
                  static_cast<unsigned>(slabs.count), static_cast<unsigned>(batch));
  switch (width) {
#define HCP_CASE(W)                                                                         \
  case W:                                                                                   \
    launch_forward<W>(stream, grid, y, x, halo, w, bias, seq, channels, slabs.length, vec); \
    break;
    HCP_CASE(1) HCP_CASE(2) HCP_CASE(3) HCP_CASE(4) HCP_CASE(5) HCP_CASE(6) HCP_CASE(7) HCP_CASE(8)
#undef HCP_CASE
  }
  return launch_status(name);
}

size_t causal_conv1d_backward_workspace_bytes(int64_t batch, int64_t seq, int64_t channels,
                                              int64_t width) {
  const int64_t chunks = std::max<int64_t>(batch, 0) * slabs_for(std::max<int64_t>(seq, 0)).count;
  WorkspaceCarver carver(Workspace{});
  carver.take<float>(chunks * channels * width);
  carver.take<float>(chunks * channels);
  return carver.used();
}

Status causal_conv1d_backward(cudaStream_t stream, bf16* dx, bf16* dhalo, bf16* dw, bf16* dbias,
                              const bf16* dy, const bf16* x, const bf16* halo, const bf16* w,
                              int64_t batch, int64_t seq, int64_t channels, int64_t width,
                              Workspace workspace) {
  const char* name = "causal_conv1d.backward";
  if (Status s = check_shape(name, batch, seq, channels, width); !s.ok()) return s;
  if (channels == 0) return Status();
  if (dhalo != nullptr && batch > 0 && width > 1) {
    const int64_t total = batch * (width - 1) * channels;
    conv_dhalo_kernel<<<grid_for(total, 256), 256, 0, stream>>>(dhalo, dy, w, batch, seq, channels,
                                                                static_cast<int>(width));
    if (Status s = launch_status(name); !s.ok()) return s;
  }
  if (batch == 0 || seq == 0) {
    if (Status s = fill(stream, dw, 0.f, channels * width); !s.ok()) return s;
    return fill(stream, dbias, 0.f, channels);
  }
  const Slabs slabs = slabs_for(seq);
  const int64_t chunks = batch * slabs.count;
  WorkspaceCarver carver(workspace);
  float* partial_w = carver.take<float>(chunks * channels * width);
  float* partial_b = carver.take<float>(chunks * channels);
  if (!carver.fits()) return Status(name, "workspace too small");
  const bool vec = channels % 8 == 0 && aligned16(dx) && aligned16(dy) && aligned16(x) &&
                   (halo == nullptr || aligned16(halo));
  const dim3 grid(static_cast<unsigned>(ceil_div(ceil_div(channels, 8), kThreads)),
                  static_cast<unsigned>(slabs.count), static_cast<unsigned>(batch));
  switch (width) {
#define HCP_CASE(W)                                                                           \
  case W:                                                                                     \
    launch_backward<W>(stream, grid, dx, partial_w, partial_b, dy, x, halo, w, seq, channels, \
                       slabs.length, vec);                                                    \
    break;
    HCP_CASE(1) HCP_CASE(2) HCP_CASE(3) HCP_CASE(4) HCP_CASE(5) HCP_CASE(6) HCP_CASE(7) HCP_CASE(8)
#undef HCP_CASE
  }
  if (Status s = launch_status(name); !s.ok()) return s;
  if (Status s = sum_partials(stream, dw, partial_w, chunks, channels * width); !s.ok()) return s;
  return sum_partials(stream, dbias, partial_b, chunks, channels);
}

}  // namespace hcp::cuda
