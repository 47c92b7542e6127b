// CUDA kernels for the sequence-mixing ops of a GraniteMoeHybrid training step: the Mamba2 SSD
// scan (chunked, forward and backward, with initial / final states for context parallelism, and
// the correction that adds a segment's entering state to outputs scanned from zero) and
// causal grouped-query attention (forward with log-sum-exp, backward), for sm_90 (H100 / H200).
//
// Each function computes its namesake in runtime/kernels/cpu/Kernels.h (the oracle) with the same
// layouts and semantics; the conventions of runtime/kernels/cuda/Kernels.h hold (device pointers,
// outputs overwritten, work queued on `stream`, caller-owned Workspace, errors as Status), and:
//   - x, B, C, y (SSD) and q, k, v, out (attention) and their gradients are bf16; dt, A, D, the
//     SSD states and their gradients, and lse are fp32. Products run on the tensor cores with bf16
//     operands and fp32 accumulation; dt, its cumulative sums, the decays and all states stay fp32.
//   - bit-reproducible run to run on one GPU model, with one exception: the default Hopper
//     attention backward (HCP_ATTN_IMPL=hopper) adds dq's pieces with the copy engine's fp32
//     reduction, whose order varies; HCP_ATTN_IMPL=hopper-det (slower) or fa2 are reproducible.
//   - supported shapes (anything else returns an error Status, never computes garbage):
//       SSD: chunk == 256, head_dim in {32, 64}, state == 128, heads % groups == 0; any batch,
//            any seq >= 1 (a partial last chunk is padded with dt = 0 internally);
//       attention: head_dim in {64, 128}, q_heads % kv_heads == 0; any lengths >= 1 and any
//            q_pos0 / k_pos0 (ring-attention blocks).
// The header is plain C++ (no device code).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "runtime/kernels/cuda/Kernels.h"  // Status, Workspace, bf16

namespace hcp::cuda {

// ---------------------------------------------------------------------------------------------
// Mamba2 SSD scan. Per batch b and head h (group g = h / (heads / groups)):
//   S_t = exp(dt_t A_h) S_{t-1} + dt_t x_t B_t^T,   y_t = S_t C_t + D_h x_t,   S_{-1} = init_state
// Same shape struct as hcp::cpu::SsdShape.
struct SsdShape {
  int64_t batch, seq, heads, head_dim, groups, state, chunk;
};
// Whether the shape is supported (see above); the functions below also check it.
bool ssd_supported(const SsdShape& shape);

// x [B,S,H,P] bf16; dt [B,S,H] fp32 (already softplus'ed); A [H] fp32 (negative); Bm, Cm [B,S,G,N]
// bf16; D [H] fp32 nullable (zero); init_state [B,H,P,N] fp32 nullable (zero).
// y [B,S,H,P] bf16; final_state [B,H,P,N] fp32 nullable (not wanted). positions [B,S] int32
// nullable: packed documents (Hugging Face's position_ids), the state restarting at each
// document's first token (positions 0), as the CPU kernels'; the functions below take it alike.
// chunk_states [B,H,ceil(S/256),P,N] fp32 nullable: the state entering each chunk, kept for
// the backward.
size_t ssd_scan_forward_workspace_bytes(const SsdShape& shape);
Status ssd_scan_forward(cudaStream_t stream, bf16* y, float* final_state, const bf16* x,
                        const float* dt, const float* A, const bf16* Bm, const bf16* Cm,
                        const float* D, const float* init_state, const SsdShape& shape,
                        Workspace workspace, const int32_t* positions = nullptr,
                        float* chunk_states = nullptr);

// Exact gradients of ssd_scan_forward (recomputes the forward's states from the inputs, or
// reads them from the forward's chunk_states when not null). dfinal_state [B,H,P,N] nullable
// (zero); dinit_state nullable (not wanted); dD is written even when D was null. dx [B,S,H,P]
// bf16, ddt [B,S,H] fp32, dA [H] fp32, dBm, dCm [B,S,G,N] bf16, dD [H] fp32, dinit_state
// [B,H,P,N] fp32.
size_t ssd_scan_backward_workspace_bytes(const SsdShape& shape);
Status ssd_scan_backward(cudaStream_t stream, bf16* dx, float* ddt, float* dA, bf16* dBm, bf16* dCm,
                         float* dD, float* dinit_state, const bf16* dy, const float* dfinal_state,
                         const bf16* x, const float* dt, const float* A, const bf16* Bm,
                         const bf16* Cm, const float* D, const float* init_state,
                         const SsdShape& shape, Workspace workspace,
                         const int32_t* positions = nullptr, const float* chunk_states = nullptr);

// The final state of ssd_scan_forward from a zero initial state, without y (context
// parallelism's segment summary): the scan's state launches only. x, dt, A, Bm as above;
// final_state [B,H,P,N] fp32.
size_t ssd_final_state_forward_workspace_bytes(const SsdShape& shape);
Status ssd_final_state_forward(cudaStream_t stream, float* final_state, const bf16* x,
                               const float* dt, const float* A, const bf16* Bm,
                               const SsdShape& shape, Workspace workspace,
                               const int32_t* positions = nullptr);

// Exact gradients of ssd_final_state_forward: ssd_scan_backward's with dy = 0 and no initial
// state, without any of its dy work (no intra-chunk products). dfinal_state [B,H,P,N] fp32;
// dx [B,S,H,P] bf16, ddt [B,S,H] fp32, dA [H] fp32, dBm [B,S,G,N] bf16.
size_t ssd_final_state_backward_workspace_bytes(const SsdShape& shape);
Status ssd_final_state_backward(cudaStream_t stream, bf16* dx, float* ddt, float* dA, bf16* dBm,
                                const float* dfinal_state, const bf16* x, const float* dt,
                                const float* A, const bf16* Bm, const SsdShape& shape,
                                Workspace workspace, const int32_t* positions = nullptr);

// Context parallelism's correction of a segment scanned from a zero start by the state that
// enters it. Per batch row b and head h (group g), with the inclusive cumulative log-decay
// Acs_t = A_h * sum_{u<=t} dt_u from the row's start:
//   out_t[p] = y_t[p] + exp(Acs_t) * sum_n init_state[b,h][p, n] C_t[n]
// y, out [B,S,H,P] bf16 (out may equal y: in place); dt [B,S,H] fp32; A [H] fp32; Cm [B,S,G,N]
// bf16; init_state [B,H,P,N] fp32 (fed to the tensor cores as bf16, as the scan's states are).
// Supported shapes: the scan's (above) except that shape.chunk is not read; out, y, Cm and
// init_state 16-byte aligned. positions [B,S] int32 nullable: packed documents; only the tokens
// before the segment's first document start (positions[t] > t) take the term.
size_t ssd_add_initial_state_forward_workspace_bytes(const SsdShape& shape);
Status ssd_add_initial_state_forward(cudaStream_t stream, bf16* out, const bf16* y, const float* dt,
                                     const float* A, const bf16* Cm, const float* init_state,
                                     const SsdShape& shape, Workspace workspace,
                                     const int32_t* positions = nullptr);

// Its gradients except y's (which is dout itself). With q_t = init_state C_t and
// w_t = exp(Acs_t) <dout_t, q_t>:
//   dinit_state = sum_t exp(Acs_t) dout_t C_t^T,   dCm_t = sum_{h in g} exp(Acs_t) init^T dout_t,
//   ddt_u = A_h sum_{t>=u} w_t,                    dA_h = sum_{b,t} w_t sum_{u<=t} dt_u.
// ddt [B,S,H] fp32, dA [H] fp32, dCm [B,S,G,N] bf16, dinit_state [B,H,P,N] fp32 (all required);
// dout [B,S,H,P] bf16; the rest as for the forward. dCm, dinit_state, dout, Cm and init_state
// 16-byte aligned. positions as for the forward.
size_t ssd_add_initial_state_backward_workspace_bytes(const SsdShape& shape);
Status ssd_add_initial_state_backward(cudaStream_t stream, float* ddt, float* dA, bf16* dCm,
                                      float* dinit_state, const bf16* dout, const float* dt,
                                      const float* A, const bf16* Cm, const float* init_state,
                                      const SsdShape& shape, Workspace workspace,
                                      const int32_t* positions = nullptr);

// ---------------------------------------------------------------------------------------------
// Attention, grouped-query (query head h uses kv head h / (q_heads / kv_heads)), explicit scale.
// q [B,Sq,Hq,D]; k, v [B,Sk,Hkv,D]; out [B,Sq,Hq,D] bf16; lse [B,Hq,Sq] fp32 (natural log).
// Query row i sits at global position q_pos0 + i, key j at k_pos0 + j; when causal, key j is
// visible to row i iff k_pos0 + j <= q_pos0 + i. A row that sees no key gets out = 0 and
// lse = -infinity. Same shape struct as hcp::cpu::AttentionShape.
struct AttentionShape {
  int64_t batch, q_len, kv_len, q_heads, kv_heads, head_dim;
};
bool attention_supported(const AttentionShape& shape);

// q_positions [B,Sq] int32 nullable: packed documents, as the CPU kernel's (key j is visible to
// row i only if k_pos0 + j >= q_pos0 + i - q_positions[b, i]); these run on the mma.sync kernels,
// skipping the key blocks no row of a query block can see.
Status attention_forward(cudaStream_t stream, bf16* out, float* lse, const bf16* q, const bf16* k,
                         const bf16* v, const AttentionShape& shape, float scale, bool causal,
                         int64_t q_pos0, int64_t k_pos0, const int32_t* q_positions = nullptr);

// Gradients of one (query block, key block) pair given the FINAL out and lse of the query rows
// (after any merging over key blocks), as ring attention needs: dq [B,Sq,Hq,D] is this block's
// contribution, dk, dv [B,Sk,Hkv,D]. Workspace: the per-row Delta = dout . out (fp32).
size_t attention_backward_workspace_bytes(const AttentionShape& shape);
Status attention_backward(cudaStream_t stream, bf16* dq, bf16* dk, bf16* dv, const bf16* dout,
                          const bf16* q, const bf16* k, const bf16* v, const bf16* out,
                          const float* lse, const AttentionShape& shape, float scale, bool causal,
                          int64_t q_pos0, int64_t k_pos0, Workspace workspace,
                          const int32_t* q_positions = nullptr);

}  // namespace hcp::cuda
