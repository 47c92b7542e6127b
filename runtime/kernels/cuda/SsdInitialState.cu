// The forward of context parallelism's initial-state correction of the Mamba2 SSD scan:
// ssd_add_initial_state_forward (SequenceKernels.h). The method, the tiling and launch 1 are in
// SsdInitialState.cuh; this file has launch 2 and the entry point.
#include "runtime/kernels/cuda/SsdInitialState.cuh"

namespace hcp::cuda {
namespace seq_detail {
namespace {

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
// written, by the same thread. With positions (packed documents), the decay is zero from the
// segment's first document start on (positions[t] <= t): the entering state reaches no later
// document.
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
                            const bf16* __restrict__ s16, const float* __restrict__ tot,
                            const int32_t* __restrict__ positions, int64_t S, int H, int G,
                            int nL) {
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
    dec[hs * kChunk + 2 * ti] =
        reaches_entering_state(positions, b, S, t) ? fast_exp(a_h * c0) : 0.f;
    dec[hs * kChunk + 2 * ti + 1] =
        reaches_entering_state(positions, b, S, t + 1) ? fast_exp(a_h * c1) : 0.f;
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
// Host side.

template <int P, int kHeads>
cudaError_t launch_forward(cudaStream_t stream, bf16* out, const bf16* y, const float* dt,
                           const float* A, const bf16* Cm, const int32_t* positions,
                           const InitBuffers& buf, const SsdShape& s, const InitGeometry& g) {
  const size_t smem = FwdSmem<P, kHeads>::kBytes;
  cudaError_t err =
      cudaFuncSetAttribute(ssd_init_forward_kernel<P, kHeads>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  dim3 grid(static_cast<unsigned>(s.heads / kHeads), static_cast<unsigned>(g.chunks),
            static_cast<unsigned>(s.batch));
  ssd_init_forward_kernel<P, kHeads><<<grid, 128 * kHeads, smem, stream>>>(
      out, y, dt, A, Cm, buf.s16, buf.tot, positions, s.seq, static_cast<int>(s.heads),
      static_cast<int>(s.groups), static_cast<int>(g.chunks));
  return cudaGetLastError();
}

// Two heads per block when the groups' head count is even (they must share C).
cudaError_t launch_forward_any(cudaStream_t stream, bf16* out, const bf16* y, const float* dt,
                               const float* A, const bf16* Cm, const int32_t* positions,
                               const InitBuffers& buf, const SsdShape& s, const InitGeometry& g) {
  const bool pairs = (s.heads / s.groups) % 2 == 0;
  if (s.head_dim == 64) {
    return pairs ? launch_forward<64, 2>(stream, out, y, dt, A, Cm, positions, buf, s, g)
                 : launch_forward<64, 1>(stream, out, y, dt, A, Cm, positions, buf, s, g);
  }
  return pairs ? launch_forward<32, 2>(stream, out, y, dt, A, Cm, positions, buf, s, g)
               : launch_forward<32, 1>(stream, out, y, dt, A, Cm, positions, buf, s, g);
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
                                     const SsdShape& s, Workspace workspace,
                                     const int32_t* positions) {
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
  err = launch_forward_any(stream, out, y, dt, A, Cm, positions, buf, s, g);
  if (err != cudaSuccess) return Status::Cuda("ssd_add_initial_state_forward: out", err);
  return Status();
}

}  // namespace hcp::cuda
