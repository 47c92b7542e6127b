// Causal grouped-query attention on the GPU, backward, for one (query block, key block) pair of
// ring attention, given the FINAL out and lse of the query rows.
//
// With P_ij = exp(scale q_i.k_j - lse_i), Delta_i = dout_i . out_i, dS_ij = P_ij (dout_i.v_j -
// Delta_i):
//   dq_i = scale sum_j dS_ij k_j,   dk_j = scale sum_i dS_ij q_i,   dv_j = sum_i P_ij dout_i.
// Three launches, no atomics (deterministic, the convention of the CUDA kernels):
//   1. attn_delta_kernel   Delta [B, Hq, Sq] fp32 into the workspace (one warp per row).
//   2. attn_dkdv_kernel    one block of 4 warps per (64 keys, kv head, batch row); each warp owns
//                          16 keys and accumulates their dk, dv (16 x D each, fp32) in registers
//                          over every query head of the GQA group and every query block that can
//                          see them (by global position), recomputing S^T = K q^T and
//                          dP^T = V dout^T on the tensor cores; P^T and dS^T feed dv += P^T dout
//                          and dk += dS^T q straight from the accumulator registers. q, dout, lse
//                          and Delta are double-buffered through shared memory with cp.async.
//   3. attn_dq_kernel      one block per (64 query rows, query head, batch row), the forward's
//                          structure: S = q K^T, dP = dout V^T, dS, dq += dS K.
// Recomputing S and dP in launch 3 costs 2 extra products of the 5 (7 in all, against FA2's 5 with
// fp32 atomics for dq): deterministic results and no 0.4 GB fp32 dq accumulator at 64K tokens.
// Packed documents (q_positions): a query row sees no key before its document's start; launch 2
// visits only the query blocks with a row that sees one of its keys (a prefix of the rows past
// the causal start, attn_rows_seeing), launch 3 only the key blocks from its first row's
// document start on.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "runtime/kernels/cuda/SequenceDetail.cuh"
#include "runtime/kernels/cuda/SequenceKernels.h"

namespace hcp::cuda {
namespace seq_detail {
namespace {

constexpr int kB = kAttnBlock;
constexpr float kLog2e = 1.4426950408889634f;

// lse in the log2 domain; an empty row (lse = -inf) becomes +inf so that every P of it is 0.
__device__ __forceinline__ float lse_log2(float lse) {
  return lse == -INFINITY ? INFINITY : lse * kLog2e;
}

// 1. Delta. One warp per (b, i, h) row; rows ordered as dout's, written to [B, Hq, Sq].
template <int D>
__global__ void __launch_bounds__(256)
    attn_delta_kernel(float* __restrict__ delta, const bf16* __restrict__ dout,
                      const bf16* __restrict__ out, int64_t rows, int64_t Sq, int Hq) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * 8 + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int lane = threadIdx.x & 31;
  constexpr int kPer = D / 32;  // 2 or 4 elements per lane
  const bf16* g = dout + row * D + lane * kPer;
  const bf16* o = out + row * D + lane * kPer;
  float acc = 0.f;
#pragma unroll
  for (int e = 0; e < kPer; e += 2) {
    const __nv_bfloat162 gv = *reinterpret_cast<const __nv_bfloat162*>(g + e);
    const __nv_bfloat162 ov = *reinterpret_cast<const __nv_bfloat162*>(o + e);
    acc += __low2float(gv) * __low2float(ov) + __high2float(gv) * __high2float(ov);
  }
#pragma unroll
  for (int m = 1; m < 32; m <<= 1) acc += __shfl_xor_sync(0xffffffffu, acc, m);
  if (lane == 0) {
    const int64_t h = row % Hq, bi = row / Hq, i = bi % Sq, b = bi / Sq;
    delta[(b * Hq + h) * Sq + i] = acc;
  }
}

// ---------------------------------------------------------------------------------------------
// 2. dk, dv.
template <int D>
struct DkdvSmem {
  static constexpr int kLd = D + 8;
  static constexpr int kTile = kB * kLd;
  // K, V, then 2 stages of [q, dout] tiles, then 2 stages of [lse, Delta] (64 floats each), then
  // 2 stages of the query rows' first visible keys relative to the block's (64 ints each).
  static constexpr size_t kBytes = sizeof(bf16) * 6 * kTile + sizeof(float) * 6 * kB;
};

template <int D>
__global__ void __launch_bounds__(128, 2)
    attn_dkdv_kernel(bf16* __restrict__ dk, bf16* __restrict__ dv, const bf16* __restrict__ dout,
                     const bf16* __restrict__ q, const bf16* __restrict__ k,
                     const bf16* __restrict__ v, const float* __restrict__ lse,
                     const float* __restrict__ delta, const int32_t* __restrict__ q_positions,
                     int64_t Sq, int64_t Sk, int Hq, int Hkv, float scale, float scale_log2,
                     bool causal, int64_t off) {
  using Sm = DkdvSmem<D>;
  constexpr int kLd = Sm::kLd, kKd = D / 16, kDt = D / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* Ks = reinterpret_cast<bf16*>(smem_raw);
  bf16* Vs = Ks + Sm::kTile;
  bf16* Qs = Vs + Sm::kTile;                                 // 2 stages
  bf16* Gs = Qs + 2 * Sm::kTile;                             // dout, 2 stages
  float* Ls = reinterpret_cast<float*>(Gs + 2 * Sm::kTile);  // lse, 2 stages
  float* Es = Ls + 2 * kB;                                   // Delta, 2 stages
  int* Fs = reinterpret_cast<int*>(Es + 2 * kB);             // first keys, 2 stages

  const int kb = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
  const int group = Hq / Hkv;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gq = lane >> 2, tq = lane & 3;
  const int64_t j0 = static_cast<int64_t>(kb) * kB;
  const int64_t q_stride = static_cast<int64_t>(Hq) * D, kv_stride = static_cast<int64_t>(Hkv) * D;
  const int k_valid = static_cast<int>(Sk - j0 < kB ? Sk - j0 : kB);

  const int64_t kv_off =
      (static_cast<int64_t>(b) * Sk + j0) * kv_stride + static_cast<int64_t>(kvh) * D;
  tile_load_async<kB, D, 128>(Ks, k + kv_off, kv_stride, k_valid);
  tile_load_async<kB, D, 128>(Vs, v + kv_off, kv_stride, k_valid);
  cp_async_commit();

  const bool documents = q_positions != nullptr;
  const int32_t* q_positions_b = documents ? q_positions + static_cast<int64_t>(b) * Sq : nullptr;
  int64_t nqb = (Sq + kB - 1) / kB;
  if (documents) {
    // Rows past those that see any of this block's keys see none of them.
    nqb = (attn_rows_seeing(q_positions_b, Sq, off, j0 + k_valid) + kB - 1) / kB;
  }
  int64_t qb_begin = attn_first_query_block(j0, causal, off);
  if (qb_begin > nqb) qb_begin = nqb;
  const int64_t per_head = nqb - qb_begin, iters = per_head * group;

  auto load_q = [&](int64_t it, int stage) {
    const int h = kvh * group + static_cast<int>(it / per_head);
    const int64_t i0 = (qb_begin + it % per_head) * kB;
    const int valid = static_cast<int>(Sq - i0 < kB ? Sq - i0 : kB);
    const int64_t qo = (static_cast<int64_t>(b) * Sq + i0) * q_stride + static_cast<int64_t>(h) * D;
    tile_load_async<kB, D, 128>(Qs + stage * Sm::kTile, q + qo, q_stride, valid);
    tile_load_async<kB, D, 128>(Gs + stage * Sm::kTile, dout + qo, q_stride, valid);
    const int64_t lo = (static_cast<int64_t>(b) * Hq + h) * Sq + i0;
    const int t = threadIdx.x;  // 16 chunks of lse, 16 of Delta (4 floats each)
    if (documents && t >= 64) {
      const int c = t - 64;  // the 64 rows' first visible keys, relative to the block's
      Fs[stage * kB + c] =
          c < valid ? attn_relative_key(attn_first_key(q_positions_b, i0 + c, off), j0) : 0;
    }
    if (t < 32) {
      const int c = t & 15;
      const bool ok = c * 4 < valid;  // Sq is not a multiple of 4 in general: see below
      const float* src = (t < 16 ? lse : delta) + lo + c * 4;
      float* dst = (t < 16 ? Ls : Es) + stage * kB + c * 4;
      // 16-byte copies need 16-byte aligned sources: fall back to scalar loads otherwise.
      if (ok && (reinterpret_cast<uintptr_t>(src) & 15) == 0 && c * 4 + 4 <= valid) {
        cp_async16(dst, src, true);
      } else {
        for (int e = 0; e < 4; e++) dst[e] = c * 4 + e < valid ? src[e] : 0.f;
      }
    }
  };
  if (iters > 0) load_q(0, 0);
  cp_async_commit();

  float dka[kDt][4] = {}, dva[kDt][4] = {};
  const int64_t key_a = j0 + warp * 16 + gq, key_b = key_a + 8;
  for (int64_t it = 0; it < iters; it++) {
    const int stage = static_cast<int>(it & 1);
    if (it + 1 < iters) load_q(it + 1, stage ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();

    const int64_t i0 = (qb_begin + it % per_head) * kB;
    const int q_valid = static_cast<int>(Sq - i0 < kB ? Sq - i0 : kB);
    const int diag = causal ? attn_diag(i0, j0, off) : 128;
    // This warp's keys are all invisible to this query block (only near the diagonal).
    const bool active = warp * 16 <= kB - 1 + diag;
    if (active) {
      const bf16* Qt = Qs + stage * Sm::kTile;
      const bf16* Gt = Gs + stage * Sm::kTile;
      const float* Lt = Ls + stage * kB;
      const float* Et = Es + stage * kB;
      const int* Ft = Fs + stage * kB;
      float st[8][4] = {}, dpt[8][4] = {};
      // Not unrolled: unrolling lets the compiler hoist the next steps' fragment loads, which
      // spills at this kernel's 255 registers (dk and dv accumulators take 2 * D / 2 of them).
#pragma unroll 1
      for (int kk = 0; kk < kKd; kk++) {
        uint32_t ka[4], va[4];
        load_a_mk(ka, Ks, kLd, warp * 16, kk * 16);
        load_a_mk(va, Vs, kLd, warp * 16, kk * 16);
#pragma unroll
        for (int np = 0; np < 4; np++) {
          uint32_t bq[4], bg[4];
          load_b_nk(bq, Qt, kLd, np * 16, kk * 16);
          load_b_nk(bg, Gt, kLd, np * 16, kk * 16);
          mma_bf16(st[2 * np], ka, bq[0], bq[1]);
          mma_bf16(st[2 * np + 1], ka, bq[2], bq[3]);
          mma_bf16(dpt[2 * np], va, bg[0], bg[1]);
          mma_bf16(dpt[2 * np + 1], va, bg[2], bg[3]);
        }
      }
      // P^T and dS^T, rows = keys, columns = query rows.
#pragma unroll
      for (int nt = 0; nt < 8; nt++) {
#pragma unroll
        for (int j = 0; j < 2; j++) {
          const int ci = nt * 8 + 2 * tq + j;
          const float L = lse_log2(Lt[ci]), E = Et[ci];
          const bool row_ok = ci < q_valid;
          const int first = documents ? Ft[ci] : -128;
#pragma unroll
          for (int half = 0; half < 2; half++) {
            const int kr = warp * 16 + gq + 8 * half;
            const bool vis = row_ok && kr < k_valid && kr <= ci + diag && kr >= first;
            const int e = 2 * half + j;
            const float p = vis ? fast_exp2(st[nt][e] * scale_log2 - L) : 0.f;
            st[nt][e] = p;
            dpt[nt][e] = p * (dpt[nt][e] - E);
          }
        }
      }
#pragma unroll
      for (int kk = 0; kk < 4; kk++) {
        uint32_t pa[4], sa[4];
        acc_to_a(pa, st[2 * kk], st[2 * kk + 1]);
        acc_to_a(sa, dpt[2 * kk], dpt[2 * kk + 1]);
#pragma unroll
        for (int np = 0; np < kDt / 2; np++) {
          uint32_t bg[4], bq[4];
          load_b_kn(bg, Gt, kLd, np * 16, kk * 16);
          load_b_kn(bq, Qt, kLd, np * 16, kk * 16);
          mma_bf16(dva[2 * np], pa, bg[0], bg[1]);
          mma_bf16(dva[2 * np + 1], pa, bg[2], bg[3]);
          mma_bf16(dka[2 * np], sa, bq[0], bq[1]);
          mma_bf16(dka[2 * np + 1], sa, bq[2], bq[3]);
        }
      }
    }
    __syncthreads();
  }
  cp_async_wait<0>();

#pragma unroll
  for (int half = 0; half < 2; half++) {
    const int64_t key = half == 0 ? key_a : key_b;
    if (key >= Sk) continue;
    const int64_t o =
        (static_cast<int64_t>(b) * Sk + key) * kv_stride + static_cast<int64_t>(kvh) * D;
#pragma unroll
    for (int dt = 0; dt < kDt; dt++) {
      const int d = dt * 8 + 2 * tq;
      *reinterpret_cast<uint32_t*>(dk + o + d) =
          pack_bf16(scale * dka[dt][2 * half], scale * dka[dt][2 * half + 1]);
      *reinterpret_cast<uint32_t*>(dv + o + d) =
          pack_bf16(dva[dt][2 * half], dva[dt][2 * half + 1]);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// 3. dq.
template <int D>
struct DqSmem {
  static constexpr int kLd = D + 8;
  static constexpr int kTile = kB * kLd;
  static constexpr size_t kBytes = sizeof(bf16) * 5 * kTile;  // q / dout staging, 2 x K, 2 x V
};

template <int D>
__global__ void __launch_bounds__(128, 2)
    attn_dq_kernel(bf16* __restrict__ dq, const bf16* __restrict__ dout, const bf16* __restrict__ q,
                   const bf16* __restrict__ k, const bf16* __restrict__ v,
                   const float* __restrict__ lse, const float* __restrict__ delta,
                   int64_t delta_stride, const int32_t* __restrict__ q_positions, int64_t Sq,
                   int64_t Sk, int Hq, int Hkv, float scale, float scale_log2, bool causal,
                   int64_t off) {
  using Sm = DqSmem<D>;
  constexpr int kLd = Sm::kLd, kKd = D / 16, kDt = D / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* Xs = reinterpret_cast<bf16*>(smem_raw);  // q, then dout (staging for the fragments)
  bf16* Ks = Xs + Sm::kTile;                     // 2 stages
  bf16* Vs = Ks + 2 * Sm::kTile;

  const int qb = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int kvh = h / (Hq / Hkv);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gq = lane >> 2, tq = lane & 3;
  const int64_t i0 = static_cast<int64_t>(qb) * kB;
  const int64_t q_stride = static_cast<int64_t>(Hq) * D, kv_stride = static_cast<int64_t>(Hkv) * D;
  const int q_valid = static_cast<int>(Sq - i0 < kB ? Sq - i0 : kB);
  const int64_t nkb = attn_key_blocks(i0, Sk, causal, off);
  const int64_t qo = (static_cast<int64_t>(b) * Sq + i0) * q_stride + static_cast<int64_t>(h) * D;
  const bool documents = q_positions != nullptr;
  const int32_t* q_positions_b = documents ? q_positions + static_cast<int64_t>(b) * Sq : nullptr;
  const int64_t kb_begin = attn_first_key_block(q_positions_b, i0, off);

  const bf16* kbase = k + static_cast<int64_t>(b) * Sk * kv_stride + static_cast<int64_t>(kvh) * D;
  const bf16* vbase = v + static_cast<int64_t>(b) * Sk * kv_stride + static_cast<int64_t>(kvh) * D;
  auto load_kv = [&](int64_t kb, int stage) {
    const int64_t j0 = kb * kB;
    const int valid = static_cast<int>(Sk - j0 < kB ? Sk - j0 : kB);
    tile_load_async<kB, D, 128>(Ks + stage * Sm::kTile, kbase + j0 * kv_stride, kv_stride, valid);
    tile_load_async<kB, D, 128>(Vs + stage * Sm::kTile, vbase + j0 * kv_stride, kv_stride, valid);
  };

  // q fragments, then dout fragments, through one staging tile.
  uint32_t qf[kKd][4], gf[kKd][4];
  tile_load_async<kB, D, 128>(Xs, q + qo, q_stride, q_valid);
  cp_async_commit();
  if (kb_begin < nkb) load_kv(kb_begin, 0);
  cp_async_commit();
  cp_async_wait<1>();
  __syncthreads();
#pragma unroll
  for (int kk = 0; kk < kKd; kk++) load_a_mk(qf[kk], Xs, kLd, warp * 16, kk * 16);
  __syncthreads();
  tile_load_async<kB, D, 128>(Xs, dout + qo, q_stride, q_valid);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
#pragma unroll
  for (int kk = 0; kk < kKd; kk++) load_a_mk(gf[kk], Xs, kLd, warp * 16, kk * 16);

  const int64_t row_a = i0 + warp * 16 + gq, row_b = row_a + 8;
  const int64_t lo = (static_cast<int64_t>(b) * Hq + h) * Sq;
  const float L_a = row_a < Sq ? lse_log2(lse[lo + row_a]) : INFINITY;
  const float L_b = row_b < Sq ? lse_log2(lse[lo + row_b]) : INFINITY;
  const int64_t lo_d = (static_cast<int64_t>(b) * Hq + h) * delta_stride;
  const float E_a = row_a < Sq ? delta[lo_d + row_a] : 0.f;
  const float E_b = row_b < Sq ? delta[lo_d + row_b] : 0.f;
  const int64_t first_a = documents && row_a < Sq ? attn_first_key(q_positions_b, row_a, off) : 0;
  const int64_t first_b = documents && row_b < Sq ? attn_first_key(q_positions_b, row_b, off) : 0;

  float acc[kDt][4] = {};
  for (int64_t kb = kb_begin; kb < nkb; kb++) {
    const int stage = static_cast<int>((kb - kb_begin) & 1);
    if (kb + 1 < nkb) load_kv(kb + 1, stage ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const bf16* Kt = Ks + stage * Sm::kTile;
    const bf16* Vt = Vs + stage * Sm::kTile;

    float s[8][4] = {}, dp[8][4] = {};
#pragma unroll
    for (int kk = 0; kk < kKd; kk++) {
#pragma unroll
      for (int np = 0; np < 4; np++) {
        uint32_t bk[4], bv[4];
        load_b_nk(bk, Kt, kLd, np * 16, kk * 16);
        load_b_nk(bv, Vt, kLd, np * 16, kk * 16);
        mma_bf16(s[2 * np], qf[kk], bk[0], bk[1]);
        mma_bf16(s[2 * np + 1], qf[kk], bk[2], bk[3]);
        mma_bf16(dp[2 * np], gf[kk], bv[0], bv[1]);
        mma_bf16(dp[2 * np + 1], gf[kk], bv[2], bv[3]);
      }
    }
    const int64_t j0 = kb * kB;
    const bool need_mask = j0 + kB > Sk || (causal && j0 + kB - 1 > i0 + off) || documents;
    const int k_valid = static_cast<int>(Sk - j0 < kB ? Sk - j0 : kB);
    const int diag = causal ? attn_diag(i0, j0, off) : 128;
    const int start_a = documents ? attn_relative_key(first_a, j0) : -128;
    const int start_b = documents ? attn_relative_key(first_b, j0) : -128;
#pragma unroll
    for (int nt = 0; nt < 8; nt++) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const bool upper = e >= 2;
        bool vis = true;
        if (need_mask) {
          const int jr = nt * 8 + 2 * tq + (e & 1);
          const int ir = warp * 16 + gq + (upper ? 8 : 0);
          vis = jr < k_valid && jr <= ir + diag && jr >= (upper ? start_b : start_a);
        }
        const float p = vis ? fast_exp2(s[nt][e] * scale_log2 - (upper ? L_b : L_a)) : 0.f;
        s[nt][e] = p * (dp[nt][e] - (upper ? E_b : E_a));
      }
    }
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
      uint32_t sa[4];
      acc_to_a(sa, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
      for (int np = 0; np < kDt / 2; np++) {
        uint32_t bk[4];
        load_b_kn(bk, Kt, kLd, np * 16, kk * 16);
        mma_bf16(acc[2 * np], sa, bk[0], bk[1]);
        mma_bf16(acc[2 * np + 1], sa, bk[2], bk[3]);
      }
    }
    __syncthreads();
  }

#pragma unroll
  for (int half = 0; half < 2; half++) {
    const int64_t row = half == 0 ? row_a : row_b;
    if (row >= Sq) continue;
    bf16* orow = dq + (static_cast<int64_t>(b) * Sq + row) * q_stride + static_cast<int64_t>(h) * D;
#pragma unroll
    for (int dt = 0; dt < kDt; dt++) {
      *reinterpret_cast<uint32_t*>(orow + dt * 8 + 2 * tq) =
          pack_bf16(scale * acc[dt][2 * half], scale * acc[dt][2 * half + 1]);
    }
  }
}

template <int D>
cudaError_t launch_dq(cudaStream_t stream, bf16* dq, const bf16* dout, const bf16* q, const bf16* k,
                      const bf16* v, const float* lse, const float* delta, int64_t delta_stride,
                      const int32_t* q_positions, const AttentionShape& s, float scale, bool causal,
                      int64_t off) {
  const int Hq = static_cast<int>(s.q_heads), Hkv = static_cast<int>(s.kv_heads);
  const size_t smem = DqSmem<D>::kBytes;
  cudaError_t err = cudaFuncSetAttribute(
      attn_dq_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  dim3 grid(static_cast<unsigned>((s.q_len + kB - 1) / kB), static_cast<unsigned>(Hq),
            static_cast<unsigned>(s.batch));
  attn_dq_kernel<D><<<grid, 128, smem, stream>>>(dq, dout, q, k, v, lse, delta, delta_stride,
                                                 q_positions, s.q_len, s.kv_len, Hq, Hkv, scale,
                                                 scale * kLog2e, causal, off);
  return cudaGetLastError();
}

template <int D>
cudaError_t launch_bwd(cudaStream_t stream, bf16* dq, bf16* dk, bf16* dv, const bf16* dout,
                       const bf16* q, const bf16* k, const bf16* v, const bf16* out,
                       const float* lse, float* delta, const int32_t* q_positions,
                       const AttentionShape& s, float scale, bool causal, int64_t off) {
  const int64_t rows = s.batch * s.q_len * s.q_heads;
  attn_delta_kernel<D><<<static_cast<unsigned>((rows + 7) / 8), 256, 0, stream>>>(
      delta, dout, out, rows, s.q_len, static_cast<int>(s.q_heads));
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  const int Hq = static_cast<int>(s.q_heads), Hkv = static_cast<int>(s.kv_heads);
  {
    const size_t smem = DkdvSmem<D>::kBytes;
    err = cudaFuncSetAttribute(attn_dkdv_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(smem));
    if (err != cudaSuccess) return err;
    dim3 grid(static_cast<unsigned>((s.kv_len + kB - 1) / kB), static_cast<unsigned>(Hkv),
              static_cast<unsigned>(s.batch));
    attn_dkdv_kernel<D><<<grid, 128, smem, stream>>>(dk, dv, dout, q, k, v, lse, delta, q_positions,
                                                     s.q_len, s.kv_len, Hq, Hkv, scale,
                                                     scale * kLog2e, causal, off);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return launch_dq<D>(stream, dq, dout, q, k, v, lse, delta, s.q_len, q_positions, s, scale, causal,
                      off);
}

}  // namespace
}  // namespace seq_detail

size_t attention_backward_workspace_bytes(const AttentionShape& s) {
  size_t bytes =
      seq_detail::align_up(static_cast<size_t>(s.batch * s.q_heads * s.q_len) * sizeof(float));
  const seq_detail::AttnImpl impl = seq_detail::attn_impl();
  if (impl != seq_detail::AttnImpl::kFa2 && s.head_dim == 128) {
    const size_t hb =
        seq_detail::attn_hopper_bwd_buffers(s, impl == seq_detail::AttnImpl::kHopper, nullptr)
            .bytes;
    if (hb > bytes) bytes = hb;
  }
  return bytes;
}

Status attention_backward(cudaStream_t stream, bf16* dq, bf16* dk, bf16* dv, const bf16* dout,
                          const bf16* q, const bf16* k, const bf16* v, const bf16* out,
                          const float* lse, const AttentionShape& s, float scale, bool causal,
                          int64_t q_pos0, int64_t k_pos0, Workspace workspace,
                          const int32_t* q_positions) {
  if (!attention_supported(s)) {
    return Status("attention_backward",
                  "unsupported shape (needs head_dim 64 or 128, q_heads % kv_heads == 0)");
  }
  if (workspace.ptr == nullptr || workspace.bytes < attention_backward_workspace_bytes(s)) {
    return Status("attention_backward", "workspace too small");
  }
  float* delta = static_cast<float*>(workspace.ptr);
  const int64_t off = q_pos0 - k_pos0;
  if (seq_detail::attn_hopper_usable(s, scale) &&
      seq_detail::attn_aligned16(q) && seq_detail::attn_aligned16(k) &&
      seq_detail::attn_aligned16(v) && seq_detail::attn_aligned16(dout) &&
      seq_detail::attn_aligned16(workspace.ptr)) {
    const bool det = seq_detail::attn_impl() == seq_detail::AttnImpl::kHopperDeterministic;
    const seq_detail::AttnHopperBwdBuffers buf =
        seq_detail::attn_hopper_bwd_buffers(s, !det, workspace.ptr);
    if (workspace.bytes < buf.bytes) return Status("attention_backward", "workspace too small");
    cudaError_t err = seq_detail::attn_hopper_backward(stream, dq, dk, dv, dout, q, k, v, out, lse,
                                                       s, scale, causal, off, buf, q_positions);
    if (err == cudaSuccess && det) {
      err = seq_detail::launch_dq<128>(stream, dq, dout, q, k, v, lse, buf.delta, buf.sq_pad,
                                       q_positions, s, scale, causal, off);
    }
    if (err != cudaSuccess) return Status::Cuda("attention_backward", err);
    return Status();
  }
  const cudaError_t err =
      s.head_dim == 128 ? seq_detail::launch_bwd<128>(stream, dq, dk, dv, dout, q, k, v, out, lse,
                                                      delta, q_positions, s, scale, causal, off)
                        : seq_detail::launch_bwd<64>(stream, dq, dk, dv, dout, q, k, v, out, lse,
                                                     delta, q_positions, s, scale, causal, off);
  if (err != cudaSuccess) return Status::Cuda("attention_backward", err);
  return Status();
}

}  // namespace hcp::cuda
