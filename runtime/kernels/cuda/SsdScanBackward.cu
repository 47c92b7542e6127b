// Mamba2 SSD scan on the GPU, backward: exact gradients by recomputation, deterministic (no
// atomics: every sum is gathered by one thread or one block in a fixed order).
//
// Per chunk c of head h, with positions l (rows, "queries") and s (columns, "keys") inside the
// chunk, a = acs (inclusive cumsum of dt*A), H_c the state entering the chunk, G_c the gradient of
// the state leaving it, dec[l,s] = exp(a_l - a_s) for s <= l, CB[l,s] = C_l . B_s:
//   G recursion   G_{nc-1} = dfinal,  G_{c-1} = exp(a_last^(c)) G_c + ds_c,
//                 ds_c = sum_l exp(a_l) dy_l^T C_l,  dinit = G_{-1}
//   dx_s   = dt_s [ sum_{l>=s} CB[l,s] dec[l,s] dy_l + exp(a_last - a_s) G_c B_s ] + D dy_s
//   W[l,s] = dec[l,s] dt_s (dy_l . x_s)                (per head; dCB = sum over the group's heads)
//   dC_l   = sum_{s<=l} dCB[l,s] B_s + sum_h exp(a_l) (dy_l H_c)            (summed over heads)
//   dB_s   = sum_{l>=s} dCB[l,s] C_l + sum_h exp(a_last - a_s) dt_s (x_s G_c)
//   da_l   = rowsum_l(W o CB) - colsum_l(W o CB) + (exp(a_l) dy_l H_c) . C_l
//            - (exp(a_last - a_l) dt_l x_l G_c) . B_l
//            + [l = last] ( sum_s (exp(a_last - a_s) dt_s x_s G_c) . B_s + exp(a_last) <G_c, H_c> )
//   ddt_s  = x_s . (dx_s - D dy_s) / dt_s  (computed without the division)  + A sum_{l>=s} da_l
//   dA     = sum_s dt_s sum_{l>=s} da_l,   dD = sum dy . x
// Launches (after recomputing acs and dt, and the entering states H_c with the forward's kernels
// unless the forward kept them, chunk_states):
//   1. chunk_outer(kind 1)     ds_c per (b, c, h)                          [SsdScan.cu]
//   2. ssd_state_passing_bwd   G_c in place over ds_c; dinit; exp(a_last)<G_c, H_c> partials
//   3. chunk_cb, chunk_scan(dir 1)
//                              CB, then dx, the explicit part of ddt, dD partials  [SsdScan.cu]
//   4. ssd_dcb_kernel          dCB per (b, c, g) as 64x64 tiles, the sum over the group's heads of
//                              W (so the heavy Q x Q x N products of dB and dC run once per group,
//                              not per head, as in mamba_ssm), and the W o CB row / column sums
//   5. ssd_dbc_kernel (x2)     dC (mode 0) and dB (mode 1), 64 rows per block: the dCB product
//                              plus the per-head state terms, with their da parts
//   6. ssd_ddt_kernel          da -> reverse cumsum -> ddt; dA partials
//   7. ssd_reduce_kernel       dA and dD per head
// Cost at the tiny shape (s = 65536): launches 1 + 3 ~ 300 GFLOP, 4 ~ 70, 5 ~ 110, and about
// 2.5 GB of traffic (fp32 states and state gradients in and out): ~2-3 ms with the forward's
// recomputation, against mamba_ssm's 6.7 ms for its backward.
//
// ssd_final_state_backward (the gradient of a context-parallel segment's summary: the final state
// from a zero start) is the same with dy = 0 and H_c the zero-start states. Every dy term
// vanishes: ds_c = 0, so G_{nc-1} = dfinal, G_{c-1} = exp(a_last^(c)) G_c; W = 0, so dCB = 0 and
// the W o CB sums are 0; dC and dD are not wanted. What is left:
//   dx_s  = dt_s exp(a_last - a_s) G_c B_s
//   dB_s  = sum_h exp(a_last - a_s) dt_s (x_s G_c)
//   da_l  = - (exp(a_last - a_l) dt_l x_l G_c) . B_l
//           + [l = last] ( sum_s (exp(a_last - a_s) dt_s x_s G_c) . B_s + exp(a_last) <G_c, H_c> )
//   ddt_s = x_s . dx_s / dt_s + A sum_{l>=s} da_l,   dA = sum_s dt_s sum_{l>=s} da_l
// by the same launches in their dy-free modes: 2 without ds (G recursion, exp(a_last)<G_c, H_c>),
// 3 without column tiles (dx and the explicit ddt from the state term alone), 5 in mode 1 without
// dCB (dB and its da part), 6 without the dCB and dC parts of da, 7 without dD. Launches 1 and 4
// do not run, nor 5's dC: no Q x Q work at all.
//
// Packed documents (positions): every term above with a decay that crosses a document start is
// zero (chunk_document_start, SequenceDetail.cuh), in each launch that takes one: the G recursion
// (no gradient passes back through a chunk in which a document starts), ds_c, dx's two terms, W,
// dC's and dB's state terms and their da parts. The da identities hold term by term, so launch 6
// is unchanged.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "runtime/kernels/cuda/SequenceDetail.cuh"
#include "runtime/kernels/cuda/SequenceKernels.h"
#include "runtime/kernels/cuda/SsdHeadSlices.h"

namespace hcp::cuda {
namespace seq_detail {
namespace {

constexpr int kQ = kSsdChunk;
constexpr int kN = kSsdState;
constexpr int kT = kSsdTile;           // tile edge within a chunk: 64
constexpr int kTiles = kSsdTiles;      // 4
constexpr int kPairs = kSsdTilePairs;  // lower-triangular tile pairs (lt >= st): 10

// Backward workspace, after the forward's buffers.
struct SsdBackwardBuffers {
  SsdForwardBuffers fwd;
  float* gstates;   // [B,H,nc,P,N]  ds_c, then G_c in place
  float* dcb;       // [B,G,nc,Q,Q]  lower-triangular 64x64 tiles written
  float* da_pairs;  // [B,H,nc,kPairs,128]  row sums (0..63), column sums (64..127) of W o CB
  float* da_c;      // [B,H,nc,Q]
  float* da_b;      // [B,H,nc,Q]
  float* ddt_part;  // [B,H,nc,Q]
  float* da_pass;   // [B,H,nc,PN/128]
  float* dD_part;   // [B,H,nc,2]
  float* dA_part;   // [B,H,nc]
  float* dbc_part;  // [splits,B,S,G,N] the dB / dC sums of each slice of heads (splits > 1)
};

// ssd_dbc_kernel's slices of a group's heads (SsdHeadSlices.h).
static_assert(kTiles == kSsdDbcTilesPerChunk);
int dbc_head_splits(const SsdShape& s) {
  return ssd_dbc_head_slices(ssd_num_chunks(s), s.batch, s.groups, s.heads);
}

// Without dy (ssd_final_state_backward) the buffers only the dy terms fill (dcb, da_pairs, da_c,
// dD_part) take no space and stay null.
size_t backward_extra_bytes(const SsdShape& s, bool with_dy, SsdBackwardBuffers* out, void* base) {
  const size_t nc = static_cast<size_t>(ssd_num_chunks(s));
  const size_t bh = static_cast<size_t>(s.batch * s.heads);
  const size_t pn = static_cast<size_t>(s.head_dim * s.state);
  const size_t dy_only = with_dy ? 1 : 0;
  const int splits = dbc_head_splits(s);
  const size_t sizes[] = {
      bh * nc * pn,                                                      // gstates
      dy_only * static_cast<size_t>(s.batch * s.groups) * nc * kQ * kQ,  // dcb
      dy_only * bh * nc * kPairs * 128,                                  // da_pairs
      dy_only * bh * nc * kQ,                                            // da_c
      bh * nc * kQ,                                                      // da_b
      bh * nc * kQ,                                                      // ddt_part
      bh * nc * (pn / 128),                                              // da_pass
      dy_only * bh * nc * 2,                                             // dD_part
      bh * nc,                                                           // dA_part
      static_cast<size_t>(ssd_dbc_slice_floats(splits, s.batch, s.seq, s.groups, s.state)),
  };
  constexpr int kCount = sizeof(sizes) / sizeof(sizes[0]);
  float* dummy[kCount];
  float** slots[kCount];
  for (int i = 0; i < kCount; i++) slots[i] = &dummy[i];
  if (out != nullptr) {
    float** named[] = {&out->gstates, &out->dcb,      &out->da_pairs, &out->da_c,
                       &out->da_b,    &out->ddt_part, &out->da_pass,  &out->dD_part,
                       &out->dA_part, &out->dbc_part};
    static_assert(sizeof(named) / sizeof(named[0]) == kCount);
    for (int i = 0; i < kCount; i++) slots[i] = named[i];
  }
  size_t total = 0;
  for (int i = 0; i < kCount; i++) {
    *slots[i] = base != nullptr && sizes[i] > 0
                    ? reinterpret_cast<float*>(static_cast<char*>(base) + total)
                    : nullptr;
    total += align_up(sizes[i] * sizeof(float));
  }
  return total;
}

// ---------------------------------------------------------------------------------------------
// 2. Reverse state passing, in place over ds: on exit st[c] = G_c. grid (P*N / 1024, H, B), 256
// threads, 4 elements each. Also writes exp(a_last^(c)) <G_c, H_c> as one partial per warp
// (da_pass[b,h,c,warp_slot], warp_slot = element / 128) and dinit = G_{-1}. Without ds (dy = 0)
// st is only written: G_{c-1} = exp(a_last^(c)) G_c.
__global__ void __launch_bounds__(256)
    ssd_state_passing_bwd_kernel(float* __restrict__ st, float* __restrict__ dinit,
                                 float* __restrict__ da_pass, const float* __restrict__ dfinal,
                                 const float* __restrict__ fwd_states,
                                 const float* __restrict__ acs,
                                 const int32_t* __restrict__ positions, int64_t S, int H, int nc,
                                 int PN, bool has_ds) {
  const int h = blockIdx.y, b = blockIdx.z;
  const int64_t bh = static_cast<int64_t>(b) * H + h;
  const int e = (blockIdx.x * 256 + threadIdx.x) * 4;
  const int slots = PN / 128, slot = e / 128;
  float4 carry = dfinal != nullptr ? *reinterpret_cast<const float4*>(dfinal + bh * PN + e)
                                   : make_float4(0.f, 0.f, 0.f, 0.f);
  float* base = st + bh * nc * PN + e;
  const float* hbase = fwd_states + bh * nc * PN + e;
  const float* alast = acs + bh * nc * kQ + (kQ - 1);
  for (int c0 = nc - 1; c0 >= 0; c0 -= 4) {
    float4 d[4], hc[4];
    float dec[4];
#pragma unroll
    for (int u = 0; u < 4; u++) {
      const int c = c0 - u;
      if (c >= 0) {
        d[u] = has_ds ? *reinterpret_cast<const float4*>(base + static_cast<int64_t>(c) * PN)
                      : make_float4(0.f, 0.f, 0.f, 0.f);
        hc[u] = *reinterpret_cast<const float4*>(hbase + static_cast<int64_t>(c) * PN);
        dec[u] = passes_through_chunk(positions, b, S, c)
                     ? fast_exp(alast[static_cast<int64_t>(c) * kQ])
                     : 0.f;
      }
    }
#pragma unroll
    for (int u = 0; u < 4; u++) {
      const int c = c0 - u;
      if (c >= 0) {
        *reinterpret_cast<float4*>(base + static_cast<int64_t>(c) * PN) = carry;
        float part = carry.x * hc[u].x + carry.y * hc[u].y + carry.z * hc[u].z + carry.w * hc[u].w;
#pragma unroll
        for (int m = 1; m < 32; m <<= 1) part += __shfl_xor_sync(0xffffffffu, part, m);
        if ((threadIdx.x & 31) == 0) da_pass[(bh * nc + c) * slots + slot] = dec[u] * part;
        const float dd = dec[u];
        carry = make_float4(fmaf(dd, carry.x, d[u].x), fmaf(dd, carry.y, d[u].y),
                            fmaf(dd, carry.z, d[u].z), fmaf(dd, carry.w, d[u].w));
      }
    }
  }
  if (dinit != nullptr) *reinterpret_cast<float4*>(dinit + bh * PN + e) = carry;
}

// ---------------------------------------------------------------------------------------------
// 4. dCB tiles. grid (kPairs, nc, B * G), 128 threads = 4 warps x 16 rows of one 64x64 tile
// (rows l in tile lt, columns s in tile st <= lt). CB for the tile is read once from
// ssd_chunk_cb's scores and kept in registers; then for each head of the group (double-buffered
// with cp.async):
//   dP = dy_l x_s^T (K = P), W = dP dec dt_s (masked), dCB += W, and the row / column sums of
//   W o CB go to da_pairs (columns reduced over the 4 warps through shared memory).
template <int P>
struct DcbSmem {
  static constexpr int kLdP = P + 8;
  static constexpr int kStageBf = 2 * kT * kLdP;  // dy tile + x tile
  static constexpr int kStageF = 3 * kT;          // a rows, a cols, dt cols
  static constexpr size_t kBytes =
      sizeof(bf16) * 2 * kStageBf + sizeof(float) * (2 * kStageF + 4 * kT);
};

// kDocuments: positions non-null (a template parameter: the two row starts cost spills at the
// 168 registers of 3 blocks per SM otherwise).
template <int P, bool kDocuments>
__global__ void __launch_bounds__(128, 3)
    ssd_dcb_kernel(float* __restrict__ dcb, float* __restrict__ da_pairs,
                   const bf16* __restrict__ x, const bf16* __restrict__ dy,
                   const float* __restrict__ cb_scores, const float* __restrict__ acs,
                   const float* __restrict__ dtc, const int32_t* __restrict__ positions, int64_t S,
                   int H, int G, int nc) {
  using Sm = DcbSmem<P>;
  constexpr int kLdP = Sm::kLdP;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* stage_bf = reinterpret_cast<bf16*>(smem_raw);  // 2 stages of [dy tile][x tile]
  float* stage_f = reinterpret_cast<float*>(stage_bf + 2 * Sm::kStageBf);  // 2 x [al, as, dts]
  float* colbuf = stage_f + 2 * Sm::kStageF;                               // [4][64]

  int lt, st;
  ssd_tile_pair(static_cast<int>(blockIdx.x), lt, st);
  const int c = blockIdx.y, b = blockIdx.z / G, g = blockIdx.z % G;
  const int hg = H / G;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gq = lane >> 2, tq = lane & 3;
  const int64_t t0 = static_cast<int64_t>(c) * kQ;
  const int valid = static_cast<int>(S - t0 < kQ ? S - t0 : kQ);
  const int l0 = lt * kT, s0 = st * kT;

  const int64_t u_stride = static_cast<int64_t>(H) * P;
  auto load_head = [&](int hh, int stage) {
    const int h = g * hg + hh;
    bf16* dys = stage_bf + stage * Sm::kStageBf;
    bf16* xs = dys + kT * kLdP;
    tile_load_async<kT, P, 128>(dys, dy + ((static_cast<int64_t>(b) * S + t0 + l0) * H + h) * P,
                                u_stride, valid - l0);
    tile_load_async<kT, P, 128>(xs, x + ((static_cast<int64_t>(b) * S + t0 + s0) * H + h) * P,
                                u_stride, valid - s0);
    const int64_t cb = ((static_cast<int64_t>(b) * H + h) * nc + c) * kQ;
    float* f = stage_f + stage * Sm::kStageF;
    const int i = threadIdx.x;  // 48 16-byte chunks: a rows, a cols, dt cols
    if (i < 16) {
      cp_async16(f + i * 4, acs + cb + l0 + i * 4, true);
    } else if (i < 32) {
      cp_async16(f + kT + (i - 16) * 4, acs + cb + s0 + (i - 16) * 4, true);
    } else if (i < 48) {
      cp_async16(f + 2 * kT + (i - 32) * 4, dtc + cb + s0 + (i - 32) * 4, true);
    }
  };
  load_head(0, 0);
  cp_async_commit();

  // CB tile rows of this warp, in the accumulator layout of W below.
  float cbt[8][4];
  load_score_rows(cbt, cb_scores + ((static_cast<int64_t>(b) * G + g) * nc + c) * kQ * kQ +
                           static_cast<int64_t>(l0 + warp * 16 + gq) * kQ + s0 + 2 * tq);

  float acc[8][4] = {};
  const int row_a = warp * 16 + gq, row_b = row_a + 8;  // tile-relative
  // The rows' document starts, tile-relative (s reaches l iff s >= the start of l's document).
  const int start_a =
      kDocuments ? chunk_document_start(positions, b, S, t0, l0 + row_a, valid) - s0 : 0;
  const int start_b =
      kDocuments ? chunk_document_start(positions, b, S, t0, l0 + row_b, valid) - s0 : 0;
  for (int hh = 0; hh < hg; hh++) {
    const int stage = hh & 1;
    if (hh + 1 < hg) load_head(hh + 1, stage ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();

    const bf16* dys = stage_bf + stage * Sm::kStageBf;
    const bf16* xs = dys + kT * kLdP;
    const float* al = stage_f + stage * Sm::kStageF;
    const float* as = al + kT;
    const float* dts = as + kT;
    float dp[8][4] = {};
    warp_product_16x64<P>(dp, dys, kLdP, warp * 16, xs, kLdP);
    const float ala = al[row_a], alb = al[row_b];
    float rsum_a = 0.f, rsum_b = 0.f;
    float csum[8][2];
#pragma unroll
    for (int nt = 0; nt < 8; nt++) {
#pragma unroll
      for (int j = 0; j < 2; j++) {
        const int col = nt * 8 + 2 * tq + j;
        const float acol = as[col], dcol = dts[col];
        const bool keep_a = (lt > st || col <= row_a) && (!kDocuments || col >= start_a);
        const bool keep_b = (lt > st || col <= row_b) && (!kDocuments || col >= start_b);
        const float wa = keep_a ? dp[nt][j] * fast_exp(ala - acol) * dcol : 0.f;
        const float wb = keep_b ? dp[nt][2 + j] * fast_exp(alb - acol) * dcol : 0.f;
        acc[nt][j] += wa;
        acc[nt][2 + j] += wb;
        const float ca = wa * cbt[nt][j], cbv = wb * cbt[nt][2 + j];
        rsum_a += ca;
        rsum_b += cbv;
        csum[nt][j] = ca + cbv;
      }
    }
#pragma unroll
    for (int m = 1; m < 4; m <<= 1) {
      rsum_a += __shfl_xor_sync(0xffffffffu, rsum_a, m);
      rsum_b += __shfl_xor_sync(0xffffffffu, rsum_b, m);
    }
#pragma unroll
    for (int nt = 0; nt < 8; nt++) {
#pragma unroll
      for (int j = 0; j < 2; j++) {
#pragma unroll
        for (int m = 4; m < 32; m <<= 1)
          csum[nt][j] += __shfl_xor_sync(0xffffffffu, csum[nt][j], m);
      }
    }
    const int h = g * hg + hh;
    float* dap =
        da_pairs + ((((static_cast<int64_t>(b) * H + h) * nc + c) * kPairs + blockIdx.x) * 128);
    if (tq == 0) {
      dap[row_a] = rsum_a;
      dap[row_b] = rsum_b;
    }
    if (gq == 0) {
#pragma unroll
      for (int nt = 0; nt < 8; nt++) {
        colbuf[warp * kT + nt * 8 + 2 * tq] = csum[nt][0];
        colbuf[warp * kT + nt * 8 + 2 * tq + 1] = csum[nt][1];
      }
    }
    __syncthreads();
    if (threadIdx.x < kT) {
      const int col = threadIdx.x;
      dap[kT + col] =
          -(colbuf[col] + colbuf[kT + col] + colbuf[2 * kT + col] + colbuf[3 * kT + col]);
    }
  }

  float* out = dcb + ((static_cast<int64_t>(b) * G + g) * nc + c) * kQ * kQ;
#pragma unroll
  for (int nt = 0; nt < 8; nt++) {
    const int col = s0 + nt * 8 + 2 * tq;
    *reinterpret_cast<float2*>(out + (l0 + row_a) * kQ + col) = make_float2(acc[nt][0], acc[nt][1]);
    *reinterpret_cast<float2*>(out + (l0 + row_b) * kQ + col) = make_float2(acc[nt][2], acc[nt][3]);
  }
}

// ---------------------------------------------------------------------------------------------
// 5. dC (kMode 0, rows = positions l) and dB (kMode 1, rows = positions s), 64 rows per block,
// grid (kTiles, nc, B * G * splits), 128 threads = 4 warps x 16 rows, each row's 128 outputs in
// registers.
//   kMode 0: acc = sum_{st <= rt} dCB[rt, st] B[st]   + sum_h exp(a_l) (dy_h H_h)_l
//   kMode 1: acc = sum_{lt >= rt} dCB[lt, rt]^T C[lt] + sum_h exp(a_last - a_s) dt_s (x_h G_h)_s
// and per head the da part: mode 0 + (head term) . C_l -> da_c; mode 1 - (head term) . B_s -> da_b.
// dcb null (dy = 0, so dCB = 0): the head terms alone, and Zm is not read. With splits > 1 (see
// dbc_head_splits) block slice k sums the heads [k hg/splits, (k+1) hg/splits) of its group (slice
// 0 also the dCB product) into part[k] in fp32, and ssd_dbc_sum_kernel writes out.
template <int P>
struct DbcSmem {
  static constexpr int kLdN = kN + 8, kLdP = P + 8, kLdT = kT + 8;
  static constexpr size_t kBytes =
      sizeof(bf16) * (kT * kLdT + 2 * kT * kLdN + kT * kLdP + P * kLdN) + sizeof(float) * kT;
};

template <int kMode, int P>
__global__ void __launch_bounds__(128, 2)
    ssd_dbc_kernel(bf16* __restrict__ out, float* __restrict__ part, float* __restrict__ da_out,
                   const float* __restrict__ dcb, const bf16* __restrict__ Zm,
                   const bf16* __restrict__ Om, const bf16* __restrict__ U,
                   const float* __restrict__ states, const float* __restrict__ acs,
                   const float* __restrict__ dtc, const int32_t* __restrict__ positions, int64_t S,
                   int H, int G, int nc, int splits) {
  using Sm = DbcSmem<P>;
  constexpr int kLdN = Sm::kLdN, kLdP = Sm::kLdP, kLdT = Sm::kLdT;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* Ts = reinterpret_cast<bf16*>(smem_raw);  // dCB tile as bf16 [l][s]
  bf16* Zs = Ts + kT * kLdT;                     // B (mode 0) / C (mode 1) tile
  bf16* Os = Zs + kT * kLdN;                     // own rows: C (mode 0) / B (mode 1)
  bf16* Us = Os + kT * kLdN;                     // dy / x rows, scaled
  bf16* Ss = Us + kT * kLdP;                     // H_c / G_c as bf16 [P][N]
  float* rs = reinterpret_cast<float*>(Ss + P * kLdN);

  const int rt = blockIdx.x, c = blockIdx.y, split = blockIdx.z % splits;
  const int b = blockIdx.z / splits / G, g = blockIdx.z / splits % G;
  const int hg = H / G, heads_per_split = hg / splits;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gq = lane >> 2, tq = lane & 3;
  const int64_t t0 = static_cast<int64_t>(c) * kQ;
  const int valid = static_cast<int>(S - t0 < kQ ? S - t0 : kQ);
  const int r0 = rt * kT;
  const int64_t bc_stride = static_cast<int64_t>(G) * kN;
  const bf16* Zg =
      dcb != nullptr ? Zm + ((static_cast<int64_t>(b) * S + t0) * G + g) * kN : nullptr;
  const float* dcb_c =
      dcb != nullptr ? dcb + ((static_cast<int64_t>(b) * G + g) * nc + c) * kQ * kQ : nullptr;

  tile_load_async<kT, kN, 128>(Os, Om + ((static_cast<int64_t>(b) * S + t0 + r0) * G + g) * kN,
                               bc_stride, valid - r0);
  cp_async_commit();

  float acc[16][4] = {};
  const int it_begin = kMode == 0 ? 0 : rt;
  const int it_end = dcb == nullptr || split != 0 ? it_begin : kMode == 0 ? rt + 1 : kTiles;
  for (int it = it_begin; it < it_end; it++) {
    const int lt = kMode == 0 ? rt : it, st = kMode == 0 ? it : rt;
    const int z0 = it * kT;  // rows of Z: s-tile (mode 0) or l-tile (mode 1)
    tile_load_async<kT, kN, 128>(Zs, Zg + z0 * bc_stride, bc_stride, valid - z0);
    cp_async_commit();
    const float* tile = dcb_c + (lt * kT) * kQ + st * kT;
    for (int i = threadIdx.x; i < kT * kT / 4; i += 128) {
      const int r = (i * 4) / kT, cc = (i * 4) % kT;
      const float4 v = *reinterpret_cast<const float4*>(tile + r * kQ + cc);
      uint2 o;
      o.x = pack_bf16(v.x, v.y);
      o.y = pack_bf16(v.z, v.w);
      *reinterpret_cast<uint2*>(Ts + r * kLdT + cc) = o;
    }
    cp_async_wait<0>();
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kT / 16; k++) {
      uint32_t a[4];
      if (kMode == 0) {
        load_a_mk(a, Ts, kLdT, warp * 16, k * 16);
      } else {
        load_a_km(a, Ts, kLdT, warp * 16, k * 16);
      }
#pragma unroll
      for (int np = 0; np < 8; np++) {
        uint32_t bb[4];
        load_b_kn(bb, Zs, kLdN, np * 16, k * 16);
        mma_bf16(acc[2 * np], a, bb[0], bb[1]);
        mma_bf16(acc[2 * np + 1], a, bb[2], bb[3]);
      }
    }
    __syncthreads();
  }

  const int row_a = warp * 16 + gq, row_b = row_a + 8;  // block-relative
  const int64_t u_stride = static_cast<int64_t>(H) * P;
  for (int hh = split * heads_per_split; hh < (split + 1) * heads_per_split; hh++) {
    const int h = g * hg + hh;
    const int64_t bhc = (static_cast<int64_t>(b) * H + h) * nc + c;
    if (threadIdx.x < kT) {
      const int r = r0 + threadIdx.x;
      const float a = acs[bhc * kQ + r];
      // Mode 0: the entering state reaches r; mode 1: r reaches the chunk's end.
      const bool reaches = kMode == 0
                               ? chunk_document_start(positions, b, S, t0, r, valid) < 0
                               : r >= chunk_document_start(positions, b, S, t0, valid - 1, valid);
      rs[threadIdx.x] = !reaches     ? 0.f
                        : kMode == 0 ? fast_exp(a)
                                     : fast_exp(acs[bhc * kQ + kQ - 1] - a) * dtc[bhc * kQ + r];
    }
    // The head's rows of U are loaded while its state is staged (all loads in flight at once).
    constexpr int kChunksPerRow = P / 8, kPieces = kT * kChunksPerRow / 128;
    uint4 raw[kPieces];
#pragma unroll
    for (int k = 0; k < kPieces; k++) {
      const int i = threadIdx.x + k * 128;
      const int r = i / kChunksPerRow, col = (i % kChunksPerRow) * 8;
      raw[k] = r0 + r < valid ? *reinterpret_cast<const uint4*>(
                                    U + (static_cast<int64_t>(b) * S + t0 + r0 + r) * u_stride +
                                    static_cast<int64_t>(h) * P + col)
                              : make_uint4(0, 0, 0, 0);
    }
    stage_state_bf16<P, 128>(Ss, states + bhc * P * kN);
    __syncthreads();  // rs visible
#pragma unroll
    for (int k = 0; k < kPieces; k++) {
      const int i = threadIdx.x + k * 128;
      const int r = i / kChunksPerRow, col = (i % kChunksPerRow) * 8;
      const bf16* e = reinterpret_cast<const bf16*>(&raw[k]);
      const float w = rs[r];
      uint4 o;
      o.x = pack_bf16(__bfloat162float(e[0]) * w, __bfloat162float(e[1]) * w);
      o.y = pack_bf16(__bfloat162float(e[2]) * w, __bfloat162float(e[3]) * w);
      o.z = pack_bf16(__bfloat162float(e[4]) * w, __bfloat162float(e[5]) * w);
      o.w = pack_bf16(__bfloat162float(e[6]) * w, __bfloat162float(e[7]) * w);
      *reinterpret_cast<uint4*>(Us + r * kLdP + col) = o;
    }
    cp_async_wait<0>();  // Os (first head only)
    __syncthreads();

    float tmp[16][4] = {};
#pragma unroll
    for (int k = 0; k < P / 16; k++) {
      uint32_t a[4];
      load_a_mk(a, Us, kLdP, warp * 16, k * 16);
#pragma unroll
      for (int np = 0; np < 8; np++) {
        uint32_t bb[4];
        load_b_kn(bb, Ss, kLdN, np * 16, k * 16);
        mma_bf16(tmp[2 * np], a, bb[0], bb[1]);
        mma_bf16(tmp[2 * np + 1], a, bb[2], bb[3]);
      }
    }
    float da_a = 0.f, da_b = 0.f;
#pragma unroll
    for (int nt = 0; nt < 16; nt++) {
      const int n = nt * 8 + 2 * tq;
      const __nv_bfloat162 oa = *reinterpret_cast<const __nv_bfloat162*>(Os + row_a * kLdN + n);
      const __nv_bfloat162 ob = *reinterpret_cast<const __nv_bfloat162*>(Os + row_b * kLdN + n);
      da_a += tmp[nt][0] * __low2float(oa) + tmp[nt][1] * __high2float(oa);
      da_b += tmp[nt][2] * __low2float(ob) + tmp[nt][3] * __high2float(ob);
#pragma unroll
      for (int e = 0; e < 4; e++) acc[nt][e] += tmp[nt][e];
    }
#pragma unroll
    for (int m = 1; m < 4; m <<= 1) {
      da_a += __shfl_xor_sync(0xffffffffu, da_a, m);
      da_b += __shfl_xor_sync(0xffffffffu, da_b, m);
    }
    if (tq == 0) {
      const float sign = kMode == 0 ? 1.f : -1.f;
      da_out[bhc * kQ + r0 + row_a] = sign * da_a;
      da_out[bhc * kQ + r0 + row_b] = sign * da_b;
    }
    __syncthreads();  // Us, Ss, rs are rewritten by the next head
  }

  const int64_t o_offset =
      (static_cast<int64_t>(b) * S + t0) * bc_stride + static_cast<int64_t>(g) * kN;
  bf16* o = out + o_offset;
  float* po = splits > 1
                  ? part + split * (static_cast<int64_t>(gridDim.z / splits) * S * kN) + o_offset
                  : nullptr;
#pragma unroll
  for (int half = 0; half < 2; half++) {
    const int row = r0 + (half == 0 ? row_a : row_b);
    if (row >= valid) continue;
#pragma unroll
    for (int nt = 0; nt < 16; nt++) {
      const int n = nt * 8 + 2 * tq;
      if (po != nullptr) {
        *reinterpret_cast<float2*>(po + row * bc_stride + n) =
            make_float2(acc[nt][2 * half], acc[nt][2 * half + 1]);
      } else {
        *reinterpret_cast<uint32_t*>(o + row * bc_stride + n) =
            pack_bf16(acc[nt][2 * half], acc[nt][2 * half + 1]);
      }
    }
  }
}

// out = the sum over the head slices of part, in slice order. n = B * S * G * N (a multiple of 4).
__global__ void __launch_bounds__(256)
    ssd_dbc_sum_kernel(bf16* __restrict__ out, const float* __restrict__ part, int splits,
                       int64_t n) {
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * 256 + threadIdx.x) * 4;
  if (i >= n) return;
  float4 sum = *reinterpret_cast<const float4*>(part + i);
  for (int k = 1; k < splits; k++) {
    const float4 v = *reinterpret_cast<const float4*>(part + k * n + i);
    sum = make_float4(sum.x + v.x, sum.y + v.y, sum.z + v.z, sum.w + v.w);
  }
  uint2 o;
  o.x = pack_bf16(sum.x, sum.y);
  o.y = pack_bf16(sum.z, sum.w);
  *reinterpret_cast<uint2*>(out + i) = o;
}

// ---------------------------------------------------------------------------------------------
// 6. da -> ddt. grid (nc, H, B), 256 threads = one per chunk position. da_pairs and da_c null:
// those parts of da are zero (dy = 0).
__device__ __forceinline__ float block_sum_256(float v, float* red) {
#pragma unroll
  for (int m = 1; m < 32; m <<= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float s = 0.f;
#pragma unroll
  for (int w = 0; w < 8; w++) s += red[w];
  return s;
}

__global__ void __launch_bounds__(256)
    ssd_ddt_kernel(float* __restrict__ ddt, float* __restrict__ dA_part,
                   const float* __restrict__ da_pairs, const float* __restrict__ da_c,
                   const float* __restrict__ da_b, const float* __restrict__ da_pass,
                   const float* __restrict__ ddt_part, const float* __restrict__ dtc,
                   const float* __restrict__ A, int64_t S, int H, int nc, int pass_slots) {
  __shared__ float red[8];
  __shared__ float wsum[8];
  const int c = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int64_t bhc = (static_cast<int64_t>(b) * H + h) * nc + c;
  const int l = threadIdx.x, lt = l / kT, o = l % kT;
  float da = da_b[bhc * kQ + l];
  if (da_c != nullptr) da += da_c[bhc * kQ + l];
  if (da_pairs != nullptr) {
    const float* dap = da_pairs + bhc * kPairs * 128;
    for (int st = 0; st <= lt; st++) da += dap[ssd_pair_index(lt, st) * 128 + o];
    for (int l2 = lt; l2 < kTiles; l2++) da += dap[ssd_pair_index(l2, lt) * 128 + kT + o];
  }
  // Last position: + sum_s (state term . B_s) = - sum_s da_b[s], + exp(a_last) <G_c, H_c>.
  const float sum_b = block_sum_256(da_b[bhc * kQ + l], red);
  if (l == kQ - 1) {
    float pass = 0.f;
    for (int i = 0; i < pass_slots; i++) pass += da_pass[bhc * pass_slots + i];
    da += pass - sum_b;
  }
  // Reverse inclusive scan: rcs_l = sum_{l2 >= l} da_l2.
  const int lane = l & 31, warp = l >> 5;
  float v = da;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const float n = __shfl_down_sync(0xffffffffu, v, off);
    if (lane + off < 32) v += n;
  }
  __syncthreads();
  if (lane == 0) wsum[warp] = v;  // lane 0 holds its warp's total
  __syncthreads();
  float later = 0.f;
  for (int w = warp + 1; w < 8; w++) later += wsum[w];
  const float rcs = v + later;
  const float dt_l = dtc[bhc * kQ + l];
  const int64_t t = static_cast<int64_t>(c) * kQ + l;
  if (t < S) ddt[(static_cast<int64_t>(b) * S + t) * H + h] = ddt_part[bhc * kQ + l] + A[h] * rcs;
  const float dsum = block_sum_256(dt_l * rcs, red);
  if (l == 0) dA_part[bhc] = dsum;
}

// 7. dA[h] = sum over (b, c) of dA_part; dD[h] = sum of dD_part (dD and dD_part null: dA
// only). grid H, 256 threads.
__global__ void __launch_bounds__(256)
    ssd_reduce_kernel(float* __restrict__ dA, float* __restrict__ dD,
                      const float* __restrict__ dA_part, const float* __restrict__ dD_part, int B,
                      int H, int nc) {
  __shared__ float red[8];
  const int h = blockIdx.x;
  float sa = 0.f, sd = 0.f;
  for (int i = threadIdx.x; i < B * nc; i += 256) {
    const int b = i / nc, c = i % nc;
    const int64_t bhc = (static_cast<int64_t>(b) * H + h) * nc + c;
    sa += dA_part[bhc];
    if (dD_part != nullptr) sd += dD_part[bhc * 2] + dD_part[bhc * 2 + 1];
  }
  sa = block_sum_256(sa, red);
  sd = block_sum_256(sd, red);
  if (threadIdx.x == 0) {
    dA[h] = sa;
    if (dD != nullptr) dD[h] = sd;
  }
}

// One ssd_dbc_kernel launch over the shape's head slices, and their sum when there are several.
template <int kMode, int P>
cudaError_t launch_dbc(cudaStream_t stream, const SsdBackwardBuffers& w, bf16* out, float* da_out,
                       const float* dcb, const bf16* Zm, const bf16* Om, const bf16* U,
                       const float* states, const int32_t* positions, const SsdShape& s) {
  const int nc = static_cast<int>(ssd_num_chunks(s));
  const int H = static_cast<int>(s.heads), G = static_cast<int>(s.groups);
  const int splits = dbc_head_splits(s);
  const size_t smem = DbcSmem<P>::kBytes;
  cudaError_t err =
      cudaFuncSetAttribute(ssd_dbc_kernel<kMode, P>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  const unsigned blocks_z = static_cast<unsigned>(s.batch * s.groups * splits);
  ssd_dbc_kernel<kMode, P><<<dim3(kTiles, nc, blocks_z), 128, smem, stream>>>(
      out, w.dbc_part, da_out, dcb, Zm, Om, U, states, w.fwd.acs, w.fwd.dtc, positions, s.seq, H, G,
      nc, splits);
  err = cudaGetLastError();
  if (err != cudaSuccess || splits == 1) return err;
  const int64_t n = s.batch * s.seq * s.groups * kN;
  ssd_dbc_sum_kernel<<<static_cast<unsigned>((n / 4 + 255) / 256), 256, 0, stream>>>(
      out, w.dbc_part, splits, n);
  return cudaGetLastError();
}

template <int P>
cudaError_t launch_backward_tail(cudaStream_t stream, const SsdBackwardBuffers& w, bf16* dBm,
                                 bf16* dCm, const bf16* dy, const bf16* x, const bf16* Bm,
                                 const bf16* Cm, const int32_t* positions, const SsdShape& s) {
  const int nc = static_cast<int>(ssd_num_chunks(s));
  const int H = static_cast<int>(s.heads), G = static_cast<int>(s.groups);
  const unsigned bg = static_cast<unsigned>(s.batch * s.groups);
  cudaError_t err;
  {
    const size_t smem = DcbSmem<P>::kBytes;
    auto launch = [&](auto kernel) {
      cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(smem));
      if (e != cudaSuccess) return e;
      kernel<<<dim3(kPairs, nc, bg), 128, smem, stream>>>(
          w.dcb, w.da_pairs, x, dy, w.fwd.cb, w.fwd.acs, w.fwd.dtc, positions, s.seq, H, G, nc);
      return cudaGetLastError();
    };
    err = positions != nullptr ? launch(ssd_dcb_kernel<P, true>) : launch(ssd_dcb_kernel<P, false>);
    if (err != cudaSuccess) return err;
  }
  // dC: Z = B, own = C, U = dy, states = H_c.
  err = launch_dbc<0, P>(stream, w, dCm, w.da_c, w.dcb, Bm, Cm, dy, w.fwd.states, positions, s);
  if (err != cudaSuccess) return err;
  // dB: Z = C, own = B, U = x, states = G_c.
  return launch_dbc<1, P>(stream, w, dBm, w.da_b, w.dcb, Cm, Bm, x, w.gstates, positions, s);
}

// dB without dy: ssd_dbc_kernel in mode 1 with no dCB (Zm unread), states = G_c.
template <int P>
cudaError_t launch_db_from_states(cudaStream_t stream, const SsdBackwardBuffers& w, bf16* dBm,
                                  const bf16* x, const bf16* Bm, const int32_t* positions,
                                  const SsdShape& s) {
  return launch_dbc<1, P>(stream, w, dBm, w.da_b, /*dcb=*/nullptr, /*Zm=*/nullptr, Bm, x, w.gstates,
                          positions, s);
}

}  // namespace
}  // namespace seq_detail

size_t ssd_scan_backward_workspace_bytes(const SsdShape& s) {
  return seq_detail::ssd_forward_buffers_bytes(s) +
         seq_detail::backward_extra_bytes(s, /*with_dy=*/true, nullptr, nullptr);
}

Status ssd_scan_backward(cudaStream_t stream, bf16* dx, float* ddt, float* dA, bf16* dBm, bf16* dCm,
                         float* dD, float* dinit_state, const bf16* dy, const float* dfinal_state,
                         const bf16* x, const float* dt, const float* A, const bf16* Bm,
                         const bf16* Cm, const float* D, const float* init_state, const SsdShape& s,
                         Workspace workspace, const int32_t* positions, const float* chunk_states) {
  using namespace seq_detail;
  if (!ssd_supported(s)) {
    return Status("ssd_scan_backward",
                  "unsupported shape (needs chunk 256, state 128, head_dim 32 or 64, "
                  "heads % groups == 0)");
  }
  if (workspace.bytes < ssd_scan_backward_workspace_bytes(s) || workspace.ptr == nullptr) {
    return Status("ssd_scan_backward", "workspace too small");
  }
  SsdBackwardBuffers w{};
  w.fwd = ssd_forward_buffers(s, workspace.ptr);
  backward_extra_bytes(s, /*with_dy=*/true, &w,
                       static_cast<char*>(workspace.ptr) + ssd_forward_buffers_bytes(s));

  const int nc = static_cast<int>(ssd_num_chunks(s));
  const int H = static_cast<int>(s.heads);
  const int PN = static_cast<int>(s.head_dim * s.state);
  cudaError_t err;
  if (chunk_states != nullptr) {
    // The forward's entering states, only read here.
    w.fwd.states = const_cast<float*>(chunk_states);
    err = ssd_chunk_cumsum(stream, w.fwd, dt, A, s);
  } else {
    err = ssd_forward_states(stream, w.fwd, nullptr, x, dt, A, Bm, init_state, positions, s);
  }
  if (err != cudaSuccess) return Status::Cuda("ssd_scan_backward: forward states", err);
  err = ssd_chunk_outer(stream, 1, w.gstates, dy, Cm, w.fwd, positions, s);
  if (err != cudaSuccess) return Status::Cuda("ssd_scan_backward: ds", err);
  ssd_state_passing_bwd_kernel<<<dim3(PN / 1024, H, static_cast<unsigned>(s.batch)), 256, 0,
                                 stream>>>(w.gstates, dinit_state, w.da_pass, dfinal_state,
                                           w.fwd.states, w.fwd.acs, positions, s.seq, H, nc, PN,
                                           /*has_ds=*/true);
  err = cudaGetLastError();
  if (err != cudaSuccess) return Status::Cuda("ssd_scan_backward: state passing", err);

  err = ssd_chunk_cb(stream, w.fwd, Cm, Bm, s);
  if (err != cudaSuccess) return Status::Cuda("ssd_scan_backward: scores", err);
  SsdScanArgs args{};
  args.R = Bm;
  args.cb = w.fwd.cb;
  args.U = dy;
  args.state = w.gstates;
  args.x = x;
  args.dy = dy;
  args.D = D;
  args.acs = w.fwd.acs;
  args.dtc = w.fwd.dtc;
  args.out = dx;
  args.ddt_part = w.ddt_part;
  args.dD_part = w.dD_part;
  args.positions = positions;
  err = ssd_chunk_scan(stream, 1, args, s);
  if (err != cudaSuccess) return Status::Cuda("ssd_scan_backward: dx", err);

  err = s.head_dim == 64
            ? launch_backward_tail<64>(stream, w, dBm, dCm, dy, x, Bm, Cm, positions, s)
            : launch_backward_tail<32>(stream, w, dBm, dCm, dy, x, Bm, Cm, positions, s);
  if (err != cudaSuccess) return Status::Cuda("ssd_scan_backward: dB, dC", err);

  ssd_ddt_kernel<<<dim3(nc, H, static_cast<unsigned>(s.batch)), 256, 0, stream>>>(
      ddt, w.dA_part, w.da_pairs, w.da_c, w.da_b, w.da_pass, w.ddt_part, w.fwd.dtc, A, s.seq, H, nc,
      PN / 128);
  err = cudaGetLastError();
  if (err != cudaSuccess) return Status::Cuda("ssd_scan_backward: ddt", err);
  ssd_reduce_kernel<<<H, 256, 0, stream>>>(dA, dD, w.dA_part, w.dD_part, static_cast<int>(s.batch),
                                           H, nc);
  err = cudaGetLastError();
  if (err != cudaSuccess) return Status::Cuda("ssd_scan_backward: dA, dD", err);
  return Status();
}

size_t ssd_final_state_backward_workspace_bytes(const SsdShape& s) {
  return seq_detail::ssd_forward_buffers_bytes(s) +
         seq_detail::backward_extra_bytes(s, /*with_dy=*/false, nullptr, nullptr);
}

// The launches of ssd_scan_backward in their dy-free modes (the file's header).
Status ssd_final_state_backward(cudaStream_t stream, bf16* dx, float* ddt, float* dA, bf16* dBm,
                                const float* dfinal_state, const bf16* x, const float* dt,
                                const float* A, const bf16* Bm, const SsdShape& s,
                                Workspace workspace, const int32_t* positions) {
  using namespace seq_detail;
  if (!ssd_supported(s)) {
    return Status("ssd_final_state_backward",
                  "unsupported shape (needs chunk 256, state 128, head_dim 32 or 64, "
                  "heads % groups == 0)");
  }
  if (workspace.bytes < ssd_final_state_backward_workspace_bytes(s) || workspace.ptr == nullptr) {
    return Status("ssd_final_state_backward", "workspace too small");
  }
  SsdBackwardBuffers w{};
  w.fwd = ssd_forward_buffers(s, workspace.ptr);
  backward_extra_bytes(s, /*with_dy=*/false, &w,
                       static_cast<char*>(workspace.ptr) + ssd_forward_buffers_bytes(s));

  const int nc = static_cast<int>(ssd_num_chunks(s));
  const int H = static_cast<int>(s.heads);
  const int PN = static_cast<int>(s.head_dim * s.state);
  // H_c: the states entering each chunk from a zero start.
  cudaError_t err = ssd_forward_states(stream, w.fwd, nullptr, x, dt, A, Bm, /*init_state=*/nullptr,
                                       positions, s);
  if (err != cudaSuccess) return Status::Cuda("ssd_final_state_backward: forward states", err);
  // G_c from dfinal alone (no ds), and exp(a_last) <G_c, H_c>.
  ssd_state_passing_bwd_kernel<<<dim3(PN / 1024, H, static_cast<unsigned>(s.batch)), 256, 0,
                                 stream>>>(w.gstates, /*dinit=*/nullptr, w.da_pass, dfinal_state,
                                           w.fwd.states, w.fwd.acs, positions, s.seq, H, nc, PN,
                                           /*has_ds=*/false);
  err = cudaGetLastError();
  if (err != cudaSuccess) return Status::Cuda("ssd_final_state_backward: state passing", err);

  // dx and the explicit part of ddt from the state term alone.
  SsdScanArgs args{};
  args.R = Bm;
  args.state = w.gstates;
  args.x = x;
  args.acs = w.fwd.acs;
  args.dtc = w.fwd.dtc;
  args.out = dx;
  args.ddt_part = w.ddt_part;
  args.positions = positions;
  err = ssd_chunk_scan(stream, 1, args, s);
  if (err != cudaSuccess) return Status::Cuda("ssd_final_state_backward: dx", err);

  // dB and its da part: the per-head state terms, no dCB.
  err = s.head_dim == 64 ? launch_db_from_states<64>(stream, w, dBm, x, Bm, positions, s)
                         : launch_db_from_states<32>(stream, w, dBm, x, Bm, positions, s);
  if (err != cudaSuccess) return Status::Cuda("ssd_final_state_backward: dB", err);

  ssd_ddt_kernel<<<dim3(nc, H, static_cast<unsigned>(s.batch)), 256, 0, stream>>>(
      ddt, w.dA_part, /*da_pairs=*/nullptr, /*da_c=*/nullptr, w.da_b, w.da_pass, w.ddt_part,
      w.fwd.dtc, A, s.seq, H, nc, PN / 128);
  err = cudaGetLastError();
  if (err != cudaSuccess) return Status::Cuda("ssd_final_state_backward: ddt", err);
  ssd_reduce_kernel<<<H, 256, 0, stream>>>(dA, /*dD=*/nullptr, w.dA_part, /*dD_part=*/nullptr,
                                           static_cast<int>(s.batch), H, nc);
  err = cudaGetLastError();
  if (err != cudaSuccess) return Status::Cuda("ssd_final_state_backward: dA", err);
  return Status();
}

}  // namespace hcp::cuda
