// Causal grouped-query attention on the GPU, forward (flash-attention 2 style) with the
// log-sum-exp of every row, for one (query block, key block) pair of ring attention.
//
// One block of 4 warps per (64 query rows, query head, batch row); each warp owns 16 rows and
// keeps their q as bf16 A fragments in registers, the output accumulators (16 x D fp32) and the
// running max / sum of its rows. It walks the 64-key blocks its rows can see (by GLOBAL position:
// key j is visible to row i iff k_pos0 + j <= q_pos0 + i, so blocks entirely past the diagonal are
// never loaded), K and V double-buffered through shared memory with cp.async:
//   S = q K^T (tensor cores, fp32), scaled into the log2 domain, masked (only on blocks that cross
//   the diagonal or the end of the keys), online softmax with exp2 (MUFU), P packed to bf16 as
//   the A operand of P V straight from the accumulator registers.
// GQA: query head h reads kv head h / (q_heads / kv_heads). Query blocks are issued in reverse so
// the longest causal rows start first. A row that sees no key gets out = 0, lse = -inf.
// Packed documents (q_positions): a row sees no key before its document's start; the key blocks
// before the block's first row's document are never loaded (attn_first_key).
//
// Expected speed: this is the mma.sync (sm_80-class) formulation; on H100-class parts it reaches
// roughly 300-350 TFLOP/s in the forward, about 55% of what a wgmma (FA3 / cuDNN) kernel reaches.
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
constexpr float kLn2 = 0.6931471805599453f;

template <int D>
struct FwdSmem {
  static constexpr int kLd = D + 8;
  static constexpr int kTile = kB * kLd;
  static constexpr size_t kBytes = sizeof(bf16) * 5 * kTile;  // Q, 2 x K, 2 x V
};

template <int D>
__global__ void __launch_bounds__(128, 2)
    attn_fwd_kernel(bf16* __restrict__ out, float* __restrict__ lse, const bf16* __restrict__ q,
                    const bf16* __restrict__ k, const bf16* __restrict__ v,
                    const int32_t* __restrict__ q_positions, int64_t Sq, int64_t Sk, int Hq,
                    int Hkv, float scale_log2, bool causal, int64_t off) {
  using Sm = FwdSmem<D>;
  constexpr int kLd = Sm::kLd, kKd = D / 16, kDt = D / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* Qs = reinterpret_cast<bf16*>(smem_raw);
  bf16* Ks = Qs + Sm::kTile;  // 2 stages
  bf16* Vs = Ks + 2 * Sm::kTile;

  const int qb = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int kvh = h / (Hq / Hkv);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gq = lane >> 2, tq = lane & 3;
  const int64_t i0 = static_cast<int64_t>(qb) * kB;
  const int64_t q_stride = static_cast<int64_t>(Hq) * D, kv_stride = static_cast<int64_t>(Hkv) * D;
  const int q_valid = static_cast<int>(Sq - i0 < kB ? Sq - i0 : kB);
  const int64_t nkb = attn_key_blocks(i0, Sk, causal, off);
  const bool documents = q_positions != nullptr;
  const int32_t* q_positions_b = documents ? q_positions + static_cast<int64_t>(b) * Sq : nullptr;
  const int64_t kb_begin = attn_first_key_block(q_positions_b, i0, off);

  tile_load_async<kB, D, 128>(
      Qs, q + (static_cast<int64_t>(b) * Sq + i0) * q_stride + static_cast<int64_t>(h) * D,
      q_stride, q_valid);
  cp_async_commit();
  const bf16* kbase = k + static_cast<int64_t>(b) * Sk * kv_stride + static_cast<int64_t>(kvh) * D;
  const bf16* vbase = v + static_cast<int64_t>(b) * Sk * kv_stride + static_cast<int64_t>(kvh) * D;
  auto load_kv = [&](int64_t kb, int stage) {
    const int64_t j0 = kb * kB;
    const int valid = static_cast<int>(Sk - j0 < kB ? Sk - j0 : kB);
    tile_load_async<kB, D, 128>(Ks + stage * Sm::kTile, kbase + j0 * kv_stride, kv_stride, valid);
    tile_load_async<kB, D, 128>(Vs + stage * Sm::kTile, vbase + j0 * kv_stride, kv_stride, valid);
  };
  if (kb_begin < nkb) load_kv(kb_begin, 0);
  cp_async_commit();
  cp_async_wait<1>();
  __syncthreads();

  uint32_t qf[kKd][4];
#pragma unroll
  for (int kk = 0; kk < kKd; kk++) load_a_mk(qf[kk], Qs, kLd, warp * 16, kk * 16);

  const int64_t row_a = i0 + warp * 16 + gq, row_b = row_a + 8;
  // The rows' first visible keys (documents; rows past Sq see nothing they would store).
  const int64_t first_a = documents && row_a < Sq ? attn_first_key(q_positions_b, row_a, off) : 0;
  const int64_t first_b = documents && row_b < Sq ? attn_first_key(q_positions_b, row_b, off) : 0;
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.f, l_b = 0.f;
  float o[kDt][4] = {};

  for (int64_t kb = kb_begin; kb < nkb; kb++) {
    const int stage = static_cast<int>((kb - kb_begin) & 1);
    if (kb + 1 < nkb) load_kv(kb + 1, stage ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const bf16* Kt = Ks + stage * Sm::kTile;
    const bf16* Vt = Vs + stage * Sm::kTile;

    float s[8][4] = {};
#pragma unroll
    for (int kk = 0; kk < kKd; kk++) {
#pragma unroll
      for (int np = 0; np < 4; np++) {
        uint32_t bb[4];
        load_b_nk(bb, Kt, kLd, np * 16, kk * 16);
        mma_bf16(s[2 * np], qf[kk], bb[0], bb[1]);
        mma_bf16(s[2 * np + 1], qf[kk], bb[2], bb[3]);
      }
    }
    const int64_t j0 = kb * kB;
    const bool need_mask = j0 + kB > Sk || (causal && j0 + kB - 1 > i0 + off) || documents;
    const int k_valid = static_cast<int>(Sk - j0 < kB ? Sk - j0 : kB);
    const int diag = causal ? attn_diag(i0, j0, off) : 128;
    // Keys jr below these (block-relative) are in an earlier document than row a's, b's.
    const int start_a = documents ? attn_relative_key(first_a, j0) : -128;
    const int start_b = documents ? attn_relative_key(first_b, j0) : -128;
#pragma unroll
    for (int nt = 0; nt < 8; nt++) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        float x = s[nt][e] * scale_log2;
        if (need_mask) {
          const int jr = nt * 8 + 2 * tq + (e & 1);
          const int ir = warp * 16 + gq + (e < 2 ? 0 : 8);
          if (jr >= k_valid || jr > ir + diag || jr < (e < 2 ? start_a : start_b)) x = -INFINITY;
        }
        s[nt][e] = x;
      }
    }
    float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < 8; nt++) {
      mx_a = fmaxf(mx_a, fmaxf(s[nt][0], s[nt][1]));
      mx_b = fmaxf(mx_b, fmaxf(s[nt][2], s[nt][3]));
    }
#pragma unroll
    for (int m = 1; m < 4; m <<= 1) {
      mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, m));
      mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, m));
    }
    const float mn_a = fmaxf(m_a, mx_a), mn_b = fmaxf(m_b, mx_b);
    // A row that has seen only masked keys keeps max -inf; exponentiate around 0 then (all terms
    // are exp2(-inf) = 0), never around -inf (which would give NaN).
    const float mu_a = mn_a == -INFINITY ? 0.f : mn_a, mu_b = mn_b == -INFINITY ? 0.f : mn_b;
    const float alpha_a = fast_exp2(m_a - mu_a), alpha_b = fast_exp2(m_b - mu_b);
    m_a = mn_a;
    m_b = mn_b;
    float sum_a = 0.f, sum_b = 0.f;
#pragma unroll
    for (int nt = 0; nt < 8; nt++) {
      s[nt][0] = fast_exp2(s[nt][0] - mu_a);
      s[nt][1] = fast_exp2(s[nt][1] - mu_a);
      s[nt][2] = fast_exp2(s[nt][2] - mu_b);
      s[nt][3] = fast_exp2(s[nt][3] - mu_b);
      sum_a += s[nt][0] + s[nt][1];
      sum_b += s[nt][2] + s[nt][3];
    }
    l_a = l_a * alpha_a + sum_a;
    l_b = l_b * alpha_b + sum_b;
#pragma unroll
    for (int dt = 0; dt < kDt; dt++) {
      o[dt][0] *= alpha_a;
      o[dt][1] *= alpha_a;
      o[dt][2] *= alpha_b;
      o[dt][3] *= alpha_b;
    }
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
      uint32_t pa[4];
      acc_to_a(pa, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
      for (int np = 0; np < kDt / 2; np++) {
        uint32_t bb[4];
        load_b_kn(bb, Vt, kLd, np * 16, kk * 16);
        mma_bf16(o[2 * np], pa, bb[0], bb[1]);
        mma_bf16(o[2 * np + 1], pa, bb[2], bb[3]);
      }
    }
    __syncthreads();
  }

#pragma unroll
  for (int m = 1; m < 4; m <<= 1) {
    l_a += __shfl_xor_sync(0xffffffffu, l_a, m);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, m);
  }
#pragma unroll
  for (int half = 0; half < 2; half++) {
    const int64_t row = half == 0 ? row_a : row_b;
    if (row >= Sq) continue;
    const float l = half == 0 ? l_a : l_b, m = half == 0 ? m_a : m_b;
    const bool empty = !(l > 0.f);
    const float inv = empty ? 0.f : 1.f / l;
    bf16* orow =
        out + (static_cast<int64_t>(b) * Sq + row) * q_stride + static_cast<int64_t>(h) * D;
#pragma unroll
    for (int dt = 0; dt < kDt; dt++) {
      *reinterpret_cast<uint32_t*>(orow + dt * 8 + 2 * tq) =
          pack_bf16(o[dt][2 * half] * inv, o[dt][2 * half + 1] * inv);
    }
    if (tq == 0) {
      lse[(static_cast<int64_t>(b) * Hq + h) * Sq + row] =
          empty ? -INFINITY : (m + __log2f(l)) * kLn2;
    }
  }
}

template <int D>
cudaError_t launch_fwd(cudaStream_t stream, bf16* out, float* lse, const bf16* q, const bf16* k,
                       const bf16* v, const int32_t* q_positions, const AttentionShape& s,
                       float scale, bool causal, int64_t off) {
  const size_t smem = FwdSmem<D>::kBytes;
  cudaError_t err = cudaFuncSetAttribute(
      attn_fwd_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  dim3 grid(static_cast<unsigned>((s.q_len + kB - 1) / kB), static_cast<unsigned>(s.q_heads),
            static_cast<unsigned>(s.batch));
  attn_fwd_kernel<D><<<grid, 128, smem, stream>>>(
      out, lse, q, k, v, q_positions, s.q_len, s.kv_len, static_cast<int>(s.q_heads),
      static_cast<int>(s.kv_heads), scale * kLog2e, causal, off);
  return cudaGetLastError();
}

}  // namespace
}  // namespace seq_detail

bool attention_supported(const AttentionShape& s) {
  return s.batch >= 1 && s.batch <= 65535 && s.q_len >= 1 && s.kv_len >= 1 && s.q_heads >= 1 &&
         s.q_heads <= 65535 && s.kv_heads >= 1 && s.q_heads % s.kv_heads == 0 &&
         (s.head_dim == 64 || s.head_dim == 128) &&
         (s.q_len + seq_detail::kAttnBlock - 1) / seq_detail::kAttnBlock <= 0x7fffffff &&
         (s.kv_len + seq_detail::kAttnBlock - 1) / seq_detail::kAttnBlock <= 0x7fffffff;
}

Status attention_forward(cudaStream_t stream, bf16* out, float* lse, const bf16* q, const bf16* k,
                         const bf16* v, const AttentionShape& s, float scale, bool causal,
                         int64_t q_pos0, int64_t k_pos0, const int32_t* q_positions) {
  if (!attention_supported(s)) {
    return Status("attention_forward",
                  "unsupported shape (needs head_dim 64 or 128, q_heads % kv_heads == 0)");
  }
  const int64_t off = q_pos0 - k_pos0;
  if (seq_detail::attn_hopper_usable(s, scale) &&
      seq_detail::attn_aligned16(out) && seq_detail::attn_aligned16(q) &&
      seq_detail::attn_aligned16(k) && seq_detail::attn_aligned16(v)) {
    const cudaError_t err =
        seq_detail::attn_hopper_forward(stream, out, lse, q, k, v, s, scale, causal, off,
                                        q_positions);
    if (err != cudaSuccess) return Status::Cuda("attention_forward", err);
    return Status();
  }
  const cudaError_t err = s.head_dim == 128
                              ? seq_detail::launch_fwd<128>(stream, out, lse, q, k, v, q_positions,
                                                            s, scale, causal, off)
                              : seq_detail::launch_fwd<64>(stream, out, lse, q, k, v, q_positions,
                                                           s, scale, causal, off);
  if (err != cudaSuccess) return Status::Cuda("attention_forward", err);
  return Status();
}

}  // namespace hcp::cuda
