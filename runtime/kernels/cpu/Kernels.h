// CPU reference kernels: every op of a GraniteMoeHybrid training step, forward and backward.
//
// These are the oracle the CUDA kernels are tested against, so they favour clarity over speed.
// Conventions, for every function below:
//   - tensors are dense and row-major; shapes are given in the comments as [dim0, dim1, ...];
//   - every output is OVERWRITTEN (never accumulated into): the compiler inserts adds where a
//     value feeds several consumers;
//   - a pointer documented as "nullable" may be nullptr, meaning "zero" for inputs and
//     "not wanted" for outputs;
//   - reductions accumulate in double, so results do not depend on loop order beyond fp32
//     rounding of the final value.
// Every function is a template over the scalar type, instantiated for float (what the runtime
// runs) and double (what the finite-difference tests check against).
//
// Packed documents. The sequence kernels take `positions` (nullable) [batch rows, seq]: each
// token's position in its document (Hugging Face's padding-free position_ids, 0 at a document's
// first token), so token t's document starts at t - positions[t] (before 0: in the rows that
// precede this segment). A token reads nothing of an earlier document: the conv's window, the
// SSD state and attention's keys stop at its document's start. Null: one document throughout.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "runtime/kernels/cpu/Parallel.h"

namespace hcp::cpu {

// ---------------------------------------------------------------------------------------------
// Matrix product. Linear layers, the vocabulary projection and their backward lower to this.
// C[m, n] = alpha * sum_k op(A)[m, k] * op(B)[k, n] + beta * C[m, n], where op(X) is X or X^T.
// lda/ldb/ldc are the row strides of A, B, C as stored. beta == 0 ignores C's old contents.
// Rows of C are split over `threads` (the same results with any count).
template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
          int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc, Threads threads = {});

// ---------------------------------------------------------------------------------------------
// Embedding: out[t, :] = table[ids[t], :] * multiplier. ids [tokens], table [vocab, hidden].
// Returns InvalidArgument naming the position if an id is outside [0, vocab).
template <typename T>
absl::Status embedding_forward(T* out, const int32_t* ids, const T* table, int64_t tokens,
                               int64_t vocab, int64_t hidden, T multiplier);
// dtable [vocab, hidden] = scatter-add of dout[t, :] * multiplier into row ids[t]. Rows equal to
// padding_idx get no gradient (torch.nn.Embedding's padding_idx); padding_idx < 0 means none.
template <typename T>
void embedding_backward(T* dtable, const T* dout, const int32_t* ids, int64_t tokens, int64_t vocab,
                        int64_t hidden, T multiplier, int64_t padding_idx);

// ---------------------------------------------------------------------------------------------
// RMSNorm over the last dim: rstd[r] = 1 / sqrt(mean(x[r, :]^2) + eps); y = x * rstd * w.
// x, y [rows, dim]; w [dim]; rstd [rows] is saved for the backward.
template <typename T>
void rms_norm_forward(T* y, T* rstd, const T* x, const T* w, int64_t rows, int64_t dim, T eps);
template <typename T>
void rms_norm_backward(T* dx, T* dw, const T* dy, const T* x, const T* w, const T* rstd,
                       int64_t rows, int64_t dim);

// Gated RMSNorm (Mamba2, gate before norm): u = y * silu(z); out = u * rstd(u) * w, over the
// whole last dim. y, z, out [rows, dim]; w [dim]; rstd [rows] saved.
template <typename T>
void gated_rms_norm_forward(T* out, T* rstd, const T* y, const T* z, const T* w, int64_t rows,
                            int64_t dim, T eps);
template <typename T>
void gated_rms_norm_backward(T* dy, T* dz, T* dw, const T* dout, const T* y, const T* z, const T* w,
                             const T* rstd, int64_t rows, int64_t dim);

// ---------------------------------------------------------------------------------------------
// Elementwise, n elements.
template <typename T>
void silu_forward(T* y, const T* x, int64_t n);
template <typename T>
void silu_backward(T* dx, const T* dy, const T* x, int64_t n);
// softplus(x) = log(1 + exp(x)), and x itself above 20 (torch's threshold).
template <typename T>
void softplus_forward(T* y, const T* x, int64_t n);
template <typename T>
void softplus_backward(T* dx, const T* dy, const T* x, int64_t n);
template <typename T>
void add(T* y, const T* a, const T* b, int64_t n);
template <typename T>
void scale(T* y, const T* x, T factor, int64_t n);
// A = -exp(A_log) (Mamba2's decay rates); backward: dA_log = dA * A.
template <typename T>
void neg_exp_forward(T* y, const T* x, int64_t n);
template <typename T>
void neg_exp_backward(T* dx, const T* dy, const T* y, int64_t n);

// Row-broadcast bias: y[r, c] = x[r, c] + bias[c]. Backward of the bias: dbias[c] = sum_r dy[r, c].
template <typename T>
void bias_add_forward(T* y, const T* x, const T* bias, int64_t rows, int64_t cols);
template <typename T>
void column_sum(T* dbias, const T* dy, int64_t rows, int64_t cols);

// Column slices, for splitting a fused projection: out[r, :] = in[r, offset : offset + width].
// in [rows, in_cols]; out [rows, width]. The backward of a split is a concat of the slices'
// gradients, done with slice_columns_backward into disjoint column ranges of one buffer.
template <typename T>
void slice_columns(T* out, const T* in, int64_t rows, int64_t in_cols, int64_t offset,
                   int64_t width);
// din[r, offset : offset + width] = dout[r, :], other columns untouched (the caller zeroes or
// fills them with the other slices).
template <typename T>
void slice_columns_backward(T* din, const T* dout, int64_t rows, int64_t in_cols, int64_t offset,
                            int64_t width);

// SwiGLU with gate-first packing: x [rows, 2*inner] = [a | b]; y [rows, inner] = silu(a) * b.
template <typename T>
void swiglu_forward(T* y, const T* x, int64_t rows, int64_t inner);
template <typename T>
void swiglu_backward(T* dx, const T* dy, const T* x, int64_t rows, int64_t inner);

// ---------------------------------------------------------------------------------------------
// Causal depthwise conv1d with bias (no activation; SiLU is a separate op).
// x, y [batch, seq, channels]; w [channels, width] (the checkpoint's [C, 1, K]); bias [channels].
// y[b, t, c] = bias[c] + sum_{j<width} w[c, j] * x[b, t - (width-1) + j, c], where positions
// before 0 read halo[b, (width-1) + (t - (width-1) + j), c] from the rows that precede this
// segment (context parallelism), or zero if halo is null. halo [batch, width-1, channels].
// With positions, tap j (lag (width-1) - j) is zero where the lag exceeds positions[b, t].
template <typename T>
void causal_conv1d_forward(T* y, const T* x, const T* halo, const T* w, const T* bias,
                           int64_t batch, int64_t seq, int64_t channels, int64_t width,
                           const int32_t* positions = nullptr);
// dhalo is nullable (not wanted) and gets the gradient of the halo rows.
template <typename T>
void causal_conv1d_backward(T* dx, T* dhalo, T* dw, T* dbias, const T* dy, const T* x,
                            const T* halo, const T* w, int64_t batch, int64_t seq, int64_t channels,
                            int64_t width, const int32_t* positions = nullptr);

// ---------------------------------------------------------------------------------------------
// Mamba2 SSD scan, chunked. Per batch b and head h (group g = h / (heads / groups)):
//   S_t = exp(dt_t * A_h) * S_{t-1} + dt_t * x_t B_t^T      (S is [head_dim, state])
//   y_t = S_t C_t + D_h * x_t,   S_{-1} = init_state (zero if null)
// computed chunk by chunk (chunk positions; a partial last chunk is fine): within a chunk the
// quadratic form with cumulative sums of dt*A, between chunks the state recurrence. dt, the
// cumulative sums and all states are kept in the scalar type (fp32 at least).
struct SsdShape {
  int64_t batch, seq, heads, head_dim, groups, state, chunk;
};
// x [B,S,H,P]; dt [B,S,H] (already softplus'ed); A [H] (negative); Bm, Cm [B,S,G,N]; D [H];
// init_state [B,H,P,N] nullable. y [B,S,H,P] nullable (not wanted: then Cm and D are not read);
// final_state [B,H,P,N] nullable. The (batch row, head) pairs are split over `threads`.
// With positions [B,S] the state restarts at each document's first token (its decay from the
// state before is 0): init_state reaches only the tokens before the first document start, and
// final_state holds only the last document's. chunk_states [B,H,ceil(S/chunk),P,N] nullable:
// the state entering each chunk, for the backward.
template <typename T>
void ssd_scan_forward(T* y, T* final_state, const T* x, const T* dt, const T* A, const T* Bm,
                      const T* Cm, const T* D, const T* init_state, const SsdShape& shape,
                      Threads threads = {}, const int32_t* positions = nullptr,
                      T* chunk_states = nullptr);
// Exact gradients of ssd_scan_forward. dfinal_state is nullable (zero); dinit_state nullable
// (not wanted). Recomputes what it needs from the inputs (states at chunk starts, then each
// chunk's states), so it needs no saved activations and memory linear in one chunk; with the
// forward's chunk_states (nullable) it reads the states at chunk starts from there instead.
// The heads are split over `threads`.
template <typename T>
void ssd_scan_backward(T* dx, T* ddt, T* dA, T* dBm, T* dCm, T* dD, T* dinit_state, const T* dy,
                       const T* dfinal_state, const T* x, const T* dt, const T* A, const T* Bm,
                       const T* Cm, const T* D, const T* init_state, const SsdShape& shape,
                       Threads threads = {}, const int32_t* positions = nullptr,
                       const T* chunk_states = nullptr);
// The final state ssd_scan_forward reaches from a zero initial state, without computing y: the
// same chunk steps, so it equals ssd_scan_forward's final_state exactly. Context parallelism's
// summary of a segment. Bm [B,S,G,N]; final_state [B,H,P,N].
template <typename T>
void ssd_final_state_forward(T* final_state, const T* x, const T* dt, const T* A, const T* Bm,
                             const SsdShape& shape, Threads threads = {},
                             const int32_t* positions = nullptr);
// Its exact gradients: ssd_scan_backward's with dy = 0 and no initial state (the oracle runs that
// with zero dy and C; correctness, not speed).
template <typename T>
void ssd_final_state_backward(T* dx, T* ddt, T* dA, T* dBm, const T* dfinal_state, const T* x,
                              const T* dt, const T* A, const T* Bm, const SsdShape& shape,
                              Threads threads = {}, const int32_t* positions = nullptr);
// Context parallelism's correction of a segment scanned from a zero start: the outputs its true
// initial state adds. Per batch row b and head h (group g), with the inclusive cumulative
// log-decay Acs_t = A_h * sum_{u<=t} dt_u from the segment's start:
//   out_t[p] = y_t[p] + exp(Acs_t) * sum_n init_state[p, n] C_t[n]
// which makes out ssd_scan_forward's y with that init_state (the scan is linear in its state).
// y, out [B,S,H,P]; dt [B,S,H]; A [H]; Cm [B,S,G,N]; init_state [B,H,P,N]. shape.chunk is not
// read. out may equal y (in place). With positions [B,S], only the tokens before the segment's
// first document start (positions[t] > t) take the term.
template <typename T>
void ssd_add_initial_state_forward(T* out, const T* y, const T* dt, const T* A, const T* Cm,
                                   const T* init_state, const SsdShape& shape,
                                   const int32_t* positions = nullptr);
// Its gradients except y's (which is dout itself). With q_t = init_state C_t and
// w_t = exp(Acs_t) <dout_t, q_t> (the gradient of Acs_t):
//   dinit_state = sum_t exp(Acs_t) dout_t C_t^T        dCm_t = sum_{h in g} exp(Acs_t) init^T
//   dout_t ddt_u = A_h sum_{t>=u} w_t                          dA_h = sum_{b,t} w_t sum_{u<=t} dt_u
template <typename T>
void ssd_add_initial_state_backward(T* ddt, T* dA, T* dCm, T* dinit_state, const T* dout,
                                    const T* dt, const T* A, const T* Cm, const T* init_state,
                                    const SsdShape& shape, const int32_t* positions = nullptr);
// Total log-decay of a segment, for passing states between segments: g[b, h] = sum_t
// dt[b,t,h]*A[h]. With positions [B,S], -infinity for a row whose last token's document starts
// in the segment (positions[last] < seq): no state passes through it. Its gradient is then zero,
// which the state scan's dg = exp(g) <...> = 0 gives the backward below.
template <typename T>
void ssd_log_decay(T* g, const T* dt, const T* A, int64_t batch, int64_t seq, int64_t heads,
                   const int32_t* positions = nullptr);
// Its gradients: ddt[b, t, h] = dg[b, h] * A[h]; dA[h] = sum_{b,t} dg[b, h] * dt[b, t, h].
template <typename T>
void ssd_log_decay_backward(T* ddt, T* dA, const T* dg, const T* dt, const T* A, int64_t batch,
                            int64_t seq, int64_t heads);

// ---------------------------------------------------------------------------------------------
// Attention, grouped-query (query head h uses kv head h / (q_heads / kv_heads)), explicit scale.
// q [B, Sq, Hq, D]; k, v [B, Sk, Hkv, D]; out [B, Sq, Hq, D]; lse [B, Hq, Sq] = natural log of
// sum_j exp(scale * q.k_j) over visible keys. Query row i sits at global position q_pos0 + i,
// key j at k_pos0 + j; when causal, key j is visible to row i iff k_pos0 + j <= q_pos0 + i.
// A row that sees no key gets out = 0 and lse = -infinity (so it merges as "empty").
// q_positions (nullable) [B, Sq]: packed documents; key j is visible to row i only if it is no
// earlier than the row's document start, k_pos0 + j >= q_pos0 + i - q_positions[b, i].
struct AttentionShape {
  int64_t batch, q_len, kv_len, q_heads, kv_heads, head_dim;
};
template <typename T>
void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v,
                       const AttentionShape& shape, T scale, bool causal, int64_t q_pos0,
                       int64_t k_pos0, const int32_t* q_positions = nullptr);
// Gradients of one (query block, key block) pair given the FINAL out and lse of the query rows
// (after any merging over key blocks), as ring attention needs. dq [B,Sq,Hq,D] is this block's
// contribution; dk, dv [B,Sk,Hkv,D].
template <typename T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                        const T* out, const T* lse, const AttentionShape& shape, T scale,
                        bool causal, int64_t q_pos0, int64_t k_pos0,
                        const int32_t* q_positions = nullptr);
// Merges a partial result (out_b, lse_b) into (out, lse) in place:
// L = log(exp(L_a) + exp(L_b)); O = exp(L_a - L) O_a + exp(L_b - L) O_b. -inf entries are empty.
// out, out_b [B, S, H, D]; lse, lse_b [B, H, S].
template <typename T>
void attention_merge(T* out, T* lse, const T* out_b, const T* lse_b, int64_t batch, int64_t seq,
                     int64_t heads, int64_t head_dim);

// ---------------------------------------------------------------------------------------------
// MoE routing: top-k of the raw logits, then softmax over the k selected logits only.
// logits [tokens, experts]; indices [tokens, k] in descending logit order (ties: lower expert
// index first); gates [tokens, k].
template <typename T>
void topk_softmax_forward(T* gates, int32_t* indices, const T* logits, int64_t tokens,
                          int64_t experts, int64_t k);
// The gates of experts chosen elsewhere: gates[t, j] = softmax over j of logits[t, indices[t, j]]
// (topk_softmax_forward's gates for its own indices). Every index must be in [0, experts).
template <typename T>
void selected_softmax_forward(T* gates, const int32_t* indices, const T* logits, int64_t tokens,
                              int64_t experts, int64_t k);
// dlogits [tokens, experts]: softmax backward on the selected entries, zero elsewhere.
template <typename T>
void topk_softmax_backward(T* dlogits, const T* dgates, const T* gates, const int32_t* indices,
                           int64_t tokens, int64_t experts, int64_t k);

// Expert compute: out[t] = sum_j gates[t, j] * W_out[e] (silu(a) * b), where [a | b] = W_in[e] x[t]
// and e = indices[t, j]. x, out [tokens, hidden]; w_in [E, 2*inner, hidden] (gate rows first);
// w_out [E, hidden, inner]. A slot whose index is outside [0, E) contributes nothing (dgates 0).
// Tokens (forward), then experts and tokens (backward) are split over `threads` (the same results
// with any count). kept_h (nullable) [tokens, k, 2*inner]: the forward stores each routed slot's
// [a | b] there (rounded to T), and the backward reads it instead of recomputing W_in[e] x.
template <typename T>
void moe_experts_forward(T* out, const T* x, const T* gates, const int32_t* indices, const T* w_in,
                         const T* w_out, int64_t tokens, int64_t hidden, int64_t inner,
                         int64_t experts, int64_t k, Threads threads = {}, T* kept_h = nullptr);
template <typename T>
void moe_experts_backward(T* dx, T* dgates, T* dw_in, T* dw_out, const T* dout, const T* x,
                          const T* gates, const int32_t* indices, const T* w_in, const T* w_out,
                          int64_t tokens, int64_t hidden, int64_t inner, int64_t experts, int64_t k,
                          Threads threads = {}, const T* kept_h = nullptr);

// ---------------------------------------------------------------------------------------------
// Cross-entropy with an ignore index. logits [tokens, vocab]; targets [tokens].
// loss_sum = sum over valid rows of (lse[t] - logits[t, targets[t]]); valid_count = number of
// valid rows (as a scalar of type T); lse [tokens] saved (ignored rows too).
// Returns InvalidArgument naming the position if a target is neither ignore_index nor in [0,
// vocab).
template <typename T>
absl::Status cross_entropy_forward(T* loss_sum, T* valid_count, T* lse, const T* logits,
                                   const int32_t* targets, int64_t tokens, int64_t vocab,
                                   int64_t ignore_index);
// dlogits = dloss_sum[0] * (softmax(logits[t]) - onehot(targets[t])) for valid rows, 0 for ignored.
template <typename T>
void cross_entropy_backward(T* dlogits, const T* dloss_sum, const T* logits, const T* lse,
                            const int32_t* targets, int64_t tokens, int64_t vocab,
                            int64_t ignore_index);

// ---------------------------------------------------------------------------------------------
// The MoE load-balancing loss (transformers' load_balancing_loss_func, Switch Transformer's):
// over every MoE layer's tokens, aux = experts * sum_e (picks_e / rows) * (probs_e / rows), with
// probs_e the summed softmax(logits[t])[e] over all experts and picks_e how many top-k slots
// chose e. router_load gives one layer's sums (the compiler adds the layers' and, split over
// ranks, all-reduces them); router_aux_loss combines them.
// probs, picks [experts]; logits [tokens, experts]; indices [tokens, k]. Returns
// InvalidArgument naming the slot if an index is outside [0, experts).
template <typename T>
absl::Status router_load_forward(T* probs, T* picks, const T* logits, const int32_t* indices,
                                 int64_t tokens, int64_t experts, int64_t k);
// dlogits [tokens, experts] = s * (dprobs - sum_e s_e dprobs_e), s = softmax(logits[t]).
template <typename T>
void router_load_backward(T* dlogits, const T* dprobs, const T* logits, int64_t tokens,
                          int64_t experts);
// loss[0] = scale * sum_e probs[e] * picks[e] (scale = experts / rows^2).
template <typename T>
void router_aux_loss_forward(T* loss, const T* probs, const T* picks, int64_t experts, T scale);
// dprobs[e] = dloss[0] * scale * picks[e] (picks, counts, have no gradient).
template <typename T>
void router_aux_loss_backward(T* dprobs, const T* dloss, const T* picks, int64_t experts, T scale);

}  // namespace hcp::cpu
