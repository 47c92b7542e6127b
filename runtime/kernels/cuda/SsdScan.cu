// Mamba2 SSD scan on the GPU, forward, and the kernels the backward shares with it.
//
// The chunked algorithm of mamba_ssm (and of the CPU oracle, runtime/kernels/cpu/SsdScan.cpp), in
// five launches, chunk Q = 256, head_dim P, state N = 128, nc = ceil(seq / Q) chunks:
//   1. ssd_cumsum_kernel        acs = inclusive cumsum of dt*A within each chunk, and dt itself,
//                               both [B,H,nc,Q] fp32, padded past the sequence with dt = 0 (so a
//                               partial last chunk behaves exactly like the oracle's short chunk).
//   2. ssd_chunk_outer_kernel   the state each chunk produces from zero,
//                               s_c = sum_l (exp(acs_last - acs_l) dt_l x_l)^T B_l   (P x N),
//                               a Q-deep tensor-core product per (b, c, h); a block serves
//                               several heads of one group, reading their shared B once.
//   3. ssd_state_passing_kernel H_0 = init, H_{c+1} = exp(acs_last^(c)) H_c + s_c, sequential over
//                               chunks, parallel over (b, h, p, n); in place, so the buffer ends
//                               up holding the state ENTERING each chunk; H_nc is the final state.
//   4. ssd_chunk_cb_kernel      CB[l,s] = C_l . B_s per (b, c, g), fp32, the lower-triangular
//                               64 x 64 tiles: once per group, since every head of the group reads
//                               the same scores (Granite has one group for all its heads).
//   5. ssd_chunk_scan_kernel    y_l = sum_{s<=l} CB[l,s] exp(acs_l - acs_s) dt_s x_s
//                                     + exp(acs_l) H_c C_l + D x_l,
//                               flash-attention style: one block per (b, c, h, 128-row tile);
//                               each warp reads its 16 rows of C as A fragments from shared memory,
//                               does the incoming-state term (C H_c^T) first, then walks 64-wide
//                               column tiles of x up to the diagonal (double-buffered with
//                               cp.async): the scores from CB (L2-resident: the blocks of one chunk
//                               run together), times the decay and dt in fp32, masked, packed to
//                               bf16 and multiplied by x on the tensor cores.
//                               The backward runs the same kernel transposed for dx (dir = 1).
// ssd_final_state_forward (context parallelism's segment summary) runs launches 1-3 only.
// Packed documents (positions): launches 2, 3 and 5 zero every decay that crosses a document
// start (chunk_document_start, SequenceDetail.cuh); launches 1 and 4 are unchanged.
// Precision: every product has bf16 operands and fp32 accumulators; x is scaled by its fp32
// weight BEFORE rounding to bf16 (kernel 2), the decayed scores are rounded once (kernel 5), and
// the fp32 entering state is rounded to bf16 as a product operand (kernel 5), as mamba_ssm does.
// dt, the cumsums, the scores, the decays, the states and their passing stay fp32.
//
// Cost at granite-4.0-h-tiny shapes (48 heads x 64, N = 128, s = 65536, batch 1): kernel 2 is
// 52 GFLOP, kernel 4 2.7 GFLOP (10 of the 16 tiles of each chunk's scores), kernel 5 about
// 115 GFLOP (the decayed scores times x, and the state term), kernels 3 and 1 move ~0.8 GB (fp32
// states in and out), kernel 4 writes 64 MB of scores that kernel 5 reads once per head from L2.
// x is read twice and y written once. Kernel 5 is bound by its loads (L1 at 70% of its peak, L2
// at 62%, the tensor cores far from theirs, on an H100 at s = 8192), not by its products.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "runtime/kernels/cuda/SequenceDetail.cuh"
#include "runtime/kernels/cuda/SequenceKernels.h"
#include "runtime/kernels/cuda/SsdHeadSlices.h"

namespace hcp::cuda {
namespace seq_detail {
namespace {

constexpr int kQ = kSsdChunk;
constexpr int kN = kSsdState;

__device__ __forceinline__ float bf2f(__nv_bfloat16 v) { return __bfloat162float(v); }

// ---------------------------------------------------------------------------------------------
// 1. Chunk cumsum. grid (nc, ceil(H / 8), B), 256 threads: warp w does head blockIdx.y * 8 + w,
// each lane 8 consecutive positions (a local scan, then a warp scan of the lane totals).
__global__ void __launch_bounds__(256)
    ssd_cumsum_kernel(float* __restrict__ acs, float* __restrict__ dtc,
                      const float* __restrict__ dt, const float* __restrict__ A, int64_t S, int H,
                      int nc) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int c = blockIdx.x, h = blockIdx.y * 8 + warp, b = blockIdx.z;
  if (h >= H) return;
  const float a = A[h];
  const int64_t t0 = static_cast<int64_t>(c) * kQ + lane * 8;
  float v[8], cs[8];
  float run = 0.f;
#pragma unroll
  for (int i = 0; i < 8; i++) {
    const int64_t t = t0 + i;
    v[i] = t < S ? dt[(static_cast<int64_t>(b) * S + t) * H + h] : 0.f;
    run += v[i] * a;
    cs[i] = run;
  }
  float incl = run;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const float n = __shfl_up_sync(0xffffffffu, incl, off);
    if (lane >= off) incl += n;
  }
  float excl = __shfl_up_sync(0xffffffffu, incl, 1);
  if (lane == 0) excl = 0.f;
  const int64_t o = ((static_cast<int64_t>(b) * H + h) * nc + c) * kQ + lane * 8;
  float4* acs4 = reinterpret_cast<float4*>(acs + o);
  float4* dt4 = reinterpret_cast<float4*>(dtc + o);
  acs4[0] = make_float4(cs[0] + excl, cs[1] + excl, cs[2] + excl, cs[3] + excl);
  acs4[1] = make_float4(cs[4] + excl, cs[5] + excl, cs[6] + excl, cs[7] + excl);
  dt4[0] = make_float4(v[0], v[1], v[2], v[3]);
  dt4[1] = make_float4(v[4], v[5], v[6], v[7]);
}

// ---------------------------------------------------------------------------------------------
// 2. out[b,h,c] (P x N fp32) = sum_l (w_l U_l)^T V_l. grid (nc, H / heads_per_block, B), 256
// threads = 8 warps in a 2 (P) x 4 (N) arrangement, each a (P/2) x 32 tile of the output, k over
// the chunk's 256 rows. A block serves heads_per_block heads of one group, one after another:
// V (B or C, shared by the group's heads) is copied once with cp.async, and each head's U is
// scaled by its w in fp32 on its way to shared memory, the next head's U loaded meanwhile.
template <int P>
__global__ void __launch_bounds__(256, 2)
    ssd_chunk_outer_kernel(int kind, float* __restrict__ out, const bf16* __restrict__ U,
                           const bf16* __restrict__ V, const float* __restrict__ acs,
                           const float* __restrict__ dtc, const int32_t* __restrict__ positions,
                           int64_t S, int H, int G, int nc, int heads_per_block) {
  constexpr int kLdU = P + 8, kLdV = kN + 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* Us = reinterpret_cast<bf16*>(smem_raw);  // [Q][kLdU]
  bf16* Vs = Us + kQ * kLdU;                     // [Q][kLdV]
  float* w = reinterpret_cast<float*>(Vs + kQ * kLdV);

  const int c = blockIdx.x, h0 = blockIdx.y * heads_per_block, b = blockIdx.z;
  const int g = h0 / (H / G);
  const int64_t t0 = static_cast<int64_t>(c) * kQ;
  const int valid = static_cast<int>((S - t0 < kQ ? S - t0 : kQ));

  tile_load_async<kQ, kN, 256>(Vs, V + ((static_cast<int64_t>(b) * S + t0) * G + g) * kN,
                               static_cast<int64_t>(G) * kN, valid);
  cp_async_commit();

  // Every load of a head's U is issued before the first is used (a loop that loads, scales and
  // stores one 16-byte piece at a time waits out the memory latency once per piece).
  constexpr int kChunksPerRow = P / 8, kPieces = kQ * kChunksPerRow / 256;
  uint4 raw[kPieces];
  auto load_u = [&](int h) {
#pragma unroll
    for (int k = 0; k < kPieces; k++) {
      const int i = threadIdx.x + k * 256;
      const int r = i / kChunksPerRow, col = (i % kChunksPerRow) * 8;
      raw[k] = r < valid ? *reinterpret_cast<const uint4*>(
                               U + ((static_cast<int64_t>(b) * S + t0 + r) * H + h) * P + col)
                         : make_uint4(0, 0, 0, 0);
    }
  };
  load_u(h0);

  constexpr int kWm = P / 2, kMt = kWm / 16, kWn = kN / 4, kNt = kWn / 8;
  const int warp = threadIdx.x >> 5, wm = warp & 1, wn = warp >> 1;
  const int lane = threadIdx.x & 31, gq = lane >> 2, tq = lane & 3;
  for (int h = h0; h < h0 + heads_per_block; h++) {
    const int64_t cb = ((static_cast<int64_t>(b) * H + h) * nc + c) * kQ;
    {
      const int l = threadIdx.x;
      const float a = acs[cb + l];
      float wl = kind == 0 ? fast_exp(acs[cb + kQ - 1] - a) * dtc[cb + l] : fast_exp(a);
      if (positions != nullptr) {
        // kind 0: l reaches the chunk's end; kind 1: the entering state reaches l.
        const bool reaches = kind == 0
                                 ? l >= chunk_document_start(positions, b, S, t0, valid - 1, valid)
                                 : chunk_document_start(positions, b, S, t0, l, valid) < 0;
        if (!reaches) wl = 0.f;
      }
      w[l] = wl;
    }
    __syncthreads();  // w written; the previous head's products done with Us
#pragma unroll
    for (int k = 0; k < kPieces; k++) {
      const int i = threadIdx.x + k * 256;
      const int r = i / kChunksPerRow, col = (i % kChunksPerRow) * 8;
      const bf16* e = reinterpret_cast<const bf16*>(&raw[k]);
      const float wr = w[r];
      uint4 o;
      o.x = pack_bf16(bf2f(e[0]) * wr, bf2f(e[1]) * wr);
      o.y = pack_bf16(bf2f(e[2]) * wr, bf2f(e[3]) * wr);
      o.z = pack_bf16(bf2f(e[4]) * wr, bf2f(e[5]) * wr);
      o.w = pack_bf16(bf2f(e[6]) * wr, bf2f(e[7]) * wr);
      *reinterpret_cast<uint4*>(Us + r * kLdU + col) = o;
    }
    if (h + 1 < h0 + heads_per_block) load_u(h + 1);
    cp_async_wait<0>();
    __syncthreads();

    float acc[kMt][kNt][4] = {};
    for (int k0 = 0; k0 < kQ; k0 += 16) {
      uint32_t a[kMt][4];
#pragma unroll
      for (int mt = 0; mt < kMt; mt++) load_a_km(a[mt], Us, kLdU, wm * kWm + mt * 16, k0);
#pragma unroll
      for (int np = 0; np < kNt / 2; np++) {
        uint32_t bb[4];
        load_b_kn(bb, Vs, kLdV, wn * kWn + np * 16, k0);
#pragma unroll
        for (int mt = 0; mt < kMt; mt++) {
          mma_bf16(acc[mt][2 * np], a[mt], bb[0], bb[1]);
          mma_bf16(acc[mt][2 * np + 1], a[mt], bb[2], bb[3]);
        }
      }
    }

    float* o = out + (((static_cast<int64_t>(b) * H + h) * nc + c) * P) * kN;
#pragma unroll
    for (int mt = 0; mt < kMt; mt++) {
#pragma unroll
      for (int nt = 0; nt < kNt; nt++) {
        const int row = wm * kWm + mt * 16 + gq, col = wn * kWn + nt * 8 + 2 * tq;
        *reinterpret_cast<float2*>(o + row * kN + col) =
            make_float2(acc[mt][nt][0], acc[mt][nt][1]);
        *reinterpret_cast<float2*>(o + (row + 8) * kN + col) =
            make_float2(acc[mt][nt][2], acc[mt][nt][3]);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// 3. Forward state passing, in place. grid (P*N / 1024, H, B), 256 threads, 4 consecutive state
// elements per thread; chunks in groups of 4 so that 4 independent loads are in flight. With
// positions, no state passes through a chunk in which a document starts.
__global__ void __launch_bounds__(256)
    ssd_state_passing_kernel(float* __restrict__ st, float* __restrict__ final_state,
                             const float* __restrict__ init, const float* __restrict__ acs,
                             const int32_t* __restrict__ positions, int64_t S, int H, int nc,
                             int PN) {
  const int h = blockIdx.y, b = blockIdx.z;
  const int64_t bh = static_cast<int64_t>(b) * H + h;
  const int e = (blockIdx.x * 256 + threadIdx.x) * 4;
  float4 carry = init != nullptr ? *reinterpret_cast<const float4*>(init + bh * PN + e)
                                 : make_float4(0.f, 0.f, 0.f, 0.f);
  float* base = st + bh * nc * PN + e;
  const float* alast = acs + bh * nc * kQ + (kQ - 1);
  for (int c0 = 0; c0 < nc; c0 += 4) {
    float4 s[4];
    float dec[4];
#pragma unroll
    for (int u = 0; u < 4; u++) {
      if (c0 + u < nc) {
        s[u] = *reinterpret_cast<const float4*>(base + static_cast<int64_t>(c0 + u) * PN);
        dec[u] = alast[static_cast<int64_t>(c0 + u) * kQ];
      }
    }
#pragma unroll
    for (int u = 0; u < 4; u++) {
      if (c0 + u < nc) {
        *reinterpret_cast<float4*>(base + static_cast<int64_t>(c0 + u) * PN) = carry;
        const float d = passes_through_chunk(positions, b, S, c0 + u) ? fast_exp(dec[u]) : 0.f;
        carry = make_float4(fmaf(d, carry.x, s[u].x), fmaf(d, carry.y, s[u].y),
                            fmaf(d, carry.z, s[u].z), fmaf(d, carry.w, s[u].w));
      }
    }
  }
  if (final_state != nullptr) *reinterpret_cast<float4*>(final_state + bh * PN + e) = carry;
}

// ---------------------------------------------------------------------------------------------
// 4. CB[l,s] = C_l . B_s for the lower-triangular 64 x 64 tile pairs (tile of l >= tile of s).
// grid (kSsdTilePairs, nc, B * G), 128 threads = 4 warps x 16 rows of one tile, K = N. Positions
// past the sequence read as zero (so their scores are 0).
constexpr int kCbTile = kSsdTile;

__global__ void __launch_bounds__(128)
    ssd_chunk_cb_kernel(float* __restrict__ cb, const bf16* __restrict__ Cm,
                        const bf16* __restrict__ Bm, int64_t S, int G, int nc) {
  constexpr int kLd = kN + 8;
  __shared__ __align__(16) bf16 Cs[kCbTile * kLd];
  __shared__ __align__(16) bf16 Bs[kCbTile * kLd];
  int lt, st;
  ssd_tile_pair(static_cast<int>(blockIdx.x), lt, st);
  const int c = blockIdx.y, b = blockIdx.z / G, g = blockIdx.z % G;
  const int64_t t0 = static_cast<int64_t>(c) * kQ;
  const int valid = static_cast<int>(S - t0 < kQ ? S - t0 : kQ);
  const int l0 = lt * kCbTile, s0 = st * kCbTile;
  const int64_t stride = static_cast<int64_t>(G) * kN;
  tile_load_async<kCbTile, kN, 128>(Cs, Cm + ((static_cast<int64_t>(b) * S + t0 + l0) * G + g) * kN,
                                    stride, valid - l0);
  tile_load_async<kCbTile, kN, 128>(Bs, Bm + ((static_cast<int64_t>(b) * S + t0 + s0) * G + g) * kN,
                                    stride, valid - s0);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gq = lane >> 2, tq = lane & 3;
  float acc[8][4] = {};
  warp_product_16x64<kN>(acc, Cs, kLd, warp * 16, Bs, kLd);
  float* o = cb + ((static_cast<int64_t>(b) * G + g) * nc + c) * kQ * kQ +
             static_cast<int64_t>(l0 + warp * 16 + gq) * kQ + s0 + 2 * tq;
#pragma unroll
  for (int nt = 0; nt < 8; nt++) {
    *reinterpret_cast<float2*>(o + nt * 8) = make_float2(acc[nt][0], acc[nt][1]);
    *reinterpret_cast<float2*>(o + 8 * kQ + nt * 8) = make_float2(acc[nt][2], acc[nt][3]);
  }
}

// ---------------------------------------------------------------------------------------------
// 5. The chunk scan, forward (kDir = 0) and its transpose for the backward's dx (kDir = 1).
// Rows r and columns j are positions within one chunk c of one head h:
//   kDir 0: acc[r][p] = exp(a_r) (C_r . H_c[p]) + sum_{j <= r} (C_r . B_j) exp(a_r - a_j) dt_j
//   x_j[p]
//           y_r = acc_r + D x_r
//   kDir 1: acc[r][p] = exp(a_last - a_r) (B_r . G_c[p]) + sum_{j >= r} (B_r . C_j) exp(a_j - a_r)
//   dy_j[p]
//           dx_r = dt_r acc_r + D dy_r,  ddt_part_r = acc_r . x_r,  dD_part += dy . x
// (G_c = gradient of the state leaving chunk c.) In both, R = row vectors, U = column values, the
// scores C_r . B_j (dir 0) or B_r . C_j = CB[j][r] (dir 1) come from CB, and every exponent is
// (later cumsum - earlier cumsum) <= 0.
// kDir 1 with args.dy null is the backward without an output gradient (ssd_final_state's: dy = 0):
// only the state term, so no column tiles, no D dy and no dD partials (args.dD_part unused).
// grid (H, 2 * nc, B) (heads fastest, so the blocks sharing one chunk's B / C run together), 256
// threads = 8 warps x 16 rows = one 128-row tile; column tiles are 64 wide.
constexpr int kScanRows = 128, kScanCols = 64, kScanThreads = 256;

template <int P>
struct ScanSmem {
  // acs, dt and the documents' chunk-relative starts [kQ] each; 16 floats for the dD reduction
  // (all before the bf16 tiles, 16-byte aligned).
  static constexpr size_t kHead = (3 * kQ + 16) * sizeof(float);
  static constexpr int kLdN = kN + 8, kLdP = P + 8;
  static constexpr int kR = kScanRows * kLdN;  // R rows (bf16)
  static constexpr int kS = P * kLdN;          // state as bf16 [P][N]
  static constexpr int kU = kScanCols * kLdP;  // one stage of U
  static constexpr size_t kBytes = kHead + sizeof(bf16) * (kR + kS + 2 * kU);
};

template <int kDir, int P>
__global__ void __launch_bounds__(kScanThreads, 2)
    ssd_chunk_scan_kernel(SsdScanArgs args, int64_t S, int H, int G, int nc) {
  using Sm = ScanSmem<P>;
  constexpr int kLdN = Sm::kLdN, kLdP = Sm::kLdP;
  constexpr int kKn = kN / 16;  // k steps over the state dimension
  constexpr int kPt = P / 8;    // 8-column tiles of the output
  extern __shared__ __align__(16) unsigned char smem_raw[];
  float* a_s = reinterpret_cast<float*>(smem_raw);
  float* dt_s = a_s + kQ;
  float* red = dt_s + kQ;                           // 16 floats for the dD reduction
  int* start_s = reinterpret_cast<int*>(red + 16);  // chunk_document_start of each position
  bf16* Rs = reinterpret_cast<bf16*>(smem_raw + Sm::kHead);
  bf16* Ss = Rs + Sm::kR;
  bf16* Us = Ss + Sm::kS;  // 2 stages

  const int h = blockIdx.x, c = blockIdx.y >> 1, rt = blockIdx.y & 1, b = blockIdx.z;
  const int g = h / (H / G);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gq = lane >> 2, tq = lane & 3;
  const int64_t t0 = static_cast<int64_t>(c) * kQ;
  const int valid = static_cast<int>((S - t0 < kQ ? S - t0 : kQ));
  const int r0 = rt * kScanRows;  // first row of this block, chunk-relative
  const int64_t bh = static_cast<int64_t>(b) * H + h;
  const int64_t cb = (bh * nc + c) * kQ;

  // Column tiles: forward up to the diagonal, backward from it; none past the sequence's end,
  // and none without dy (their values U would be dy: all zero).
  const bool has_dy = kDir == 0 || args.dy != nullptr;
  const int valid_tiles = (valid + kScanCols - 1) / kScanCols;
  int jt_begin, jt_end;
  if (kDir == 0) {
    jt_begin = 0;
    jt_end = min((r0 + kScanRows) / kScanCols, valid_tiles);
  } else {
    jt_begin = r0 / kScanCols;
    jt_end = has_dy ? valid_tiles : jt_begin;
  }
  const int64_t bc_row_stride = static_cast<int64_t>(G) * kN;
  const bf16* Rg = args.R + ((static_cast<int64_t>(b) * S + t0) * G + g) * kN;
  const float* cb_chunk = args.cb + ((static_cast<int64_t>(b) * G + g) * nc + c) * kQ * kQ;
  const int64_t u_row_stride = static_cast<int64_t>(H) * P;
  const bf16* Ug = args.U + ((static_cast<int64_t>(b) * S + t0) * H + h) * P;

  // Stage 0: this block's rows of R; then the first column tile.
  tile_load_async<kScanRows, kN, kScanThreads>(Rs, Rg + r0 * bc_row_stride, bc_row_stride,
                                               valid - r0);
  cp_async_commit();
  auto load_tile = [&](int jt, int stage) {
    const int j0 = jt * kScanCols;
    tile_load_async<kScanCols, P, kScanThreads>(Us + stage * Sm::kU, Ug + j0 * u_row_stride,
                                                u_row_stride, valid - j0);
  };
  if (jt_begin < jt_end) load_tile(jt_begin, 0);
  cp_async_commit();

  const bool documents = args.positions != nullptr;
  for (int l = threadIdx.x; l < kQ; l += kScanThreads) {
    a_s[l] = args.acs[cb + l];
    dt_s[l] = args.dtc[cb + l];
    start_s[l] = chunk_document_start(args.positions, b, S, t0, l, valid);
  }
  stage_state_bf16<P, kScanThreads>(Ss, args.state + (bh * nc + c) * P * kN);
  cp_async_wait<1>();
  __syncthreads();

  // This warp's 16 rows of R are A fragments read from shared memory at every k step (keeping
  // them in registers, 32 more per thread, spills at 2 blocks of 256 threads per SM).
  const int wr0 = r0 + warp * 16;  // chunk-relative first row of this warp

  // Incoming-state term.
  float acc[kPt][4] = {};
#pragma unroll
  for (int k = 0; k < kKn; k++) {
    uint32_t ra[4];
    load_a_mk(ra, Rs, kLdN, warp * 16, k * 16);
#pragma unroll
    for (int np = 0; np < kPt / 2; np++) {
      uint32_t bb[4];
      load_b_nk(bb, Ss, kLdN, np * 16, k * 16);
      mma_bf16(acc[2 * np], ra, bb[0], bb[1]);
      mma_bf16(acc[2 * np + 1], ra, bb[2], bb[3]);
    }
  }
  const int row_a = wr0 + gq, row_b = row_a + 8;
  const float a_last = a_s[kQ - 1];
  const int start_a = start_s[row_a], start_b = start_s[row_b], start_last = start_s[valid - 1];
  {
    // The entering state reaches the row (forward), or the row the chunk's end (backward).
    const bool reach_a = kDir == 0 ? start_a < 0 : row_a >= start_last;
    const bool reach_b = kDir == 0 ? start_b < 0 : row_b >= start_last;
    float fa = kDir == 0 ? fast_exp(a_s[row_a]) : fast_exp(a_last - a_s[row_a]);
    float fb = kDir == 0 ? fast_exp(a_s[row_b]) : fast_exp(a_last - a_s[row_b]);
    if (documents) {
      fa = reach_a ? fa : 0.f;
      fb = reach_b ? fb : 0.f;
    }
#pragma unroll
    for (int nt = 0; nt < kPt; nt++) {
      acc[nt][0] *= fa;
      acc[nt][1] *= fa;
      acc[nt][2] *= fb;
      acc[nt][3] *= fb;
    }
  }
  const float a_row_a = a_s[row_a], a_row_b = a_s[row_b];

  // Quadratic (chunk-local) term over the column tiles.
  for (int jt = jt_begin; jt < jt_end; jt++) {
    const int stage = (jt - jt_begin) & 1;
    if (jt + 1 < jt_end) load_tile(jt + 1, stage ^ 1);
    cp_async_commit();

    const int j0 = jt * kScanCols;
    const bool active = kDir == 0 ? (j0 <= wr0 + 15) : (j0 + kScanCols - 1 >= wr0);
    // This warp's scores, in the accumulator layout (rows row_a / row_b, columns
    // j0 + nt * 8 + 2 * tq + {0, 1}), loaded before the wait so that the loads overlap it.
    float sc[8][4];
    if (active && kDir == 0) {
      load_score_rows(sc, cb_chunk + row_a * kQ + j0 + 2 * tq);
    } else if (active) {
      // The transpose: B_r . C_j = CB[j][r].
#pragma unroll
      for (int nt = 0; nt < 8; nt++) {
        const int col = j0 + nt * 8 + 2 * tq;
        sc[nt][0] = __ldg(cb_chunk + col * kQ + row_a);
        sc[nt][1] = __ldg(cb_chunk + (col + 1) * kQ + row_a);
        sc[nt][2] = __ldg(cb_chunk + col * kQ + row_b);
        sc[nt][3] = __ldg(cb_chunk + (col + 1) * kQ + row_b);
      }
    }
    cp_async_wait<1>();
    __syncthreads();

    if (active) {
      const bf16* Ut = Us + stage * Sm::kU;
      // Decay (and dt for the forward), causal mask.
#pragma unroll
      for (int nt = 0; nt < 8; nt++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int row = e < 2 ? row_a : row_b;
          const float a_row = e < 2 ? a_row_a : a_row_b;
          const int col = j0 + nt * 8 + 2 * tq + (e & 1);
          float w;
          bool keep;
          if (kDir == 0) {
            keep = col <= row;
            if (documents) keep = keep && col >= (e < 2 ? start_a : start_b);
            w = fast_exp(a_row - a_s[col]) * dt_s[col];
          } else {
            keep = col >= row;
            if (documents) keep = keep && row >= start_s[col];
            w = fast_exp(a_s[col] - a_row);
          }
          sc[nt][e] = keep ? sc[nt][e] * w : 0.f;
        }
      }
#pragma unroll
      for (int kk = 0; kk < 4; kk++) {
        uint32_t pa[4];
        acc_to_a(pa, sc[2 * kk], sc[2 * kk + 1]);
#pragma unroll
        for (int np = 0; np < kPt / 2; np++) {
          uint32_t bb[4];
          load_b_kn(bb, Ut, kLdP, np * 16, kk * 16);
          mma_bf16(acc[2 * np], pa, bb[0], bb[1]);
          mma_bf16(acc[2 * np + 1], pa, bb[2], bb[3]);
        }
      }
    }
    __syncthreads();
  }

  // Epilogue.
  const float Dh = args.D != nullptr ? args.D[h] : 0.f;
  float ddt_a = 0.f, ddt_b = 0.f, dd = 0.f;
#pragma unroll
  for (int half = 0; half < 2; half++) {
    const int row = half == 0 ? row_a : row_b;
    const bool in_seq = row < valid;
    const int64_t xo = ((static_cast<int64_t>(b) * S + t0 + row) * H + h) * P;
#pragma unroll
    for (int nt = 0; nt < kPt; nt++) {
      const int p = nt * 8 + 2 * tq;
      const float v0 = acc[nt][2 * half], v1 = acc[nt][2 * half + 1];
      if (!in_seq) continue;
      const __nv_bfloat162 xv = *reinterpret_cast<const __nv_bfloat162*>(args.x + xo + p);
      const float x0 = __low2float(xv), x1 = __high2float(xv);
      uint32_t o;
      if (kDir == 0) {
        o = pack_bf16(v0 + Dh * x0, v1 + Dh * x1);
      } else {
        float g0 = 0.f, g1 = 0.f;
        if (has_dy) {
          const __nv_bfloat162 gv = *reinterpret_cast<const __nv_bfloat162*>(args.dy + xo + p);
          g0 = __low2float(gv);
          g1 = __high2float(gv);
        }
        const float dtr = dt_s[row];
        o = pack_bf16(dtr * v0 + Dh * g0, dtr * v1 + Dh * g1);
        const float part = v0 * x0 + v1 * x1;
        if (half == 0) {
          ddt_a += part;
        } else {
          ddt_b += part;
        }
        dd += g0 * x0 + g1 * x1;
      }
      *reinterpret_cast<uint32_t*>(args.out + xo + p) = o;
    }
  }
  if (kDir == 1) {
#pragma unroll
    for (int m = 1; m < 4; m <<= 1) {
      ddt_a += __shfl_xor_sync(0xffffffffu, ddt_a, m);
      ddt_b += __shfl_xor_sync(0xffffffffu, ddt_b, m);
    }
    if (tq == 0) {
      args.ddt_part[cb + row_a] = ddt_a;
      args.ddt_part[cb + row_b] = ddt_b;
    }
    if (has_dy) {  // uniform over the block
#pragma unroll
      for (int m = 1; m < 32; m <<= 1) dd += __shfl_xor_sync(0xffffffffu, dd, m);
      if (lane == 0) red[warp] = dd;
      __syncthreads();
      if (threadIdx.x == 0) {
        float s = 0.f;
        for (int w = 0; w < kScanThreads / 32; w++) s += red[w];
        args.dD_part[(bh * nc + c) * 2 + rt] = s;
      }
    }
  }
}

// How many heads a chunk_outer block serves (ssd_outer_heads_per_block), on this device: tiny
// (48 heads of 64, one group, 132 SMs) 6 at s = 8192 (256 blocks, one wave), 8 at s = 65536.
int chunk_outer_heads_per_block(int64_t blocks, int64_t group_heads, int64_t head_dim) {
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    sms = 132;
  }
  // Two blocks an SM: the kernel's launch bounds, and its shared memory (107 KB at P = 64).
  return ssd_outer_heads_per_block(blocks, group_heads, head_dim, kQ, kN, sms, 2);
}

template <int P>
cudaError_t launch_chunk_outer(cudaStream_t stream, int kind, float* out, const bf16* U,
                               const bf16* V, const SsdForwardBuffers& buf,
                               const int32_t* positions, const SsdShape& s) {
  const int nc = static_cast<int>(ssd_num_chunks(s));
  const size_t smem = sizeof(bf16) * (kQ * (P + 8) + kQ * (kN + 8)) + kQ * sizeof(float);
  cudaError_t err =
      cudaFuncSetAttribute(ssd_chunk_outer_kernel<P>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  const int per_block = chunk_outer_heads_per_block(nc * s.batch * s.groups, s.heads / s.groups, P);
  dim3 grid(nc, static_cast<unsigned>(s.heads / per_block), static_cast<unsigned>(s.batch));
  ssd_chunk_outer_kernel<P><<<grid, 256, smem, stream>>>(
      kind, out, U, V, buf.acs, buf.dtc, positions, s.seq, static_cast<int>(s.heads),
      static_cast<int>(s.groups), nc, per_block);
  return cudaGetLastError();
}

template <int kDir, int P>
cudaError_t launch_chunk_scan(cudaStream_t stream, const SsdScanArgs& args, const SsdShape& s) {
  const int nc = static_cast<int>(ssd_num_chunks(s));
  const size_t smem = ScanSmem<P>::kBytes;
  cudaError_t err =
      cudaFuncSetAttribute(ssd_chunk_scan_kernel<kDir, P>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  dim3 grid(static_cast<unsigned>(s.heads), static_cast<unsigned>(2 * nc),
            static_cast<unsigned>(s.batch));
  ssd_chunk_scan_kernel<kDir, P><<<grid, kScanThreads, smem, stream>>>(
      args, s.seq, static_cast<int>(s.heads), static_cast<int>(s.groups), nc);
  return cudaGetLastError();
}

}  // namespace

size_t ssd_forward_buffers_bytes(const SsdShape& s) {
  const size_t nc = static_cast<size_t>(ssd_num_chunks(s));
  const size_t bh = static_cast<size_t>(s.batch * s.heads);
  const size_t bg = static_cast<size_t>(s.batch * s.groups);
  return 2 * align_up(bh * nc * kQ * sizeof(float)) +
         align_up(bh * nc * static_cast<size_t>(s.head_dim * s.state) * sizeof(float)) +
         align_up(bg * nc * kQ * kQ * sizeof(float));
}

SsdForwardBuffers ssd_forward_buffers(const SsdShape& s, void* base) {
  const size_t nc = static_cast<size_t>(ssd_num_chunks(s));
  const size_t bh = static_cast<size_t>(s.batch * s.heads);
  char* p = static_cast<char*>(base);
  SsdForwardBuffers buf;
  buf.acs = reinterpret_cast<float*>(p);
  p += align_up(bh * nc * kQ * sizeof(float));
  buf.dtc = reinterpret_cast<float*>(p);
  p += align_up(bh * nc * kQ * sizeof(float));
  buf.states = reinterpret_cast<float*>(p);
  p += align_up(bh * nc * static_cast<size_t>(s.head_dim * s.state) * sizeof(float));
  buf.cb = reinterpret_cast<float*>(p);
  return buf;
}

cudaError_t ssd_chunk_cb(cudaStream_t stream, const SsdForwardBuffers& buf, const bf16* Cm,
                         const bf16* Bm, const SsdShape& s) {
  const int nc = static_cast<int>(ssd_num_chunks(s));
  dim3 grid(kSsdTilePairs, nc, static_cast<unsigned>(s.batch * s.groups));
  ssd_chunk_cb_kernel<<<grid, 128, 0, stream>>>(buf.cb, Cm, Bm, s.seq, static_cast<int>(s.groups),
                                                nc);
  return cudaGetLastError();
}

cudaError_t ssd_chunk_outer(cudaStream_t stream, int kind, float* out, const bf16* U, const bf16* V,
                            const SsdForwardBuffers& buf, const int32_t* positions,
                            const SsdShape& s) {
  if (s.head_dim == 64) return launch_chunk_outer<64>(stream, kind, out, U, V, buf, positions, s);
  return launch_chunk_outer<32>(stream, kind, out, U, V, buf, positions, s);
}

cudaError_t ssd_chunk_cumsum(cudaStream_t stream, const SsdForwardBuffers& buf, const float* dt,
                             const float* A, const SsdShape& s) {
  const int nc = static_cast<int>(ssd_num_chunks(s));
  const int H = static_cast<int>(s.heads);
  dim3 grid(nc, (H + 7) / 8, static_cast<unsigned>(s.batch));
  ssd_cumsum_kernel<<<grid, 256, 0, stream>>>(buf.acs, buf.dtc, dt, A, s.seq, H, nc);
  return cudaGetLastError();
}

cudaError_t ssd_forward_states(cudaStream_t stream, const SsdForwardBuffers& buf,
                               float* final_state, const bf16* x, const float* dt, const float* A,
                               const bf16* Bm, const float* init_state, const int32_t* positions,
                               const SsdShape& s) {
  const int nc = static_cast<int>(ssd_num_chunks(s));
  const int H = static_cast<int>(s.heads);
  cudaError_t err = ssd_chunk_cumsum(stream, buf, dt, A, s);
  if (err != cudaSuccess) return err;
  err = ssd_chunk_outer(stream, 0, buf.states, x, Bm, buf, positions, s);
  if (err != cudaSuccess) return err;
  const int PN = static_cast<int>(s.head_dim * s.state);
  dim3 g3(PN / 1024, H, static_cast<unsigned>(s.batch));
  ssd_state_passing_kernel<<<g3, 256, 0, stream>>>(buf.states, final_state, init_state, buf.acs,
                                                   positions, s.seq, H, nc, PN);
  return cudaGetLastError();
}

cudaError_t ssd_chunk_scan(cudaStream_t stream, int dir, const SsdScanArgs& args,
                           const SsdShape& s) {
  if (dir == 0) {
    if (s.head_dim == 64) return launch_chunk_scan<0, 64>(stream, args, s);
    return launch_chunk_scan<0, 32>(stream, args, s);
  }
  if (s.head_dim == 64) return launch_chunk_scan<1, 64>(stream, args, s);
  return launch_chunk_scan<1, 32>(stream, args, s);
}

}  // namespace seq_detail

bool ssd_supported(const SsdShape& s) {
  return s.batch >= 1 && s.seq >= 1 && s.heads >= 1 && s.groups >= 1 && s.heads % s.groups == 0 &&
         s.chunk == seq_detail::kSsdChunk && s.state == seq_detail::kSsdState &&
         (s.head_dim == 64 || s.head_dim == 32) && s.batch * s.groups <= 65535 &&
         s.heads <= 65535 && seq_detail::ssd_num_chunks(s) <= 32767;
}

size_t ssd_scan_forward_workspace_bytes(const SsdShape& s) {
  return seq_detail::ssd_forward_buffers_bytes(s);
}

size_t ssd_final_state_forward_workspace_bytes(const SsdShape& s) {
  return seq_detail::ssd_forward_buffers_bytes(s);
}

// Launches 1-3 of the scan: the states are all a final state needs; kernel 4 (y) is skipped.
Status ssd_final_state_forward(cudaStream_t stream, float* final_state, const bf16* x,
                               const float* dt, const float* A, const bf16* Bm, const SsdShape& s,
                               Workspace workspace, const int32_t* positions) {
  if (!ssd_supported(s)) {
    return Status("ssd_final_state_forward",
                  "unsupported shape (needs chunk 256, state 128, head_dim 32 or 64, "
                  "heads % groups == 0)");
  }
  if (workspace.bytes < ssd_final_state_forward_workspace_bytes(s) || workspace.ptr == nullptr) {
    return Status("ssd_final_state_forward", "workspace too small");
  }
  const seq_detail::SsdForwardBuffers buf = seq_detail::ssd_forward_buffers(s, workspace.ptr);
  const cudaError_t err = seq_detail::ssd_forward_states(stream, buf, final_state, x, dt, A, Bm,
                                                         /*init_state=*/nullptr, positions, s);
  if (err != cudaSuccess) return Status::Cuda("ssd_final_state_forward: states", err);
  return Status();
}

Status ssd_scan_forward(cudaStream_t stream, bf16* y, float* final_state, const bf16* x,
                        const float* dt, const float* A, const bf16* Bm, const bf16* Cm,
                        const float* D, const float* init_state, const SsdShape& s,
                        Workspace workspace, const int32_t* positions, float* chunk_states) {
  if (!ssd_supported(s)) {
    return Status("ssd_scan_forward",
                  "unsupported shape (needs chunk 256, state 128, head_dim 32 or 64, "
                  "heads % groups == 0)");
  }
  if (workspace.bytes < ssd_scan_forward_workspace_bytes(s) || workspace.ptr == nullptr) {
    return Status("ssd_scan_forward", "workspace too small");
  }
  seq_detail::SsdForwardBuffers buf = seq_detail::ssd_forward_buffers(s, workspace.ptr);
  if (chunk_states != nullptr) buf.states = chunk_states;  // kept for the backward
  cudaError_t err = seq_detail::ssd_forward_states(stream, buf, final_state, x, dt, A, Bm,
                                                   init_state, positions, s);
  if (err != cudaSuccess) return Status::Cuda("ssd_scan_forward: states", err);
  err = seq_detail::ssd_chunk_cb(stream, buf, Cm, Bm, s);
  if (err != cudaSuccess) return Status::Cuda("ssd_scan_forward: scores", err);
  seq_detail::SsdScanArgs args{};
  args.R = Cm;
  args.cb = buf.cb;
  args.U = x;
  args.state = buf.states;
  args.x = x;
  args.D = D;
  args.acs = buf.acs;
  args.dtc = buf.dtc;
  args.out = y;
  args.positions = positions;
  err = seq_detail::ssd_chunk_scan(stream, 0, args, s);
  if (err != cudaSuccess) return Status::Cuda("ssd_scan_forward: chunk scan", err);
  return Status();
}

}  // namespace hcp::cuda
