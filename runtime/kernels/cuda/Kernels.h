// CUDA kernels for the token-local ops of a GraniteMoeHybrid training step, forward and backward,
// and the cuBLASLt matrix product. Each function computes exactly its namesake in
// runtime/kernels/cpu/Kernels.h (the oracle): same layouts, same semantics, with the precision
// differences listed here.
//
// Conventions, for every function below:
//   - pointers are device pointers; tensors are dense and row-major, shapes as in the CPU header;
//   - every output is OVERWRITTEN, except where a function says otherwise;
//   - work is queued on `stream` and the function returns without waiting, except the MoE expert
//     functions, which wait once for the per-expert token counts (cuBLASLt needs them on the host);
//   - activations and weights are bf16; arithmetic is fp32; reductions accumulate in fp32 (or
//     double where named) in a FIXED order, so every result is bit-reproducible run to run on one
//     GPU model (no floating-point atomics anywhere);
//   - per-row statistics (rstd, lse), losses, routing gates and optimizer state are fp32;
//   - functions templated on T exist for T = float and T = bf16 (explicitly instantiated);
//   - scratch memory comes from the caller: `Workspace` of at least the bytes the matching
//     *_workspace_bytes function returns (16-byte aligned), used only until the queued work ends;
//   - errors come back as a Status (bad arguments, launch and library failures). Bad DATA that
//     only the device sees (a token id outside the vocabulary, a bad target) cannot be returned:
//     where the CPU oracle returns InvalidArgument, these functions take `bad_position`, a
//     nullable device int32 that the kernel lowers (atomicMin) to the first bad position; the
//     caller sets it to INT32_MAX beforehand and reads it when convenient. The affected outputs
//     are NaN so that a step using them is skipped by the training loop's NaN policy.
// The header is plain C++ (no device code): the runtime includes it from .cpp files. It needs no
// Abseil: Status is converted to absl::Status at the runtime's edge.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <span>

namespace hcp::cuda {

using bf16 = __nv_bfloat16;

// Success, or where the first failure happened and the library's message (both static strings).
class Status {
 public:
  Status() = default;
  Status(const char* where, const char* message) : where_(where), message_(message) {}
  static Status Cuda(const char* where, cudaError_t error) {
    return Status(where, cudaGetErrorString(error));
  }
  bool ok() const { return where_ == nullptr; }
  const char* where() const { return where_ == nullptr ? "" : where_; }
  const char* message() const { return message_ == nullptr ? "" : message_; }

 private:
  const char* where_ = nullptr;
  const char* message_ = nullptr;
};

// Caller-owned scratch memory.
struct Workspace {
  void* ptr = nullptr;
  size_t bytes = 0;
};

// ---------------------------------------------------------------------------------------------
// Matrix product through cuBLASLt (Gemm.cpp).
// C[m, n] = alpha * op(A)[m, k] op(B)[k, n] + beta * C[m, n], row-major, op(X) = X or X^T, lda/ldb/
// ldc the row strides as stored (the CPU gemm's contract). A and B are bf16; C is bf16 or fp32
// (TC); the product accumulates in fp32. beta == 0 never reads C (it may hold NaN). k == 0 gives
// C = beta * C for beta in {0, 1} (other betas with k == 0 are refused).
// A GemmContext holds the cuBLASLt handle, a device workspace and a cache of the algorithm the
// heuristic picked per problem; use one context per stream (the workspace is shared by its
// launches). Shapes whose leading row-major dimension varies from call to call (MoE experts'
// token counts) share cache entries by rounding that dimension up to a multiple of 64.
// It also owns `lanes` streams, each with a workspace of its own, for gemm_group.
// On a problem's first call outside graph capture, where the call can be run again with the same
// result (beta 0, or gemm_add with an addend other than its output), the context times the
// heuristic's first few candidates on the call's own operands and keeps the fastest of those whose
// result is the first's bit for bit (so the numbers never depend on the timing);
// set_tuning(false) keeps the heuristic's first.
struct GemmContext;
Status gemm_context_create(GemmContext** ctx, size_t workspace_bytes = size_t{32} << 20,
                           int lanes = 4);
void gemm_context_destroy(GemmContext* ctx);
void gemm_context_set_tuning(GemmContext* ctx, bool tune);
// The elements at which two matrices of the same layout differ in their bits (`batches` of
// [rows, cols], row stride ld, batch stride `stride`, elements of 2 or 4 bytes), into *count
// (device memory). GemmCompare.cu, for the tuning above.
Status count_differences(cudaStream_t stream, unsigned long long* count, const void* a,
                         const void* b, int element_bytes, int64_t batches, int64_t stride,
                         int64_t rows, int64_t cols, int64_t ld);
// The device memory such a context allocates.
size_t gemm_context_bytes(size_t workspace_bytes, int lanes);

template <typename TC>
Status gemm(GemmContext* ctx, cudaStream_t stream, bool trans_a, bool trans_b, int64_t m, int64_t n,
            int64_t k, float alpha, const bf16* a, int64_t lda, const bf16* b, int64_t ldb,
            float beta, TC* c, int64_t ldc);

// out = alpha * op(A) op(B) + beta * c, rounded once (c and out: [m, n] with row stride ldc; out
// may be c itself). A GEMM with its following add folded into cuBLASLt's epilogue (C = c,
// D = out): the product is not stored and read back.
template <typename TC>
Status gemm_add(GemmContext* ctx, cudaStream_t stream, bool trans_a, bool trans_b, int64_t m,
                int64_t n, int64_t k, float alpha, const bf16* a, int64_t lda, const bf16* b,
                int64_t ldb, float beta, const TC* c, TC* out, int64_t ldc);

// Independent products (no problem's C overlaps another's A, B or C; C bf16 or fp32, TC), with
// the results of running them one after another on `stream`: products too small to fill the GPU
// alone (one MoE expert's rows: a few dozen output tiles each) run side by side on the context's
// lanes, which start after the work queued on `stream` so far and which `stream` waits for
// before anything queued after. Each lane's products are planned for its share of the SMs
// (cuBLASLt's SM count target), so a product may run another algorithm than gemm() would: the
// same result up to the order of its fp32 sums.
template <typename TC>
struct GemmProblemOf {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  float alpha = 1.f;
  const bf16* a = nullptr;
  int64_t lda = 0;
  const bf16* b = nullptr;
  int64_t ldb = 0;
  float beta = 0.f;
  TC* c = nullptr;
  int64_t ldc = 0;
};
using GemmProblem = GemmProblemOf<bf16>;
template <typename TC>
Status gemm_group(GemmContext* ctx, cudaStream_t stream,
                  std::span<const GemmProblemOf<TC>> problems);
// `batch` products of p's shape in one cuBLASLt launch (strided batched): the i-th reads
// p.a + i * stride_a and p.b + i * stride_b and writes p.c + i * stride_c (elements), with p's row
// strides. The same result as `batch` gemm() calls up to the order of the fp32 sums.
template <typename TC>
Status gemm_strided_batched(GemmContext* ctx, cudaStream_t stream, const GemmProblemOf<TC>& p,
                            int64_t batch, int64_t stride_a, int64_t stride_b, int64_t stride_c);

// ---------------------------------------------------------------------------------------------
// Elementwise (Elementwise.cu), n elements unless said. In-place use (y == x) is allowed.
template <typename T>
Status fill(cudaStream_t stream, T* y, float value, int64_t n);
template <typename T>
Status copy(cudaStream_t stream, T* y, const T* x, int64_t n);
// Conversions between the two element types (bf16 <- float rounds to nearest even).
Status cast(cudaStream_t stream, bf16* y, const float* x, int64_t n);
Status cast(cudaStream_t stream, float* y, const bf16* x, int64_t n);
template <typename T>
Status scale(cudaStream_t stream, T* y, const T* x, float factor, int64_t n);
// y[i] = a[i] op b[i % rhs_n]: b broadcast over the leading dims (rhs_n == n: plain). rhs_n
// must divide n. add with rhs_n = cols is the CPU bias_add_forward.
enum class BinaryOp { kAdd, kMul, kDiv };
template <typename T>
Status binary(cudaStream_t stream, BinaryOp op, T* y, const T* a, const T* b, int64_t n,
              int64_t rhs_n);
template <typename T>
Status silu_forward(cudaStream_t stream, T* y, const T* x, int64_t n);
template <typename T>
Status silu_backward(cudaStream_t stream, T* dx, const T* dy, const T* x, int64_t n);
// softplus(x) = log(1 + exp(x)), x itself above 20.
template <typename T>
Status softplus_forward(cudaStream_t stream, T* y, const T* x, int64_t n);
template <typename T>
Status softplus_backward(cudaStream_t stream, T* dx, const T* dy, const T* x, int64_t n);
// y = -exp(x); backward dx = dy * y (the saved output).
template <typename T>
Status neg_exp_forward(cudaStream_t stream, T* y, const T* x, int64_t n);
template <typename T>
Status neg_exp_backward(cudaStream_t stream, T* dx, const T* dy, const T* y, int64_t n);
// x [rows, 2*inner] = [a | b]; y [rows, inner] = silu(a) * b.
template <typename T>
Status swiglu_forward(cudaStream_t stream, T* y, const T* x, int64_t rows, int64_t inner);
template <typename T>
Status swiglu_backward(cudaStream_t stream, T* dx, const T* dy, const T* x, int64_t rows,
                       int64_t inner);
// out [rows, width] = in[:, offset : offset + width], in [rows, in_cols].
template <typename T>
Status slice_columns(cudaStream_t stream, T* out, const T* in, int64_t rows, int64_t in_cols,
                     int64_t offset, int64_t width);
// out[:, offset : offset + width] = in [rows, width]; the other columns of out [rows, out_cols]
// are left untouched (the CPU slice_columns_backward).
template <typename T>
Status insert_columns(cudaStream_t stream, T* out, const T* in, int64_t rows, int64_t out_cols,
                      int64_t offset, int64_t width);
// y [cols] = sum over rows of x [rows, cols] (the bias gradient; KernelTable's sum_leading), in
// fp32 over fixed row chunks, the chunks summed in order.
size_t column_sum_workspace_bytes(int64_t rows, int64_t cols);
template <typename T>
Status column_sum(cudaStream_t stream, T* y, const T* x, int64_t rows, int64_t cols,
                  Workspace workspace);

// ---------------------------------------------------------------------------------------------
// RMSNorm over the last dim (Norms.cu). dim <= 32768. x, y [rows, dim] bf16; w [dim] bf16;
// rstd [rows] fp32, nullable on the forward (not wanted) and on the backward (recomputed from x
// with eps, as the CPU backend does). y = x * rstd * w rounded once (Hugging Face rounds
// x * rstd to bf16 before the weight multiply; the difference is within one bf16 rounding).
Status rms_norm_forward(cudaStream_t stream, bf16* y, float* rstd, const bf16* x, const bf16* w,
                        int64_t rows, int64_t dim, float eps);
size_t rms_norm_backward_workspace_bytes(int64_t rows, int64_t dim);
// dresidual, nullable: added to dx (dx = the norm's input gradient + dresidual, rounded once).
Status rms_norm_backward(cudaStream_t stream, bf16* dx, bf16* dw, const bf16* dy, const bf16* x,
                         const bf16* w, const bf16* dresidual, const float* rstd, int64_t rows,
                         int64_t dim, float eps, Workspace workspace);
// Gated RMSNorm (gate before norm): u = y * silu(z) in fp32; out = u * rstd(u) * w.
Status gated_rms_norm_forward(cudaStream_t stream, bf16* out, float* rstd, const bf16* y,
                              const bf16* z, const bf16* w, int64_t rows, int64_t dim, float eps);
size_t gated_rms_norm_backward_workspace_bytes(int64_t rows, int64_t dim);
Status gated_rms_norm_backward(cudaStream_t stream, bf16* dy, bf16* dz, bf16* dw, const bf16* dout,
                               const bf16* y, const bf16* z, const bf16* w, const float* rstd,
                               int64_t rows, int64_t dim, float eps, Workspace workspace);

// ---------------------------------------------------------------------------------------------
// Embedding (Embedding.cu). out [tokens, hidden] = table[ids] * multiplier. A bad id gives a
// NaN row and is reported through bad_position (see the conventions).
Status embedding_forward(cudaStream_t stream, bf16* out, const int32_t* ids, const bf16* table,
                         int64_t tokens, int64_t vocab, int64_t hidden, float multiplier,
                         int32_t* bad_position);
// dtable [vocab, hidden]: every row written once, the rows of absent ids and padding_idx (< 0:
// none) zero. Deterministic: a stable radix sort of the ids (CUB) groups the tokens of each id,
// then one warp per vocabulary row sums its tokens' gradients in token order in fp32. Ids outside
// the vocabulary are skipped.
size_t embedding_backward_workspace_bytes(int64_t tokens, int64_t vocab);
Status embedding_backward(cudaStream_t stream, bf16* dtable, const bf16* dout, const int32_t* ids,
                          int64_t tokens, int64_t vocab, int64_t hidden, float multiplier,
                          int64_t padding_idx, Workspace workspace);

// ---------------------------------------------------------------------------------------------
// Causal depthwise conv1d with bias (Conv.cu), 1 <= width <= 8. x, y [batch, seq, channels];
// w [channels, width]; bias [channels] (nullable: zero); halo [batch, width-1, channels] nullable
// (zeros): the rows that precede each sequence (context parallelism). With `silu`, y =
// silu(conv) with the conv rounded to bf16 first: what a silu_forward of the stored conv gives.
// positions [batch, seq] int32, nullable (one document): packed documents, as the CPU kernel's
// (tap j reads nothing where its lag (width-1) - j exceeds positions[b, t]).
Status causal_conv1d_forward(cudaStream_t stream, bf16* y, const bf16* x, const bf16* halo,
                             const bf16* w, const bf16* bias, int64_t batch, int64_t seq,
                             int64_t channels, int64_t width, bool silu = false,
                             const int32_t* positions = nullptr);
// dhalo nullable (not wanted). dw, dbias sum over batch and sequence in fp32 (fixed slabs). With
// `silu`, dy is the gradient of silu(conv): the kernel recomputes the conv from x, w, halo and
// bias (needed then) and takes dy through the SiLU as silu_backward would (rounded to bf16).
size_t causal_conv1d_backward_workspace_bytes(int64_t batch, int64_t seq, int64_t channels,
                                              int64_t width);
Status causal_conv1d_backward(cudaStream_t stream, bf16* dx, bf16* dhalo, bf16* dw, bf16* dbias,
                              const bf16* dy, const bf16* x, const bf16* halo, const bf16* w,
                              const bf16* bias, int64_t batch, int64_t seq, int64_t channels,
                              int64_t width, bool silu, Workspace workspace,
                              const int32_t* positions = nullptr);

// ---------------------------------------------------------------------------------------------
// A Mamba segment's total log-decay (SsdLogDecay.cu), for state passing between sequence shards.
// All fp32: dt [batch, seq, heads], A [heads], g and dg [batch, heads], ddt as dt, dA as A.
// g[b,h] = sum_t dt[b,t,h] * A[h]; backward ddt[b,t,h] = dg[b,h] * A[h] and
// dA[h] = sum_{b,t} dg[b,h] * dt[b,t,h]. Products and sums in double (as the CPU's), in a fixed
// order; the workspace holds per-slab double partials. batch <= 65535, seq <= 65535 * 1024.
// positions [batch, seq] nullable: packed documents; g is -infinity for a row whose last token's
// document starts in the segment (no state passes through it; its gradient is then zero).
size_t ssd_log_decay_workspace_bytes(int64_t batch, int64_t seq, int64_t heads);
Status ssd_log_decay_forward(cudaStream_t stream, float* g, const float* dt, const float* A,
                             int64_t batch, int64_t seq, int64_t heads, Workspace workspace,
                             const int32_t* positions = nullptr);
Status ssd_log_decay_backward(cudaStream_t stream, float* ddt, float* dA, const float* dg,
                              const float* dt, const float* A, int64_t batch, int64_t seq,
                              int64_t heads, Workspace workspace);

// ---------------------------------------------------------------------------------------------
// Mixture of experts (Moe.cu).
// Routing: top-k of the raw logits [tokens, experts] (descending, ties to the lower expert),
// softmax over the k selected. T = float or bf16 logits; gates fp32 [tokens, k]; indices
// [tokens, k]. experts <= 256, k <= 16.
template <typename T>
Status moe_route_forward(cudaStream_t stream, float* gates, int32_t* indices, const T* logits,
                         int64_t tokens, int64_t experts, int64_t k);
// dlogits [tokens, experts] (type T): softmax backward on the selected entries, zero elsewhere.
template <typename T>
Status moe_route_backward(cudaStream_t stream, T* dlogits, const float* dgates, const float* gates,
                          const int32_t* indices, int64_t tokens, int64_t experts, int64_t k);
// The MoE load-balancing loss (RouterLoad.cu; the CPU oracle's router_load_* and
// router_aux_loss_*). probs, picks [experts] fp32: one layer's summed softmax(logits[t]) and count
// of top-k picks per expert; logits [tokens, experts] (T = float or bf16); experts <= 256. The
// sums run in a fixed order (the same bits on every run).
size_t router_load_forward_workspace_bytes(int64_t tokens, int64_t experts);
template <typename T>
Status router_load_forward(cudaStream_t stream, float* probs, float* picks, const T* logits,
                           const int32_t* indices, int64_t tokens, int64_t experts, int64_t k,
                           Workspace workspace);
// dlogits [tokens, experts] = s * (dprobs - sum_e s_e dprobs_e), s = softmax(logits[t]).
template <typename T>
Status router_load_backward(cudaStream_t stream, T* dlogits, const float* dprobs, const T* logits,
                            int64_t tokens, int64_t experts);
// loss[0] = scale * sum_e probs[e] picks[e]; dprobs[e] = dloss[0] * scale * picks[e].
Status router_aux_loss_forward(cudaStream_t stream, float* loss, const float* probs,
                               const float* picks, int64_t experts, float scale);
Status router_aux_loss_backward(cudaStream_t stream, float* dprobs, const float* dloss,
                                const float* picks, int64_t experts, float scale);
// Experts: out[t] = sum_j gates[t, j] * W_out[e] (silu(a) * b), [a | b] = W_in[e] x[t],
// e = indices[t, j]. x, out [tokens, hidden]; w_in [E, 2*inner, hidden]; w_out [E, hidden, inner].
// The (token, slot) pairs are sorted by expert (stably), gathered, and each expert runs two
// cuBLASLt GEMMs on its rows; the products and SwiGLU are rounded to bf16 between the GEMMs (as
// a bf16 model does); the gate-weighted sum over a token's slots is fp32 in slot order.
// Slots whose index is outside [0, experts) contribute nothing (and get dgates 0).
// The experts run over the tokens in chunks of at most `token_chunk` tokens, one after another,
// each with its own sort, layout and GEMMs: the workspace holds one chunk's rows, however long
// the sequence (the weight gradients sum the chunks in fp32 and are rounded once). A call of
// one chunk is the whole computation at once.
// cuBLASLt takes the GEMMs' row counts on the host. A caller that has the routing there passes
// it (ExpertRoutingOnHost) and the call returns without waiting; for a chunk it cannot count
// from that, the call copies the chunk's counts down and waits for the stream.
// kept_h (nullable) [tokens, k, 2*inner]: the forward also stores each routed slot's h = [a | b]
// there, and the backward given it skips recomputing h (the same results bit for bit; rows of
// slots without an expert are neither written nor read).
// dout_scale (the backward): dout is read as dout_scale * dout, rounded once as it is gathered
// (a scale of the experts' output gradient folded in: the same values as scaling dout first).
inline constexpr int64_t kExpertTokenChunk = 16384;
struct ExpertRoutingOnHost {
  const int32_t* indices = nullptr;        // [tokens, k], the same as `indices`: every chunk
  const int64_t* expert_counts = nullptr;  // [experts], the whole call's: a call of one chunk
};
size_t moe_experts_forward_workspace_bytes(int64_t tokens, int64_t hidden, int64_t inner,
                                           int64_t experts, int64_t k,
                                           int64_t token_chunk = kExpertTokenChunk);
Status moe_experts_forward(GemmContext* ctx, cudaStream_t stream, bf16* out, const bf16* x,
                           const float* gates, const int32_t* indices, const bf16* w_in,
                           const bf16* w_out, int64_t tokens, int64_t hidden, int64_t inner,
                           int64_t experts, int64_t k, Workspace workspace,
                           ExpertRoutingOnHost on_host = {},
                           int64_t token_chunk = kExpertTokenChunk, bf16* kept_h = nullptr);
// Recomputes the expert activations, h too unless kept_h is given. dw_in, dw_out are every
// expert's full gradient (zero for an expert no token reached).
size_t moe_experts_backward_workspace_bytes(int64_t tokens, int64_t hidden, int64_t inner,
                                            int64_t experts, int64_t k,
                                            int64_t token_chunk = kExpertTokenChunk);
Status moe_experts_backward(GemmContext* ctx, cudaStream_t stream, bf16* dx, float* dgates,
                            bf16* dw_in, bf16* dw_out, const bf16* dout, const bf16* x,
                            const float* gates, const int32_t* indices, const bf16* w_in,
                            const bf16* w_out, int64_t tokens, int64_t hidden, int64_t inner,
                            int64_t experts, int64_t k, Workspace workspace,
                            ExpertRoutingOnHost on_host = {},
                            int64_t token_chunk = kExpertTokenChunk, const bf16* kept_h = nullptr,
                            float dout_scale = 1.f);

// The pieces of expert parallelism's exchange (the CUDA backend's moe_experts_ep), which runs
// the experts above on rows that other GPUs send: the same gather and combine they use inside.
// rows[p] = x[slot_of_row[p] / k] for p < count (x [tokens, hidden], rows [count, hidden]).
Status moe_gather_rows(cudaStream_t stream, bf16* rows, const bf16* x, const int32_t* slot_of_row,
                       int64_t count, int64_t hidden, int64_t k);
// out[t] = sum_j w_j rows[row_of_slot[t*k + j]], w_j = gates[t*k + j] (1 with gates null), fp32
// in slot order, rounded once; a slot whose row is -1 contributes nothing.
Status moe_combine_rows(cudaStream_t stream, bf16* out, const bf16* rows, const float* gates,
                        const int32_t* row_of_slot, int64_t tokens, int64_t hidden, int64_t k);
// Expert parallelism's token routes (comm::TokenRoutes has their counts) for the slots' global
// expert ids slot_experts [tokens, k], `experts` split over `ep` ranks, E/ep each. A token goes
// once to each rank owning one of its experts; the sent rows are ordered by owner rank, then
// token, `sent` of them (at most tokens * ep):
//   row_token [sent]       each row's token;
//   row_slot [sent, k]     row r's slot j: row_token[r] * k + j;
//   row_experts [sent, k]  that slot's expert counted from the row's owner's first, -1 where
//                          another rank (or no rank: an id outside [0, experts)) owns it;
//   token_row [tokens, ep] the row token t sent to rank p, or -1;
//   slot_row [tokens, k]   slot (t, j) as row * k + j of the row that went to its expert's
//                          owner, -1 for an id outside [0, experts).
// ep <= 16, k <= 16.
Status moe_token_routes(cudaStream_t stream, int32_t* row_token, int32_t* row_slot,
                        int32_t* row_experts, int32_t* token_row, int32_t* slot_row,
                        const int32_t* slot_experts, int64_t tokens, int64_t k, int64_t experts,
                        int64_t ep);
// out[i] = in[index[i]], or 0 where index[i] = -1, for i < n.
Status moe_gather_values(cudaStream_t stream, float* out, const float* in, const int32_t* index,
                         int64_t n);

// ---------------------------------------------------------------------------------------------
// Cross-entropy with an ignore index (CrossEntropy.cu).
// On given logits [tokens, vocab] (T = float or bf16): loss_sum [1] = sum over valid rows of
// lse - logit[target] (summed in double, row order), valid_count [1], lse [tokens] (every row).
// A bad target makes its row's loss NaN and is reported through bad_position.
size_t cross_entropy_forward_workspace_bytes(int64_t tokens);
template <typename T>
Status cross_entropy_forward(cudaStream_t stream, float* loss_sum, float* valid_count, float* lse,
                             const T* logits, const int32_t* targets, int64_t tokens, int64_t vocab,
                             int64_t ignore_index, int32_t* bad_position, Workspace workspace);
// dlogits = dloss_sum[0] * (softmax(logits) - onehot(target)); zero rows for ignored targets.
template <typename T>
Status cross_entropy_backward(cudaStream_t stream, T* dlogits, const float* dloss_sum,
                              const T* logits, const float* lse, const int32_t* targets,
                              int64_t tokens, int64_t vocab, int64_t ignore_index);

// The vocabulary projection fused with the cross-entropy, chunk by chunk so that the logits of
// the whole sequence never exist: logits = hidden [tokens, hid] @ table [vocab, hid]^T /
// logits_scaling, computed for chunk_tokens rows at a time into a bf16 buffer (as a bf16 model's
// logits are), then the cross-entropy above on that chunk. Same outputs as the forward above.
size_t lm_head_cross_entropy_forward_workspace_bytes(int64_t tokens, int64_t vocab,
                                                     int64_t chunk_tokens);
Status lm_head_cross_entropy_forward(GemmContext* ctx, cudaStream_t stream, float* loss_sum,
                                     float* valid_count, float* lse, const bf16* hidden,
                                     const bf16* table, const int32_t* targets, int64_t tokens,
                                     int64_t vocab, int64_t hid, float logits_scaling,
                                     int64_t ignore_index, int64_t chunk_tokens,
                                     int32_t* bad_position, Workspace workspace);
// Recomputes each chunk's logits, turns them in place into dlogits (with lse from the forward,
// and 1/logits_scaling folded in), then dhidden[chunk] = dlogits @ table and dtable +=
// dlogits^T @ hidden[chunk]; dtable accumulates over chunks in an fp32 workspace buffer
// [vocab, hid] and is rounded to bf16 once at the end.
size_t lm_head_cross_entropy_backward_workspace_bytes(int64_t tokens, int64_t vocab, int64_t hid,
                                                      int64_t chunk_tokens);
Status lm_head_cross_entropy_backward(GemmContext* ctx, cudaStream_t stream, bf16* dhidden,
                                      bf16* dtable, const float* dloss_sum, const bf16* hidden,
                                      const bf16* table, const int32_t* targets, const float* lse,
                                      int64_t tokens, int64_t vocab, int64_t hid,
                                      float logits_scaling, int64_t ignore_index,
                                      int64_t chunk_tokens, Workspace workspace);

// ---------------------------------------------------------------------------------------------
// Optimizer (AdamW.cu): hcp::train::AdamWKernel on the GPU, element for element the same fp32
// operations (no fused multiply-adds), so the results are bit-identical to the CPU's.
// master, m, v: fp32 [n]; grad: fp32 or bf16 (G); param: the bf16 compute copy written back
// from the updated master (nullable: not wanted).
struct AdamWStep {
  double lr = 0;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  double clip_coef = 1;
  int64_t t = 1;  // 1-based update number
  bool decay = true;
};
template <typename G>
Status adamw_update(cudaStream_t stream, float* master, bf16* param, const G* grad, float* m,
                    float* v, int64_t n, const AdamWStep& step);
// Every parameter's update in one launch (the optimizer step): each tensor's elements exactly as
// adamw_update's, the tensors cut into chunks of kAdamWChunk elements, a block each. `decay`
// per tensor (AdamWStep::decay is not read). The workspace holds the tensors' table
// (adamw_update_many_workspace_bytes of the same sizes).
inline constexpr int64_t kAdamWChunk = 65536;
struct AdamWTensor {
  float* master = nullptr;
  bf16* param = nullptr;  // nullable
  const void* grad = nullptr;
  bool grad_is_bf16 = true;  // else fp32
  float* m = nullptr;
  float* v = nullptr;
  int64_t n = 0;
  bool decay = true;
};
size_t adamw_update_many_workspace_bytes(std::span<const int64_t> sizes);
Status adamw_update_many(cudaStream_t stream, std::span<const AdamWTensor> tensors,
                         const AdamWStep& step, Workspace workspace);
// *out (device double) = sum of x^2, for the global gradient norm; fp32 squares per thread,
// double across threads and blocks, fixed order.
size_t sum_of_squares_workspace_bytes(int64_t n);
template <typename T>
Status sum_of_squares(cudaStream_t stream, double* out, const T* x, int64_t n, Workspace workspace);
// Every gradient's sum of squares in two launches: out[i] (device doubles) for tensor i, its
// chunks of kAdamWChunk elements summed by a block each, then in order.
struct SquaresTensor {
  const void* x = nullptr;
  bool is_bf16 = true;  // else fp32
  int64_t n = 0;
};
size_t sum_of_squares_many_workspace_bytes(std::span<const int64_t> sizes);
Status sum_of_squares_many(cudaStream_t stream, double* out, std::span<const SquaresTensor> tensors,
                           Workspace workspace);

}  // namespace hcp::cuda
