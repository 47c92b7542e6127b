// Context parallelism's initial-state correction of the Mamba2 SSD scan, on the GPU:
// ssd_add_initial_state_forward / _backward (SequenceKernels.h; the oracle is
// runtime/kernels/cpu/SsdInitialState.cpp).
//
// A segment scanned from a zero start lacks what its true entering state adds. Per batch row b
// and head h (group g = h / (H / G)), with S = init_state[b, h] (P x N, fp32), the inclusive
// cumulative sum of dt over the WHOLE row cum_t = sum_{u<=t} dt_u and the decay
// d_t = exp(A_h cum_t):
//   forward    out_t = y_t + d_t S C_t
//   backward   dCh_t = d_t S^T dout_t             (N values: head h's share of dC_t)
//              w_t   = d_t <dout_t, S C_t> = <dCh_t, C_t>        (the gradient of A_h cum_t)
//              dC_t  = sum_{h in g} dCh_t,   dinit = sum_t d_t dout_t C_t^T
//              ddt_u = A_h sum_{t>=u} w_t,   dA_h = sum_{b,t} w_t cum_t
// w is read off dCh's fp32 accumulators (dCh . C), so the backward needs two tensor-core products
// per (position, head), not three (no separate S C_t).
//
// Positions come in 64-row "tiles" (the products' row blocks) and 256-position "chunks" (the
// granularity of the dt sums and of the forward's blocks). The products run on Hopper's warpgroup
// MMA (wgmma, sm_90a, as AttentionHopper.cu: operands in 128-byte-swizzled shared memory, loaded
// with cp.async), whose accumulator layout is mma.sync's, so the fp32 epilogues are the usual ones.
// Forward, two launches:
//   1. ssd_init_prep_kernel     tot[b, c, h] = sum of dt over chunk c (fp32), and S -> bf16 once
//                               (workspace) for the products.
//   2. ssd_init_forward_kernel  one block per (pair of heads, chunk, b), a warpgroup per head:
//                               cum over its chunk (the earlier chunks' totals plus a block scan
//                               of its dt), the decays, the heads' S in shared memory (loaded
//                               once, used for the chunk's 4 tiles), then per tile the
//                               [64 t x N] x [N x P] product C S^T, out = y + d * product in fp32.
//                               C is prefetched two tiles ahead (cp.async), y two tiles ahead into
//                               registers; y and out move as 16-byte pieces straight from / to
//                               the accumulator layout (S's rows are permuted to make that so).
// Backward, five launches:
//   1. ssd_init_prep_kernel     the dt totals and S as bf16, as for the forward; zeroes the
//                               completion counters of launches 3 and 4.
//   2. ssd_init_cumsum_kernel   cum [B, H, S_pad] fp32 (per chunk: the earlier chunks' totals plus
//                               a local scan; transposed through shared memory so that each
//                               head's positions are contiguous for the later kernels).
//   3. ssd_init_dc_kernel       one block per (tile, slice of the group's heads, b, g), a
//                               warpgroup per half of N: for each head of the slice
//                               (double-buffered dout tile and S): the [64 t x P] x [P x N/2]
//                               product dout S, w = d (product . C) per row, dC += d * product in
//                               fp32 registers. w is written as two halves (one per warpgroup),
//                               and per warp the sums of its w half and of that times cum over its
//                               16 rows (for ddt and dA). With several slices each writes an fp32
//                               slice buffer, and the tile's last slice block to finish adds them
//                               in slice order.
//   4. ssd_init_dinit_kernel    one block per (range of tiles, pair of heads, b), a warpgroup per
//                               head: dinit's partial sums over the range, the [P x 64 t] x
//                               [64 t x N] products (d dout)^T C accumulated in registers; fp32
//                               partials per range, added in range order by the heads' last range
//                               block to finish.
//   5. ssd_init_finish_kernel   ddt (reverse scan of w: the later tiles' sums plus a local scan)
//                               and dA (a fixed-order sum over (b, tile, warp)).
// Every sum has a fixed order, so the results are bit-reproducible run to run: the only atomics
// are integer completion counters, which choose the block that adds a set of partials, never the
// order it adds them in. How many head slices (launch 3) and t ranges (launch 4) there are
// depends on the shape only.
//
// Precision: dt, cum, the decays, w, ddt, dA and dinit stay fp32; the products take bf16 operands
// (C, dout, S rounded to bf16 as the scan's chunk kernels do with their states; in launch 4 dout
// scaled by its fp32 decay before rounding) and accumulate in fp32.
//
// Cost at granite-4.0-h-tiny with context parallelism 2 (B = 2 rows of s = 4096, 48 heads x 64,
// one group, N = 128): forward 6.4 GFLOP and ~110 MB of DRAM traffic (y in, out out); backward
// 12.9 GFLOP, dout read twice (launches 3 and 4, ~100 MB) and ~25 MB of fp32 partials. Measured
// on an H200 (median of 30): forward 0.048 ms (launch 2 alone ~37 us at ~58% of DRAM bandwidth),
// backward 0.106 ms (launches 3 and 4 ~45 and ~35 us).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "runtime/kernels/cuda/AttentionHopperMma.cuh"
#include "runtime/kernels/cuda/SequenceDetail.cuh"
#include "runtime/kernels/cuda/SequenceKernels.h"

namespace hcp::cuda {
namespace seq_detail {
namespace {

constexpr int kN = kSsdState;                        // 128
constexpr int kLdN = kN + 8;                         // padded shared row of N bf16
constexpr int kT = 64;                               // rows per tile
constexpr int kChunk = 256;                          // positions per dt total / forward block
constexpr int kTilesPerChunk = kChunk / kT;          // 4
constexpr int kWarpParts = 8;                        // launch 3's warps: w sums per (tile, head)
constexpr int64_t kDcTargetBlocks = 2 * 132;         // launch 3: 2 blocks per SM on an H100 / H200
constexpr int64_t kDinitTargetBlocks = 3 * 132;      // launch 4, one head per block: 3 per SM
constexpr int64_t kDinitPairTargetBlocks = 2 * 132;  // launch 4, two heads per block: 2 per SM

__device__ __forceinline__ float warp_sum_xor(float v) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
  return v;
}

// v[i] = p[i * stride] for i <= last if `valid` (else zero), the 32 loads issued back to back
// before any use: the addresses are clamped to row min(i, last), which the caller guarantees to
// exist (also when last < 0), so the loads carry no branches that would let the compiler
// interleave them with their consumers (with in-order issue each would then wait out a full
// memory latency).
template <typename T>
__device__ __forceinline__ void load32(T (&v)[32], const T* p, int64_t stride, int64_t last,
                                       bool valid, T zero) {
#pragma unroll
  for (int i = 0; i < 32; i++) v[i] = p[(i < last ? i : last) * stride];
#pragma unroll
  for (int i = 0; i < 32; i++) v[i] = valid && i <= last ? v[i] : zero;
}

// ---------------------------------------------------------------------------------------------
// Shape-derived sizes, shared by the host functions.
struct InitGeometry {
  int64_t chunks;       // nL = ceil(seq / 256)
  int64_t tiles;        // nT = ceil(seq / 64)
  int64_t s_pad;        // chunks * 256: the row length of cum
  int64_t head_blocks;  // ceil(heads / 32)
  int slices;           // launch 3: slices of each group's heads
  int dinit_heads;      // launch 4: heads per block (2 when the groups' head count is even)
  int ranges;           // launch 4: t ranges per (b, h)
  int tiles_per_range;
};

// slices: the largest divisor d <= 8 of heads / groups with tiles * batch * groups * d within
// kDcTargetBlocks (more blocks than one wave only add fp32 slice traffic). ranges: about one
// wave of launch 4's blocks (kDinit*TargetBlocks / its (b, head) blocks), at most one per tile,
// none empty.
InitGeometry init_geometry(const SsdShape& s) {
  InitGeometry g{};
  g.chunks = (s.seq + kChunk - 1) / kChunk;
  g.tiles = (s.seq + kT - 1) / kT;
  g.s_pad = g.chunks * kChunk;
  g.head_blocks = (s.heads + 31) / 32;
  const int64_t dc_blocks = g.tiles * s.batch * s.groups;
  const int64_t per_group = s.heads / s.groups;
  g.slices = 1;
  for (int d = 2; d <= 8; d++) {
    if (per_group % d == 0 && dc_blocks * d <= kDcTargetBlocks) g.slices = d;
  }
  g.dinit_heads = per_group % 2 == 0 ? 2 : 1;
  const int64_t target = g.dinit_heads == 2 ? kDinitPairTargetBlocks : kDinitTargetBlocks;
  const int64_t ranges =
      std::clamp<int64_t>(target / (s.batch * s.heads / g.dinit_heads), int64_t{1}, g.tiles);
  g.tiles_per_range = static_cast<int>((g.tiles + ranges - 1) / ranges);
  g.ranges = static_cast<int>((g.tiles + g.tiles_per_range - 1) / g.tiles_per_range);
  return g;
}

// Completion counters of the backward's launches 3 (per (b, g, tile)) and 4 (per (b, block of
// heads)).
size_t init_counters(const SsdShape& s, const InitGeometry& g) {
  return static_cast<size_t>(s.batch * s.groups * g.tiles + s.batch * s.heads / g.dinit_heads);
}

// Workspace slices (fp32 unless named). The forward uses tot and s16 alone.
struct InitBuffers {
  float* tot;         // [B, nL, H]     dt summed over each chunk
  bf16* s16;          // [B, H, P, N]   init_state as bf16
  float* cum;         // [B, H, s_pad]  inclusive cumsum of dt over the row (dt = 0 past the end)
  float* w;           // [B, S, H, 2]   w_t in two parts (launch 3's column halves)
  float* wtot;        // [B, nT, H, 8]  sum of w's part over each warp's rows of a tile
  float* dAp;         // [B, nT, H, 8]  sum of w's part times cum over the same rows
  float* dc_part;     // [slices, B, S, G, N] dC of each head slice (slices > 1)
  float* dinit_part;  // [B, H, ranges, P, N] dinit of each t range (ranges > 1)
  int* counters;      // launch 3's [B G, nT] then launch 4's [B, H / dinit_heads]: blocks done
  int n_counters;
};

size_t init_buffers(const SsdShape& s, const InitGeometry& g, bool backward, InitBuffers* out,
                    void* base) {
  const size_t B = static_cast<size_t>(s.batch), H = static_cast<size_t>(s.heads);
  const size_t S = static_cast<size_t>(s.seq), PN = static_cast<size_t>(s.head_dim * s.state);
  const size_t bwd = backward ? 1 : 0;
  const size_t bytes[] = {
      sizeof(float) * B * g.chunks * H,                                                  // tot
      sizeof(bf16) * B * H * PN,                                                         // s16
      bwd * sizeof(float) * B * H * g.s_pad,                                             // cum
      bwd * sizeof(float) * B * S * H * 2,                                               // w
      bwd * sizeof(float) * B * g.tiles * H * kWarpParts,                                // wtot
      bwd * sizeof(float) * B * g.tiles * H * kWarpParts,                                // dAp
      bwd * (g.slices > 1 ? sizeof(float) * g.slices * B * S * s.groups * s.state : 0),  // dc_part
      bwd * (g.ranges > 1 ? sizeof(float) * B * H * g.ranges * PN : 0),  // dinit_part
      bwd * sizeof(int) * init_counters(s, g),                           // counters
  };
  constexpr int kCount = sizeof(bytes) / sizeof(bytes[0]);
  void* ptrs[kCount];
  size_t total = 0;
  for (int i = 0; i < kCount; i++) {
    ptrs[i] = base != nullptr && bytes[i] > 0 ? static_cast<char*>(base) + total : nullptr;
    total += align_up(bytes[i]);
  }
  if (out != nullptr) {
    out->tot = static_cast<float*>(ptrs[0]);
    out->s16 = static_cast<bf16*>(ptrs[1]);
    out->cum = static_cast<float*>(ptrs[2]);
    out->w = static_cast<float*>(ptrs[3]);
    out->wtot = static_cast<float*>(ptrs[4]);
    out->dAp = static_cast<float*>(ptrs[5]);
    out->dc_part = static_cast<float*>(ptrs[6]);
    out->dinit_part = static_cast<float*>(ptrs[7]);
    out->counters = static_cast<int*>(ptrs[8]);
    out->n_counters = backward ? static_cast<int>(init_counters(s, g)) : 0;
  }
  return total;
}

// ---------------------------------------------------------------------------------------------
// Launch 1 (forward and backward): prep. 1D grid, 256 threads.
//   blocks [0, dt_blocks): (chunk c, 32-head block hb, b), c fastest. Lane = head (consecutive
//     heads are consecutive floats of dt: coalesced), warp w = positions [32 w, 32 w + 32) of the
//     chunk, summed in order; then the 8 warp sums in order: tot[b, c, h].
//     These blocks also zero the backward's completion counters (launches 3 and 4).
//   blocks [dt_blocks, ...): init_state -> bf16, 8 elements per thread.
__global__ void __launch_bounds__(256)
    ssd_init_prep_kernel(float* __restrict__ tot, bf16* __restrict__ s16,
                         int* __restrict__ counters, const float* __restrict__ dt,
                         const float* __restrict__ init, int64_t S, int H, int nL, int head_blocks,
                         int dt_blocks, int64_t state_elems, int n_counters) {
  __shared__ float part[8][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int blk = static_cast<int>(blockIdx.x);
  if (blk < dt_blocks) {
    for (int i = blk * 256 + threadIdx.x; i < n_counters; i += dt_blocks * 256) counters[i] = 0;
    const int c = blk % nL, rest = blk / nL;
    const int hb = rest % head_blocks, b = rest / head_blocks;
    const int h = hb * 32 + lane;
    const int64_t t0 = static_cast<int64_t>(c) * kChunk + warp * 32;
    // All 32 loads first (one memory latency), then the sum in order.
    float v[32];
    // Rows past the sequence end read its last row (masked); lanes past H read head H - 1.
    load32(v, dt + (static_cast<int64_t>(b) * S + t0) * H + min(h, H - 1), H, S - 1 - t0, h < H,
           0.f);
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < 32; i++) sum += v[i];
    part[warp][lane] = sum;
    __syncthreads();
    if (warp == 0 && h < H) {
      float total = 0.f;
#pragma unroll
      for (int w = 0; w < 8; w++) total += part[w][lane];
      tot[(static_cast<int64_t>(b) * nL + c) * H + h] = total;
    }
    return;
  }
  const int64_t e = (static_cast<int64_t>(blk - dt_blocks) * 256 + threadIdx.x) * 8;
  if (e >= state_elems) return;
  const float4 lo = *reinterpret_cast<const float4*>(init + e);
  const float4 hi = *reinterpret_cast<const float4*>(init + e + 4);
  uint4 o;
  o.x = pack_bf16(lo.x, lo.y);
  o.y = pack_bf16(lo.z, lo.w);
  o.z = pack_bf16(hi.x, hi.y);
  o.w = pack_bf16(hi.z, hi.w);
  *reinterpret_cast<uint4*>(s16 + e) = o;
}

// ---------------------------------------------------------------------------------------------
// Backward launch 2: cum[b, h, t] for all t < s_pad (dt = 0 past the end, so the padding repeats
// the last value). grid (nL, head_blocks, B), 256 threads, the prep's mapping (lane = head, warp =
// 32 positions). Earlier chunks' totals: warp w adds chunks w, w + 8, ... in order, then every
// thread adds the 8 warp sums in order; then the warp sums of this chunk's earlier positions, then
// its own run. The results go through shared memory so that the stores run along each head's row.
__global__ void __launch_bounds__(256)
    ssd_init_cumsum_kernel(float* __restrict__ cum, const float* __restrict__ tot,
                           const float* __restrict__ dt, int64_t S, int64_t s_pad, int H, int nL) {
  __shared__ float part[8][32];
  __shared__ float seg[8][32];
  __shared__ float tr[32][kChunk + 1];  // [head][position]; +1: conflict-free column writes
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int c = blockIdx.x, hb = blockIdx.y, b = blockIdx.z;
  const int h = hb * 32 + lane;
  const bool active = h < H;

  // Four chunks' loads at a time (clamped, masked), then their sums in order.
  float o = 0.f;
  const float* tp = tot + static_cast<int64_t>(b) * nL * H + min(h, H - 1);
  for (int c0 = warp; c0 < c; c0 += 32) {
    float t4[4];
#pragma unroll
    for (int u = 0; u < 4; u++) t4[u] = tp[static_cast<int64_t>(min(c0 + 8 * u, c - 1)) * H];
#pragma unroll
    for (int u = 0; u < 4; u++) {
      if (c0 + 8 * u < c) o += t4[u];
    }
  }
  if (!active) o = 0.f;
  part[warp][lane] = o;
  const int64_t t0 = static_cast<int64_t>(c) * kChunk + warp * 32;
  float v[32];
  load32(v, dt + (static_cast<int64_t>(b) * S + t0) * H + min(h, H - 1), H, S - 1 - t0, active,
         0.f);
  float run = 0.f;
#pragma unroll
  for (int i = 0; i < 32; i++) run += v[i];
  seg[warp][lane] = run;
  __syncthreads();
  float base = 0.f;
#pragma unroll
  for (int w = 0; w < 8; w++) base += part[w][lane];
  for (int w = 0; w < warp; w++) base += seg[w][lane];
  run = base;
#pragma unroll
  for (int i = 0; i < 32; i++) {
    run += v[i];
    tr[lane][warp * 32 + i] = run;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < 32 * kChunk; i += 256) {
    const int r = i / kChunk, col = i % kChunk;
    const int hh = hb * 32 + r;
    if (hh < H) {
      cum[(static_cast<int64_t>(b) * H + hh) * s_pad + static_cast<int64_t>(c) * kChunk + col] =
          tr[r][col];
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Hopper warpgroup MMA (wgmma, sm_90a) for the products: D[64 x n] (+)= A[64 x k] B[k x n], both
// operands in 128-byte-swizzled shared memory (AttentionHopper.cu's layout): a matrix whose rows
// hold 64-element atoms is stored [atom][rows][64], rows of 128 B, the 16-byte chunk j of row r at
// chunk j ^ (r % 8), every atom 1024-byte aligned. K-major operands have K along the rows (the
// forward's C and S, launch 3's dout), MN-major ones M or N (launch 3's S, launch 4's operands).
// D's registers follow mma.sync's accumulator layout: warp w of the warpgroup owns rows 16w ..
// 16w + 15, d[4i + e] = (row 16w + lane/4 + 8 (e >= 2), column 8i + 2 (lane % 4) + e % 2).
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define HCP_INIT_WGMMA 1
#else
#define HCP_INIT_WGMMA 0
#endif

// Shared-memory matrix descriptor, 128-byte swizzle: start >> 4; leading byte offset `lbo`
// (K-major: unused, 16; MN-major: the distance between 64-wide atoms along M / N); stride byte
// offset 1024 (8 rows of 128 B). A K-major operand's k step of 16 advances the start by 32 B (by a
// whole half every 4 steps); an MN-major operand's by 16 rows, 2048 B.
__device__ __forceinline__ uint64_t wgmma_desc(uint32_t saddr, uint32_t lbo = 16) {
  return static_cast<uint64_t>((saddr & 0x3FFFFu) >> 4) |
         (static_cast<uint64_t>((lbo >> 4) & 0x3FFFu) << 16) | (uint64_t{1024 >> 4} << 32) |
         (uint64_t{1} << 62);
}

// m64nNk16, bf16 x bf16 -> fp32, A and B from shared memory, K-major; scale_d 0: D = A B.
template <int N>
__device__ __forceinline__ void wgmma_k16(float (&d)[N / 2], uint64_t da, uint64_t db,
                                          int scale_d) {
#if HCP_INIT_WGMMA
  if constexpr (N == 64) {
    hopper::wgmma_ss_n64<0, 0>(d, da, db, scale_d);
  } else {
    static_assert(N == 32);
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
        "%16, %17, p, 1, 1, 0, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
          "+f"(d[14]), "+f"(d[15])
        : "l"(da), "l"(db), "r"(scale_d));
  }
#else
  __trap();  // the library is built for sm_90a (Sequence.cmake)
#endif
}

// d[64 x 128] += A[64 x 16] B[16 x 128], both operands MN-major (stored [k][m] and [k][n]).
__device__ __forceinline__ void wgmma_mn_major_n128(float (&d)[64], uint64_t da, uint64_t db) {
#if HCP_INIT_WGMMA
  hopper::wgmma_ss_n128<1, 1>(d, da, db, 1);
#else
  __trap();
#endif
}
// d[64 x 64] (+)= A[64 x 16] B[16 x 64], A K-major (stored [m][k]), B MN-major (stored [k][n]).
__device__ __forceinline__ void wgmma_kmn_n64(float (&d)[32], uint64_t da, uint64_t db,
                                              int scale_d) {
#if HCP_INIT_WGMMA
  hopper::wgmma_ss_n64<0, 1>(d, da, db, scale_d);
#else
  __trap();
#endif
}

__device__ __forceinline__ void wgmma_fence() {
#if HCP_INIT_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit_wait() {
#if HCP_INIT_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#endif
}
// Orders shared-memory writes of the generic proxy (cp.async here) before the wgmma's reads.
__device__ __forceinline__ void fence_proxy_async() {
#if HCP_INIT_WGMMA
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
// Keeps the compiler from moving accesses of the accumulators across the wgmma wait.
template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; i++) asm volatile("" : "+f"(r[i])::"memory");
}

// Copies rows [0, kRows) of a [rows][kCols] bf16 matrix (row r at src + r * stride) into the
// swizzled layout at dst (1024-byte aligned): 64-column atoms [kCols / 64][kRows][64] (one atom,
// half used, for kCols = 32), row r going to row dst_row(r); rows >= valid_rows are zero-filled.
// All threads of the block call it.
template <int kRows, int kCols, int kThreads, typename RowMap>
__device__ __forceinline__ void load_swizzled(unsigned char* dst, const bf16* src, int64_t stride,
                                              int valid_rows, RowMap dst_row) {
  constexpr int kChunks = kCols / 8;
  for (int i = threadIdx.x; i < kRows * kChunks; i += kThreads) {
    const int r = i / kChunks, j = i % kChunks, rd = dst_row(r);
    const bool valid = r < valid_rows;
    cp_async16(dst + (j >> 3) * (kRows * 128) + rd * 128 + (((j & 7) ^ (rd & 7)) << 4),
               valid ? src + r * stride + j * 8 : src, valid);
  }
}

// The same copy for tiles loaded again and again (identity row order): a thread's chunk column,
// and with it the swizzle phase, is fixed (kThreads is a multiple of the chunks per row and the
// rows it takes are kRowStep apart, a multiple of 8), so its shared and global offsets are
// computed once rather than per chunk and per tile.
template <int kRows, int kCols, int kThreads>
struct SwizzledTileLoader {
  static constexpr int kChunks = kCols / 8, kRowStep = kThreads / kChunks;
  static constexpr int kPer = kRows / kRowStep;  // chunks per thread
  static_assert(kThreads % kChunks == 0 && kRowStep % 8 == 0 && kRows % kRowStep == 0);
  int r0;
  uint32_t soff;  // shared byte offset of the thread's first chunk
  int64_t goff, gstep;
  __device__ __forceinline__ explicit SwizzledTileLoader(int64_t stride) {
    const int j = threadIdx.x % kChunks;
    r0 = threadIdx.x / kChunks;
    soff = (j >> 3) * (kRows * 128) + r0 * 128 + (((j & 7) ^ (r0 & 7)) << 4);
    goff = r0 * stride + j * 8;
    gstep = kRowStep * stride;
  }
  __device__ __forceinline__ void load(unsigned char* dst, const bf16* src, int valid_rows) const {
#pragma unroll
    for (int k = 0; k < kPer; k++) {
      const bool valid = r0 + k * kRowStep < valid_rows;
      cp_async16(dst + soff + k * kRowStep * 128, valid ? src + goff + k * gstep : src, valid);
    }
  }
};

// ---------------------------------------------------------------------------------------------
// Forward launch 2: out. grid (H / kHeads, nL, B) (heads fastest: the blocks sharing a chunk's C
// run together). A block takes kHeads (2 when the group's head count is even, else 1) adjacent
// heads of one group, which share C: the C tile is read from L2 once for both (per head, C is
// twice the bytes of y). One warpgroup (128 threads) per head: warp rg of warpgroup hl takes rows
// [16 rg, 16 rg + 16) of a 64-row tile for head h0 + hl. Per tile, rows r, columns p:
//   out[r][p] = y[r][p] + d_r sum_n C[r][n] S[p][n]
// the product by wgmma (8 k steps of m64nPk16). C runs three stages deep (cp.async, two tiles
// ahead); y and out go straight between registers and global memory, y two tiles ahead. For
// that, S's rows sit permuted in shared memory (perm_row): a thread's accumulators of output
// tiles 4m .. 4m + 3 then hold 8 consecutive p, so y and out move as 16-byte pieces (a warp's
// access covers 8 rows x 64 contiguous bytes). out may alias y: every element is read, then
// written, by the same thread.
template <int P, int kHeads>
struct FwdSmem {
  static constexpr int kSHead = 2 * P * 128;   // bytes of one head's S (two swizzled halves)
  static constexpr int kCTile = 2 * kT * 128;  // bytes of one C tile
  static constexpr int kStages = 3;
  static constexpr int kC = kHeads * kSHead;  // byte offsets from the 1024-aligned base
  static constexpr int kDec = kC + kStages * kCTile;
  static constexpr size_t kBytes = kDec + sizeof(float) * kHeads * kChunk + 1024;  // + alignment
};

// The shared row of S's row p (within 32-row groups): the product's output column 2 tq + e of
// 8-column tile 4m + t (t = 0..3, e = 0, 1) is row 32 m + 8 t + 2 tq + e; placing
// p = 32 m + 8 tq + 2 t + e there gives thread tq the columns 8 tq .. 8 tq + 7 of group m.
__device__ __forceinline__ int perm_row(int p) {
  const int q = p & 31, tq = q >> 3, t = (q & 7) >> 1, e = q & 1;
  return (p & ~31) + 8 * t + 2 * tq + e;
}

template <int P, int kHeads>
__global__ void __launch_bounds__(128 * kHeads, kHeads == 1 ? 3 : 2)
    ssd_init_forward_kernel(bf16* out, const bf16* y, const float* __restrict__ dt,
                            const float* __restrict__ A, const bf16* __restrict__ Cm,
                            const bf16* __restrict__ s16, const float* __restrict__ tot, int64_t S,
                            int H, int G, int nL) {
  using Sm = FwdSmem<P, kHeads>;
  constexpr int kThreads = 128 * kHeads, kStages = Sm::kStages;
  constexpr int kM = P / 32;  // 32-column groups of a warp's output (4 8-column tiles each)
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* base = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  float* dec = reinterpret_cast<float*>(base + Sm::kDec);  // [kHeads][kChunk]
  __shared__ float red[kHeads][2][4];

  const int h0 = blockIdx.x * kHeads, c = blockIdx.y, b = blockIdx.z;
  const int g = h0 / (H / G);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gq = lane >> 2, tq = lane & 3;
  const int rg = warp & 3, hl = warp >> 2;
  const int64_t r0 = static_cast<int64_t>(c) * kChunk;
  const int rvalid = static_cast<int>(S - r0 < kChunk ? S - r0 : kChunk);
  const int tiles = (rvalid + kT - 1) / kT;
  const int64_t c_stride = static_cast<int64_t>(G) * kN, y_stride = static_cast<int64_t>(H) * P;
  const bf16* Cg = Cm + ((static_cast<int64_t>(b) * S + r0) * G + g) * kN;

  // S (rows permuted) with the first C tile; the second C tile on its own.
  for (int hh = 0; hh < kHeads; hh++) {
    load_swizzled<P, kN, kThreads>(base + hh * Sm::kSHead,
                                   s16 + (static_cast<int64_t>(b) * H + h0 + hh) * P * kN, kN, P,
                                   [](int r) { return perm_row(r); });
  }
  const SwizzledTileLoader<kT, kN, kThreads> c_loader(c_stride);
  auto load_c = [&](int i) {
    c_loader.load(base + Sm::kC + (i % kStages) * Sm::kCTile, Cg + i * kT * c_stride,
                  rvalid - i * kT);
  };
  load_c(0);
  cp_async_commit();
  if (tiles > 1) load_c(1);
  cp_async_commit();

  // This thread's y / out elements of a tile: rows row_a, row_b; per m, columns 32 m + 8 tq .. + 7
  // of head h0 + hl.
  const int row_a = rg * 16 + gq, row_b = row_a + 8;
  const int64_t col0 = static_cast<int64_t>(hl) * P + 8 * tq;
  const bf16* Yg = y + ((static_cast<int64_t>(b) * S + r0) * H + h0) * P + col0;
  bf16* Og = out + ((static_cast<int64_t>(b) * S + r0) * H + h0) * P + col0;
  uint4 yv[2][2][kM];  // [tile % 2][row a / b][m]: two tiles in flight
  auto load_y = [&](int i) {
#pragma unroll
    for (int half = 0; half < 2; half++) {
      const int row = i * kT + (half == 0 ? row_a : row_b);
#pragma unroll
      for (int m = 0; m < kM; m++) {
        yv[i & 1][half][m] = row < rvalid
                                 ? *reinterpret_cast<const uint4*>(Yg + row * y_stride + 32 * m)
                                 : make_uint4(0, 0, 0, 0);
      }
    }
  };
  load_y(0);
  if (tiles > 1) load_y(1);

  // Decays of the chunk's 256 positions for each head; the threads [128 j, 128 j + 128) take head
  // h0 + j, thread i of them positions 2i and 2i + 1. The earlier chunks' totals: thread i adds
  // chunks i, i + 128, ..., then a warp tree and the head's 4 warps in order.
  {
    const int hs = threadIdx.x >> 7, ti = threadIdx.x & 127, wh = ti >> 5;
    const int h = h0 + hs;
    const float a_h = A[h];
    float o = 0.f;
    for (int cc = ti; cc < c; cc += 128) o += tot[(static_cast<int64_t>(b) * nL + cc) * H + h];
    o = warp_sum_xor(o);
    const int64_t t = r0 + 2 * ti;
    const float* p = dt + (static_cast<int64_t>(b) * S + t) * H + h;
    const float v0 = t < S ? p[0] : 0.f;
    const float v1 = t + 1 < S ? p[H] : 0.f;
    float incl = v0 + v1;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const float n = __shfl_up_sync(0xffffffffu, incl, off);
      if (lane >= off) incl += n;
    }
    float excl = __shfl_up_sync(0xffffffffu, incl, 1);
    if (lane == 0) excl = 0.f;
    if (lane == 0) red[hs][0][wh] = o;
    if (lane == 31) red[hs][1][wh] = incl;
    __syncthreads();
    float base_sum = ((red[hs][0][0] + red[hs][0][1]) + red[hs][0][2]) + red[hs][0][3];
    for (int w = 0; w < wh; w++) base_sum += red[hs][1][w];
    base_sum += excl;
    const float c0 = base_sum + v0, c1 = c0 + v1;
    dec[hs * kChunk + 2 * ti] = fast_exp(a_h * c0);
    dec[hs * kChunk + 2 * ti + 1] = fast_exp(a_h * c1);
  }

  const uint32_t s_addr = smem_addr(base + hl * Sm::kSHead);  // this warpgroup's head
  const float* dech = dec + hl * kChunk;
  // Unrolled over the chunk's 4 tiles, so that the y registers of tile i are named statically.
#pragma unroll
  for (int i = 0; i < kTilesPerChunk; i++) {
    if (i >= tiles) break;
    cp_async_wait<1>();  // tile i's group (the newest, tile i + 1's, may still be in flight)
    fence_proxy_async();
    __syncthreads();  // tile i (at i = 0 also S, dec) visible; tile i - 1's stage is free
    if (i + 2 < tiles) load_c(i + 2);
    cp_async_commit();
    const uint32_t c_addr = smem_addr(base + Sm::kC + (i % kStages) * Sm::kCTile);
    float acc[P / 2];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kN / 16; kk++) {
      wgmma_k16<P>(acc, wgmma_desc(c_addr + (kk >> 2) * (kT * 128) + (kk & 3) * 32),
                   wgmma_desc(s_addr + (kk >> 2) * (P * 128) + (kk & 3) * 32), kk > 0 ? 1 : 0);
    }
    wgmma_commit_wait();
    fence_regs(acc);
#pragma unroll
    for (int half = 0; half < 2; half++) {
      const int row = i * kT + (half == 0 ? row_a : row_b);
      if (row >= rvalid) continue;
      const float d = dech[row];
#pragma unroll
      for (int m = 0; m < kM; m++) {
        // 8-column tile 4m + t holds p = 32m + 8tq + 2t + 0, 1 of this row.
        const uint4 yy = yv[i & 1][half][m];
        const uint32_t* yw = reinterpret_cast<const uint32_t*>(&yy);
        uint4 o;
        uint32_t* ow = reinterpret_cast<uint32_t*>(&o);
#pragma unroll
        for (int t = 0; t < 4; t++) {
          const float* a2 = acc + 4 * (4 * m + t) + 2 * half;
          const float2 y2 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(yw + t));
          ow[t] = pack_bf16(fmaf(d, a2[0], y2.x), fmaf(d, a2[1], y2.y));
        }
        *reinterpret_cast<uint4*>(Og + row * y_stride + 32 * m) = o;
      }
    }
    if (i + 2 < tiles) load_y(i + 2);  // in flight during the next two tiles
  }
}

// ---------------------------------------------------------------------------------------------
// Backward launch 3: dC and w. grid (nT, slices, B * G), 256 threads = two warpgroups: warpgroup
// ch takes columns [64 ch, 64 ch + 64) of N, its warp rg rows [16 rg, 16 rg + 16) of the tile.
// For each head of the slice, in order:
//   prod[r][n] = sum_p dout[r][p] S[p][n]      (wgmma m64n64k16: dout K-major, S MN-major)
//   dC[r][n] += d_r prod[r][n],   w_half[r][ch] = d_r (prod[r][n] . C[r][n] over the warp's n)
// The two halves of w are kept apart (w [B, S, H, 2]; the finish kernel adds them in order), and
// so are the per-warp sums of w and w cum over the warp's rows (wtot, dAp [B, nT, H, 8]): no
// exchange between warps. The head's dout tile, S (bf16, from the prep) and cum rows are
// double-buffered with cp.async; C stays in a padded row-major tile for the dot products.
struct DcArgs {
  bf16* dC;        // [B, S, G, N] (slices == 1)
  float* dc_part;  // [slices, B, S, G, N] (slices > 1)
  float* w;
  float* wtot;
  float* dAp;
  const bf16* dout;
  const bf16* Cm;
  const bf16* s16;
  const float* cum;
  const float* A;
  int* counters;                  // [B G, nT], zero on entry (slices > 1)
  int64_t S, s_pad, part_stride;  // part_stride = B * S * G * N
  int H, G, nT, slices;
};

template <int P>
struct DcSmem {
  // Per stage (byte offsets from the 1024-aligned base): the head's dout tile, K-major swizzled
  // [64 t][64] (half used for P = 32); its S, MN-major swizzled [2][P][64]; its cum rows.
  static constexpr int kU = kT * 128, kS = 2 * P * 128;
  static constexpr int kStage = (kU + kS + kT * 4 + 1023) / 1024 * 1024;
  static constexpr int kC = 2 * kStage;  // the C tile, row-major padded [64][N + 8] bf16
  static constexpr size_t kBytes = kC + sizeof(bf16) * kT * kLdN + 1024;  // + alignment
};

template <int P>
__global__ void __launch_bounds__(256, 2) ssd_init_dc_kernel(const DcArgs args) {
  using Sm = DcSmem<P>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* base = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  bf16* Cs = reinterpret_cast<bf16*>(base + Sm::kC);
  auto Us = [&](int stage) { return base + stage * Sm::kStage; };
  auto Ss = [&](int stage) { return base + stage * Sm::kStage + Sm::kU; };
  auto cum_s = [&](int stage) {
    return reinterpret_cast<float*>(base + stage * Sm::kStage + Sm::kU + Sm::kS);
  };

  const int H = args.H, G = args.G;
  const int tile = blockIdx.x, slice = blockIdx.y, b = blockIdx.z / G, g = blockIdx.z % G;
  const int per_slice = H / G / args.slices;
  const int h0 = g * (H / G) + slice * per_slice;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gq = lane >> 2, tq = lane & 3;
  const int rg = warp & 3, ch = warp >> 2;  // warp within its warpgroup; warpgroup = N half
  const int64_t S = args.S, t0 = static_cast<int64_t>(tile) * kT;
  const int valid = static_cast<int>(S - t0 < kT ? S - t0 : kT);
  const int64_t c_stride = static_cast<int64_t>(G) * kN, u_stride = static_cast<int64_t>(H) * P;

  tile_load_async<kT, kN, 256>(Cs, args.Cm + ((static_cast<int64_t>(b) * S + t0) * G + g) * kN,
                               c_stride, valid);
  const SwizzledTileLoader<kT, P, 256> u_loader(u_stride);
  const SwizzledTileLoader<P, kN, 256> s_loader(kN);
  const bf16* dout_t = args.dout + ((static_cast<int64_t>(b) * S + t0) * H + h0) * P;
  auto load_head = [&](int i, int stage) {
    const int64_t bh = static_cast<int64_t>(b) * H + h0 + i;
    u_loader.load(Us(stage), dout_t + i * P, valid);
    s_loader.load(Ss(stage), args.s16 + bh * P * kN, P);
    if (threadIdx.x < kT / 4) {
      cp_async16(cum_s(stage) + 4 * threadIdx.x, args.cum + bh * args.s_pad + t0 + 4 * threadIdx.x,
                 true);
    }
  };
  load_head(0, 0);
  cp_async_commit();

  const int row_a = rg * 16 + gq, row_b = row_a + 8;
  const int n0 = ch * 64;
  float acc[8][4] = {};
  float a_next = args.A[h0];
  for (int i = 0; i < per_slice; i++) {
    const int stage = i & 1, h = h0 + i;
    const float a_h = a_next;
    cp_async_wait<0>();
    fence_proxy_async();
    __syncthreads();  // head i's stage visible; every warpgroup is done with head i - 1's stage
    if (i + 1 < per_slice) {
      load_head(i + 1, stage ^ 1);
      a_next = args.A[h + 1];
    }
    cp_async_commit();

    // prod = dout S over this warpgroup's 64 columns: prod[4 nt + e] is row (16 rg + gq, + 8 for
    // e >= 2), column n0 + 8 nt + 2 tq + e % 2 (mma.sync's accumulator layout).
    float prod[32];
    const uint32_t u_addr = smem_addr(Us(stage));
    const uint32_t s_addr = smem_addr(Ss(stage)) + ch * (P * 128);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < P / 16; kk++) {
      wgmma_kmn_n64(prod, wgmma_desc(u_addr + kk * 32), wgmma_desc(s_addr + kk * 2048, P * 128),
                    kk > 0 ? 1 : 0);
    }
    wgmma_commit_wait();
    fence_regs(prod);
    const float cum_a = cum_s(stage)[row_a], cum_b = cum_s(stage)[row_b];
    const float da = row_a < valid ? fast_exp(a_h * cum_a) : 0.f;
    const float db = row_b < valid ? fast_exp(a_h * cum_b) : 0.f;
    float dot_a = 0.f, dot_b = 0.f;
#pragma unroll
    for (int nt = 0; nt < 8; nt++) {
      const int n = n0 + nt * 8 + 2 * tq;
      const float2 ca =
          __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(Cs + row_a * kLdN + n));
      const float2 cb =
          __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(Cs + row_b * kLdN + n));
      const float* pr = prod + 4 * nt;
      dot_a = fmaf(pr[0], ca.x, fmaf(pr[1], ca.y, dot_a));
      dot_b = fmaf(pr[2], cb.x, fmaf(pr[3], cb.y, dot_b));
      acc[nt][0] = fmaf(da, pr[0], acc[nt][0]);
      acc[nt][1] = fmaf(da, pr[1], acc[nt][1]);
      acc[nt][2] = fmaf(db, pr[2], acc[nt][2]);
      acc[nt][3] = fmaf(db, pr[3], acc[nt][3]);
    }
#pragma unroll
    for (int m = 1; m < 4; m <<= 1) {
      dot_a += __shfl_xor_sync(0xffffffffu, dot_a, m);
      dot_b += __shfl_xor_sync(0xffffffffu, dot_b, m);
    }
    // Rows past the sequence: d = 0 and a zero dout tile, so their w is 0.
    const float wa = da * dot_a, wb = db * dot_b;
    if (tq == 0) {
      if (row_a < valid) args.w[((static_cast<int64_t>(b) * S + t0 + row_a) * H + h) * 2 + ch] = wa;
      if (row_b < valid) args.w[((static_cast<int64_t>(b) * S + t0 + row_b) * H + h) * 2 + ch] = wb;
    }
    // The warp's 16 rows (the 4 lanes of a row hold the same values: sum over gq only).
    float ws = wa + wb, das = fmaf(wa, cum_a, wb * cum_b);
#pragma unroll
    for (int m = 4; m < 32; m <<= 1) {
      ws += __shfl_xor_sync(0xffffffffu, ws, m);
      das += __shfl_xor_sync(0xffffffffu, das, m);
    }
    if (lane == 0) {
      const int64_t o = ((static_cast<int64_t>(b) * args.nT + tile) * H + h) * kWarpParts + warp;
      args.wtot[o] = ws;
      args.dAp[o] = das;
    }
  }

  const int64_t row0 = (static_cast<int64_t>(b) * S + t0) * G + g;  // (b, t0, g) row of dC
  if (args.slices == 1) {
#pragma unroll
    for (int half = 0; half < 2; half++) {
      const int row = half == 0 ? row_a : row_b;
      if (row >= valid) continue;
      const int64_t o = (row0 + static_cast<int64_t>(row) * G) * kN + n0;
#pragma unroll
      for (int nt = 0; nt < 8; nt++) {
        *reinterpret_cast<uint32_t*>(args.dC + o + nt * 8 + 2 * tq) =
            pack_bf16(acc[nt][2 * half], acc[nt][2 * half + 1]);
      }
    }
    return;
  }
  // Several slices: this slice's fp32 sums, then the last slice block of the tile to finish adds
  // all of them in slice order (the counter only picks which block adds, not the order).
  float* part = args.dc_part + slice * args.part_stride;
#pragma unroll
  for (int half = 0; half < 2; half++) {
    const int row = half == 0 ? row_a : row_b;
    if (row >= valid) continue;
    const int64_t o = (row0 + static_cast<int64_t>(row) * G) * kN + n0;
#pragma unroll
    for (int nt = 0; nt < 8; nt++) {
      *reinterpret_cast<float2*>(part + o + nt * 8 + 2 * tq) =
          make_float2(acc[nt][2 * half], acc[nt][2 * half + 1]);
    }
  }
  __shared__ int last;
  __threadfence();  // this block's sums are visible device-wide before it counts itself done
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(args.counters + static_cast<int64_t>(blockIdx.z) * args.nT + tile, 1) ==
           args.slices - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int e = threadIdx.x; e < valid * (kN / 4); e += 256) {
    const int row = e / (kN / 4), n = (e % (kN / 4)) * 4;
    const int64_t o = (row0 + static_cast<int64_t>(row) * G) * kN + n;
    float4 sum = __ldcg(reinterpret_cast<const float4*>(args.dc_part + o));
    for (int k = 1; k < args.slices; k++) {
      const float4 v =
          __ldcg(reinterpret_cast<const float4*>(args.dc_part + k * args.part_stride + o));
      sum = make_float4(sum.x + v.x, sum.y + v.y, sum.z + v.z, sum.w + v.w);
    }
    uint2 packed;
    packed.x = pack_bf16(sum.x, sum.y);
    packed.y = pack_bf16(sum.z, sum.w);
    *reinterpret_cast<uint2*>(args.dC + o) = packed;
  }
}

// ---------------------------------------------------------------------------------------------
// Backward launch 4: dinit over a range of tiles. grid (ranges, H / kHeads, B). A block takes
// kHeads adjacent heads of one group (2 when the group's head count is even), which share C (read
// from L2 once for both); their outputs stacked are a (kHeads P) x N matrix,
//   out[p][n] += sum_t (d_t dout_t[p]) C_t[n]      (p over the heads' P rows)
// computed by wgmma, one warpgroup per 64 rows of it (m64n128k16, 4 k steps per 64-row tile, the
// fp32 accumulators in registers over the whole range). Both operands are MN-major ([t][p] and
// [t][n] as stored), in the 128-byte-swizzled layout of 64-wide atoms. dout is scaled by its
// decay in fp32 on its way to shared memory (loaded into registers one tile ahead); C is copied
// with cp.async; both double-buffered. One range: the block writes dinit; several: an fp32
// partial per range, which the heads' last range block to finish adds in range order.
template <int P, int kHeads>
struct DinitSmem {
  static constexpr int kW = kHeads * P;          // output rows, dout columns of the block
  static constexpr int kAtoms = (kW + 63) / 64;  // 64-wide atoms of the dout tile (and warpgroups)
  static constexpr int kThreads = 128 * kAtoms;
  static constexpr int kCTile = 2 * kT * 128;                     // [2][64 t][64] bf16
  static constexpr int kUTile = kAtoms * kT * 128;                // [kAtoms][64 t][64] bf16
  static constexpr size_t kBytes = 2 * (kCTile + kUTile) + 1024;  // + alignment
};

template <int P, int kHeads>
__global__ void __launch_bounds__(DinitSmem<P, kHeads>::kThreads, 2)
    ssd_init_dinit_kernel(float* __restrict__ dinit, float* __restrict__ part,
                          int* __restrict__ counters, const bf16* __restrict__ dout,
                          const bf16* __restrict__ Cm, const float* __restrict__ cum,
                          const float* __restrict__ A, int64_t S, int64_t s_pad, int H, int G,
                          int nT, int tiles_per_range, int ranges) {
  using Sm = DinitSmem<P, kHeads>;
  constexpr int kW = Sm::kW, kThreads = Sm::kThreads;
  constexpr int kPiecesPerRow = kW / 8;
  constexpr int kPieces = kT * kPiecesPerRow / kThreads;  // 16-byte pieces of dout per thread
  static_assert(kPieces * kThreads == kT * kPiecesPerRow && kThreads % kPiecesPerRow == 0);
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* base = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  unsigned char* Cs = base;                   // 2 stages
  unsigned char* Us = base + 2 * Sm::kCTile;  // 2 stages

  const int r = blockIdx.x, h0 = blockIdx.y * kHeads, b = blockIdx.z;
  const int g = h0 / (H / G);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gq = lane >> 2, tq = lane & 3;
  const int wg = warp >> 2, wr = warp & 3;  // warpgroup (64 output rows), warp within it
  const int j_begin = r * tiles_per_range;
  const int j_end = min(nT, j_begin + tiles_per_range);
  const int64_t c_stride = static_cast<int64_t>(G) * kN, u_stride = static_cast<int64_t>(H) * P;
  const bf16* dout_b = dout + static_cast<int64_t>(b) * S * u_stride + static_cast<int64_t>(h0) * P;

  // A thread's pieces share their column (kThreads is a multiple of the pieces per row), so their
  // head; a piece is the 16-byte chunk j of its row.
  const int j = threadIdx.x % kPiecesPerRow, col = j * 8, row0 = threadIdx.x / kPiecesPerRow;
  constexpr int kRowStep = kThreads / kPiecesPerRow;
  const float a_h = A[h0 + col / P];
  const float* cum_h = cum + (static_cast<int64_t>(b) * H + h0 + col / P) * s_pad;
  const SwizzledTileLoader<kT, kN, kThreads> c_loader(c_stride);
  uint4 raw[kPieces];
  float cv[kPieces];
  auto load_tile = [&](int jt, int stage) {
    const int64_t t0 = static_cast<int64_t>(jt) * kT;
    const int valid = static_cast<int>(S - t0 < kT ? S - t0 : kT);
    c_loader.load(Cs + stage * Sm::kCTile, Cm + ((static_cast<int64_t>(b) * S + t0) * G + g) * kN,
                  valid);
    cp_async_commit();
#pragma unroll
    for (int k = 0; k < kPieces; k++) {
      const int row = row0 + k * kRowStep;
      raw[k] = row < valid ? *reinterpret_cast<const uint4*>(dout_b + (t0 + row) * u_stride + col)
                           : make_uint4(0, 0, 0, 0);
      cv[k] = cum_h[t0 + row];  // t0 + row < s_pad
    }
  };
  // The decay is taken here, not at the load, so that the loads stay in flight meanwhile.
  auto store_tile = [&](int stage) {
#pragma unroll
    for (int k = 0; k < kPieces; k++) {
      const int row = row0 + k * kRowStep;
      const float d = fast_exp(a_h * cv[k]);
      const bf16* e = reinterpret_cast<const bf16*>(&raw[k]);
      uint4 o;
      o.x = pack_bf16(__bfloat162float(e[0]) * d, __bfloat162float(e[1]) * d);
      o.y = pack_bf16(__bfloat162float(e[2]) * d, __bfloat162float(e[3]) * d);
      o.z = pack_bf16(__bfloat162float(e[4]) * d, __bfloat162float(e[5]) * d);
      o.w = pack_bf16(__bfloat162float(e[6]) * d, __bfloat162float(e[7]) * d);
      *reinterpret_cast<uint4*>(Us + stage * Sm::kUTile + (j >> 3) * (kT * 128) + row * 128 +
                                (((j & 7) ^ (row & 7)) << 4)) = o;
    }
  };

  float acc[64];
#pragma unroll
  for (int i = 0; i < 64; i++) acc[i] = 0.f;
  load_tile(j_begin, 0);
  for (int jt = j_begin; jt < j_end; jt++) {
    const int stage = (jt - j_begin) & 1;
    store_tile(stage);  // Us[stage] was last read two tiles ago (wgmma waited before a barrier)
    cp_async_wait<0>();
    fence_proxy_async();
    __syncthreads();  // tile jt visible; every warpgroup is done with tile jt - 1's stage
    if (jt + 1 < j_end) load_tile(jt + 1, stage ^ 1);
    const uint32_t c_addr = smem_addr(Cs + stage * Sm::kCTile);
    const uint32_t u_addr = smem_addr(Us + stage * Sm::kUTile + wg * (kT * 128));
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kT / 16; kk++) {
      wgmma_mn_major_n128(acc, wgmma_desc(u_addr + kk * 2048, kT * 128),
                          wgmma_desc(c_addr + kk * 2048, kT * 128));
    }
    wgmma_commit_wait();
    fence_regs(acc);
  }

  // acc[4i + e]: output row 64 wg + 16 wr + gq (+ 8 for e >= 2), column 8i + 2 tq + e % 2. The
  // rows of one 16-row group lie in one head (P is a multiple of 16). Past kW (one head of 32):
  // rows of nothing, not written.
  constexpr int kPN = P * kN;
  const int prow = 64 * wg + 16 * wr;
  if (prow < kW) {
    const int hl = prow / P, p0 = prow % P;
    float* o = ranges == 1 ? dinit + (static_cast<int64_t>(b) * H + h0 + hl) * kPN
                           : part + ((static_cast<int64_t>(b) * H + h0 + hl) * ranges + r) * kPN;
#pragma unroll
    for (int i = 0; i < 16; i++) {
      const int row = p0 + gq, c2 = 8 * i + 2 * tq;
      *reinterpret_cast<float2*>(o + row * kN + c2) = make_float2(acc[4 * i], acc[4 * i + 1]);
      *reinterpret_cast<float2*>(o + (row + 8) * kN + c2) =
          make_float2(acc[4 * i + 2], acc[4 * i + 3]);
    }
  }
  if (ranges == 1) return;
  // The last range block of these heads to finish adds the ranges' partials in range order.
  __shared__ int last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(counters + static_cast<int64_t>(b) * gridDim.y + blockIdx.y, 1) == ranges - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int e = threadIdx.x; e < kHeads * kPN / 4; e += kThreads) {
    const int hh = e / (kPN / 4), off = (e % (kPN / 4)) * 4;
    const int64_t bh = static_cast<int64_t>(b) * H + h0 + hh;
    const float* src = part + bh * ranges * kPN + off;
    float4 sum = __ldcg(reinterpret_cast<const float4*>(src));
    for (int k = 1; k < ranges; k++) {
      const float4 v = __ldcg(reinterpret_cast<const float4*>(src + static_cast<int64_t>(k) * kPN));
      sum = make_float4(sum.x + v.x, sum.y + v.y, sum.z + v.z, sum.w + v.w);
    }
    *reinterpret_cast<float4*>(dinit + bh * kPN + off) = sum;
  }
}

// ---------------------------------------------------------------------------------------------
// Backward launch 5: two jobs over one 1D grid of 256-thread blocks.
//   ddt (nL x head_blocks x B blocks, the cumsum kernel's mapping): the later tiles' w sums (warp w
//       adds tiles first + w, + 8, ...; each tile's 8 warp parts in order), the later warps' sums
//       of this chunk, then a reverse run over the warp's 32 positions (w = its two halves
//       added); ddt = A_h * (sum of w from the position on).
//   dA  8 heads per block, a warp per head: lane l adds the (b, tile) entries l, l + 32, ... (each
//       tile's 8 parts in order), then a warp tree.
struct FinishArgs {
  float* ddt;
  float* dA;
  const float* w;
  const float* wtot;
  const float* dAp;
  const float* A;
  int64_t S;
  int H, B, nL, nT, head_blocks, ddt_blocks;  // dA takes the blocks after ddt's
};

// The 8 warp parts of a (tile, head), in order.
__device__ __forceinline__ float sum8(float4 lo, float4 hi) {
  return ((((((lo.x + lo.y) + lo.z) + lo.w) + hi.x) + hi.y) + hi.z) + hi.w;
}

__global__ void __launch_bounds__(256) ssd_init_finish_kernel(const FinishArgs a) {
  static_assert(kWarpParts == 8);
  __shared__ float part[8][32];
  __shared__ float seg[8][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int blk = static_cast<int>(blockIdx.x);
  if (blk < a.ddt_blocks) {
    const int c = blk % a.nL, rest = blk / a.nL;
    const int hb = rest % a.head_blocks, b = rest / a.head_blocks;
    const int h = hb * 32 + lane;
    const bool active = h < a.H;
    // Four tiles' loads at a time (clamped to the last tile, masked), then their sums in order.
    float o = 0.f;
    const float* p = a.wtot + (static_cast<int64_t>(b) * a.nT * a.H + min(h, a.H - 1)) * kWarpParts;
    const int64_t tile_stride = static_cast<int64_t>(a.H) * kWarpParts;
    for (int j0 = (c + 1) * kTilesPerChunk + warp; j0 < a.nT; j0 += 32) {
      float4 lo[4], hi[4];
#pragma unroll
      for (int u = 0; u < 4; u++) {
        const float* q = p + min(j0 + 8 * u, a.nT - 1) * tile_stride;
        lo[u] = *reinterpret_cast<const float4*>(q);
        hi[u] = *reinterpret_cast<const float4*>(q + 4);
      }
#pragma unroll
      for (int u = 0; u < 4; u++) {
        if (j0 + 8 * u < a.nT) o += sum8(lo[u], hi[u]);
      }
    }
    if (!active) o = 0.f;
    part[warp][lane] = o;
    const int64_t t0 = static_cast<int64_t>(c) * kChunk + warp * 32;
    float2 halves[32];
    load32(halves,
           reinterpret_cast<const float2*>(a.w) + (static_cast<int64_t>(b) * a.S + t0) * a.H +
               min(h, a.H - 1),
           a.H, a.S - 1 - t0, active, make_float2(0.f, 0.f));
    float v[32];
    float run = 0.f;
#pragma unroll
    for (int i = 0; i < 32; i++) {
      v[i] = halves[i].x + halves[i].y;
      run += v[i];
    }
    seg[warp][lane] = run;
    __syncthreads();
    float base = 0.f;
#pragma unroll
    for (int w = 0; w < 8; w++) base += part[w][lane];
    for (int w = 7; w > warp; w--) base += seg[w][lane];
    if (!active) return;
    const float a_h = a.A[h];
    float* q = a.ddt + (static_cast<int64_t>(b) * a.S + t0) * a.H + h;
    run = base;
#pragma unroll
    for (int i = 31; i >= 0; i--) {
      run += v[i];
      if (t0 + i < a.S) q[static_cast<int64_t>(i) * a.H] = a_h * run;
    }
    return;
  }
  const int h = (blk - a.ddt_blocks) * 8 + warp;
  if (h >= a.H) return;
  // Entries lane, lane + 32, ..., four at a time (loads first, then their sums in order).
  float s = 0.f;
  const int n = a.B * a.nT;
  for (int i0 = lane; i0 < n; i0 += 128) {
    float4 lo[4], hi[4];
#pragma unroll
    for (int u = 0; u < 4; u++) {
      const int i = min(i0 + 32 * u, n - 1), b = i / a.nT, j = i % a.nT;
      const float* q = a.dAp + ((static_cast<int64_t>(b) * a.nT + j) * a.H + h) * kWarpParts;
      lo[u] = *reinterpret_cast<const float4*>(q);
      hi[u] = *reinterpret_cast<const float4*>(q + 4);
    }
#pragma unroll
    for (int u = 0; u < 4; u++) {
      if (i0 + 32 * u < n) s += sum8(lo[u], hi[u]);
    }
  }
  s = warp_sum_xor(s);
  if (lane == 0) a.dA[h] = s;
}

// ---------------------------------------------------------------------------------------------
// Host side.

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// The scan's supported shapes (SequenceKernels.h) without its chunk condition, plus grid limits.
bool init_state_supported(const SsdShape& s) {
  SsdShape t = s;
  t.chunk = kSsdChunk;
  if (!ssd_supported(t)) return false;
  const InitGeometry g = init_geometry(s);
  return g.tiles <= INT_MAX / 2 && g.chunks * g.head_blocks * s.batch <= INT_MAX / 2 &&
         s.batch * s.heads * s.head_dim * s.state / 2048 <= INT_MAX / 2 && s.batch <= 65535;
}

// One prep launch: the dt totals, and (s16 non-null) init_state as bf16.
cudaError_t launch_prep(cudaStream_t stream, const InitBuffers& buf, const float* dt,
                        const float* init, const SsdShape& s, const InitGeometry& g) {
  const int dt_blocks = static_cast<int>(g.chunks * g.head_blocks * s.batch);
  const int64_t state_elems = buf.s16 != nullptr ? s.batch * s.heads * s.head_dim * s.state : 0;
  const int state_blocks = static_cast<int>((state_elems / 8 + 255) / 256);
  ssd_init_prep_kernel<<<dt_blocks + state_blocks, 256, 0, stream>>>(
      buf.tot, buf.s16, buf.counters, dt, init, s.seq, static_cast<int>(s.heads),
      static_cast<int>(g.chunks), static_cast<int>(g.head_blocks), dt_blocks, state_elems,
      buf.n_counters);
  return cudaGetLastError();
}

template <int P, int kHeads>
cudaError_t launch_forward(cudaStream_t stream, bf16* out, const bf16* y, const float* dt,
                           const float* A, const bf16* Cm, const InitBuffers& buf,
                           const SsdShape& s, const InitGeometry& g) {
  const size_t smem = FwdSmem<P, kHeads>::kBytes;
  cudaError_t err =
      cudaFuncSetAttribute(ssd_init_forward_kernel<P, kHeads>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  dim3 grid(static_cast<unsigned>(s.heads / kHeads), static_cast<unsigned>(g.chunks),
            static_cast<unsigned>(s.batch));
  ssd_init_forward_kernel<P, kHeads><<<grid, 128 * kHeads, smem, stream>>>(
      out, y, dt, A, Cm, buf.s16, buf.tot, s.seq, static_cast<int>(s.heads),
      static_cast<int>(s.groups), static_cast<int>(g.chunks));
  return cudaGetLastError();
}

// Two heads per block when the groups' head count is even (they must share C).
cudaError_t launch_forward_any(cudaStream_t stream, bf16* out, const bf16* y, const float* dt,
                               const float* A, const bf16* Cm, const InitBuffers& buf,
                               const SsdShape& s, const InitGeometry& g) {
  const bool pairs = (s.heads / s.groups) % 2 == 0;
  if (s.head_dim == 64) {
    return pairs ? launch_forward<64, 2>(stream, out, y, dt, A, Cm, buf, s, g)
                 : launch_forward<64, 1>(stream, out, y, dt, A, Cm, buf, s, g);
  }
  return pairs ? launch_forward<32, 2>(stream, out, y, dt, A, Cm, buf, s, g)
               : launch_forward<32, 1>(stream, out, y, dt, A, Cm, buf, s, g);
}

template <int P, int kHeads>
cudaError_t launch_dinit(cudaStream_t stream, float* dinit, const bf16* dout, const float* A,
                         const bf16* Cm, const InitBuffers& buf, const SsdShape& s,
                         const InitGeometry& g) {
  const size_t smem = DinitSmem<P, kHeads>::kBytes;
  cudaError_t err =
      cudaFuncSetAttribute(ssd_init_dinit_kernel<P, kHeads>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  dim3 grid(static_cast<unsigned>(g.ranges), static_cast<unsigned>(s.heads / kHeads),
            static_cast<unsigned>(s.batch));
  ssd_init_dinit_kernel<P, kHeads><<<grid, DinitSmem<P, kHeads>::kThreads, smem, stream>>>(
      dinit, buf.dinit_part, buf.counters + s.batch * s.groups * g.tiles, dout, Cm, buf.cum, A,
      s.seq, g.s_pad, static_cast<int>(s.heads), static_cast<int>(s.groups),
      static_cast<int>(g.tiles), g.tiles_per_range, g.ranges);
  return cudaGetLastError();
}

template <int P>
cudaError_t launch_backward_products(cudaStream_t stream, float* dinit, bf16* dCm, const bf16* dout,
                                     const float* A, const bf16* Cm, const InitBuffers& buf,
                                     const SsdShape& s, const InitGeometry& g) {
  {
    const size_t smem = DcSmem<P>::kBytes;
    cudaError_t err = cudaFuncSetAttribute(
        ssd_init_dc_kernel<P>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (err != cudaSuccess) return err;
    DcArgs args{};
    args.dC = dCm;
    args.dc_part = buf.dc_part;
    args.w = buf.w;
    args.wtot = buf.wtot;
    args.dAp = buf.dAp;
    args.dout = dout;
    args.Cm = Cm;
    args.s16 = buf.s16;
    args.cum = buf.cum;
    args.A = A;
    args.S = s.seq;
    args.s_pad = g.s_pad;
    args.part_stride = s.batch * s.seq * s.groups * s.state;
    args.H = static_cast<int>(s.heads);
    args.G = static_cast<int>(s.groups);
    args.nT = static_cast<int>(g.tiles);
    args.slices = g.slices;
    args.counters = buf.counters;
    dim3 grid(static_cast<unsigned>(g.tiles), static_cast<unsigned>(g.slices),
              static_cast<unsigned>(s.batch * s.groups));
    ssd_init_dc_kernel<P><<<grid, 256, smem, stream>>>(args);  // two warpgroups
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return g.dinit_heads == 2 ? launch_dinit<P, 2>(stream, dinit, dout, A, Cm, buf, s, g)
                            : launch_dinit<P, 1>(stream, dinit, dout, A, Cm, buf, s, g);
}

}  // namespace
}  // namespace seq_detail

size_t ssd_add_initial_state_forward_workspace_bytes(const SsdShape& s) {
  if (!seq_detail::init_state_supported(s)) return 0;
  const seq_detail::InitGeometry g = seq_detail::init_geometry(s);
  return seq_detail::init_buffers(s, g, /*backward=*/false, nullptr, nullptr);
}

Status ssd_add_initial_state_forward(cudaStream_t stream, bf16* out, const bf16* y, const float* dt,
                                     const float* A, const bf16* Cm, const float* init_state,
                                     const SsdShape& s, Workspace workspace) {
  using namespace seq_detail;
  constexpr const char* kWhere = "ssd_add_initial_state_forward";
  if (!init_state_supported(s)) {
    return Status(kWhere,
                  "unsupported shape (needs state 128, head_dim 32 or 64, heads % groups == 0)");
  }
  if (!aligned16(out) || !aligned16(y) || !aligned16(Cm) || !aligned16(init_state)) {
    return Status(kWhere, "out, y, Cm and init_state must be 16-byte aligned");
  }
  const InitGeometry g = init_geometry(s);
  if (workspace.ptr == nullptr ||
      workspace.bytes < init_buffers(s, g, /*backward=*/false, nullptr, nullptr)) {
    return Status(kWhere, "workspace too small");
  }
  InitBuffers buf{};
  init_buffers(s, g, /*backward=*/false, &buf, workspace.ptr);
  cudaError_t err = launch_prep(stream, buf, dt, init_state, s, g);
  if (err != cudaSuccess) return Status::Cuda("ssd_add_initial_state_forward: prep", err);
  err = launch_forward_any(stream, out, y, dt, A, Cm, buf, s, g);
  if (err != cudaSuccess) return Status::Cuda("ssd_add_initial_state_forward: out", err);
  return Status();
}

size_t ssd_add_initial_state_backward_workspace_bytes(const SsdShape& s) {
  if (!seq_detail::init_state_supported(s)) return 0;
  const seq_detail::InitGeometry g = seq_detail::init_geometry(s);
  return seq_detail::init_buffers(s, g, /*backward=*/true, nullptr, nullptr);
}

Status ssd_add_initial_state_backward(cudaStream_t stream, float* ddt, float* dA, bf16* dCm,
                                      float* dinit_state, const bf16* dout, const float* dt,
                                      const float* A, const bf16* Cm, const float* init_state,
                                      const SsdShape& s, Workspace workspace) {
  using namespace seq_detail;
  constexpr const char* kWhere = "ssd_add_initial_state_backward";
  if (!init_state_supported(s)) {
    return Status(kWhere,
                  "unsupported shape (needs state 128, head_dim 32 or 64, heads % groups == 0)");
  }
  if (!aligned16(dCm) || !aligned16(dinit_state) || !aligned16(dout) || !aligned16(Cm) ||
      !aligned16(init_state)) {
    return Status(kWhere, "dCm, dinit_state, dout, Cm and init_state must be 16-byte aligned");
  }
  const InitGeometry g = init_geometry(s);
  if (workspace.ptr == nullptr ||
      workspace.bytes < init_buffers(s, g, /*backward=*/true, nullptr, nullptr)) {
    return Status(kWhere, "workspace too small");
  }
  InitBuffers buf{};
  init_buffers(s, g, /*backward=*/true, &buf, workspace.ptr);
  const int H = static_cast<int>(s.heads);

  cudaError_t err = launch_prep(stream, buf, dt, init_state, s, g);
  if (err != cudaSuccess) return Status::Cuda("ssd_add_initial_state_backward: prep", err);
  ssd_init_cumsum_kernel<<<dim3(static_cast<unsigned>(g.chunks),
                                static_cast<unsigned>(g.head_blocks),
                                static_cast<unsigned>(s.batch)),
                           256, 0, stream>>>(buf.cum, buf.tot, dt, s.seq, g.s_pad, H,
                                             static_cast<int>(g.chunks));
  err = cudaGetLastError();
  if (err != cudaSuccess) return Status::Cuda("ssd_add_initial_state_backward: cumsum", err);
  err = s.head_dim == 64
            ? launch_backward_products<64>(stream, dinit_state, dCm, dout, A, Cm, buf, s, g)
            : launch_backward_products<32>(stream, dinit_state, dCm, dout, A, Cm, buf, s, g);
  if (err != cudaSuccess) return Status::Cuda("ssd_add_initial_state_backward: dC, dinit", err);

  FinishArgs f{};
  f.ddt = ddt;
  f.dA = dA;
  f.w = buf.w;
  f.wtot = buf.wtot;
  f.dAp = buf.dAp;
  f.A = A;
  f.S = s.seq;
  f.H = H;
  f.B = static_cast<int>(s.batch);
  f.nL = static_cast<int>(g.chunks);
  f.nT = static_cast<int>(g.tiles);
  f.head_blocks = static_cast<int>(g.head_blocks);
  f.ddt_blocks = static_cast<int>(g.chunks * g.head_blocks * s.batch);
  ssd_init_finish_kernel<<<f.ddt_blocks + (H + 7) / 8, 256, 0, stream>>>(f);
  err = cudaGetLastError();
  if (err != cudaSuccess) return Status::Cuda("ssd_add_initial_state_backward: ddt, dA", err);
  return Status();
}

}  // namespace hcp::cuda
