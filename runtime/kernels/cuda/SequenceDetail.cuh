// Internal to the sequence kernels (SsdScan*.cu, Attention*.cu): warp-level tensor-core helpers
// (mma.sync m16n8k16 bf16 -> fp32, ldmatrix, cp.async) and the SSD scan's internal launchers,
// shared by its forward and backward translation units.
//
// Fragment layouts of mma.sync.m16n8k16 (g = lane / 4, t = lane % 4), used throughout:
//   A (16x16, row-major): a[0] = (row g,   k 2t..2t+1)   a[1] = (row g+8, k 2t..2t+1)
//                         a[2] = (row g,   k 2t+8..+9)   a[3] = (row g+8, k 2t+8..+9)
//   B (16x8):             b[0] = (k 2t..2t+1, col g)     b[1] = (k 2t+8..+9, col g)
//   C (16x8, fp32):       c[0], c[1] = (row g, cols 2t, 2t+1); c[2], c[3] = (row g+8, same cols)
// So the accumulators of two adjacent 8-column tiles, packed to bf16, ARE the A fragment of the
// 16-wide k step over those columns (the flash-attention trick): see acc_to_a().
//
// Shared-memory tiles are bf16, row-major, with rows padded by 8 elements (16 bytes): when a row
// holds a multiple of 64 elements, the 8 rows one ldmatrix reads fall in 8 distinct 16-byte bank
// groups, so the loads are conflict-free.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "runtime/kernels/cuda/SequenceKernels.h"

namespace hcp::cuda::seq_detail {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// d += a * b, bf16 operands, fp32 accumulators.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats to a bf16 pair; `lo` lands at the lower address / lower column.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// Accumulators of 8-column tiles 2j and 2j+1 -> the A fragment of k step j.
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[4], const float (&c0)[4],
                                         const float (&c1)[4]) {
  a[0] = pack_bf16(c0[0], c0[1]);
  a[1] = pack_bf16(c0[2], c0[3]);
  a[2] = pack_bf16(c1[0], c1[1]);
  a[3] = pack_bf16(c1[2], c1[3]);
}

// A fragment (16 x 16 at (m0, k0)) of a matrix stored row-major as A[m][k] (row stride ld).
__device__ __forceinline__ void load_a_mk(uint32_t (&a)[4], const __nv_bfloat16* base, int ld,
                                          int m0, int k0) {
  const int lane = threadIdx.x & 31;
  ldsm_x4(a, smem_addr(base + (m0 + (lane & 15)) * ld + k0 + (lane >> 4) * 8));
}
// A fragment of A = At^T where At[k][m] is what is stored (row stride ld).
__device__ __forceinline__ void load_a_km(uint32_t (&a)[4], const __nv_bfloat16* base, int ld,
                                          int m0, int k0) {
  const int lane = threadIdx.x & 31;
  ldsm_x4_trans(
      a, smem_addr(base + (k0 + (lane & 7) + (lane >> 4) * 8) * ld + m0 + ((lane >> 3) & 1) * 8));
}
// B fragments of two 8-column tiles (n0 and n0 + 8) over k0..k0+15, B stored as Bt[n][k]:
// b[0], b[1] for the first tile, b[2], b[3] for the second.
__device__ __forceinline__ void load_b_nk(uint32_t (&b)[4], const __nv_bfloat16* base, int ld,
                                          int n0, int k0) {
  const int lane = threadIdx.x & 31;
  ldsm_x4(b,
          smem_addr(base + (n0 + (lane & 7) + (lane >> 4) * 8) * ld + k0 + ((lane >> 3) & 1) * 8));
}
// The same, B stored as B[k][n].
__device__ __forceinline__ void load_b_kn(uint32_t (&b)[4], const __nv_bfloat16* base, int ld,
                                          int n0, int k0) {
  const int lane = threadIdx.x & 31;
  ldsm_x4_trans(
      b, smem_addr(base + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld + n0 + (lane >> 4) * 8));
}

// acc += A Bt^T for a warp's 16 rows: A[m0 .. m0 + 16][0 .. K) and Bt[0 .. 64][0 .. K), both
// row-major bf16 in shared memory (row strides lda, ldb); acc is [16 x 64] in the mma
// accumulator layout (acc[nt]: columns nt * 8 ..).
template <int K>
__device__ __forceinline__ void warp_product_16x64(float (&acc)[8][4], const __nv_bfloat16* A,
                                                   int lda, int m0, const __nv_bfloat16* Bt,
                                                   int ldb) {
#pragma unroll
  for (int k = 0; k < K / 16; k++) {
    uint32_t a[4];
    load_a_mk(a, A, lda, m0, k * 16);
#pragma unroll
    for (int np = 0; np < 4; np++) {
      uint32_t b[4];
      load_b_nk(b, Bt, ldb, np * 16, k * 16);
      mma_bf16(acc[2 * np], a, b[0], b[1]);
      mma_bf16(acc[2 * np + 1], a, b[2], b[3]);
    }
  }
}

// 16-byte global -> shared copy that bypasses registers; zero-fills when !valid (src not read).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem),
               "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// 2^x (MUFU.EX2; ex2(-inf) = 0).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
// e^x through ex2; relative error ~1e-7 * (1 + |x|), far below bf16 rounding.
__device__ __forceinline__ float fast_exp(float x) { return fast_exp2(x * 1.4426950408889634f); }

// Copies a [rows, cols] bf16 tile whose row r starts at src + r * src_stride (elements) into a
// padded shared tile (row stride cols + 8) with cp.async, zero-filling rows >= valid_rows.
// cols must be a multiple of 8; all threads of the block call it.
template <int kRows, int kCols, int kThreads>
__device__ __forceinline__ void tile_load_async(__nv_bfloat16* dst, const __nv_bfloat16* src,
                                                int64_t src_stride, int valid_rows) {
  constexpr int kChunksPerRow = kCols / 8;
  constexpr int kChunks = kRows * kChunksPerRow;
  for (int i = threadIdx.x; i < kChunks; i += kThreads) {
    const int r = i / kChunksPerRow, c = (i % kChunksPerRow) * 8;
    const bool valid = r < valid_rows;
    const __nv_bfloat16* s = valid ? src + r * src_stride + c : src;
    cp_async16(dst + r * (kCols + 8) + c, s, valid);
  }
}

// ---------------------------------------------------------------------------------------------
// SSD internals. The chunk is fixed at 256 positions (the Granite 4.0 value, and the only one
// ssd_supported accepts); the state size at 128.
constexpr int kSsdChunk = 256;
constexpr int kSsdState = 128;

// A chunk's 64 x 64 tiles. The kernels that work on its Q x Q scores C_l . B_s take one
// lower-triangular pair of tiles a block (rows in tile lt >= columns in tile st), numbered row by
// row: pair (lt, st) is block lt (lt + 1) / 2 + st.
constexpr int kSsdTile = 64, kSsdTiles = kSsdChunk / kSsdTile;
constexpr int kSsdTilePairs = kSsdTiles * (kSsdTiles + 1) / 2;
__host__ __device__ inline int ssd_pair_index(int lt, int st) { return lt * (lt + 1) / 2 + st; }
// The tiles (lt, st) of pair `index`.
__device__ __forceinline__ void ssd_tile_pair(int index, int& lt, int& st) {
  lt = 0;
  while (ssd_pair_index(lt + 1, 0) <= index) lt++;
  st = index - ssd_pair_index(lt, 0);
}

// A warp's 16 rows of fp32 scores (row stride kSsdChunk) in the mma accumulator layout: row
// points at the lane's first row (gq) and first column (2 * tq); sc[nt] holds columns nt * 8 +
// {0, 1} of it (0, 1) and of the row 8 below (2, 3).
__device__ __forceinline__ void load_score_rows(float (&sc)[8][4], const float* row) {
#pragma unroll
  for (int nt = 0; nt < 8; nt++) {
    const float2 a = __ldg(reinterpret_cast<const float2*>(row + nt * 8));
    const float2 b = __ldg(reinterpret_cast<const float2*>(row + 8 * kSsdChunk + nt * 8));
    sc[nt][0] = a.x;
    sc[nt][1] = a.y;
    sc[nt][2] = b.x;
    sc[nt][3] = b.y;
  }
}

// One chunk's fp32 state [P][N] (contiguous) into a padded bf16 shared tile (row stride N + 8).
// All of a thread's loads are issued before its first conversion, in groups of 8 16-byte loads
// (32 registers): one load-convert-store at a time would wait out the memory latency per piece.
// All threads of the block call it.
template <int P, int kThreads>
__device__ __forceinline__ void stage_state_bf16(__nv_bfloat16* dst, const float* src) {
  constexpr int kPieces = P * kSsdState / 4 / kThreads;
  constexpr int kGroup = kPieces < 8 ? kPieces : 8;
  static_assert(kPieces * kThreads * 4 == P * kSsdState && kPieces % kGroup == 0);
#pragma unroll
  for (int k0 = 0; k0 < kPieces; k0 += kGroup) {
    float4 v[kGroup];
#pragma unroll
    for (int k = 0; k < kGroup; k++) {
      v[k] = reinterpret_cast<const float4*>(src)[threadIdx.x + (k0 + k) * kThreads];
    }
#pragma unroll
    for (int k = 0; k < kGroup; k++) {
      const int e = (threadIdx.x + (k0 + k) * kThreads) * 4;
      const int p = e / kSsdState, n = e % kSsdState;
      uint2 o;
      o.x = pack_bf16(v[k].x, v[k].y);
      o.y = pack_bf16(v[k].z, v[k].w);
      *reinterpret_cast<uint2*>(dst + p * (kSsdState + 8) + n) = o;
    }
  }
}

// Packed documents in the SSD scan (positions [B,S], Hugging Face's position_ids; null: one
// document). Within a chunk (first position t0, `valid` positions), position l's document starts
// at chunk position l - positions[t0 + l], negative when it began before the chunk. Every decay
// of the chunked algorithm runs from an earlier position to a later one, and is zero (the term
// masked) when a document starts after the earlier one, up to the later one:
//   within the chunk, s to l (s <= l):   s >= start(l)
//   the entering state to l:             start(l) < 0
//   s to the chunk's end (its state):    s >= start(last), last = valid - 1
//   through the whole chunk:             start(last) < 0
// Without documents and past the sequence, kNoDocumentStart: every mask passes.
constexpr int kNoDocumentStart = -(1 << 30);
__device__ __forceinline__ int chunk_document_start(const int32_t* positions, int64_t b, int64_t S,
                                                    int64_t t0, int l, int valid) {
  if (positions == nullptr || l >= valid) return kNoDocumentStart;
  return max(kNoDocumentStart, l - positions[b * S + t0 + l]);
}

// Whether a state passes through chunk c of batch row b whole: no document starts in it.
__device__ __forceinline__ bool passes_through_chunk(const int32_t* positions, int64_t b, int64_t S,
                                                     int64_t c) {
  if (positions == nullptr) return true;
  const int64_t t0 = c * kSsdChunk;
  const int valid = static_cast<int>(S - t0 < kSsdChunk ? S - t0 : kSsdChunk);
  return chunk_document_start(positions, b, S, t0, valid - 1, valid) < 0;
}

// Workspace slices of the forward (and of the backward, which starts with the same three).
//   acs    [B, H, nc, Q]      inclusive cumulative sum of dt * A within each chunk (fp32)
//   dtc    [B, H, nc, Q]      dt, zero past the end of the sequence (fp32)
//   states [B, H, nc, P, N]   the state ENTERING each chunk (fp32)
//   cb     [B, G, nc, Q, Q]   C_l . B_s within each chunk (fp32), only its lower-triangular 64 x 64
//                             tiles (s <= l, tile-wise) written; shared by the group's heads
struct SsdForwardBuffers {
  float* acs;
  float* dtc;
  float* states;
  float* cb;
};
size_t ssd_forward_buffers_bytes(const SsdShape& shape);
SsdForwardBuffers ssd_forward_buffers(const SsdShape& shape, void* base);

// Fills acs and dtc.
cudaError_t ssd_chunk_cumsum(cudaStream_t stream, const SsdForwardBuffers& buf, const float* dt,
                             const float* A, const SsdShape& shape);

// Fills acs, dtc and states (entering states; the final state goes to final_state if not null).
// positions nullable (packed documents).
cudaError_t ssd_forward_states(cudaStream_t stream, const SsdForwardBuffers& buf,
                               float* final_state, const bf16* x, const float* dt, const float* A,
                               const bf16* Bm, const float* init_state, const int32_t* positions,
                               const SsdShape& shape);

// Fills buf.cb from C and B [B,S,G,N] (bf16), for ssd_chunk_scan's column tiles.
cudaError_t ssd_chunk_cb(cudaStream_t stream, const SsdForwardBuffers& buf, const bf16* Cm,
                         const bf16* Bm, const SsdShape& shape);

// Per-chunk weighted outer-product sums, out[b,h,c] (P x N fp32) = sum_l U_l^T w_l V_l over the
// chunk's positions, with U [B,S,H,P] and V [B,S,G,N] (bf16). kind 0: the chunk state
// (U = x, V = B, w_l = exp(acs_last - acs_l) dt_l); kind 1: the backward's state gradient from
// the outputs (U = dy, V = C, w_l = exp(acs_l)). With positions, w_l is zero where the decay
// crosses a document start (kind 0: l before the last document's start; kind 1: l after the
// chunk's first).
cudaError_t ssd_chunk_outer(cudaStream_t stream, int kind, float* out, const bf16* U, const bf16* V,
                            const SsdForwardBuffers& buf, const int32_t* positions,
                            const SsdShape& shape);

// The chunk-local quadratic form plus the incoming-state term, for the forward's y (dir 0) or the
// backward's dx (dir 1); see SsdScan.cu.
struct SsdScanArgs {
  const bf16* R;       // row-side vectors [B,S,G,N]: C (fwd) or B (bwd)
  const float* cb;     // [B,G,nc,Q,Q] C_l . B_s (ssd_chunk_cb; unread without column tiles)
  const bf16* U;       // column-side values [B,S,H,P]: x (fwd) or dy (bwd)
  const float* state;  // [B,H,nc,P,N]: entering states (fwd) or gradients of leaving states (bwd)
  const bf16* x;       // [B,S,H,P]
  const bf16* dy;      // [B,S,H,P] (bwd only; null: dy = 0, only the state term)
  const float* D;      // [H] nullable
  const float* acs;
  const float* dtc;
  bf16* out;                 // y (fwd) or dx (bwd)
  float* ddt_part;           // bwd: [B,H,nc,Q] the explicit part of ddt
  float* dD_part;            // bwd: [B,H,nc,2] partial sums of dy . x (not written without dy)
  const int32_t* positions;  // [B,S] packed documents, or null
};
cudaError_t ssd_chunk_scan(cudaStream_t stream, int dir, const SsdScanArgs& args,
                           const SsdShape& shape);

// ---------------------------------------------------------------------------------------------
// Attention internals: 64-row query blocks and 64-row key blocks; off = q_pos0 - k_pos0, so key j
// is visible to query row i iff j <= i + off (when causal).
constexpr int kAttnBlock = 64;

// Number of key blocks query rows [i0, i0 + 64) can see (0 when none).
__host__ __device__ inline int64_t attn_key_blocks(int64_t i0, int64_t Sk, bool causal,
                                                   int64_t off) {
  int64_t last = Sk - 1;
  if (causal) {
    const int64_t vis = i0 + kAttnBlock - 1 + off;
    if (vis < last) last = vis;
  }
  return last < 0 ? 0 : last / kAttnBlock + 1;
}
// First query block whose rows can see key rows [j0, j0 + 64).
__host__ __device__ inline int64_t attn_first_query_block(int64_t j0, bool causal, int64_t off) {
  if (!causal) return 0;
  const int64_t first_row = j0 - off;  // the smallest i with j0 <= i + off
  return first_row <= 0 ? 0 : first_row / kAttnBlock;
}

// Packed documents (q_positions [B, Sq] of the query rows, nullable): query row i sees no key
// before its document's start, key index i + off - q_positions[i] (off = q_pos0 - k_pos0). That
// first visible key never decreases along the rows (a document goes on, or a new one starts at
// the row itself), so a block of rows sees no key before its first row's, and the rows that see
// any key of a block below j_end form a prefix (attn_rows_seeing).
__device__ __forceinline__ int64_t attn_first_key(const int32_t* q_positions_b, int64_t i,
                                                  int64_t off) {
  return i + off - q_positions_b[i];
}
// The first key block (of `block` keys) the query rows from i0 on can see (0 without documents).
__device__ __forceinline__ int64_t attn_first_key_block(const int32_t* q_positions_b, int64_t i0,
                                                        int64_t off, int block = kAttnBlock) {
  if (q_positions_b == nullptr) return 0;
  const int64_t first = attn_first_key(q_positions_b, i0, off);
  return first <= 0 ? 0 : first / block;
}
// The number of leading rows (of Sq) whose first visible key is below j_end.
__device__ __forceinline__ int64_t attn_rows_seeing(const int32_t* q_positions_b, int64_t Sq,
                                                    int64_t off, int64_t j_end) {
  int64_t lo = 0, hi = Sq;  // rows [0, lo) see below j_end; rows [hi, Sq) do not
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (attn_first_key(q_positions_b, mid, off) < j_end) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}
// A key index relative to a block's first key j0, clamped to 32 bits (the masks compare it with
// 0..63).
__host__ __device__ inline int attn_clamp128(int64_t d) {
  return static_cast<int>(d < -128 ? -128 : (d > 128 ? 128 : d));
}
__device__ __forceinline__ int attn_relative_key(int64_t key, int64_t j0) {
  return attn_clamp128(key - j0);
}

// i0 + off - j0 clamped to [-128, 128]: within a (query block i0, key block j0) pair, key row
// jr (0..63) is causally visible to query row ir iff jr <= ir + attn_diag(...). 32-bit, so the
// per-element masks cost no 64-bit arithmetic.
__host__ __device__ inline int attn_diag(int64_t i0, int64_t j0, int64_t off) {
  return attn_clamp128(i0 + off - j0);
}

// The Hopper attention path (AttentionHopper.cu: wgmma + TMA, head_dim 128, sm_90a builds).
// Which implementation attention_forward / attention_backward use is read from the environment
// at every call: HCP_ATTN_IMPL = hopper (default: Hopper kernels, dq through fp32 additions in
// a workspace, not bit-reproducible) | hopper-det (Hopper forward and dk/dv, dq from the
// deterministic mma.sync kernel) | fa2 (the mma.sync kernels only). Shapes or devices the Hopper
// kernels do not take (head_dim 64, not an sm_90 device) always use the mma.sync kernels.
enum class AttnImpl { kFa2, kHopper, kHopperDeterministic };
AttnImpl attn_impl();
// Device is sm_90, head_dim 128, scale > 0, lengths < 2^30, and attn_impl() is not kFa2.
bool attn_hopper_usable(const AttentionShape& s, float scale);
// The copy engine needs 16-byte aligned tensors.
inline bool attn_aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }
// q_positions: packed documents, as attn_first_key (null: one document).
cudaError_t attn_hopper_forward(cudaStream_t stream, bf16* out, float* lse, const bf16* q,
                                const bf16* k, const bf16* v, const AttentionShape& s, float scale,
                                bool causal, int64_t off, const int32_t* q_positions);
// The backward's workspace: Delta and lse * log2(e) per row [B, Hq, sq_pad] (sq_pad = q_len
// rounded up to 64), and with_dq the fp32 dq accumulator [B, Hq, sq_pad, 128].
struct AttnHopperBwdBuffers {
  float* delta;
  float* lse2;
  float* dq_acc;  // null: dq is not computed (deterministic mode)
  size_t bytes;
  int64_t sq_pad;
};
AttnHopperBwdBuffers attn_hopper_bwd_buffers(const AttentionShape& s, bool with_dq, void* base);
// dk, dv (and dq when buf.dq_acc is set); fills buf.delta (stride sq_pad per (b, h)).
cudaError_t attn_hopper_backward(cudaStream_t stream, bf16* dq, bf16* dk, bf16* dv,
                                 const bf16* dout, const bf16* q, const bf16* k, const bf16* v,
                                 const bf16* out, const float* lse, const AttentionShape& s,
                                 float scale, bool causal, int64_t off,
                                 const AttnHopperBwdBuffers& buf, const int32_t* q_positions);

inline int64_t ssd_num_chunks(const SsdShape& s) { return (s.seq + s.chunk - 1) / s.chunk; }
inline size_t align_up(size_t n) { return (n + 255) & ~size_t{255}; }

}  // namespace hcp::cuda::seq_detail
