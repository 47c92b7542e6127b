// The backward of context parallelism's initial-state correction of the Mamba2 SSD scan:
// ssd_add_initial_state_backward (SequenceKernels.h). The method, the tiling and launch 1 are in
// SsdInitialState.cuh; this file has launches 2 to 5 and the entry point.
#include "runtime/kernels/cuda/SsdInitialState.cuh"

namespace hcp::cuda {
namespace seq_detail {
namespace {

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
  const int32_t* positions;       // [B, S] packed documents, or null
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
    const float da = row_a < valid && reaches_entering_state(args.positions, b, S, t0 + row_a)
                         ? fast_exp(a_h * cum_a)
                         : 0.f;
    const float db = row_b < valid && reaches_entering_state(args.positions, b, S, t0 + row_b)
                         ? fast_exp(a_h * cum_b)
                         : 0.f;
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
                          const float* __restrict__ A, const int32_t* __restrict__ positions,
                          int64_t S, int64_t s_pad, int H, int G, int nT, int tiles_per_range,
                          int ranges) {
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
  uint32_t masked = 0;  // bit k: piece k's row is past the segment's first document start
  static_assert(kPieces <= 32);
  auto load_tile = [&](int jt, int stage) {
    const int64_t t0 = static_cast<int64_t>(jt) * kT;
    const int valid = static_cast<int>(S - t0 < kT ? S - t0 : kT);
    c_loader.load(Cs + stage * Sm::kCTile, Cm + ((static_cast<int64_t>(b) * S + t0) * G + g) * kN,
                  valid);
    cp_async_commit();
    masked = 0;
#pragma unroll
    for (int k = 0; k < kPieces; k++) {
      const int row = row0 + k * kRowStep;
      raw[k] = row < valid ? *reinterpret_cast<const uint4*>(dout_b + (t0 + row) * u_stride + col)
                           : make_uint4(0, 0, 0, 0);
      cv[k] = cum_h[t0 + row];  // t0 + row < s_pad
      if (!reaches_entering_state(positions, b, S, t0 + row)) masked |= 1u << k;
    }
  };
  // The decay is taken here, not at the load, so that the loads stay in flight meanwhile.
  auto store_tile = [&](int stage) {
#pragma unroll
    for (int k = 0; k < kPieces; k++) {
      const int row = row0 + k * kRowStep;
      const float d = masked & (1u << k) ? 0.f : fast_exp(a_h * cv[k]);
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

template <int P, int kHeads>
cudaError_t launch_dinit(cudaStream_t stream, float* dinit, const bf16* dout, const float* A,
                         const bf16* Cm, const int32_t* positions, const InitBuffers& buf,
                         const SsdShape& s, const InitGeometry& g) {
  const size_t smem = DinitSmem<P, kHeads>::kBytes;
  cudaError_t err =
      cudaFuncSetAttribute(ssd_init_dinit_kernel<P, kHeads>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  dim3 grid(static_cast<unsigned>(g.ranges), static_cast<unsigned>(s.heads / kHeads),
            static_cast<unsigned>(s.batch));
  ssd_init_dinit_kernel<P, kHeads><<<grid, DinitSmem<P, kHeads>::kThreads, smem, stream>>>(
      dinit, buf.dinit_part, buf.counters + s.batch * s.groups * g.tiles, dout, Cm, buf.cum, A,
      positions, s.seq, g.s_pad, static_cast<int>(s.heads), static_cast<int>(s.groups),
      static_cast<int>(g.tiles), g.tiles_per_range, g.ranges);
  return cudaGetLastError();
}

template <int P>
cudaError_t launch_backward_products(cudaStream_t stream, float* dinit, bf16* dCm, const bf16* dout,
                                     const float* A, const bf16* Cm, const int32_t* positions,
                                     const InitBuffers& buf, const SsdShape& s,
                                     const InitGeometry& g) {
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
    args.positions = positions;
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
  return g.dinit_heads == 2 ? launch_dinit<P, 2>(stream, dinit, dout, A, Cm, positions, buf, s, g)
                            : launch_dinit<P, 1>(stream, dinit, dout, A, Cm, positions, buf, s, g);
}

}  // namespace
}  // namespace seq_detail

size_t ssd_add_initial_state_backward_workspace_bytes(const SsdShape& s) {
  if (!seq_detail::init_state_supported(s)) return 0;
  const seq_detail::InitGeometry g = seq_detail::init_geometry(s);
  return seq_detail::init_buffers(s, g, /*backward=*/true, nullptr, nullptr);
}

Status ssd_add_initial_state_backward(cudaStream_t stream, float* ddt, float* dA, bf16* dCm,
                                      float* dinit_state, const bf16* dout, const float* dt,
                                      const float* A, const bf16* Cm, const float* init_state,
                                      const SsdShape& s, Workspace workspace,
                                      const int32_t* positions) {
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
  err = s.head_dim == 64 ? launch_backward_products<64>(stream, dinit_state, dCm, dout, A, Cm,
                                                        positions, buf, s, g)
                         : launch_backward_products<32>(stream, dinit_state, dCm, dout, A, Cm,
                                                        positions, buf, s, g);
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
