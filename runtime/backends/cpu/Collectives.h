// The collectives of context parallelism on CPU ranks: the reference for the NCCL versions, next
// to the local kernels they wrap (runtime/kernels/cpu/Kernels.h). Semantics and argument lists are
// KernelTable.txt's; CpuBackend.cpp unpacks a plan step into these calls.
//
// Sequence layout (plan::Mesh): the global sequence is cut into mesh.segments() segments of `len`
// tokens; cp rank r holds segment r (contiguous) or segments r and 2*cp-1-r in that order
// (zigzag). A rank's local tensor [batch, segs*len, ...] is viewed as [batch*segs, len, ...]:
// row b*segs + k is local segment k of sequence b. Every function here is collective over the
// cp group of `comm` (ring, chain and gather partners are cp ranks), except all_reduce, which is
// collective over its group: every rank of the group calls it with the same sizes, even when it
// has nothing to contribute. Decays, states and log-sum-exps are combined in double; what travels
// is fp32, like the buffers.
#pragma once

#include <cstdint>

#include "absl/status/status.h"

#include "runtime/comm/Communicator.h"
#include "runtime/kernels/cpu/Kernels.h"
#include "runtime/plan/Plan.h"

namespace hcp::cpu {

// halo [rows, width, channels] = for each local segment, the last `width` rows of x
// [rows, len, channels] of the segment before it in the sequence (zeros for segment 0).
// `width` is the halo's row count (a conv of width w needs w - 1 rows); 1 <= width <= len.
void halo_exchange_forward(comm::Communicator& comm, const plan::Mesh& mesh, float* halo,
                           const float* x, int64_t batch, int64_t segs, int64_t len,
                           int64_t channels, int64_t width);
// The transpose: dx [rows, len, channels] is zero except each local segment's last `width` rows,
// which get dhalo [rows, width, channels] of the segment after it (zero for the last segment).
void halo_exchange_backward(comm::Communicator& comm, const plan::Mesh& mesh, float* dx,
                            const float* dhalo, int64_t batch, int64_t segs, int64_t len,
                            int64_t channels, int64_t width);

// Mamba2 state passing between segments, per batch row b and head h, over the global segment
// order j: s_in[j] = exp(g[j-1]) s_in[j-1] + s[j-1], s_in[0] = 0.
struct StateScanShape {
  int64_t batch, segs, heads, head_dim, state;
};
enum class StateScanStrategy : int64_t {
  kAllGather = 0,  // one all-gather of every segment's (g, s), then a local scan in double
  kChain = 1,      // send/recv in segment order: cp-1 hops (2cp-1 segments under zigzag)
};
// g [rows, heads]; s, s_in [rows, heads, head_dim, state].
void state_scan_forward(comm::Communicator& comm, const plan::Mesh& mesh, float* s_in,
                        const float* g, const float* s, const StateScanShape& shape,
                        StateScanStrategy strategy);
// The transpose, a reverse scan: ds[j] = G[j+1] where G[j] = ds_in[j] + exp(g[j]) G[j+1] and
// G[segments] = 0; dg[j] = exp(g[j]) <s_in[j], ds[j]>.
void state_scan_backward(comm::Communicator& comm, const plan::Mesh& mesh, float* dg, float* ds,
                         const float* ds_in, const float* g, const float* s_in,
                         const StateScanShape& shape, StateScanStrategy strategy);

// Attention of the local queries over the keys of the whole sequence. `shape` is local
// (q_len = kv_len = segs * len). The K/V of every cp rank visits every rank once around the ring
// (cp - 1 send/recv steps); each (query segment, key segment) pair runs attention_forward with its
// global positions and merges by log-sum-exp; pairs whose keys all lie after the queries' last
// position are skipped (causal only).
// positions (nullable) [batch, seq]: the local queries' positions in their documents (packed
// documents: a query sees no key before its document's start, Kernels.h).
void ring_attention_forward(comm::Communicator& comm, const plan::Mesh& mesh, float* out,
                            float* lse, const float* q, const float* k, const float* v,
                            const AttentionShape& shape, float scale, bool causal,
                            const int32_t* positions = nullptr);
// From the final out and lse: dq accumulates locally; each K/V block travels around the ring with
// its dK/dV accumulators, which a last send/recv brings back to the block's owner (cp send/recv
// steps in all).
void ring_attention_backward(comm::Communicator& comm, const plan::Mesh& mesh, float* dq, float* dk,
                             float* dv, const float* dout, const float* q, const float* k,
                             const float* v, const float* out, const float* lse,
                             const AttentionShape& shape, float scale, bool causal,
                             const int32_t* positions = nullptr);

// y = the sum of x over `group` (summed in double, rounded to fp32 once).
void all_reduce(comm::Communicator& comm, float* y, const float* x, int64_t n, comm::Group group);

// Expert parallelism: moe_experts_forward/backward with the experts split over the ep group of
// `comm` (Communicator.h's kEp: this rank holds experts [e_idx * E/ep, (e_idx + 1) * E/ep),
// e_idx = comm.ep_index(), E = shape.experts, the global count). x, gates, experts (global ids)
// and out/dx/dgates are this rank's tokens, as in the single-rank kernels; w_in [E/ep, 2*inner,
// hidden], w_out [E/ep, hidden, inner] and dw_in, dw_out are this rank's experts.
//
// Each (token, slot) goes to ep-group rank experts[t, j] / (E/ep): the counts travel first (an
// all-to-all of one int64 per peer), then the slots (AllToAllV), in the order (peer, token,
// slot); the experts run on what arrived with moe_experts_forward/backward<double> (k = 1, one
// row per slot), and the results return the same way. Forward: a slot carries (expert id, x[t])
// out and the expert's output o (double) back; the gate multiply and the sum over the k slots
// happen at home in double and slot order, exactly as moe_experts_forward does, so out is bit
// for bit the single-rank result. Backward: (expert id, gate, x[t], dout[t]) out — x is sent
// again rather than kept from the forward, which would need a buffer of data-dependent size —
// and (dgate, the slot's dx share) back in double; dx adds a token's shares in ascending expert
// order (the single-rank loop order), rounded to fp32 once. dw_in/dw_out sum, in double, every
// slot of the ep group that reached this rank's experts (zero for an expert no token reached).
//
// Collective over the ep group: every member joins every exchange, with zero counts where it
// has nothing for a peer. An expert id outside [0, E) makes this rank send none of its slots
// (their outputs, dx and dgates are zero) and return InvalidArgument after the exchanges.
struct MoeShape {
  int64_t tokens, hidden, inner, experts, k, ep;
};
absl::Status moe_experts_ep_forward(comm::Communicator& comm, float* out, const float* x,
                                    const float* gates, const int32_t* experts, const float* w_in,
                                    const float* w_out, const MoeShape& shape);
absl::Status moe_experts_ep_backward(comm::Communicator& comm, float* dx, float* dgates,
                                     float* dw_in, float* dw_out, const float* dout, const float* x,
                                     const float* gates, const int32_t* experts, const float* w_in,
                                     const float* w_out, const MoeShape& shape);

}  // namespace hcp::cpu
