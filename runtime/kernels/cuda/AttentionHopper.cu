// Causal grouped-query attention for Hopper (sm_90a): warpgroup MMA (wgmma) on operands that the
// bulk tensor copy engine (TMA) loads into 128-byte-swizzled shared memory, warp-specialised
// (one producer warp issues the copies, two consumer warpgroups compute). Head dim 128 only;
// Attention.cu / AttentionBackward.cu dispatch here when the device is sm_90 (see
// attn_hopper_usable) and fall back to the mma.sync kernels otherwise.
//
// Forward (one CTA per 128 query rows x query head x batch row, 3 warpgroups):
//   WG0: one thread loads Q (128 x 128) once and K, V key blocks (128 x 128 each) into a 2-stage
//        ring (mbarriers: full = bytes landed, empty = both consumers done with the stage).
//   WG1, WG2: 64 query rows each. S = Q K^T (wgmma m64n128k16, both operands from shared memory),
//        online softmax in registers (exp2, the scale folded into one FFMA), O += P V with P as the
//        register A operand (the accumulator layout IS the A fragment layout) and V as an
//        MN-major B operand. Software-pipelined as FlashAttention-3: the S of key block j+1 and
//        the P V of block j are in flight together while the softmax of block j+1 runs.
//        Key blocks are visited from the last visible one down, so the masked (diagonal / tail)
//        blocks come first. Epilogue: O / l -> bf16 into the (private) Q rows of shared memory ->
//        TMA store (rows past Sq are clipped by the copy engine); lse from registers.
// Backward (one CTA per 128 keys x kv head x batch row, 3 warpgroups; FlashAttention-3 style):
//   WG0: one thread loads K, V once and, per step, the Q and dout tiles (64 rows x 128) of one
//        (query head of the GQA group, 64-row query block) with lse (log2 domain) and Delta.
//   WG1, WG2: 64 keys each; dK, dV (64 x 128 fp32 each) stay in registers for the whole CTA.
//        Per step: S^T = K Q^T, dP^T = V dout^T (m64n64k16), P^T = exp2(S^T scale log2e - lse2),
//        dS^T = P^T (dP^T - Delta); dV += P^T dout, dK += dS^T Q (m64n128k16, A from registers).
//        kDq: dS^T also goes to shared memory (bf16, MN-major), and dQ(64 x 128) = dS K is split
//        by columns over the two warpgroups (m64n64k16, both operands MN-major from shared
//        memory), staged in shared memory and added into an fp32 workspace by the copy engine
//        (cp.reduce.async.bulk .add.f32: floating-point atomics, so dq's last bits vary run to
//        run). A small kernel turns the workspace into dq (bf16). Without kDq the dq of the
//        deterministic mode comes from AttentionBackward.cu's dq kernel instead.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "runtime/kernels/cuda/AttentionHopperMma.cuh"
#include "runtime/kernels/cuda/SequenceDetail.cuh"
#include "runtime/kernels/cuda/SequenceKernels.h"

// The device pass for sm_90a has the wgmma / setmaxnreg instructions; any other device pass
// compiles the kernels to a trap (attn_hopper_usable keeps the host from launching them there).
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define HCP_HOPPER_ENABLED 1
#else
#define HCP_HOPPER_ENABLED 0
#endif

namespace hcp::cuda {
namespace hopper {
namespace {

using seq_detail::attn_first_key;
using seq_detail::attn_first_key_block;
using seq_detail::attn_rows_seeing;

constexpr int kD = 128;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// ---------------------------------------------------------------------------------------------
// Device primitives (PTX).
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ bool mbar_try_wait(uint32_t bar, uint32_t parity) {
  uint32_t ok;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(ok)
      : "r"(bar), "r"(parity)
      : "memory");
  return ok != 0;
}
// Waits for the phase with the given parity to complete. (No time-out trap: a __trap() here
// makes ptxas drop the setmaxnreg register budgets, and the consumers spill.)
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  while (!mbar_try_wait(bar, parity)) {
  }
}

__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void named_bar_sync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// TMA: a 4-d box of a [B, S, H, D] bf16 tensor (coordinates innermost first: d, h, s, b).
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* map, uint32_t bar,
                                            int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}
__device__ __forceinline__ void tma_store_4d(const CUtensorMap* map, uint32_t src, int c0, int c1,
                                             int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}
// Plain bulk copy global -> shared (16-byte aligned, size a multiple of 16).
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes,
                                          uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}
// global[dst .. dst + bytes) += shared[src ..] (fp32), by the copy engine.
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, uint32_t src, uint32_t bytes) {
  asm volatile(
      "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst),
      "r"(src), "r"(bytes)
      : "memory");
}
__device__ __forceinline__ void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
template <int N>
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accesses of accumulator registers across a wgmma wait.
template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; i++) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void fence_regs(uint32_t (&r)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; i++) {
#pragma unroll
    for (int j = 0; j < 4; j++) asm volatile("" : "+r"(r[i][j])::"memory");
  }
}

template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

// Shared-memory matrix descriptor, 128-byte swizzle. K-major operands: rows of 64 bf16 (128 B),
// 8-row groups 1024 B apart (sbo); k steps of 16 advance the start by 32 B. MN-major operands:
// 64-element atoms along M/N `lbo` apart, 8-row (k) groups `sbo` = 1024 B apart.
__device__ __forceinline__ uint64_t make_desc(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((saddr & 0x3FFFFu) >> 4) |
         (static_cast<uint64_t>((lbo >> 4) & 0x3FFFu) << 16) |
         (static_cast<uint64_t>((sbo >> 4) & 0x3FFFu) << 32) | (uint64_t{1} << 62);
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ void st_shared_u32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ void st_shared_v4(uint32_t addr, float a, float b, float c, float d) {
  asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "f"(a), "f"(b), "f"(c),
               "f"(d)
               : "memory");
}
__device__ __forceinline__ float2 ld_shared_f2(uint32_t addr) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(addr) : "memory");
  return v;
}

// Accumulator columns 16k..16k+15 (8-column groups 2k, 2k+1) as the bf16 A fragment of k step k.
template <int NACC>
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[4], const float (&d)[NACC], int k) {
  a[0] = pack_bf16(d[8 * k + 0], d[8 * k + 1]);
  a[1] = pack_bf16(d[8 * k + 2], d[8 * k + 3]);
  a[2] = pack_bf16(d[8 * k + 4], d[8 * k + 5]);
  a[3] = pack_bf16(d[8 * k + 6], d[8 * k + 7]);
}

__device__ __forceinline__ int clamp_diag(int64_t d) {
  return static_cast<int>(d < -512 ? -512 : (d > 512 ? 512 : d));
}

// ---------------------------------------------------------------------------------------------
// Forward.
constexpr int kFwdM = 128;        // query rows per CTA (2 consumer warpgroups x 64)
constexpr int kFwdN = 128;        // keys per block
constexpr int kFwdThreads = 384;  // producer warpgroup + 2 consumer warpgroups
struct FwdSmem {
  static constexpr uint32_t kQ = 0;                     // [2 halves][128 rows][64] bf16, 32 KB
  static constexpr uint32_t kK = 32768;                 // 2 stages x [2 halves][128 keys][64]
  static constexpr uint32_t kV = kK + 2 * 32768;        // 2 stages x [2 halves][128 keys][64]
  static constexpr uint32_t kBar = kV + 2 * 32768;      // q_full, k_full[2], v_full[2], empty[2]
  static constexpr uint32_t kBytes = kBar + 64 + 1024;  // + alignment slack
};

__global__ void __launch_bounds__(kFwdThreads, 1)
    attn_fwd_hopper_kernel(const __grid_constant__ CUtensorMap tm_q,
                           const __grid_constant__ CUtensorMap tm_k,
                           const __grid_constant__ CUtensorMap tm_v,
                           const __grid_constant__ CUtensorMap tm_o, float* __restrict__ lse,
                           int Sq, int Sk, int Hq, int Hkv, float scale_log2, bool causal,
                           int64_t off, const int32_t* __restrict__ q_positions) {
#if HCP_HOPPER_ENABLED
  extern __shared__ unsigned char smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t bar_q = base + FwdSmem::kBar;
  const uint32_t bar_k = bar_q + 8;       // [2]
  const uint32_t bar_v = bar_q + 24;      // [2]
  const uint32_t bar_empty = bar_q + 40;  // [2]

  const int qt = static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x);
  const int h = blockIdx.y, b = blockIdx.z;
  const int kvh = h / (Hq / Hkv);
  const int i0 = qt * kFwdM;
  int64_t last = Sk - 1;
  if (causal && static_cast<int64_t>(i0) + kFwdM - 1 + off < last) {
    last = static_cast<int64_t>(i0) + kFwdM - 1 + off;
  }
  const int nkb = last < 0 ? 0 : static_cast<int>(last / kFwdN) + 1;
  // Packed documents: the key blocks before the first row's document are skipped, and the
  // blocks before the last row's document start are masked row by row (attn_first_key).
  const int32_t* positions_b =
      q_positions == nullptr ? nullptr : q_positions + static_cast<int64_t>(b) * Sq;
  const int fkb = static_cast<int>(attn_first_key_block(positions_b, i0, off, kFwdN));
  const int nit = nkb > fkb ? nkb - fkb : 0;  // key blocks nkb - 1 down to fkb
  const int64_t tile_first_key =
      positions_b == nullptr ? 0 : attn_first_key(positions_b, min(i0 + kFwdM, Sq) - 1, off);

  if (threadIdx.x == 0) {
    mbar_init(bar_q, 1);
    for (int s = 0; s < 2; s++) {
      mbar_init(bar_k + 8 * s, 1);
      mbar_init(bar_v + 8 * s, 1);
      mbar_init(bar_empty + 8 * s, 8);  // lane 0 of each of the 8 consumer warps
    }
    fence_barrier_init();
  }
  __syncthreads();

  // Warp-uniform by construction (a shuffle from lane 0): each role is one branch, and the
  // consumers get 240 registers (setmaxnreg) while the kernel is compiled for 168.
  const int wg = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 128, 0);
  if (wg == 0) {
    setmaxnreg_dec<24>();
    if (threadIdx.x == 0) {
      mbar_expect_tx(bar_q, 32768);
      for (int hh = 0; hh < 2; hh++) {
        for (int w = 0; w < 2; w++) {
          tma_load_4d(base + FwdSmem::kQ + hh * 16384 + w * 8192, &tm_q, bar_q, hh * 64, h,
                      i0 + w * 64, b);
        }
      }
      for (int it = 0; it < nit; it++) {
        const int kb = nkb - 1 - it, st = it & 1;
        if (it >= 2) mbar_wait(bar_empty + 8 * st, ((it >> 1) - 1) & 1);
        mbar_expect_tx(bar_k + 8 * st, 32768);
        for (int hh = 0; hh < 2; hh++) {
          tma_load_4d(base + FwdSmem::kK + st * 32768 + hh * 16384, &tm_k, bar_k + 8 * st, hh * 64,
                      kvh, kb * kFwdN, b);
        }
        mbar_expect_tx(bar_v + 8 * st, 32768);
        for (int hh = 0; hh < 2; hh++) {
          tma_load_4d(base + FwdSmem::kV + st * 32768 + hh * 16384, &tm_v, bar_v + 8 * st, hh * 64,
                      kvh, kb * kFwdN, b);
        }
      }
    }
  } else {
    // Consumers.
    setmaxnreg_inc<240>();
    const int w = wg - 1;  // 0 or 1: query rows 64w .. 64w + 63 of the tile
    const int tid = threadIdx.x & 127, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, tq = lane & 3;
    const int r_a = 64 * w + 16 * warp + g;  // tile-local rows of this thread: r_a, r_a + 8
    // Their first visible keys (documents; rows past Sq take the last row's).
    const int64_t first_key_a =
        positions_b == nullptr ? 0 : attn_first_key(positions_b, min(i0 + r_a, Sq - 1), off);
    const int64_t first_key_b =
        positions_b == nullptr ? 0 : attn_first_key(positions_b, min(i0 + r_a + 8, Sq - 1), off);

    float o[64];
#pragma unroll
    for (int i = 0; i < 64; i++) o[i] = 0.f;
    float s[64];
    uint32_t p[8][4];
    float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.f, l_b = 0.f;

    const uint32_t q_addr = base + FwdSmem::kQ + w * 8192;
    auto issue_qk = [&](int st) {
      const uint32_t k_addr = base + FwdSmem::kK + st * 32768;
#pragma unroll
      for (int kk = 0; kk < 8; kk++) {
        const uint32_t off_b = (kk >> 2) * 16384 + (kk & 3) * 32;
        wgmma_ss_n128<0, 0>(s, make_desc(q_addr + off_b, 16, 1024),
                            make_desc(k_addr + off_b, 16, 1024), kk > 0 ? 1 : 0);
      }
    };
    auto issue_pv = [&](int st) {
      const uint32_t v_addr = base + FwdSmem::kV + st * 32768;
#pragma unroll
      for (int kk = 0; kk < 8; kk++) {
        wgmma_rs_n128<1>(o, p[kk], make_desc(v_addr + kk * 2048, 16384, 1024), 1);
      }
    };
    // Mask (when needed), running max, exponentials in place, running sums; returns the factors
    // by which the old O rows must be scaled.
    auto softmax = [&](int kb, float& alpha_a, float& alpha_b) {
      const int64_t j0 = static_cast<int64_t>(kb) * kFwdN;
      const bool need_mask = j0 + kFwdN > Sk ||
                             (causal && j0 + kFwdN - 1 > static_cast<int64_t>(i0) + off) ||
                             j0 < tile_first_key;
      if (need_mask) {
        const int kvalid = static_cast<int>(Sk - j0 < kFwdN ? Sk - j0 : kFwdN);
        const int diag = causal ? clamp_diag(static_cast<int64_t>(i0) + off - j0) : 512;
        const int lim_a = min(kvalid - 1, r_a + diag), lim_b = min(kvalid - 1, r_a + 8 + diag);
        // Keys below lo are another document's (documents; 0 without).
        const int lo_a = clamp_diag(first_key_a - j0), lo_b = clamp_diag(first_key_b - j0);
#pragma unroll
        for (int n8 = 0; n8 < 16; n8++) {
          const int j = 8 * n8 + 2 * tq;
          if (j > lim_a || j < lo_a) s[4 * n8 + 0] = -INFINITY;
          if (j + 1 > lim_a || j + 1 < lo_a) s[4 * n8 + 1] = -INFINITY;
          if (j > lim_b || j < lo_b) s[4 * n8 + 2] = -INFINITY;
          if (j + 1 > lim_b || j + 1 < lo_b) s[4 * n8 + 3] = -INFINITY;
        }
      }
      float mx_a = m_a, mx_b = m_b;
#pragma unroll
      for (int n8 = 0; n8 < 16; n8++) {
        mx_a = fmaxf(mx_a, fmaxf(s[4 * n8 + 0], s[4 * n8 + 1]));
        mx_b = fmaxf(mx_b, fmaxf(s[4 * n8 + 2], s[4 * n8 + 3]));
      }
      mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, 1));
      mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, 1));
      mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, 2));
      mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, 2));
      // A row that has seen only masked keys keeps max -inf: exponentiate around 0 then.
      const float mu_a = mx_a == -INFINITY ? 0.f : mx_a * scale_log2;
      const float mu_b = mx_b == -INFINITY ? 0.f : mx_b * scale_log2;
      alpha_a = fast_exp2(m_a * scale_log2 - mu_a);
      alpha_b = fast_exp2(m_b * scale_log2 - mu_b);
      m_a = mx_a;
      m_b = mx_b;
      float sum_a = 0.f, sum_b = 0.f;
#pragma unroll
      for (int n8 = 0; n8 < 16; n8++) {
        s[4 * n8 + 0] = fast_exp2(fmaf(s[4 * n8 + 0], scale_log2, -mu_a));
        s[4 * n8 + 1] = fast_exp2(fmaf(s[4 * n8 + 1], scale_log2, -mu_a));
        s[4 * n8 + 2] = fast_exp2(fmaf(s[4 * n8 + 2], scale_log2, -mu_b));
        s[4 * n8 + 3] = fast_exp2(fmaf(s[4 * n8 + 3], scale_log2, -mu_b));
        sum_a += s[4 * n8 + 0] + s[4 * n8 + 1];
        sum_b += s[4 * n8 + 2] + s[4 * n8 + 3];
      }
      l_a = l_a * alpha_a + sum_a;
      l_b = l_b * alpha_b + sum_b;
    };
    auto release = [&](int st) {
      __syncwarp();
      if (lane == 0) mbar_arrive(bar_empty + 8 * st);
    };

    mbar_wait(bar_q, 0);
    if (nit > 0) {
      float alpha_a, alpha_b;
      mbar_wait(bar_k, 0);
      wgmma_fence();
      issue_qk(0);
      wgmma_commit();
      wgmma_wait<0>();
      fence_regs(s);
      softmax(nkb - 1, alpha_a, alpha_b);
#pragma unroll
      for (int kk = 0; kk < 8; kk++) acc_to_a(p[kk], s, kk);
      for (int it = 1; it < nit; it++) {
        const int st = it & 1, ph = (it >> 1) & 1;
        const int pst = st ^ 1, pph = ((it - 1) >> 1) & 1;
        mbar_wait(bar_k + 8 * st, ph);
        wgmma_fence();
        issue_qk(st);
        wgmma_commit();
        mbar_wait(bar_v + 8 * pst, pph);
        wgmma_fence();
        issue_pv(pst);
        wgmma_commit();
        wgmma_wait<1>();
        fence_regs(s);
        softmax(nkb - 1 - it, alpha_a, alpha_b);
        wgmma_wait<0>();
        fence_regs(o);
        fence_regs(p);
        release(pst);
#pragma unroll
        for (int n8 = 0; n8 < 16; n8++) {
          o[4 * n8 + 0] *= alpha_a;
          o[4 * n8 + 1] *= alpha_a;
          o[4 * n8 + 2] *= alpha_b;
          o[4 * n8 + 3] *= alpha_b;
        }
#pragma unroll
        for (int kk = 0; kk < 8; kk++) acc_to_a(p[kk], s, kk);
      }
      const int lst = (nit - 1) & 1, lph = ((nit - 1) >> 1) & 1;
      mbar_wait(bar_v + 8 * lst, lph);
      wgmma_fence();
      issue_pv(lst);
      wgmma_commit();
      wgmma_wait<0>();
      fence_regs(o);
    }

    // Epilogue.
    l_a += __shfl_xor_sync(0xffffffffu, l_a, 1);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, 1);
    l_a += __shfl_xor_sync(0xffffffffu, l_a, 2);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, 2);
    const float inv_a = l_a > 0.f ? 1.f / l_a : 0.f, inv_b = l_b > 0.f ? 1.f / l_b : 0.f;
    // O rows into this warpgroup's own Q rows (row-local rl = 16 warp + g (+8); 128-byte rows of
    // 64 columns per half, 16-byte chunks XOR-swizzled by row % 8, as the TMA store expects).
    const int rl = 16 * warp + g;
#pragma unroll
    for (int n8 = 0; n8 < 16; n8++) {
      const uint32_t half = q_addr + (n8 >> 3) * 16384;
      const uint32_t chunk = static_cast<uint32_t>(((n8 & 7) ^ (rl & 7)) << 4) + 4 * tq;
      st_shared_u32(half + rl * 128 + chunk,
                    pack_bf16(o[4 * n8 + 0] * inv_a, o[4 * n8 + 1] * inv_a));
      st_shared_u32(half + (rl + 8) * 128 + chunk,
                    pack_bf16(o[4 * n8 + 2] * inv_b, o[4 * n8 + 3] * inv_b));
    }
    fence_proxy_async();
    named_bar_sync(1 + w, 128);
    if (tid == 0) {
      for (int hh = 0; hh < 2; hh++) {
        tma_store_4d(&tm_o, q_addr + hh * 16384, hh * 64, h, i0 + 64 * w, b);
      }
      bulk_commit();
    }
    if (tq == 0) {
      const int row_a = i0 + r_a, row_b = row_a + 8;
      float* lrow = lse + (static_cast<int64_t>(b) * Hq + h) * Sq;
      if (row_a < Sq)
        lrow[row_a] = l_a > 0.f ? (m_a * scale_log2 + __log2f(l_a)) * kLn2 : -INFINITY;
      if (row_b < Sq)
        lrow[row_b] = l_b > 0.f ? (m_b * scale_log2 + __log2f(l_b)) * kLn2 : -INFINITY;
    }
    if (tid == 0) bulk_wait<0>();
  }
#else
  __trap();
#endif
}

// ---------------------------------------------------------------------------------------------
// Backward.
constexpr int kBwdN = 128;        // keys per CTA (2 consumer warpgroups x 64)
constexpr int kBwdM = 64;         // query rows per step
constexpr int kBwdThreads = 384;  // producer warpgroup + 2 consumer warpgroups
struct BwdSmem {
  static constexpr uint32_t kK = 0;                 // [2 halves][128 keys][64] bf16
  static constexpr uint32_t kV = 32768;             // same
  static constexpr uint32_t kQ = 65536;             // 2 stages x [2 halves][64 rows][64]
  static constexpr uint32_t kdO = kQ + 2 * 16384;   // 2 stages x [2 halves][64 rows][64]
  static constexpr uint32_t kdS = kdO + 2 * 16384;  // 2 buffers x [128 keys][64 rows] bf16
  static constexpr uint32_t kdQ = kdS + 2 * 16384;  // [2 warpgroups][8][128 threads][4] f32
  static constexpr uint32_t kL = kdQ + 32768;       // 2 stages x 64 lse2 (f32)
  static constexpr uint32_t kE = kL + 512;          // 2 stages x 64 Delta (f32)
  static constexpr uint32_t kBar = kE + 512;        // kv_full, q_full[2], q_empty[2]
  static constexpr uint32_t kBytes = kBar + 64 + 1024;
};

template <bool kDq>
__global__ void __launch_bounds__(kBwdThreads, 1)
    attn_bwd_hopper_kernel(const __grid_constant__ CUtensorMap tm_q,
                           const __grid_constant__ CUtensorMap tm_k,
                           const __grid_constant__ CUtensorMap tm_v,
                           const __grid_constant__ CUtensorMap tm_do, float* __restrict__ dq_acc,
                           bf16* __restrict__ dk, bf16* __restrict__ dv,
                           const float* __restrict__ lse2, const float* __restrict__ delta, int Sq,
                           int Sk, int Hq, int Hkv, int Sq_pad, float scale, float scale_log2,
                           bool causal, int64_t off, const int32_t* __restrict__ q_positions) {
#if HCP_HOPPER_ENABLED
  extern __shared__ unsigned char smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t bar_kv = base + BwdSmem::kBar;
  const uint32_t bar_full = bar_kv + 8;    // [2]
  const uint32_t bar_empty = bar_kv + 24;  // [2]

  const int kb = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
  const int group = Hq / Hkv;
  const int j0 = kb * kBwdN;
  const int nqb = (Sq + kBwdM - 1) / kBwdM;
  int qb_begin = 0;
  if (causal) {
    const int64_t first_row = static_cast<int64_t>(j0) - off;
    qb_begin =
        first_row <= 0 ? 0 : static_cast<int>(first_row / kBwdM < nqb ? first_row / kBwdM : nqb);
  }
  // Packed documents: the query rows whose document starts after this key block see none of it
  // (they are the last rows: attn_rows_seeing).
  const int32_t* positions_b =
      q_positions == nullptr ? nullptr : q_positions + static_cast<int64_t>(b) * Sq;
  const int qb_end =
      positions_b == nullptr
          ? nqb
          : static_cast<int>((attn_rows_seeing(positions_b, Sq, off, j0 + kBwdN) + kBwdM - 1) /
                             kBwdM);
  const int per_head = qb_end > qb_begin ? qb_end - qb_begin : 0;
  const int iters = per_head * group;

  if (threadIdx.x == 0) {
    mbar_init(bar_kv, 1);
    for (int s = 0; s < 2; s++) {
      mbar_init(bar_full + 8 * s, 1);
      mbar_init(bar_empty + 8 * s, 8);
    }
    fence_barrier_init();
  }
  __syncthreads();

  // Warp-uniform by construction (a shuffle from lane 0): each role is one branch, and the
  // consumers get 240 registers (setmaxnreg) while the kernel is compiled for 168.
  const int wg = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 128, 0);
  if (wg == 0) {
    setmaxnreg_dec<24>();
    if (threadIdx.x == 0) {
      mbar_expect_tx(bar_kv, 65536);
      for (int hh = 0; hh < 2; hh++) {
        tma_load_4d(base + BwdSmem::kK + hh * 16384, &tm_k, bar_kv, hh * 64, kvh, j0, b);
        tma_load_4d(base + BwdSmem::kV + hh * 16384, &tm_v, bar_kv, hh * 64, kvh, j0, b);
      }
      for (int it = 0; it < iters; it++) {
        const int st = it & 1;
        if (it >= 2) mbar_wait(bar_empty + 8 * st, ((it >> 1) - 1) & 1);
        const int hq = kvh * group + it / per_head;
        const int i0 = (qb_begin + it % per_head) * kBwdM;
        const uint32_t full = bar_full + 8 * st;
        mbar_expect_tx(full, 2 * 16384 + 2 * 256);
        for (int hh = 0; hh < 2; hh++) {
          tma_load_4d(base + BwdSmem::kQ + st * 16384 + hh * 8192, &tm_q, full, hh * 64, hq, i0, b);
          tma_load_4d(base + BwdSmem::kdO + st * 16384 + hh * 8192, &tm_do, full, hh * 64, hq, i0,
                      b);
        }
        const int64_t ro = (static_cast<int64_t>(b) * Hq + hq) * Sq_pad + i0;
        bulk_load(base + BwdSmem::kL + st * 256, lse2 + ro, 256, full);
        bulk_load(base + BwdSmem::kE + st * 256, delta + ro, 256, full);
      }
    }
  } else {
    setmaxnreg_inc<240>();
    const int w = wg - 1;  // keys 64w .. 64w + 63 of the block
    const int tid = threadIdx.x & 127, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, tq = lane & 3;
    const int k_a = 64 * w + 16 * warp + g;  // block-local keys of this thread: k_a, k_a + 8
    const int kvalid = Sk - j0 < kBwdN ? Sk - j0 : kBwdN;

    float dka[64], dva[64];
#pragma unroll
    for (int i = 0; i < 64; i++) {
      dka[i] = 0.f;
      dva[i] = 0.f;
    }
    const uint32_t k_addr = base + BwdSmem::kK + w * 8192;  // this warpgroup's 64 key rows
    const uint32_t v_addr = base + BwdSmem::kV + w * 8192;
    mbar_wait(bar_kv, 0);

    for (int it = 0; it < iters; it++) {
      const int st = it & 1, ph = (it >> 1) & 1;
      const int hq = kvh * group + it / per_head;
      const int i0 = (qb_begin + it % per_head) * kBwdM;
      const uint32_t q_addr = base + BwdSmem::kQ + st * 16384;
      const uint32_t do_addr = base + BwdSmem::kdO + st * 16384;
      mbar_wait(bar_full + 8 * st, ph);

      float sacc[32], dpacc[32];
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 8; kk++) {
        const uint32_t oa = (kk >> 2) * 16384 + (kk & 3) * 32;
        const uint32_t ob = (kk >> 2) * 8192 + (kk & 3) * 32;
        wgmma_ss_n64<0, 0>(sacc, make_desc(k_addr + oa, 16, 1024), make_desc(q_addr + ob, 16, 1024),
                           kk > 0 ? 1 : 0);
      }
      wgmma_commit();
#pragma unroll
      for (int kk = 0; kk < 8; kk++) {
        const uint32_t oa = (kk >> 2) * 16384 + (kk & 3) * 32;
        const uint32_t ob = (kk >> 2) * 8192 + (kk & 3) * 32;
        wgmma_ss_n64<0, 0>(dpacc, make_desc(v_addr + oa, 16, 1024),
                           make_desc(do_addr + ob, 16, 1024), kk > 0 ? 1 : 0);
      }
      wgmma_commit();
      wgmma_wait<1>();
      fence_regs(sacc);

      // P^T (rows = keys, columns = query rows of the block).
      const uint32_t l_addr = base + BwdSmem::kL + st * 256, e_addr = base + BwdSmem::kE + st * 256;
      // Documents: some of the block's rows start their document after this key block starts.
      const bool doc_mask =
          positions_b != nullptr && attn_first_key(positions_b, min(i0 + kBwdM, Sq) - 1, off) > j0;
      const bool need_mask = j0 + kBwdN > Sk || doc_mask ||
                             (causal && static_cast<int64_t>(j0) + kBwdN - 1 >
                                            static_cast<int64_t>(i0) + off);
      // Column (query row) c sees this thread's key k iff c >= lim: lim = k - diag (causal), and
      // no column sees a key past the end.
      int lim_a = -(1 << 20), lim_b = -(1 << 20);
      if (need_mask) {
        const int diag = causal ? clamp_diag(static_cast<int64_t>(i0) + off - j0) : 512;
        lim_a = k_a < kvalid ? k_a - diag : (1 << 20);
        lim_b = k_a + 8 < kvalid ? k_a + 8 - diag : (1 << 20);
      }
#pragma unroll
      for (int n8 = 0; n8 < 8; n8++) {
        const int c = 8 * n8 + 2 * tq;
        const float2 L = ld_shared_f2(l_addr + 4 * c);
        sacc[4 * n8 + 0] = c >= lim_a ? fast_exp2(fmaf(sacc[4 * n8 + 0], scale_log2, -L.x)) : 0.f;
        sacc[4 * n8 + 1] =
            c + 1 >= lim_a ? fast_exp2(fmaf(sacc[4 * n8 + 1], scale_log2, -L.y)) : 0.f;
        sacc[4 * n8 + 2] = c >= lim_b ? fast_exp2(fmaf(sacc[4 * n8 + 2], scale_log2, -L.x)) : 0.f;
        sacc[4 * n8 + 3] =
            c + 1 >= lim_b ? fast_exp2(fmaf(sacc[4 * n8 + 3], scale_log2, -L.y)) : 0.f;
      }
      if (doc_mask) {
        // Column c sees key k only from its document's first key on (a row past Sq takes the
        // last row's first key: its dout is zero, so it adds nothing either way).
#pragma unroll
        for (int n8 = 0; n8 < 8; n8++) {
#pragma unroll
          for (int e = 0; e < 2; e++) {
            const int row = min(i0 + 8 * n8 + 2 * tq + e, Sq - 1);
            const int64_t lo = attn_first_key(positions_b, row, off) - j0;
            if (k_a < lo) sacc[4 * n8 + e] = 0.f;
            if (k_a + 8 < lo) sacc[4 * n8 + 2 + e] = 0.f;
          }
        }
      }
      wgmma_wait<0>();
      fence_regs(dpacc);
#pragma unroll
      for (int n8 = 0; n8 < 8; n8++) {
        const float2 E = ld_shared_f2(e_addr + 4 * (8 * n8 + 2 * tq));
        dpacc[4 * n8 + 0] = sacc[4 * n8 + 0] * (dpacc[4 * n8 + 0] - E.x);
        dpacc[4 * n8 + 1] = sacc[4 * n8 + 1] * (dpacc[4 * n8 + 1] - E.y);
        dpacc[4 * n8 + 2] = sacc[4 * n8 + 2] * (dpacc[4 * n8 + 2] - E.x);
        dpacc[4 * n8 + 3] = sacc[4 * n8 + 3] * (dpacc[4 * n8 + 3] - E.y);
      }
      uint32_t pa[4][4], sa[4][4];
#pragma unroll
      for (int kk = 0; kk < 4; kk++) {
        acc_to_a(pa[kk], sacc, kk);
        acc_to_a(sa[kk], dpacc, kk);
      }
      if constexpr (kDq) {
        // dS^T -> shared memory, [128 keys][64 rows] bf16, 128-byte rows, chunks swizzled.
        const uint32_t ds_addr = base + BwdSmem::kdS + (it & 1) * 16384;
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
#pragma unroll
          for (int j = 0; j < 2; j++) {
            const int n8 = 2 * kk + j;
            const uint32_t chunk = static_cast<uint32_t>((n8 ^ (k_a & 7)) << 4) + 4 * tq;
            st_shared_u32(ds_addr + k_a * 128 + chunk, sa[kk][2 * j]);
            st_shared_u32(ds_addr + (k_a + 8) * 128 + chunk, sa[kk][2 * j + 1]);
          }
        }
      }
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 4; kk++) {
        wgmma_rs_n128<1>(dva, pa[kk], make_desc(do_addr + kk * 2048, 8192, 1024), 1);
      }
#pragma unroll
      for (int kk = 0; kk < 4; kk++) {
        wgmma_rs_n128<1>(dka, sa[kk], make_desc(q_addr + kk * 2048, 8192, 1024), 1);
      }
      wgmma_commit();
      if constexpr (kDq) {
        fence_proxy_async();
        if (tid == 0) bulk_wait_read<0>();  // the previous step's dQ staging has been read
        named_bar_sync(1, 256);             // dS^T of both warpgroups in shared memory
        float dq[32];
        wgmma_fence();
        const uint32_t ds_addr = base + BwdSmem::kdS + (it & 1) * 16384;
        const uint32_t kd_addr = base + BwdSmem::kK + w * 16384;  // columns 64w.. of K, all keys
#pragma unroll
        for (int kk = 0; kk < 8; kk++) {
          wgmma_ss_n64<1, 1>(dq, make_desc(ds_addr + kk * 2048, 8192, 1024),
                             make_desc(kd_addr + kk * 2048, 8192, 1024), kk > 0 ? 1 : 0);
        }
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs(dq);
        fence_regs(dka);
        fence_regs(dva);
        fence_regs(pa);
        fence_regs(sa);
        __syncwarp();
        if (lane == 0) mbar_arrive(bar_empty + 8 * st);
        const uint32_t dq_addr = base + BwdSmem::kdQ + w * 16384;
#pragma unroll
        for (int n8 = 0; n8 < 8; n8++) {
          st_shared_v4(dq_addr + (n8 * 128 + tid) * 16, dq[4 * n8 + 0], dq[4 * n8 + 1],
                       dq[4 * n8 + 2], dq[4 * n8 + 3]);
        }
        fence_proxy_async();
        named_bar_sync(2 + w, 128);
        if (tid == 0) {
          float* dst =
              dq_acc + ((static_cast<int64_t>(b) * Hq + hq) * Sq_pad + i0) * kD + w * (kBwdM * 64);
          bulk_reduce_add_f32(dst, dq_addr, 16384);
          bulk_commit();
        }
      } else {
        wgmma_wait<0>();
        fence_regs(dka);
        fence_regs(dva);
        fence_regs(pa);
        fence_regs(sa);
        __syncwarp();
        if (lane == 0) mbar_arrive(bar_empty + 8 * st);
      }
    }
    if (kDq && tid == 0) bulk_wait<0>();

    // dK (scaled), dV -> global bf16.
    const int64_t kv_stride = static_cast<int64_t>(Hkv) * kD;
#pragma unroll
    for (int half = 0; half < 2; half++) {
      const int key = j0 + k_a + 8 * half;
      if (key >= Sk) continue;
      const int64_t o =
          (static_cast<int64_t>(b) * Sk + key) * kv_stride + static_cast<int64_t>(kvh) * kD;
#pragma unroll
      for (int n8 = 0; n8 < 16; n8++) {
        const int d = 8 * n8 + 2 * tq;
        *reinterpret_cast<uint32_t*>(dk + o + d) =
            pack_bf16(scale * dka[4 * n8 + 2 * half], scale * dka[4 * n8 + 2 * half + 1]);
        *reinterpret_cast<uint32_t*>(dv + o + d) =
            pack_bf16(dva[4 * n8 + 2 * half], dva[4 * n8 + 2 * half + 1]);
      }
    }
  }
#else
  __trap();
#endif
}

// Delta = dout . out per row and lse in the log2 domain, both [B, Hq, Sq_pad] (rows past Sq:
// Delta 0, lse2 +inf so that their P is 0). One warp per row.
__global__ void __launch_bounds__(256)
    attn_bwd_prep_kernel(float* __restrict__ delta, float* __restrict__ lse2,
                         const bf16* __restrict__ dout, const bf16* __restrict__ out,
                         const float* __restrict__ lse, int64_t rows, int Sq, int Sq_pad, int Hq) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * 8 + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int lane = threadIdx.x & 31;
  const int i = static_cast<int>(row % Sq_pad);
  const int64_t bh = row / Sq_pad;
  if (i >= Sq) {
    if (lane == 0) {
      delta[row] = 0.f;
      lse2[row] = INFINITY;
    }
    return;
  }
  const int h = static_cast<int>(bh % Hq);
  const int64_t b = bh / Hq;
  const int64_t off = ((b * Sq + i) * Hq + h) * kD + lane * 4;
  const uint2 gv = *reinterpret_cast<const uint2*>(dout + off);
  const uint2 ov = *reinterpret_cast<const uint2*>(out + off);
  const __nv_bfloat162* g2 = reinterpret_cast<const __nv_bfloat162*>(&gv);
  const __nv_bfloat162* o2 = reinterpret_cast<const __nv_bfloat162*>(&ov);
  float acc = 0.f;
#pragma unroll
  for (int e = 0; e < 2; e++) {
    acc += __low2float(g2[e]) * __low2float(o2[e]) + __high2float(g2[e]) * __high2float(o2[e]);
  }
#pragma unroll
  for (int m = 1; m < 32; m <<= 1) acc += __shfl_xor_sync(0xffffffffu, acc, m);
  if (lane == 0) {
    delta[row] = acc;
    const float l = lse[bh * Sq + i];
    lse2[row] = l == -INFINITY ? INFINITY : l * kLog2e;
  }
}

// dq = scale * dQ accumulator (fp32 workspace, the backward kernel's tile order) as bf16. One
// block of 256 threads per 64-row tile.
__global__ void __launch_bounds__(256)
    attn_bwd_dq_convert_kernel(bf16* __restrict__ dq, const float* __restrict__ acc, int Sq,
                               int Sq_pad, int Hq, float scale) {
  const int64_t tile = blockIdx.x;  // (b * Hq + h) * (Sq_pad / 64) + qb
  const int tiles_per_head = Sq_pad / kBwdM;
  const int qb = static_cast<int>(tile % tiles_per_head);
  const int64_t bh = tile / tiles_per_head;
  const int h = static_cast<int>(bh % Hq);
  const int64_t b = bh / Hq;
  const int w = threadIdx.x >> 7, t = threadIdx.x & 127;
  const int row_a = qb * kBwdM + 16 * (t >> 5) + ((t & 31) >> 2);
  const float* src = acc + tile * (kBwdM * kD) + w * (kBwdM * 64);
#pragma unroll
  for (int n8 = 0; n8 < 8; n8++) {
    const float4 v = *reinterpret_cast<const float4*>(src + (n8 * 128 + t) * 4);
    const int col = 64 * w + 8 * n8 + 2 * (t & 3);
    if (row_a < Sq) {
      *reinterpret_cast<uint32_t*>(dq + ((b * Sq + row_a) * Hq + h) * kD + col) =
          pack_bf16(scale * v.x, scale * v.y);
    }
    if (row_a + 8 < Sq) {
      *reinterpret_cast<uint32_t*>(dq + ((b * Sq + row_a + 8) * Hq + h) * kD + col) =
          pack_bf16(scale * v.z, scale * v.w);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Host side.
PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                         &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess) {
      fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
    }
  });
  return fn;
}

// A [B, S, H, 128] bf16 tensor as a 4-d TMA map with boxes of 64 (d) x 1 (h) x rows x 1 (b),
// 128-byte swizzle; rows past S read as zeros (and are not written by stores).
bool make_map(CUtensorMap* map, const bf16* ptr, int64_t B, int64_t S, int64_t H, int rows) {
  auto fn = encode_fn();
  if (fn == nullptr) return false;
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(kD), static_cast<cuuint64_t>(H),
                              static_cast<cuuint64_t>(S), static_cast<cuuint64_t>(B)};
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(kD * 2),
                                 static_cast<cuuint64_t>(H * kD * 2),
                                 static_cast<cuuint64_t>(S * H * kD * 2)};
  const cuuint32_t box[4] = {64, 1, static_cast<cuuint32_t>(rows), 1};
  const cuuint32_t estr[4] = {1, 1, 1, 1};
  const CUresult r =
      fn(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<bf16*>(ptr), dims, strides, box, estr,
         CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
         CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS;
}

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

}  // namespace
}  // namespace hopper

namespace seq_detail {

AttnImpl attn_impl() {
  const char* e = std::getenv("HCP_ATTN_IMPL");
  if (e == nullptr || e[0] == '\0') return AttnImpl::kHopper;
  if (std::strcmp(e, "fa2") == 0) return AttnImpl::kFa2;
  if (std::strcmp(e, "hopper-det") == 0) return AttnImpl::kHopperDeterministic;
  return AttnImpl::kHopper;
}

bool attn_hopper_usable(const AttentionShape& s, float scale) {
  if (attn_impl() == AttnImpl::kFa2) return false;
  if (s.head_dim != 128 || !(scale > 0.f) || !std::isfinite(scale)) return false;
  if (s.q_len >= (int64_t{1} << 30) || s.kv_len >= (int64_t{1} << 30)) return false;
  if (hopper::encode_fn() == nullptr) return false;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
    return false;
  }
  return major == 9 && minor == 0;
}

cudaError_t attn_hopper_forward(cudaStream_t stream, bf16* out, float* lse, const bf16* q,
                                const bf16* k, const bf16* v, const AttentionShape& s, float scale,
                                bool causal, int64_t off, const int32_t* q_positions) {
  using namespace hopper;
  CUtensorMap tq, tk, tv, to;
  if (!make_map(&tq, q, s.batch, s.q_len, s.q_heads, 64) ||
      !make_map(&tk, k, s.batch, s.kv_len, s.kv_heads, 128) ||
      !make_map(&tv, v, s.batch, s.kv_len, s.kv_heads, 128) ||
      !make_map(&to, out, s.batch, s.q_len, s.q_heads, 64)) {
    return cudaErrorInvalidValue;
  }
  const int smem = static_cast<int>(FwdSmem::kBytes);
  cudaError_t err = cudaFuncSetAttribute(attn_fwd_hopper_kernel,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  dim3 grid(static_cast<unsigned>((s.q_len + kFwdM - 1) / kFwdM), static_cast<unsigned>(s.q_heads),
            static_cast<unsigned>(s.batch));
  attn_fwd_hopper_kernel<<<grid, kFwdThreads, smem, stream>>>(
      tq, tk, tv, to, lse, static_cast<int>(s.q_len), static_cast<int>(s.kv_len),
      static_cast<int>(s.q_heads), static_cast<int>(s.kv_heads), scale * kLog2e, causal, off,
      q_positions);
  return cudaGetLastError();
}

AttnHopperBwdBuffers attn_hopper_bwd_buffers(const AttentionShape& s, bool with_dq, void* base) {
  const int64_t sq_pad = hopper::round_up(s.q_len, hopper::kBwdM);
  const size_t rows = static_cast<size_t>(s.batch * s.q_heads * sq_pad);
  AttnHopperBwdBuffers buf{};
  unsigned char* p = static_cast<unsigned char*>(base);
  size_t at = 0;
  buf.delta = reinterpret_cast<float*>(p + at);
  at += align_up(rows * sizeof(float));
  buf.lse2 = reinterpret_cast<float*>(p + at);
  at += align_up(rows * sizeof(float));
  buf.dq_acc = with_dq ? reinterpret_cast<float*>(p + at) : nullptr;
  if (with_dq) at += align_up(rows * hopper::kD * sizeof(float));
  buf.bytes = at;
  buf.sq_pad = sq_pad;
  return buf;
}

cudaError_t attn_hopper_backward(cudaStream_t stream, bf16* dq, bf16* dk, bf16* dv,
                                 const bf16* dout, const bf16* q, const bf16* k, const bf16* v,
                                 const bf16* out, const float* lse, const AttentionShape& s,
                                 float scale, bool causal, int64_t off,
                                 const AttnHopperBwdBuffers& buf, const int32_t* q_positions) {
  using namespace hopper;
  const bool with_dq = buf.dq_acc != nullptr;
  const int Sq_pad = static_cast<int>(buf.sq_pad);
  const int64_t rows = s.batch * s.q_heads * buf.sq_pad;
  attn_bwd_prep_kernel<<<static_cast<unsigned>((rows + 7) / 8), 256, 0, stream>>>(
      buf.delta, buf.lse2, dout, out, lse, rows, static_cast<int>(s.q_len), Sq_pad,
      static_cast<int>(s.q_heads));
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  if (with_dq) {
    err = cudaMemsetAsync(buf.dq_acc, 0, static_cast<size_t>(rows) * kD * sizeof(float), stream);
    if (err != cudaSuccess) return err;
  }
  CUtensorMap tq, tk, tv, tdo;
  if (!make_map(&tq, q, s.batch, s.q_len, s.q_heads, 64) ||
      !make_map(&tk, k, s.batch, s.kv_len, s.kv_heads, 128) ||
      !make_map(&tv, v, s.batch, s.kv_len, s.kv_heads, 128) ||
      !make_map(&tdo, dout, s.batch, s.q_len, s.q_heads, 64)) {
    return cudaErrorInvalidValue;
  }
  const int smem = static_cast<int>(BwdSmem::kBytes);
  auto kernel = with_dq ? attn_bwd_hopper_kernel<true> : attn_bwd_hopper_kernel<false>;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  dim3 grid(static_cast<unsigned>((s.kv_len + kBwdN - 1) / kBwdN),
            static_cast<unsigned>(s.kv_heads), static_cast<unsigned>(s.batch));
  kernel<<<grid, kBwdThreads, smem, stream>>>(
      tq, tk, tv, tdo, buf.dq_acc, dk, dv, buf.lse2, buf.delta, static_cast<int>(s.q_len),
      static_cast<int>(s.kv_len), static_cast<int>(s.q_heads), static_cast<int>(s.kv_heads), Sq_pad,
      scale, scale * kLog2e, causal, off, q_positions);
  err = cudaGetLastError();
  if (err != cudaSuccess || !with_dq) return err;
  const int64_t tiles = s.batch * s.q_heads * (buf.sq_pad / kBwdM);
  attn_bwd_dq_convert_kernel<<<static_cast<unsigned>(tiles), 256, 0, stream>>>(
      dq, buf.dq_acc, static_cast<int>(s.q_len), Sq_pad, static_cast<int>(s.q_heads), scale);
  return cudaGetLastError();
}

}  // namespace seq_detail
}  // namespace hcp::cuda
