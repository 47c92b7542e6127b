// Causal depthwise conv1d (Mamba2's, width 4) with an optional halo, forward and backward.
//
// Thread layout (both kernels): each thread owns 4 consecutive channels of one batch row (a warp
// reads 256 consecutive bytes of a row, 8-byte accesses) and a sub-slab of consecutive time
// steps; the warps of a block take consecutive sub-slabs. A thread walks its sub-slab in order,
// loading several rows at once (all in flight before any is used) and keeping the rows it still
// needs in registers, so every row is read once (plus a few rows at each sub-slab's edge). The
// partition depends only on the shape, so the backward's weight and bias sums (fp32 per block,
// then the blocks summed in order) are the same on every GPU.
#include "runtime/kernels/cuda/Common.cuh"

namespace hcp::cuda {
namespace {

using namespace detail;

constexpr int kMaxWidth = 8;

// 8-byte accesses (4 bf16) need their pointers 8-byte aligned.
inline bool aligned8(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 7) == 0; }

// V (4 or 8) consecutive bf16 as they lie in memory, two per word: the loads stay packed until
// used (half the registers of fp32).
template <int V>
struct Packed {
  static_assert(V == 4 || V == 8, "one 8- or 16-byte access");
  uint32_t word[V / 2];
};

// The first `valid` of p[0, V), zeros after; one 8- or 16-byte access when `vec` and all valid.
template <int V>
__device__ __forceinline__ Packed<V> load_packed(const bf16* p, int valid, bool vec) {
  Packed<V> r;
  if (vec && valid == V) {
    if constexpr (V == 8) {
      const uint4 u = *reinterpret_cast<const uint4*>(p);
      r.word[0] = u.x, r.word[1] = u.y, r.word[2] = u.z, r.word[3] = u.w;
    } else {
      const uint2 u = *reinterpret_cast<const uint2*>(p);
      r.word[0] = u.x, r.word[1] = u.y;
    }
  } else {
#pragma unroll
    for (int k = 0; k < V / 2; k++) {
      const uint32_t lo = 2 * k < valid ? __bfloat16_as_ushort(p[2 * k]) : 0u;
      const uint32_t hi = 2 * k + 1 < valid ? __bfloat16_as_ushort(p[2 * k + 1]) : 0u;
      r.word[k] = lo | (hi << 16);
    }
  }
  return r;
}
template <int V>
__device__ __forceinline__ Packed<V> zero_packed() {
  Packed<V> r;
#pragma unroll
  for (int k = 0; k < V / 2; k++) r.word[k] = 0u;
  return r;
}
// bf16 -> fp32 is exact: the bits moved to the top half.
template <int V>
__device__ __forceinline__ void unpack(float (&v)[V], const Packed<V>& r) {
#pragma unroll
  for (int k = 0; k < V / 2; k++) {
    v[2 * k] = __uint_as_float(r.word[k] << 16);
    v[2 * k + 1] = __uint_as_float(r.word[k] & 0xffff0000u);
  }
}
// v rounded to bf16 into p[0, valid).
template <int V>
__device__ __forceinline__ void store_rounded(bf16* p, const float (&v)[V], int valid, bool vec) {
  if (vec && valid == V) {
    uint32_t word[V / 2];
#pragma unroll
    for (int k = 0; k < V / 2; k++) {
      const __nv_bfloat162 pair = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]);
      word[k] = *reinterpret_cast<const uint32_t*>(&pair);
    }
    if constexpr (V == 8) {
      *reinterpret_cast<uint4*>(p) = make_uint4(word[0], word[1], word[2], word[3]);
    } else {
      *reinterpret_cast<uint2*>(p) = make_uint2(word[0], word[1]);
    }
  } else {
#pragma unroll
    for (int e = 0; e < V; e++) {
      if (e < valid) p[e] = __float2bfloat16_rn(v[e]);
    }
  }
}

// The forward: y[t] = bias + sum_j w[j] x[t - (W-1) + j], or with kSilu silu of that rounded to
// bf16 first, as silu.forward computes it from a stored conv output (the separate steps' values).
// With positions (packed documents), tap j reads nothing where its lag (W-1) - j exceeds
// positions[t], the distance back to the token's document start.
//
// Block: kForwardLanes x kForwardWarps threads, as the backward's (below): a lane owns kForwardV
// = 4 consecutive channels, the warps split the block's time span into consecutive sub-slabs.
// A thread keeps the W-1 input rows before its next output (the window, packed bf16), loads the
// next kForwardAhead input rows at once, computes and stores those kForwardAhead outputs, and the
// newest W-1 rows become the window. One row at a time (a load waited on every step) was
// latency-bound: 8 channels per thread that way ran at 1.77 TB/s at tiny's shape (H200). The
// sizes below are the backward's measured choices, not yet tuned for the forward on their own.
constexpr int kForwardLanes = 32;
constexpr int kForwardWarps = 4;
constexpr int kForwardThreads = kForwardLanes * kForwardWarps;
// 6 blocks per SM cap the registers at 80: width 4 fits without spills in both variants (8
// blocks, 64 registers, spill); the wider windows' weights and rows need up to 128.
constexpr int forward_min_blocks_per_sm(int width) { return width <= 4 ? 6 : 4; }
constexpr int kForwardV = 4;
constexpr int kForwardAhead = 8;
// The distance from row r of a batch row to its document's start: positions[r], or unbounded
// without documents (every tap reads) and for rows outside the sequence (their values are zero).
// The kernels take kDocuments as a template parameter: without documents they compile as if the
// masks were not there (the registers of the width-4 backward are at their cap).
template <bool kDocuments>
__device__ __forceinline__ int document_reach(const int32_t* positions_b, int64_t r, int64_t seq) {
  if constexpr (kDocuments) {
    return r >= 0 && r < seq ? positions_b[r] : INT_MAX;
  } else {
    return INT_MAX;
  }
}

// Time steps per warp (more for long sequences: at most kMaxForwardChunksPerRow blocks per batch
// row, well inside the grid's y limit). Each sub-slab also reads the W-1 rows before it.
constexpr int64_t kForwardSub = 32;
constexpr int64_t kMaxForwardChunksPerRow = 256;

// A batch row's time steps split into blocks of `warps` consecutive sub-slabs, one per warp:
// sub-slabs of at least `min_sub` steps, longer where that keeps the blocks per row at most
// `max_blocks` (shape-only, so the backward's sums do not depend on the GPU).
struct SubSlabs {
  int64_t sub;    // time steps per warp
  int64_t count;  // blocks (chunks of warps * sub steps) per batch row
};
SubSlabs sub_slabs(int64_t seq, int64_t min_sub, int64_t warps, int64_t max_blocks) {
  const int64_t sub = std::max(min_sub, ceil_div(seq, max_blocks * warps));
  return {sub, ceil_div(seq, sub * warps)};
}

template <int W, bool kSilu, bool kDocuments>
__global__ void __launch_bounds__(kForwardThreads, forward_min_blocks_per_sm(W))
    conv_forward_kernel(bf16* __restrict__ y, const bf16* __restrict__ x,
                        const bf16* __restrict__ halo, const bf16* __restrict__ w,
                        const bf16* __restrict__ bias, const int32_t* __restrict__ positions,
                        int64_t seq, int64_t channels, int64_t sub_length, bool vec) {
  constexpr int V = kForwardV;
  const int lane = threadIdx.x, warp = threadIdx.y;
  const int64_t c = (blockIdx.x * int64_t{kForwardLanes} + lane) * V;
  const int64_t b = blockIdx.z;
  const int64_t t0 = (blockIdx.y * int64_t{kForwardWarps} + warp) * sub_length;
  const int64_t t1 = min(seq, t0 + sub_length);
  // No shared memory and no barrier: a thread without channels or steps can leave.
  if (c >= channels || t0 >= t1) return;
  const int valid = static_cast<int>(min(int64_t{V}, channels - c));
  float wv[W][V], bv[V];
#pragma unroll
  for (int e = 0; e < V; e++) {
#pragma unroll
    for (int j = 0; j < W; j++) wv[j][e] = e < valid ? __bfloat162float(w[(c + e) * W + j]) : 0.f;
    bv[e] = bias != nullptr && e < valid ? __bfloat162float(bias[c + e]) : 0.f;
  }
  const bf16* x_b = x + b * seq * channels + c;
  bf16* y_b = y + b * seq * channels + c;
  const int32_t* positions_b = positions != nullptr ? positions + b * seq : nullptr;
  // rows[k] = input row t - (W-1) + k for the outputs t .. t + kForwardAhead - 1 of a batch of
  // steps: the window (k < W-1), then the batch's new rows.
  Packed<V> rows[W - 1 + kForwardAhead];
  // The first window: x, or before the sequence the halo (zeros without one).
#pragma unroll
  for (int k = 0; k < W - 1; k++) {
    const int64_t r = t0 - (W - 1) + k;
    if (r >= 0) {
      rows[k] = load_packed<V>(x_b + r * channels, valid, vec);
    } else if (halo != nullptr) {
      rows[k] = load_packed<V>(halo + (b * (W - 1) + (W - 1) + r) * channels + c, valid, vec);
    } else {
      rows[k] = zero_packed<V>();
    }
  }
  // The batch's output u, time step t (from rows[u .. u + W-1]) into dst[0, n), one access when
  // `full`.
  auto output = [&](int u, int64_t t, bf16* dst, int n, bool full) {
    const int reach = document_reach<kDocuments>(positions_b, t, seq);
    float xv[W][V], out[V];
#pragma unroll
    for (int j = 0; j < W; j++) unpack<V>(xv[j], rows[u + j]);
#pragma unroll
    for (int e = 0; e < V; e++) {
      float acc = bv[e];
#pragma unroll
      for (int j = 0; j < W; j++) {
        if (W - 1 - j <= reach) acc += wv[j][e] * xv[j][e];
      }
      if constexpr (kSilu) {
        const float v = round_bf16(acc);
        out[e] = v * sigmoidf(v);
      } else {
        out[e] = acc;
      }
    }
    store_rounded<V>(dst, out, n, full);
  };
  const bool full = vec && valid == V;
  for (int64_t t = t0; t < t1; t += kForwardAhead) {
    if (full && t + kForwardAhead <= t1) {
      // A whole batch of vector accesses (every batch but a sub-slab's last, short one, at the
      // usual shapes): no bounds, constant arguments (only the vector forms compiled here), and
      // the addresses advance by one row (few registers for them).
      const bf16* x_p = x_b + t * channels;
#pragma unroll
      for (int u = 0; u < kForwardAhead; u++, x_p += channels) {
        rows[W - 1 + u] = load_packed<V>(x_p, V, true);
      }
      bf16* y_p = y_b + t * channels;
#pragma unroll
      for (int u = 0; u < kForwardAhead; u++, y_p += channels) output(u, t + u, y_p, V, true);
    } else {
      // A short batch, or masked / unaligned accesses: one row at a time. Loading all rows first
      // here would hold V separate 2-byte loads per row in flight, raising the registers of the
      // whole kernel.
#pragma unroll
      for (int u = 0; u < kForwardAhead; u++) {
        if (t + u >= t1) break;
        rows[W - 1 + u] = load_packed<V>(x_b + (t + u) * channels, valid, vec);
        output(u, t + u, y_b + (t + u) * channels, valid, vec);
      }
    }
    // The newest W-1 rows are the next batch's window (kForwardAhead >= W-1).
#pragma unroll
    for (int k = 0; k < W - 1; k++) rows[k] = rows[k + kForwardAhead];
  }
}

// The backward: one pass over dy and x per time step, dx stored and the dw, dbias terms summed.
//
// Written with q the INPUT row: dx[q] = sum_j w[j] dy[q + (W-1) - j] and dw[j] += x[q] dy[q +
// (W-1) - j], so both read the same window g[k] = dy[q + k], k < W (zero outside [0, seq)), and
// the input row is used once (no window of x). The input rows before the sequence (q < 0: the
// halo, or zeros) take the same step: their dx is dhalo[q + W-1] and their terms go into dw.
//
// Block: kBackwardLanes x kBackwardWarps threads. A lane owns kBackwardV = 4 consecutive
// channels (a warp reads 256 consecutive bytes of a row); the warps of a block split the block's
// time span into consecutive sub-slabs, each walked in order, its rows loaded kBackwardAhead at a
// time (all those loads in flight at once). Measured on an H200 at tiny's shape (8192 x 3328,
// docs/performance.md, 2026-12-01 eighth session): 8 channels per thread need 185-200 registers
// (too few warps per SM); 4 with 8 rows ahead fit in 128 (4 blocks of 4 warps per SM) and were
// the fastest; 4 rows ahead, sub-slabs of 16 or 64, or blocks of 8 warps were slower, blocks of
// 2 warps as fast with twice the partial sums. The warps then add their dw, dbias sums in shared
// memory (warp order), so there is one partial sum per block in global memory (4 MB at tiny's
// shape, summed by a second small kernel).
// Every size here depends only on the shape: the sums are the same on every GPU.
//
// With positions, dy row r reaches the input row r - k (its lag k tap) only for k <= positions[r]:
// the window keeps each dy row's position beside it.
constexpr int kBackwardLanes = 32;
constexpr int kBackwardWarps = 4;
constexpr int kBackwardThreads = kBackwardLanes * kBackwardWarps;
// 4 caps the registers at 128 (width 4: no spills); wider windows get up to 255, not spills.
// With the SiLU folded in (a window of x too) 3, 168 registers, for width 4.
constexpr int backward_min_blocks_per_sm(int width, bool silu) {
  return width <= 4 ? (silu ? 3 : 4) : 2;
}
constexpr int kBackwardV = 4;
constexpr int kBackwardAhead = 8;
// Time steps per warp (more for long sequences, keeping at most kMaxChunksPerRow blocks, hence
// partial sums, per batch row).
constexpr int64_t kBackwardSub = 32;
constexpr int64_t kMaxChunksPerRow = 256;

SubSlabs backward_chunks(int64_t seq) {
  return sub_slabs(seq, kBackwardSub, kBackwardWarps, kMaxChunksPerRow);
}

// Partials [chunk][W + 1][channels]: row j < W is dw's column j, row W dbias.
//
// kSilu: dy is the gradient of silu(conv). The window then holds the conv output's gradient
// dconv[r] = dy[r] silu'(conv[r]), with conv[r] = bias + sum_j w[j] x[r - (W-1) + j] rounded to
// bf16 and dconv[r] rounded to bf16 as the separate silu.backward step stores it: each new dy
// row r = q + W-1 needs the input rows q .. q + W-1, so x is read W-1 rows ahead of the input
// row and kept in a window of its own (xw[k] = x[q + k]).
template <int W, int V, bool kSilu, bool kDocuments>
__global__ void __launch_bounds__(kBackwardThreads, backward_min_blocks_per_sm(W, kSilu))
    conv_backward_kernel(bf16* __restrict__ dx, bf16* __restrict__ dhalo,
                         float* __restrict__ partials, const bf16* __restrict__ dy,
                         const bf16* __restrict__ x, const bf16* __restrict__ halo,
                         const bf16* __restrict__ w, const bf16* __restrict__ bias,
                         const int32_t* __restrict__ positions, int64_t seq, int64_t channels,
                         int64_t sub_length, bool vec) {
  // One dw (or dbias) column of every warp but the first, [warp - 1][channel][lane].
  __shared__ float others[kBackwardWarps - 1][V][kBackwardLanes];
  const int lane = threadIdx.x, warp = threadIdx.y;
  const int64_t c = (blockIdx.x * int64_t{kBackwardLanes} + lane) * V;
  const int valid = static_cast<int>(max(int64_t{0}, min(int64_t{V}, channels - c)));
  const int64_t b = blockIdx.z;
  const int64_t t0 = (blockIdx.y * int64_t{kBackwardWarps} + warp) * sub_length;
  const int64_t t1 = min(seq, t0 + sub_length);
  // The first sub-slab of a row also takes the W-1 input rows before it (dw terms, dhalo).
  const int64_t q0 = t0 == 0 && W > 1 && (halo != nullptr || dhalo != nullptr) ? -(W - 1) : t0;
  float acc_w[W][V] = {}, acc_b[V] = {};
  if (valid > 0 && q0 < t1) {
    float wv[W][V];
#pragma unroll
    for (int e = 0; e < V; e++) {
#pragma unroll
      for (int j = 0; j < W; j++) wv[j][e] = e < valid ? __bfloat162float(w[(c + e) * W + j]) : 0.f;
    }
    float bv[V] = {};
    if constexpr (kSilu) {
#pragma unroll
      for (int e = 0; e < V; e++) bv[e] = e < valid ? __bfloat162float(bias[c + e]) : 0.f;
    }
    const bf16* dy_b = dy + b * seq * channels + c;
    const bf16* x_b = x + b * seq * channels + c;
    const int32_t* positions_b = positions != nullptr ? positions + b * seq : nullptr;
    // dy row r of this batch row, zeros outside the sequence.
    auto dy_row = [&](int64_t r) {
      return r >= 0 && r < seq ? load_packed<V>(dy_b + r * channels, valid, vec) : zero_packed<V>();
    };
    // Input row r: x, or before the sequence the halo (zeros without one), zeros after it.
    auto input_packed = [&](int64_t r) {
      if (r >= seq || r < -(W - 1)) return zero_packed<V>();
      if (r >= 0) return load_packed<V>(x_b + r * channels, valid, vec);
      if (halo == nullptr) return zero_packed<V>();
      return load_packed<V>(halo + (b * (W - 1) + (W - 1) + r) * channels + c, valid, vec);
    };
    // With kSilu, x is read this many rows ahead of the input row.
    constexpr int kAheadX = kSilu ? W - 1 : 0;
    Packed<V> xw[W];  // kSilu: xw[k] = input row q + k
    // The window's entry for dy row r, given dy[r], its document reach and (kSilu) xw = input
    // rows r-(W-1) .. r.
    auto window_entry = [&](float(&dst)[V], const Packed<V>& dy_r, int reach) {
      unpack<V>(dst, dy_r);
      if constexpr (kSilu) {
        float xv[W][V];
#pragma unroll
        for (int j = 0; j < W; j++) unpack<V>(xv[j], xw[j]);
#pragma unroll
        for (int e = 0; e < V; e++) {
          float acc = bv[e];
#pragma unroll
          for (int j = 0; j < W; j++) {
            if (W - 1 - j <= reach) acc += wv[j][e] * xv[j][e];
          }
          dst[e] = round_bf16(dst[e] * silu_grad(round_bf16(acc)));
        }
      }
    };
    float g[W][V];  // g[k] = dy row q + k (kSilu: the conv output's gradient there)
    // Nibble k: dy row q + k's document reach, capped at 15 (lags are below 8). One register for
    // the window's reaches (one each spilled at width 4).
    uint32_t g_reach = 0;
    auto nibble = [](int reach) { return static_cast<uint32_t>(min(reach, 15)); };
#pragma unroll
    for (int k = 0; k < W - 1; k++) {
      g_reach |= nibble(document_reach<kDocuments>(positions_b, q0 + k, seq)) << (4 * k);
    }
    if constexpr (kSilu) {
      // The windows for the first step: input rows q0 - (W-1) .. q0 + W-2 pass through xw.
#pragma unroll
      for (int k = 0; k < W - 1; k++) xw[k + 1] = input_packed(q0 - (W - 1) + k);
#pragma unroll
      for (int k = 0; k < W - 1; k++) {
#pragma unroll
        for (int j = 0; j < W - 1; j++) xw[j] = xw[j + 1];
        xw[W - 1] = input_packed(q0 + k);
        window_entry(g[k], dy_row(q0 + k), document_reach<kDocuments>(positions_b, q0 + k, seq));
      }
    } else {
#pragma unroll
      for (int k = 0; k < W - 1; k++) unpack<V>(g[k], dy_row(q0 + k));
    }
    // One step: dx (or dhalo) row `dst` (nullptr: not wanted) and the sums, then the window moves.
    // x_new is the input row q (kSilu: q + W-1, the input row q is then xw[0] after the shift);
    // dy_new is dy row q + W-1, `reach` its document reach.
    auto step = [&](const Packed<V>& dy_new, const Packed<V>& x_new, int reach, bf16* dst) {
      float in[V], out[V];
      g_reach |= nibble(reach) << (4 * (W - 1));
      if constexpr (kSilu) {
#pragma unroll
        for (int j = 0; j < W - 1; j++) xw[j] = xw[j + 1];
        xw[W - 1] = x_new;
        window_entry(g[W - 1], dy_new, reach);
        unpack<V>(in, xw[0]);
      } else {
        unpack<V>(g[W - 1], dy_new);
        unpack<V>(in, x_new);
      }
#pragma unroll
      for (int e = 0; e < V; e++) {
        float acc = 0.f;
#pragma unroll
        for (int j = 0; j < W; j++) {
          // Lag W-1-j: dy row q + W-1-j reaches back to the input row q only within its document.
          const uint32_t lag = W - 1 - j;
          const float gj = lag <= ((g_reach >> (4 * lag)) & 15u) ? g[W - 1 - j][e] : 0.f;
          acc += wv[j][e] * gj;
          acc_w[j][e] += in[e] * gj;
        }
        acc_b[e] += g[0][e];  // zero before the sequence
        out[e] = acc;
      }
      if (dst != nullptr) store_rounded<V>(dst, out, valid, vec);
#pragma unroll
      for (int k = 0; k < W - 1; k++) {
#pragma unroll
        for (int e = 0; e < V; e++) g[k][e] = g[k + 1][e];
      }
      g_reach >>= 4;
    };
    for (int64_t q = q0; q < t1; q += kBackwardAhead) {
      // The rows of the next kBackwardAhead steps, all loads issued before any is used.
      Packed<V> dy_next[kBackwardAhead], x_next[kBackwardAhead];
      if (q >= 0 && q + kBackwardAhead <= t1 && q + kBackwardAhead + W - 1 <= seq) {
        // All rows inside the sequence (every batch of steps but a sub-slab's ends): no bounds,
        // and the addresses advance by one row (few registers for them).
        const bf16* dy_p = dy_b + (q + W - 1) * channels;
        const bf16* x_p = x_b + (q + kAheadX) * channels;
#pragma unroll
        for (int u = 0; u < kBackwardAhead; u++, dy_p += channels, x_p += channels) {
          dy_next[u] = load_packed<V>(dy_p, valid, vec);
          x_next[u] = load_packed<V>(x_p, valid, vec);
        }
        bf16* dx_p = dx + (b * seq + q) * channels + c;
#pragma unroll
        for (int u = 0; u < kBackwardAhead; u++, dx_p += channels) {
          step(dy_next[u], x_next[u], document_reach<kDocuments>(positions_b, q + u + W - 1, seq),
               dx_p);
        }
      } else {
#pragma unroll
        for (int u = 0; u < kBackwardAhead; u++) {
          if (q + u < t1) {
            dy_next[u] = dy_row(q + u + W - 1);
            x_next[u] = input_packed(q + u + kAheadX);
          }
        }
#pragma unroll
        for (int u = 0; u < kBackwardAhead; u++) {
          const int64_t r = q + u;
          if (r >= t1) break;
          bf16* dst = r >= 0             ? dx + (b * seq + r) * channels + c
                      : dhalo != nullptr ? dhalo + (b * (W - 1) + (W - 1) + r) * channels + c
                                         : nullptr;
          step(dy_next[u], x_next[u], document_reach<kDocuments>(positions_b, r + W - 1, seq), dst);
        }
      }
    }
  }
  // The block's sums, column by column: warp 0 adds the other warps' in warp order and writes.
  float* out = partials + (b * gridDim.y + blockIdx.y) * (W + 1) * channels + c;
#pragma unroll
  for (int j = 0; j <= W; j++) {
    float(&acc)[V] = j < W ? acc_w[j] : acc_b;
    if (warp > 0) {
#pragma unroll
      for (int e = 0; e < V; e++) others[warp - 1][e][lane] = acc[e];
    }
    __syncthreads();
    if (warp == 0) {
#pragma unroll
      for (int e = 0; e < V; e++) {
        float s = acc[e];
#pragma unroll
        for (int k = 0; k < kBackwardWarps - 1; k++) s += others[k][e][lane];
        if (e < valid) out[j * channels + e] = s;
      }
    }
    __syncthreads();
  }
}

// dw [channels, W] and dbias from the partials [chunks][W + 1][channels], each column summed
// over the chunks in a fixed order: row lane y takes chunks y, y + 8, ..., then the 8 lane sums
// are added in order (as sum_partials, one launch for both outputs).
constexpr int kFinishRowLanes = 8;
template <int W>
__global__ void conv_backward_finish_kernel(bf16* dw, bf16* dbias, const float* partials,
                                            int64_t chunks, int64_t channels) {
  __shared__ float lanes[kFinishRowLanes][33];
  const int64_t cols = (W + 1) * channels;
  const int64_t col = blockIdx.x * int64_t{32} + threadIdx.x;
  float s = 0.f;
  if (col < cols) {
    for (int64_t k = threadIdx.y; k < chunks; k += kFinishRowLanes) s += partials[k * cols + col];
  }
  lanes[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    float total = 0.f;
#pragma unroll
    for (int l = 0; l < kFinishRowLanes; l++) total += lanes[l][threadIdx.x];
    const int64_t j = col / channels, c = col % channels;
    if (j < W) {
      dw[c * W + j] = __float2bfloat16_rn(total);
    } else {
      dbias[c] = __float2bfloat16_rn(total);
    }
  }
}

template <int W>
void launch_forward(cudaStream_t stream, dim3 grid, bool silu, bf16* y, const bf16* x,
                    const bf16* halo, const bf16* w, const bf16* bias, const int32_t* positions,
                    int64_t seq, int64_t channels, int64_t sub_length, bool vec) {
  const dim3 block(kForwardLanes, kForwardWarps);
  auto launch = [&](auto kernel) {
    kernel<<<grid, block, 0, stream>>>(y, x, halo, w, bias, positions, seq, channels, sub_length,
                                       vec);
  };
  if (positions != nullptr) {
    silu ? launch(conv_forward_kernel<W, true, true>) : launch(conv_forward_kernel<W, false, true>);
  } else {
    silu ? launch(conv_forward_kernel<W, true, false>)
         : launch(conv_forward_kernel<W, false, false>);
  }
}

template <int W>
void launch_backward(cudaStream_t stream, dim3 grid, bool silu, bf16* dx, bf16* dhalo,
                     float* partials, const bf16* dy, const bf16* x, const bf16* halo,
                     const bf16* w, const bf16* bias, const int32_t* positions, int64_t seq,
                     int64_t channels, int64_t sub_length, bool vec) {
  const dim3 block(kBackwardLanes, kBackwardWarps);
  auto launch = [&](auto kernel) {
    kernel<<<grid, block, 0, stream>>>(dx, dhalo, partials, dy, x, halo, w, bias, positions, seq,
                                       channels, sub_length, vec);
  };
  constexpr int V = kBackwardV;
  if (positions != nullptr) {
    silu ? launch(conv_backward_kernel<W, V, true, true>)
         : launch(conv_backward_kernel<W, V, false, true>);
  } else {
    silu ? launch(conv_backward_kernel<W, V, true, false>)
         : launch(conv_backward_kernel<W, V, false, false>);
  }
}

template <int W>
void launch_backward_finish(cudaStream_t stream, bf16* dw, bf16* dbias, const float* partials,
                            int64_t chunks, int64_t channels) {
  const int64_t cols = (W + 1) * channels;
  conv_backward_finish_kernel<W>
      <<<static_cast<unsigned>(ceil_div(cols, 32)), dim3(32, kFinishRowLanes), 0, stream>>>(
          dw, dbias, partials, chunks, channels);
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
                             int64_t channels, int64_t width, bool silu, const int32_t* positions) {
  const char* name = "causal_conv1d.forward";
  if (Status s = check_shape(name, batch, seq, channels, width); !s.ok()) return s;
  if (batch == 0 || seq == 0 || channels == 0) return Status();
  const bool vec = channels % kForwardV == 0 && aligned8(y) && aligned8(x) &&
                   (halo == nullptr || aligned8(halo));
  const SubSlabs chunks = sub_slabs(seq, kForwardSub, kForwardWarps, kMaxForwardChunksPerRow);
  const dim3 grid(static_cast<unsigned>(ceil_div(channels, kForwardLanes * kForwardV)),
                  static_cast<unsigned>(chunks.count), static_cast<unsigned>(batch));
  switch (width) {
#define HCP_CASE(W)                                                                      \
  case W:                                                                                \
    launch_forward<W>(stream, grid, silu, y, x, halo, w, bias, positions, seq, channels, \
                      chunks.sub, vec);                                                  \
    break;
    HCP_CASE(1) HCP_CASE(2) HCP_CASE(3) HCP_CASE(4) HCP_CASE(5) HCP_CASE(6) HCP_CASE(7) HCP_CASE(8)
#undef HCP_CASE
  }
  return launch_status(name);
}

size_t causal_conv1d_backward_workspace_bytes(int64_t batch, int64_t seq, int64_t channels,
                                              int64_t width) {
  const int64_t chunks =
      std::max<int64_t>(batch, 0) * backward_chunks(std::max<int64_t>(seq, 0)).count;
  WorkspaceCarver carver(Workspace{});
  carver.take<float>(chunks * (width + 1) * channels);
  return carver.used();
}

Status causal_conv1d_backward(cudaStream_t stream, bf16* dx, bf16* dhalo, bf16* dw, bf16* dbias,
                              const bf16* dy, const bf16* x, const bf16* halo, const bf16* w,
                              const bf16* bias, int64_t batch, int64_t seq, int64_t channels,
                              int64_t width, bool silu, Workspace workspace,
                              const int32_t* positions) {
  const char* name = "causal_conv1d.backward";
  if (Status s = check_shape(name, batch, seq, channels, width); !s.ok()) return s;
  if (silu && bias == nullptr) return Status(name, "the SiLU's backward needs the bias");
  if (channels == 0) return Status();
  if (batch == 0 || seq == 0) {
    // No dy: dhalo (the kernel's steps before the sequence) is zero too.
    if (dhalo != nullptr && width > 1) {
      if (Status s = fill(stream, dhalo, 0.f, batch * (width - 1) * channels); !s.ok()) return s;
    }
    if (Status s = fill(stream, dw, 0.f, channels * width); !s.ok()) return s;
    return fill(stream, dbias, 0.f, channels);
  }
  const SubSlabs chunks = backward_chunks(seq);
  WorkspaceCarver carver(workspace);
  float* partials = carver.take<float>(batch * chunks.count * (width + 1) * channels);
  if (!carver.fits()) return Status(name, "workspace too small");
  const bool vec = channels % kBackwardV == 0 && aligned16(dx) && aligned16(dy) && aligned16(x) &&
                   (halo == nullptr || aligned16(halo)) && (dhalo == nullptr || aligned16(dhalo));
  const dim3 grid(static_cast<unsigned>(ceil_div(channels, kBackwardLanes * kBackwardV)),
                  static_cast<unsigned>(chunks.count), static_cast<unsigned>(batch));
  switch (width) {
#define HCP_CASE(W)                                                                              \
  case W:                                                                                        \
    launch_backward<W>(stream, grid, silu, dx, dhalo, partials, dy, x, halo, w, bias, positions, \
                       seq, channels, chunks.sub, vec);                                          \
    if (Status s = launch_status(name); !s.ok()) return s;                                       \
    launch_backward_finish<W>(stream, dw, dbias, partials, batch * chunks.count, channels);      \
    break;
    HCP_CASE(1) HCP_CASE(2) HCP_CASE(3) HCP_CASE(4) HCP_CASE(5) HCP_CASE(6) HCP_CASE(7) HCP_CASE(8)
#undef HCP_CASE
  }
  return launch_status(name);
}

}  // namespace hcp::cuda
