// What the two halves of the initial-state correction share (SsdInitialState.cu, the forward;
// SsdInitialStateBackward.cu, the backward): the method, the tiling constants, the workspace
// layout, launch 1 (prep, run by both), the wgmma helpers and the tile loaders.
//
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
// Packed documents (positions non-null): the decay d_t is zero from the segment's first document
// start on (reaches_entering_state), in launch 2 of the forward and launches 3 and 4 of the
// backward; w is then zero there, and with it those positions' ddt and dA terms.
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
#pragma once

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

// Packed documents: whether position t of batch row b (t < S) is before the segment's first
// document start, where the state entering the segment still reaches (positions[t] > t: t's
// document began before the segment). Always without documents (positions null), and past the
// row's end (whose rows are masked anyway).
__device__ __forceinline__ bool reaches_entering_state(const int32_t* positions, int64_t b,
                                                       int64_t S, int64_t t) {
  return positions == nullptr || t >= S || positions[b * S + t] > t;
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
inline InitGeometry init_geometry(const SsdShape& s) {
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
inline size_t init_counters(const SsdShape& s, const InitGeometry& g) {
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

inline size_t init_buffers(const SsdShape& s, const InitGeometry& g, bool backward,
                           InitBuffers* out, void* base) {
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
// Host side.

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// The scan's supported shapes (SequenceKernels.h) without its chunk condition, plus grid limits.
inline bool init_state_supported(const SsdShape& s) {
  SsdShape t = s;
  t.chunk = kSsdChunk;
  if (!ssd_supported(t)) return false;
  const InitGeometry g = init_geometry(s);
  return g.tiles <= INT_MAX / 2 && g.chunks * g.head_blocks * s.batch <= INT_MAX / 2 &&
         s.batch * s.heads * s.head_dim * s.state / 2048 <= INT_MAX / 2 && s.batch <= 65535;
}

// One prep launch: the dt totals, and (s16 non-null) init_state as bf16.
inline cudaError_t launch_prep(cudaStream_t stream, const InitBuffers& buf, const float* dt,
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

}  // namespace
}  // namespace seq_detail
}  // namespace hcp::cuda
