// Mixture of experts: top-k routing with a softmax over the selected logits, and the experts'
// SwiGLU MLPs (grouped by expert, through cuBLASLt) combined with the gates.
//
// Expert compute, forward:
//   plan     sort the (token, slot) pairs by expert, stably: sorted_slot[p] is the slot at
//            permuted row p, slot_pos[s] the permuted row of slot s, offsets[e] expert e's first
//            row (per chunk of slots: count, scan, place; deterministic);
//   layout   expert e's first min(count_e, capacity) rows at e * capacity + i (padded: the rows
//            past its count are zero), the rest in an overflow region after them, expert by
//            expert. Every expert's product is then ONE strided-batched GEMM over the padded
//            rows (one launch that fills the GPU, where one expert's GEMM is a few dozen tiles)
//            plus one GEMM per expert that overflows (side by side, gemm_group). The capacity
//            (a multiple of 64) is chosen per call from the counts: the largest count when the
//            routing is balanced, less when a few experts take far more rows than the rest;
//   gather   xp[p] = x[token of the slot at row p] (zero for a padding row), written from the
//            tokens' side (each row of x read once);
//   experts  h = xp W_in[e]^T (GEMM), u = swiglu(h) (all rows at once), y = u W_out[e]^T (GEMM);
//   combine  out[t] = sum_j gates[t, j] y[slot_pos[t*k + j]], fp32, slot order.
// The backward recomputes h the same way (not y: its one use, dgates, has another form), gathers
// dyp[p] = dout[t] and takes du = dyp W_out[e]; then, in one pass over the rows, u = swiglu(h),
// dgates[s] = dout[t] . y[p] = du[p] . u[p], gu = gate u and dh = swiglu'(gate du);
// dW_out[e] = dyp^T gu, dxp = dh W_in[e], dW_in[e] = dh^T xp, and dx[t] = sum_j
// dxp[slot_pos[t*k + j]]. Without y's product the backward runs 5 expert GEMMs instead of 6.
// All of this runs per chunk of at most token_chunk tokens (Kernels.h), so that the workspace
// holds one chunk's rows; with several chunks the weight gradients add up in fp32 buffers there
// and are rounded to bf16 at the end.
#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <vector>

#include "runtime/kernels/cuda/Common.cuh"
#include "runtime/kernels/cuda/ExpertRows.h"

namespace hcp::cuda {
namespace {

using namespace detail;

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;
constexpr int kMaxRouteExperts = 256;  // 8 logits per lane
constexpr int kMaxK = 16;
constexpr int kMaxPlanExperts = 4096;  // the plan's shared per-expert counts
constexpr int kPlanThreads = 1024;

// ---------------------------------------------------------------------------------------------
// Routing: one warp per token; lane l holds logits l, l + 32, ...

template <typename T>
__global__ void route_forward_kernel(float* gates, int32_t* indices, const T* logits,
                                     int64_t tokens, int experts, int k) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t{gridDim.x} * kWarpsPerBlock;
  for (int64_t t = blockIdx.x * int64_t{kWarpsPerBlock} + (threadIdx.x >> 5); t < tokens;
       t += warps) {
    float val[kMaxRouteExperts / 32];
#pragma unroll
    for (int i = 0; i < kMaxRouteExperts / 32; i++) {
      const int e = lane + 32 * i;
      val[i] = e < experts ? to_float(logits[t * experts + e]) : -INFINITY;
    }
    unsigned taken = 0;  // bit i: logit lane + 32 i already selected
    float max_logit = 0.f, sum = 0.f, my_val = 0.f;
    int my_idx = 0;
#pragma unroll
    for (int j = 0; j < kMaxK; j++) {
      if (j >= k) break;
      // This lane's best untaken logit (ties: lower expert), then the warp's.
      float best = -INFINITY;
      int best_e = INT32_MAX;
#pragma unroll
      for (int i = 0; i < kMaxRouteExperts / 32; i++) {
        const int e = lane + 32 * i;
        if (e < experts && !(taken & (1u << i)) && (val[i] > best || best_e == INT32_MAX)) {
          best = val[i];
          best_e = e;
        }
      }
#pragma unroll
      for (int offset = 16; offset > 0; offset >>= 1) {
        const float other = __shfl_xor_sync(0xffffffffu, best, offset);
        const int other_e = __shfl_xor_sync(0xffffffffu, best_e, offset);
        if (other > best || (other == best && other_e < best_e) ||
            (best_e == INT32_MAX && other_e != INT32_MAX)) {
          best = other;
          best_e = other_e;
        }
      }
      if ((best_e & 31) == lane) taken |= 1u << (best_e >> 5);
      if (j == 0) max_logit = best;
      sum += expf(best - max_logit);
      if (lane == j) {
        my_val = best;
        my_idx = best_e;
      }
    }
    if (lane < k) {
      gates[t * k + lane] = expf(my_val - max_logit) / sum;
      indices[t * k + lane] = my_idx;
    }
  }
}

// dl_j = g_j (dg_j - sum_i g_i dg_i) on the selected logits, zero elsewhere.
template <typename T>
__global__ void route_backward_kernel(T* dlogits, const float* dgates, const float* gates,
                                      const int32_t* indices, int64_t tokens, int experts, int k) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t{gridDim.x} * kWarpsPerBlock;
  for (int64_t t = blockIdx.x * int64_t{kWarpsPerBlock} + (threadIdx.x >> 5); t < tokens;
       t += warps) {
    float g = 0.f, dg = 0.f;
    int idx = -1;
    if (lane < k) {
      g = gates[t * k + lane];
      dg = dgates[t * k + lane];
      idx = indices[t * k + lane];
    }
    const float dot = warp_sum(g * dg);
    // Every lane runs every pass, since the shuffles need the whole warp; a lane past the last
    // expert only skips its store. (A bound of e < experts per lane left lanes >= experts % 32
    // out of the last pass's full-mask shuffles, which is undefined: slots j >= experts % 32
    // came back wrong, e.g. 72 experts top-10.)
    for (int base = 0; base < experts; base += 32) {
      const int e = base + lane;
      float value = 0.f;
      for (int j = 0; j < k; j++) {
        const int idx_j = __shfl_sync(0xffffffffu, idx, j);
        const float g_j = __shfl_sync(0xffffffffu, g, j);
        const float dg_j = __shfl_sync(0xffffffffu, dg, j);
        if (idx_j == e) value = g_j * (dg_j - dot);
      }
      if (e < experts) dlogits[t * experts + e] = from_float<T>(value);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The expert plan, over chunks of kPlanChunk slots (deterministic, and stable: an expert's rows
// keep slot order):
//   plan_count_kernel  block c counts chunk c's slots per expert: chunk_rows[e * chunks + c];
//   plan_scan_kernel   per expert, its chunks' counts become their first rows among its rows;
//   plan_offsets_kernel  the experts' totals become the offsets;
//   plan_place_kernel  block c gives each of its slots the next row of its expert, the chunk's
//                      warps one after another (a warp's slots of one expert found by
//                      __match_any_sync).
// Slots whose index is outside [0, experts) get slot_pos = -1. (One block per expert reading
// every slot took 86 us for tiny's 49,152 slots; tiny's forward went from 0.680 to 0.608 ms.)
constexpr int kPlanChunk = 256;

__global__ void __launch_bounds__(kPlanChunk)
    plan_count_kernel(int32_t* chunk_rows, const int32_t* indices, int64_t slots, int64_t chunks,
                      int experts) {
  extern __shared__ int32_t hist[];
  const int64_t c = blockIdx.x, s = c * kPlanChunk + threadIdx.x;
  for (int e = threadIdx.x; e < experts; e += blockDim.x) hist[e] = 0;
  __syncthreads();
  const int32_t idx = s < slots ? indices[s] : -1;
  if (idx >= 0 && idx < experts) atomicAdd(&hist[idx], 1);
  __syncthreads();
  for (int e = threadIdx.x; e < experts; e += blockDim.x) chunk_rows[e * chunks + c] = hist[e];
}

// Exclusive prefix sums of values[0..n) in place, by one warp, 32 at a time; returns the total.
__device__ int32_t warp_exclusive_scan(int32_t* values, int64_t n) {
  const int lane = threadIdx.x & 31;
  int32_t running = 0;
  for (int64_t base = 0; base < n; base += 32) {
    const int64_t i = base + lane;
    const int32_t v = i < n ? values[i] : 0;
    int32_t inclusive = v;
#pragma unroll
    for (int offset = 1; offset < 32; offset <<= 1) {
      const int32_t up = __shfl_up_sync(0xffffffffu, inclusive, offset);
      if (lane >= offset) inclusive += up;
    }
    if (i < n) values[i] = running + inclusive - v;
    running += __shfl_sync(0xffffffffu, inclusive, 31);
  }
  return running;
}

// One warp per expert e: its chunks' counts become their first rows among e's rows; offsets[e]
// takes e's total for plan_offsets_kernel.
__global__ void plan_scan_kernel(int32_t* chunk_rows, int32_t* offsets, int64_t chunks) {
  const int e = blockIdx.x;
  const int32_t total = warp_exclusive_scan(chunk_rows + int64_t{e} * chunks, chunks);
  if (threadIdx.x == 0) offsets[e] = total;
}

// One warp: the experts' totals become their first rows; offsets[experts] = every routed slot.
__global__ void plan_offsets_kernel(int32_t* offsets, int experts) {
  const int32_t all = warp_exclusive_scan(offsets, experts);
  if (threadIdx.x == 0) offsets[experts] = all;
}

__global__ void __launch_bounds__(kPlanChunk)
    plan_place_kernel(int32_t* sorted_slot, int32_t* slot_pos, const int32_t* chunk_rows,
                      const int32_t* offsets, const int32_t* indices, int64_t slots, int64_t chunks,
                      int experts) {
  extern __shared__ int32_t next_row[];  // [experts]: the next row of each expert
  const int64_t c = blockIdx.x, s = c * kPlanChunk + threadIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int e = threadIdx.x; e < experts; e += blockDim.x) {
    next_row[e] = offsets[e] + chunk_rows[e * chunks + c];
  }
  int32_t idx = s < slots ? indices[s] : -1;
  if (idx < 0 || idx >= experts) {
    if (s < slots) slot_pos[s] = -1;
    idx = -1;
  }
  // Lanes of one expert: the lowest takes the rows, each the one after its lower peers'.
  const unsigned peers = __match_any_sync(0xffffffffu, idx);
  const int rank = __popc(peers & ((1u << lane) - 1u));
  for (int w = 0; w < kPlanChunk / 32; w++) {
    __syncthreads();  // next_row is up to date for warp w
    if (warp == w && idx >= 0) {
      const int32_t row = next_row[idx] + rank;
      __syncwarp(peers);
      if (rank == 0) next_row[idx] += __popc(peers);
      sorted_slot[row] = static_cast<int32_t>(s);
      slot_pos[s] = row;
    }
  }
}

// moe_token_routes' arrays (Kernels.h), one block per owner rank p: it
// first counts the rows of the owners before it (its first place in the send order "by owner,
// then token"), then walks the tokens in order, placing each that reaches p by a warp ballot and
// the block's warp counts.
__global__ void __launch_bounds__(kPlanThreads)
    token_routes_kernel(int32_t* row_token, int32_t* row_slot, int32_t* row_experts,
                        int32_t* token_row, int32_t* slot_row, const int32_t* slot_experts,
                        int64_t tokens, int k, int experts, int ep) {
  __shared__ int32_t warp_counts[32];
  const int p = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warps = static_cast<int>(blockDim.x >> 5), per_rank = experts / ep;
  auto owners = [&](int64_t t) {  // bit q set: token t has a slot on rank q
    uint64_t mask = 0;
    for (int j = 0; j < k; j++) {
      const int32_t e = slot_experts[t * k + j];
      if (e >= 0 && e < experts) mask |= uint64_t{1} << (e / per_rank);
    }
    return mask;
  };
  const uint64_t earlier_owners = (uint64_t{1} << p) - 1;
  int32_t earlier = 0;
  for (int64_t t = threadIdx.x; t < tokens; t += blockDim.x) {
    earlier += __popcll(owners(t) & earlier_owners);
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    earlier += __shfl_down_sync(0xffffffffu, earlier, offset);
  }
  if (lane == 0) warp_counts[warp] = earlier;
  __syncthreads();
  int32_t base = 0;
  for (int w = 0; w < warps; w++) base += warp_counts[w];
  const unsigned lanes_below = (1u << lane) - 1u;
  for (int64_t start = 0; start < tokens; start += blockDim.x) {
    const int64_t t = start + threadIdx.x;
    const bool mine = t < tokens && ((owners(t) >> p) & 1);
    const unsigned ballot = __ballot_sync(0xffffffffu, mine);
    __syncthreads();  // every thread has read warp_counts' previous values
    if (lane == 0) warp_counts[warp] = __popc(ballot);
    __syncthreads();
    int32_t before = 0, total = 0;
    for (int w = 0; w < warps; w++) {
      if (w < warp) before += warp_counts[w];
      total += warp_counts[w];
    }
    if (t < tokens) {
      int32_t at = -1;
      if (mine) {
        at = base + before + __popc(ballot & lanes_below);
        row_token[at] = static_cast<int32_t>(t);
      }
      token_row[t * ep + p] = at;
      for (int j = 0; j < k; j++) {
        const int32_t e = slot_experts[t * k + j];
        const bool valid = e >= 0 && e < experts;
        if (mine) {
          row_slot[int64_t{at} * k + j] = static_cast<int32_t>(t * k + j);
          row_experts[int64_t{at} * k + j] = valid && e / per_rank == p ? e - p * per_rank : -1;
        }
        if (valid && e / per_rank == p) slot_row[t * k + j] = at * k + j;
        if (!valid && p == 0) slot_row[t * k + j] = -1;
      }
    }
    base += total;
  }
}

// Where each expert's overflow rows start (after the padded rows), from the compact offsets:
// one thread, the experts in order.
__global__ void overflow_offsets_kernel(int32_t* overflow_start, const int32_t* offsets,
                                        int64_t capacity, int experts) {
  int64_t next = experts * capacity;
  for (int e = 0; e < experts; e++) {
    overflow_start[e] = static_cast<int32_t>(next);
    next += max(int64_t{0}, offsets[e + 1] - offsets[e] - capacity);
  }
}

// The layout from the compact plan, one thread per compact row p (expert e, its i-th row): the
// row it moves to, row_slot there, and its slot's slot_pos.
__global__ void layout_kernel(int32_t* row_slot, int32_t* slot_pos, const int32_t* sorted_slot,
                              const int32_t* offsets, const int32_t* overflow_start,
                              int64_t capacity, int64_t routed, int experts) {
  for (int64_t p = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; p < routed;
       p += int64_t{gridDim.x} * blockDim.x) {
    int lo = 0, hi = experts - 1;  // the last expert whose first row is <= p
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (offsets[mid] <= p) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    const int64_t i = p - offsets[lo];
    const int64_t q = i < capacity ? lo * capacity + i : overflow_start[lo] + (i - capacity);
    const int32_t slot = sorted_slot[p];
    row_slot[q] = slot;
    slot_pos[slot] = static_cast<int32_t>(q);
  }
}

// row_slot = -1 on the padded rows past each expert's count.
__global__ void padding_kernel(int32_t* row_slot, const int32_t* offsets, int64_t capacity,
                               int64_t rows) {
  for (int64_t q = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; q < rows;
       q += int64_t{gridDim.x} * blockDim.x) {
    const int64_t e = q / capacity;
    if (q % capacity >= offsets[e + 1] - offsets[e]) row_slot[q] = -1;
  }
}

// xp[p] = scale * x[row_slot[p] / k] (fp32, rounded once; an exact copy for scale 1), or zeros
// where row_slot[p] < 0 (padding): one warp per row.
__global__ void gather_kernel(bf16* xp, const bf16* x, const int32_t* row_slot, int64_t rows,
                              int64_t hidden, int k, float scale, bool vec) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t{gridDim.x} * kWarpsPerBlock;
  for (int64_t p = blockIdx.x * int64_t{kWarpsPerBlock} + (threadIdx.x >> 5); p < rows;
       p += warps) {
    const int32_t slot = row_slot[p];
    const int64_t t = slot / k;
    for (int64_t c = lane * 8; c < hidden; c += 256) {
      const int valid = static_cast<int>(min(int64_t{8}, hidden - c));
      float v[8] = {};
      if (slot >= 0) load8_any(v, x + t * hidden + c, valid, vec);
#pragma unroll
      for (int e = 0; e < 8; e++) v[e] *= scale;
      store8_any(xp + p * hidden + c, v, valid, vec);
    }
  }
}

// The same rows as gather_kernel, written from the tokens' side: each token's row of x is read
// once and stored, times scale, at the rows of its slots (slot_pos; -1: none), then the padding
// rows among the first `padded` rows (row_slot < 0) are zeroed. A gather by row reads a token's row
// k times, mostly from memory once the rows it writes have pushed x out of L2. One warp per token,
// then one per padded row.
__global__ void scatter_rows_kernel(bf16* xp, const bf16* x, const int32_t* slot_pos,
                                    const int32_t* row_slot, int64_t tokens, int64_t padded,
                                    int64_t hidden, int k, float scale, bool vec) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t{gridDim.x} * kWarpsPerBlock;
  for (int64_t w = blockIdx.x * int64_t{kWarpsPerBlock} + (threadIdx.x >> 5); w < tokens + padded;
       w += warps) {
    if (w >= tokens) {
      const int64_t p = w - tokens;
      if (row_slot[p] >= 0) continue;
      const float zeros[8] = {};
      for (int64_t c = lane * 8; c < hidden; c += 256) {
        store8_any(xp + p * hidden + c, zeros, static_cast<int>(min(int64_t{8}, hidden - c)), vec);
      }
      continue;
    }
    const int32_t my_row = lane < k ? slot_pos[w * k + lane] : -1;
    for (int64_t c = lane * 8; c < hidden; c += 256) {
      const int valid = static_cast<int>(min(int64_t{8}, hidden - c));
      float v[8];
      load8_any(v, x + w * hidden + c, valid, vec);
#pragma unroll
      for (int e = 0; e < 8; e++) v[e] *= scale;
      for (int j = 0; j < k; j++) {
        const int32_t p = __shfl_sync(0xffffffffu, my_row, j);
        if (p >= 0) store8_any(xp + int64_t{p} * hidden + c, v, valid, vec);
      }
    }
  }
}

// out[t] = sum_j w_j rows[slot_pos[t*k + j]] with w_j = gates[t*k + j] (or 1 when gates is
// null), fp32 in slot order; slots outside the plan contribute nothing. When dgates is given, it
// is zeroed for those slots (the backward's combine).
__global__ void combine_kernel(bf16* out, const bf16* rows, const float* gates,
                               const int32_t* slot_pos, float* dgates, int64_t tokens,
                               int64_t hidden, int k, bool vec) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t{gridDim.x} * kWarpsPerBlock;
  for (int64_t t = blockIdx.x * int64_t{kWarpsPerBlock} + (threadIdx.x >> 5); t < tokens;
       t += warps) {
    if (dgates != nullptr && lane < k && slot_pos[t * k + lane] < 0) dgates[t * k + lane] = 0.f;
    for (int64_t c = lane * 8; c < hidden; c += 256) {
      const int valid = static_cast<int>(min(int64_t{8}, hidden - c));
      float acc[8] = {};
      for (int j = 0; j < k; j++) {
        const int32_t p = slot_pos[t * k + j];
        if (p < 0) continue;
        const float w = gates != nullptr ? gates[t * k + j] : 1.f;
        float v[8];
        load8_any(v, rows + int64_t{p} * hidden + c, valid, vec);
#pragma unroll
        for (int e = 0; e < 8; e++) acc[e] += w * v[e];
      }
      store8_any(out + t * hidden + c, acc, valid, vec);
    }
  }
}

// The rest of the backward between the two expert products, per row p of the layout (slot
// s = row_slot[p]; -1 for padding, which gets zeros): with du[p] = dout[token] W_out[e] (not
// scaled by the gate) and h[p] = [a | b], u = silu(a) b,
//   dgates[s] = <dout[token], y[p]> = <du[p], u>   (so the backward needs no y),
//   gu[p] = gate u                                  (for dW_out = dout^T (gate u)),
//   dh[p] = swiglu'(gate du[p]).
// u and gate du are rounded to bf16 where the separate kernels this pass replaced stored them,
// so that it gives their results bit for bit. h is the layout's rows, or with `h_by_slot` the
// forward's kept rows in slot order (a padding row then reads zeros, as its recomputed h is).
// One warp per row.
__global__ void expert_rows_backward_kernel(bf16* gu, bf16* dh, float* dgates, const bf16* du,
                                            const bf16* h, bool h_by_slot, const float* gates,
                                            const int32_t* row_slot, int64_t rows, int64_t inner,
                                            bool vec) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t{gridDim.x} * kWarpsPerBlock;
  for (int64_t p = blockIdx.x * int64_t{kWarpsPerBlock} + (threadIdx.x >> 5); p < rows;
       p += warps) {
    const int64_t s = row_slot[p];
    const float gate = s < 0 ? 0.f : gates[s];
    const int64_t h_row = h_by_slot ? s : p;
    float dot = 0.f;
    for (int64_t c = lane * 8; c < inner; c += 256) {
      const int valid = static_cast<int>(min(int64_t{8}, inner - c));
      float g[8], a[8] = {}, b[8] = {}, u[8];
      load8_any(g, du + p * inner + c, valid, vec);
      if (h_row >= 0) {
        load8_any(a, h + h_row * 2 * inner + c, valid, vec);
        load8_any(b, h + h_row * 2 * inner + inner + c, valid, vec);
      }
#pragma unroll
      for (int e = 0; e < 8; e++) {
        u[e] = round_bf16(a[e] * sigmoidf(a[e]) * b[e]);
        dot += g[e] * u[e];
        const float scaled = round_bf16(g[e] * gate);
        u[e] *= gate;
        g[e] = scaled * b[e] * silu_grad(a[e]);  // da
        b[e] = scaled * a[e] * sigmoidf(a[e]);   // db
      }
      store8_any(gu + p * inner + c, u, valid, vec);
      store8_any(dh + p * 2 * inner + c, g, valid, vec);
      store8_any(dh + p * 2 * inner + inner + c, b, valid, vec);
    }
    dot = warp_sum(dot);
    if (lane == 0 && s >= 0) dgates[s] = dot;
  }
}

// u[p] = swiglu(h[p]) as swiglu_forward computes it, and each routed row's h copied to
// kept_h[row_slot[p]] (slot order, for the backward; padding rows are not copied). One warp
// per row.
__global__ void swiglu_keep_kernel(bf16* u, bf16* kept_h, const bf16* h, const int32_t* row_slot,
                                   int64_t rows, int64_t inner, bool vec) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t{gridDim.x} * kWarpsPerBlock;
  for (int64_t p = blockIdx.x * int64_t{kWarpsPerBlock} + (threadIdx.x >> 5); p < rows;
       p += warps) {
    const int64_t s = row_slot[p];
    for (int64_t c = lane * 8; c < inner; c += 256) {
      const int valid = static_cast<int>(min(int64_t{8}, inner - c));
      float a[8], b[8];
      load8_any(a, h + p * 2 * inner + c, valid, vec);
      load8_any(b, h + p * 2 * inner + inner + c, valid, vec);
      if (s >= 0) {
        store8_any(kept_h + s * 2 * inner + c, a, valid, vec);
        store8_any(kept_h + s * 2 * inner + inner + c, b, valid, vec);
      }
#pragma unroll
      for (int e = 0; e < 8; e++) a[e] = a[e] * sigmoidf(a[e]) * b[e];
      store8_any(u + p * inner + c, a, valid, vec);
    }
  }
}

unsigned warp_grid(int64_t items) { return grid_for(items, kWarpsPerBlock); }

// chunk_tokens: the tokens of the call's largest chunk.
Status check_experts_shape(const char* name, int64_t chunk_tokens, int64_t hidden, int64_t inner,
                           int64_t experts, int64_t k) {
  if (chunk_tokens < 0 || hidden <= 0 || inner <= 0 || experts <= 0 || k <= 0) {
    return Status(name, "bad shape");
  }
  if (experts > kMaxPlanExperts) return Status(name, "more than 4096 experts");
  if (k > kMaxK) return Status(name, "k above 16");
  // Row indices within a chunk are int32, the padded layout's too.
  if (expert_row_limit(chunk_tokens * k, experts) > INT32_MAX)
    return Status(name, "too many (token, slot) pairs");
  return Status();
}

// The plan and the activations both passes need, carved from the workspace: R = expert_row_limit
// rows.
struct ExpertBuffers {
  int32_t* chunk_rows;      // [experts, S / kPlanChunk], the plan's
  int32_t* sorted_slot;     // [S], the compact plan
  int32_t* slot_pos;        // [S]
  int32_t* offsets;         // [experts + 1]
  int32_t* overflow_start;  // [experts]
  int32_t* row_slot;        // [R], the slot at each row of the layout (-1: padding)
  bf16* xp;                 // [R, hidden]
  bf16* h;                  // [R, 2*inner]
  bf16* u;                  // [R, inner]
  bf16* y;                  // [R, hidden]; the backward reuses it for dxp
  // Backward only.
  bf16* dyp;  // [R, hidden]
  bf16* du;   // [R, inner]
  bf16* dh;   // [R, 2*inner]
  // Backward over several chunks: the weight gradients' fp32 sums.
  float* dw_in_sum;   // [experts, 2*inner, hidden]
  float* dw_out_sum;  // [experts, hidden, inner]
};

int64_t chunk_count(int64_t tokens, int64_t token_chunk) {
  return std::max<int64_t>(1, ceil_div(tokens, token_chunk));
}

// For a call over `tokens` tokens: the buffers of its largest chunk.
ExpertBuffers carve(WorkspaceCarver& carver, int64_t tokens, int64_t hidden, int64_t inner,
                    int64_t experts, int64_t k, bool backward, int64_t token_chunk) {
  const int64_t chunks = chunk_count(tokens, token_chunk);
  const int64_t slots = std::min(tokens, token_chunk) * k, rows = expert_row_limit(slots, experts);
  ExpertBuffers b{};
  b.chunk_rows = carver.take<int32_t>(experts * ceil_div(slots, kPlanChunk));
  b.sorted_slot = carver.take<int32_t>(slots);
  b.slot_pos = carver.take<int32_t>(slots);
  b.offsets = carver.take<int32_t>(experts + 1);
  b.overflow_start = carver.take<int32_t>(experts);
  b.row_slot = carver.take<int32_t>(rows);
  b.xp = carver.take<bf16>(rows * hidden);
  b.h = carver.take<bf16>(rows * 2 * inner);
  b.u = carver.take<bf16>(rows * inner);
  b.y = carver.take<bf16>(rows * hidden);
  if (backward) {
    b.dyp = carver.take<bf16>(rows * hidden);
    b.du = carver.take<bf16>(rows * inner);
    b.dh = carver.take<bf16>(rows * 2 * inner);
  }
  if (backward && chunks > 1) {
    b.dw_in_sum = carver.take<float>(experts * 2 * inner * hidden);
    b.dw_out_sum = carver.take<float>(experts * hidden * inner);
  }
  return b;
}

// Chunk [t0, t0 + n)'s slots per expert, on the host: from the host's copy of the indices, or
// the whole call's counts when the chunk is the whole call; empty when neither gives them
// (expert_forward_pass then counts on the device and waits).
std::vector<int64_t> host_chunk_counts(const ExpertRoutingOnHost& on_host, int64_t t0, int64_t n,
                                       int64_t tokens, int64_t experts, int64_t k) {
  std::vector<int64_t> counts;
  if (on_host.indices != nullptr) {
    counts.assign(experts, 0);
    for (int64_t s = t0 * k; s < (t0 + n) * k; s++) {
      const int32_t e = on_host.indices[s];
      if (e >= 0 && e < experts) counts[e]++;
    }
  } else if (on_host.expert_counts != nullptr && n == tokens) {
    counts.assign(on_host.expert_counts, on_host.expert_counts + experts);
  }
  return counts;
}

// The same product for every expert e, on its rows of `a` and `c` (row strides lda, ldc) and its
// matrix of `b` (stride b_stride): one batched GEMM over the padded rows, then one GEMM per
// expert that overflows. With `rows_are_k` the rows are the reduction (a weight gradient:
// op(A) = A^T, and `b` is the other operand's rows, not a weight): the overflow then adds to what
// the batched GEMM wrote (beta 1), and an expert without rows gets C = 0, or keeps its C when
// `accumulate` (the batched GEMM adds onto C as well: the sum over chunks).
template <typename TC>
Status expert_products(GemmContext* ctx, cudaStream_t stream, const ExpertRows& layout,
                       bool rows_are_k, bool trans_b, int64_t m, int64_t n, int64_t k,
                       const bf16* a, int64_t lda, const bf16* b, int64_t ldb, int64_t b_stride,
                       TC* c, int64_t ldc, int64_t c_stride, bool accumulate = false) {
  const int64_t cap = layout.capacity, experts = static_cast<int64_t>(layout.counts.size());
  const GemmProblemOf<TC> padded{.trans_a = rows_are_k,
                                 .trans_b = trans_b,
                                 .m = rows_are_k ? m : cap,
                                 .n = n,
                                 .k = rows_are_k ? cap : k,
                                 .a = a,
                                 .lda = lda,
                                 .b = b,
                                 .ldb = ldb,
                                 .beta = accumulate ? 1.f : 0.f,
                                 .c = c,
                                 .ldc = ldc};
  // Per expert: a's rows move by cap rows; c by cap rows, or by a whole matrix for a weight
  // gradient; b by b_stride (a weight, or the other operand's cap rows).
  if (Status s = gemm_strided_batched(ctx, stream, padded, experts, cap * lda, b_stride,
                                      rows_are_k ? c_stride : cap * ldc);
      !s.ok()) {
    return s;
  }
  std::vector<GemmProblemOf<TC>> overflow;
  for (int64_t e = 0; e < experts; e++) {
    const int64_t r0 = layout.overflow[e], rows = layout.counts[e] - cap;
    if (rows <= 0) continue;
    // As the padded product, for this expert's overflow rows; a weight gradient's part adds onto
    // what the batched GEMM wrote.
    overflow.push_back({.trans_a = rows_are_k,
                        .trans_b = trans_b,
                        .m = rows_are_k ? m : rows,
                        .n = n,
                        .k = rows_are_k ? rows : k,
                        .a = a + r0 * lda,
                        .lda = lda,
                        .b = rows_are_k ? b + r0 * ldb : b + e * b_stride,
                        .ldb = ldb,
                        .beta = rows_are_k ? 1.f : 0.f,
                        .c = rows_are_k ? c + e * c_stride : c + r0 * ldc,
                        .ldc = ldc});
  }
  return gemm_group<TC>(ctx, stream, overflow);
}

// rows[p] = scale * x[token of the slot at row p] for every row of the layout, zero for padding.
Status scatter_rows(cudaStream_t stream, const char* name, const ExpertBuffers& b,
                    const ExpertRows& layout, bf16* rows, const bf16* x, int64_t tokens,
                    int64_t hidden, int64_t k, float scale) {
  const int64_t padded = layout.capacity * static_cast<int64_t>(layout.counts.size());
  const bool vec = hidden % 8 == 0 && aligned16(x) && aligned16(rows);
  scatter_rows_kernel<<<warp_grid(tokens + padded), kThreads, 0, stream>>>(
      rows, x, b.slot_pos, b.row_slot, tokens, padded, hidden, static_cast<int>(k), scale, vec);
  return launch_status(name);
}

// How much of the forward expert_forward_pass runs: all of it (the forward), up to h (the
// backward), or only the layout and xp (the backward, given the forward's kept h).
enum class ForwardUpTo { kOutput, kH, kLayout };

// Plan, layout, gather, then (see ForwardUpTo) h = xp W_in[e]^T, u = swiglu(h) (h also copied
// to kept_h in slot order when given) and the expert MLPs' output rows y; returns where the rows
// are.
Status expert_forward_pass(GemmContext* ctx, cudaStream_t stream, const char* name,
                           const ExpertBuffers& b, ExpertRows& layout, const bf16* x,
                           const int32_t* indices, const bf16* w_in, const bf16* w_out,
                           int64_t tokens, int64_t hidden, int64_t inner, int64_t experts,
                           int64_t k, const int64_t* expert_counts, ForwardUpTo up_to,
                           bf16* kept_h = nullptr) {
  const int64_t slots = tokens * k;
  const int e_count = static_cast<int>(experts);
  const int64_t chunks = ceil_div(slots, kPlanChunk);
  const size_t per_expert = sizeof(int32_t) * (experts + 1);
  plan_count_kernel<<<static_cast<unsigned>(chunks), kPlanChunk, per_expert, stream>>>(
      b.chunk_rows, indices, slots, chunks, e_count);
  plan_scan_kernel<<<e_count, 32, 0, stream>>>(b.chunk_rows, b.offsets, chunks);
  plan_offsets_kernel<<<1, 32, 0, stream>>>(b.offsets, e_count);
  plan_place_kernel<<<static_cast<unsigned>(chunks), kPlanChunk, per_expert, stream>>>(
      b.sorted_slot, b.slot_pos, b.chunk_rows, b.offsets, indices, slots, chunks, e_count);
  if (Status s = launch_status(name); !s.ok()) return s;
  std::vector<int64_t> counts(experts);
  if (expert_counts != nullptr) {
    std::copy_n(expert_counts, experts, counts.begin());
  } else {
    std::vector<int32_t> offsets(experts + 1, 0);
    cudaError_t error = cudaMemcpyAsync(offsets.data(), b.offsets, sizeof(int32_t) * (experts + 1),
                                        cudaMemcpyDeviceToHost, stream);
    if (error != cudaSuccess) return Status::Cuda(name, error);
    // The one wait: cuBLASLt takes the row counts from the host.
    error = cudaStreamSynchronize(stream);
    if (error != cudaSuccess) return Status::Cuda(name, error);
    for (int64_t e = 0; e < experts; e++) counts[e] = offsets[e + 1] - offsets[e];
  }
  int64_t routed = 0;
  for (int64_t n : counts) routed += n;
  if (routed == 0) return Status();
  layout = plan_expert_rows(std::move(counts), expert_row_limit(slots, experts));
  const int64_t cap = layout.capacity;
  overflow_offsets_kernel<<<1, 1, 0, stream>>>(b.overflow_start, b.offsets, cap, e_count);
  if (Status s = launch_status(name); !s.ok()) return s;
  layout_kernel<<<grid_for(routed, kThreads), kThreads, 0, stream>>>(
      b.row_slot, b.slot_pos, b.sorted_slot, b.offsets, b.overflow_start, cap, routed, e_count);
  if (Status s = launch_status(name); !s.ok()) return s;
  padding_kernel<<<grid_for(experts * cap, kThreads), kThreads, 0, stream>>>(b.row_slot, b.offsets,
                                                                             cap, experts * cap);
  if (Status s = launch_status(name); !s.ok()) return s;
  const int64_t rows = layout.rows;
  if (Status s = scatter_rows(stream, name, b, layout, b.xp, x, tokens, hidden, k, 1.f); !s.ok()) {
    return s;
  }
  if (up_to == ForwardUpTo::kLayout) return Status();
  // h = xp W_in[e]^T, then u = swiglu(h), y = u W_out[e]^T.
  if (Status s = expert_products(ctx, stream, layout, false, true, 0, 2 * inner, hidden, b.xp,
                                 hidden, w_in, hidden, 2 * inner * hidden, b.h, 2 * inner, 0);
      !s.ok()) {
    return s;
  }
  if (up_to == ForwardUpTo::kH) return Status();
  if (kept_h == nullptr) {
    if (Status s = swiglu_forward(stream, b.u, b.h, rows, inner); !s.ok()) return s;
  } else {
    const bool vec_inner = inner % 8 == 0 && aligned16(b.u) && aligned16(b.h) && aligned16(kept_h);
    swiglu_keep_kernel<<<warp_grid(rows), kThreads, 0, stream>>>(b.u, kept_h, b.h, b.row_slot, rows,
                                                                 inner, vec_inner);
    if (Status s = launch_status(name); !s.ok()) return s;
  }
  return expert_products(ctx, stream, layout, false, true, 0, hidden, inner, b.u, inner, w_out,
                         inner, hidden * inner, b.y, hidden, 0);
}

// out[i] = in[index[i]], or 0 where index[i] < 0.
__global__ void gather_values_kernel(float* out, const float* in, const int32_t* index, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = index[i] < 0 ? 0.f : in[index[i]];
  }
}

}  // namespace

template <typename T>
Status moe_route_forward(cudaStream_t stream, float* gates, int32_t* indices, const T* logits,
                         int64_t tokens, int64_t experts, int64_t k) {
  const char* name = "moe_route.forward";
  if (tokens < 0 || experts <= 0 || experts > kMaxRouteExperts || k <= 0 || k > kMaxK ||
      k > experts) {
    return Status(name, "need 0 < k <= experts <= 256 and k <= 16");
  }
  if (tokens == 0) return Status();
  route_forward_kernel<<<warp_grid(tokens), kThreads, 0, stream>>>(
      gates, indices, logits, tokens, static_cast<int>(experts), static_cast<int>(k));
  return launch_status(name);
}

template <typename T>
Status moe_route_backward(cudaStream_t stream, T* dlogits, const float* dgates, const float* gates,
                          const int32_t* indices, int64_t tokens, int64_t experts, int64_t k) {
  const char* name = "moe_route.backward";
  if (tokens < 0 || experts <= 0 || k <= 0 || k > 32) return Status(name, "bad shape");
  if (tokens == 0) return Status();
  route_backward_kernel<<<warp_grid(tokens), kThreads, 0, stream>>>(
      dlogits, dgates, gates, indices, tokens, static_cast<int>(experts), static_cast<int>(k));
  return launch_status(name);
}

template Status moe_route_forward<float>(cudaStream_t, float*, int32_t*, const float*, int64_t,
                                         int64_t, int64_t);
template Status moe_route_forward<bf16>(cudaStream_t, float*, int32_t*, const bf16*, int64_t,
                                        int64_t, int64_t);
template Status moe_route_backward<float>(cudaStream_t, float*, const float*, const float*,
                                          const int32_t*, int64_t, int64_t, int64_t);
template Status moe_route_backward<bf16>(cudaStream_t, bf16*, const float*, const float*,
                                         const int32_t*, int64_t, int64_t, int64_t);

size_t moe_experts_forward_workspace_bytes(int64_t tokens, int64_t hidden, int64_t inner,
                                           int64_t experts, int64_t k, int64_t token_chunk) {
  WorkspaceCarver carver(Workspace{});
  carve(carver, tokens, hidden, inner, experts, k, false, std::max<int64_t>(1, token_chunk));
  return carver.used();
}

size_t moe_experts_backward_workspace_bytes(int64_t tokens, int64_t hidden, int64_t inner,
                                            int64_t experts, int64_t k, int64_t token_chunk) {
  WorkspaceCarver carver(Workspace{});
  carve(carver, tokens, hidden, inner, experts, k, true, std::max<int64_t>(1, token_chunk));
  return carver.used();
}

Status moe_experts_forward(GemmContext* ctx, cudaStream_t stream, bf16* out, const bf16* x,
                           const float* gates, const int32_t* indices, const bf16* w_in,
                           const bf16* w_out, int64_t tokens, int64_t hidden, int64_t inner,
                           int64_t experts, int64_t k, Workspace workspace,
                           ExpertRoutingOnHost on_host, int64_t token_chunk, bf16* kept_h) {
  const char* name = "moe_experts.forward";
  if (token_chunk <= 0) return Status(name, "token_chunk must be positive");
  if (Status s =
          check_experts_shape(name, std::min(tokens, token_chunk), hidden, inner, experts, k);
      !s.ok()) {
    return s;
  }
  if (tokens == 0) return Status();
  WorkspaceCarver carver(workspace);
  const ExpertBuffers b = carve(carver, tokens, hidden, inner, experts, k, false, token_chunk);
  if (!carver.fits()) return Status(name, "workspace too small");
  const bool vec = hidden % 8 == 0 && aligned16(out);
  for (int64_t t0 = 0; t0 < tokens; t0 += token_chunk) {
    const int64_t n = std::min(token_chunk, tokens - t0);
    const std::vector<int64_t> counts = host_chunk_counts(on_host, t0, n, tokens, experts, k);
    ExpertRows layout;
    if (Status s = expert_forward_pass(
            ctx, stream, name, b, layout, x + t0 * hidden, indices + t0 * k, w_in, w_out, n, hidden,
            inner, experts, k, counts.empty() ? nullptr : counts.data(), ForwardUpTo::kOutput,
            kept_h == nullptr ? nullptr : kept_h + t0 * k * 2 * inner);
        !s.ok()) {
      return s;
    }
    combine_kernel<<<warp_grid(n), kThreads, 0, stream>>>(out + t0 * hidden, b.y, gates + t0 * k,
                                                          b.slot_pos, nullptr, n, hidden,
                                                          static_cast<int>(k), vec);
    if (Status s = launch_status(name); !s.ok()) return s;
  }
  return Status();
}

namespace {

// The backward over one chunk of n tokens (dx, dgates, dout, x, gates and indices start at the
// chunk's first token): dx and dgates for its tokens; its weight gradients into dw_in / dw_out,
// or added onto them with `accumulate`.
template <typename TW>
Status expert_backward_chunk(GemmContext* ctx, cudaStream_t stream, const char* name,
                             const ExpertBuffers& b, bf16* dx, float* dgates, TW* dw_in, TW* dw_out,
                             const bf16* dout, const bf16* x, const float* gates,
                             const int32_t* indices, const bf16* w_in, const bf16* w_out, int64_t n,
                             int64_t hidden, int64_t inner, int64_t experts, int64_t k,
                             const int64_t* expert_counts, bool accumulate, const bf16* kept_h,
                             float dout_scale) {
  ExpertRows layout;
  if (Status s = expert_forward_pass(ctx, stream, name, b, layout, x, indices, w_in, w_out, n,
                                     hidden, inner, experts, k, expert_counts,
                                     kept_h == nullptr ? ForwardUpTo::kH : ForwardUpTo::kLayout);
      !s.ok()) {
    return s;
  }
  const int64_t rows = layout.rows;
  const bool vec = hidden % 8 == 0 && aligned16(dout) && aligned16(dx);
  auto combine_dx = [&](const bf16* dxp) {  // also zeroes the dgates of slots without an expert
    combine_kernel<<<warp_grid(n), kThreads, 0, stream>>>(dx, dxp, nullptr, b.slot_pos, dgates, n,
                                                          hidden, static_cast<int>(k), vec);
    return launch_status(name);
  };
  if (rows == 0) {  // no slot has an expert: dx = 0, dgates = 0, no weight gradient
    if (!accumulate) {
      if (Status s = fill(stream, dw_in, 0.f, experts * 2 * inner * hidden); !s.ok()) return s;
      if (Status s = fill(stream, dw_out, 0.f, experts * hidden * inner); !s.ok()) return s;
    }
    return combine_dx(b.y);
  }
  // dyp = the rows' dout times dout_scale, not scaled by the gate (zero for padding).
  if (Status s = scatter_rows(stream, name, b, layout, b.dyp, dout, n, hidden, k, dout_scale);
      !s.ok()) {
    return s;
  }
  // Through W_out: du = dyp W_out[e]; then dgates = <du, u>, gu = gate u into u's buffer and
  // dh = swiglu'(gate du) (expert_rows_backward_kernel); dW_out[e] = dyp^T gu (zero for an
  // expert without rows).
  // Through W_in: dxp = dh W_in[e] (into y's buffer, unused in the backward); dW_in[e] = dh^T xp.
  bf16* dxp = b.y;
  if (Status s = expert_products(ctx, stream, layout, false, false, 0, inner, hidden, b.dyp, hidden,
                                 w_out, inner, hidden * inner, b.du, inner, 0);
      !s.ok()) {
    return s;
  }
  const bf16* h = kept_h == nullptr ? b.h : kept_h;
  const bool vec_inner =
      inner % 8 == 0 && aligned16(b.du) && aligned16(b.u) && aligned16(h) && aligned16(b.dh);
  expert_rows_backward_kernel<<<warp_grid(rows), kThreads, 0, stream>>>(
      b.u, b.dh, dgates, b.du, h, kept_h != nullptr, gates, b.row_slot, rows, inner, vec_inner);
  if (Status s = launch_status(name); !s.ok()) return s;
  const int64_t cap = layout.capacity;
  if (Status s =
          expert_products(ctx, stream, layout, true, false, hidden, inner, 0, b.dyp, hidden, b.u,
                          inner, cap * inner, dw_out, inner, hidden * inner, accumulate);
      !s.ok()) {
    return s;
  }
  if (Status s = expert_products(ctx, stream, layout, false, false, 0, hidden, 2 * inner, b.dh,
                                 2 * inner, w_in, hidden, 2 * inner * hidden, dxp, hidden, 0);
      !s.ok()) {
    return s;
  }
  if (Status s = expert_products(ctx, stream, layout, true, false, 2 * inner, hidden, 0, b.dh,
                                 2 * inner, b.xp, hidden, cap * hidden, dw_in, hidden,
                                 2 * inner * hidden, accumulate);
      !s.ok()) {
    return s;
  }
  return combine_dx(dxp);
}

}  // namespace

Status moe_experts_backward(GemmContext* ctx, cudaStream_t stream, bf16* dx, float* dgates,
                            bf16* dw_in, bf16* dw_out, const bf16* dout, const bf16* x,
                            const float* gates, const int32_t* indices, const bf16* w_in,
                            const bf16* w_out, int64_t tokens, int64_t hidden, int64_t inner,
                            int64_t experts, int64_t k, Workspace workspace,
                            ExpertRoutingOnHost on_host, int64_t token_chunk, const bf16* kept_h,
                            float dout_scale) {
  const char* name = "moe_experts.backward";
  if (token_chunk <= 0) return Status(name, "token_chunk must be positive");
  if (Status s =
          check_experts_shape(name, std::min(tokens, token_chunk), hidden, inner, experts, k);
      !s.ok()) {
    return s;
  }
  const int64_t dw_in_size = experts * 2 * inner * hidden, dw_out_size = experts * hidden * inner;
  if (tokens == 0) {
    if (Status s = fill(stream, dw_in, 0.f, dw_in_size); !s.ok()) return s;
    return fill(stream, dw_out, 0.f, dw_out_size);
  }
  WorkspaceCarver carver(workspace);
  const ExpertBuffers b = carve(carver, tokens, hidden, inner, experts, k, true, token_chunk);
  if (!carver.fits()) return Status(name, "workspace too small");
  const int64_t chunks = chunk_count(tokens, token_chunk);
  if (chunks == 1) {
    const std::vector<int64_t> counts = host_chunk_counts(on_host, 0, tokens, tokens, experts, k);
    return expert_backward_chunk(ctx, stream, name, b, dx, dgates, dw_in, dw_out, dout, x, gates,
                                 indices, w_in, w_out, tokens, hidden, inner, experts, k,
                                 counts.empty() ? nullptr : counts.data(), /*accumulate=*/false,
                                 kept_h, dout_scale);
  }
  // Several chunks: every chunk adds its weight gradients onto the fp32 sums, rounded at the end.
  if (Status s = fill(stream, b.dw_in_sum, 0.f, dw_in_size); !s.ok()) return s;
  if (Status s = fill(stream, b.dw_out_sum, 0.f, dw_out_size); !s.ok()) return s;
  for (int64_t t0 = 0; t0 < tokens; t0 += token_chunk) {
    const int64_t n = std::min(token_chunk, tokens - t0);
    const std::vector<int64_t> counts = host_chunk_counts(on_host, t0, n, tokens, experts, k);
    if (Status s = expert_backward_chunk(
            ctx, stream, name, b, dx + t0 * hidden, dgates + t0 * k, b.dw_in_sum, b.dw_out_sum,
            dout + t0 * hidden, x + t0 * hidden, gates + t0 * k, indices + t0 * k, w_in, w_out, n,
            hidden, inner, experts, k, counts.empty() ? nullptr : counts.data(),
            /*accumulate=*/true, kept_h == nullptr ? nullptr : kept_h + t0 * k * 2 * inner,
            dout_scale);
        !s.ok()) {
      return s;
    }
  }
  if (Status s = cast(stream, dw_in, b.dw_in_sum, dw_in_size); !s.ok()) return s;
  return cast(stream, dw_out, b.dw_out_sum, dw_out_size);
}

// ---------------------------------------------------------------------------------------------
// The expert-parallel exchange's pieces: the same gather and combine as above, on rows that
// travel between GPUs.

Status moe_gather_rows(cudaStream_t stream, bf16* rows, const bf16* x, const int32_t* slot_of_row,
                       int64_t count, int64_t hidden, int64_t k) {
  const char* name = "moe_gather_rows";
  if (count < 0 || hidden <= 0 || k <= 0) return Status(name, "bad shape");
  if (count == 0) return Status();
  const bool vec = hidden % 8 == 0 && aligned16(x) && aligned16(rows);
  gather_kernel<<<warp_grid(count), kThreads, 0, stream>>>(rows, x, slot_of_row, count, hidden,
                                                           static_cast<int>(k), 1.f, vec);
  return launch_status(name);
}

Status moe_combine_rows(cudaStream_t stream, bf16* out, const bf16* rows, const float* gates,
                        const int32_t* row_of_slot, int64_t tokens, int64_t hidden, int64_t k) {
  const char* name = "moe_combine_rows";
  if (tokens < 0 || hidden <= 0 || k <= 0 || k > kMaxK) return Status(name, "bad shape");
  if (tokens == 0) return Status();
  const bool vec = hidden % 8 == 0 && aligned16(out) && aligned16(rows);
  combine_kernel<<<warp_grid(tokens), kThreads, 0, stream>>>(
      out, rows, gates, row_of_slot, nullptr, tokens, hidden, static_cast<int>(k), vec);
  return launch_status(name);
}

Status moe_token_routes(cudaStream_t stream, int32_t* row_token, int32_t* row_slot,
                        int32_t* row_experts, int32_t* token_row, int32_t* slot_row,
                        const int32_t* slot_experts, int64_t tokens, int64_t k, int64_t experts,
                        int64_t ep) {
  const char* name = "moe_token_routes";
  if (tokens < 0 || k <= 0 || k > kMaxK || ep <= 0 || ep > kMaxK || experts % ep != 0 ||
      experts <= 0 || tokens * k * ep > INT32_MAX) {
    return Status(name,
                  "need 0 < k <= 16, 0 < ep <= 16 dividing the experts, tokens*k*ep in int32");
  }
  if (tokens == 0) return Status();
  token_routes_kernel<<<static_cast<unsigned>(ep), kPlanThreads, 0, stream>>>(
      row_token, row_slot, row_experts, token_row, slot_row, slot_experts, tokens,
      static_cast<int>(k), static_cast<int>(experts), static_cast<int>(ep));
  return launch_status(name);
}

Status moe_gather_values(cudaStream_t stream, float* out, const float* in, const int32_t* index,
                         int64_t n) {
  const char* name = "moe_gather_values";
  if (n < 0) return Status(name, "bad size");
  if (n == 0) return Status();
  gather_values_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(out, in, index, n);
  return launch_status(name);
}

}  // namespace hcp::cuda
