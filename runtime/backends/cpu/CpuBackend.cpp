#include "runtime/backends/cpu/CpuBackend.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "runtime/backends/cpu/DistKernels.h"
#include "runtime/kernels/cpu/Kernels.h"

namespace hcp::cpu {
namespace {

using plan::KernelId;

// A step's arguments as the kernels take them: typed pointers into the arenas and scalars.
class Args {
 public:
  Args(const plan::Plan& plan, const plan::Step& step, const ArenaBases& arenas,
       comm::Communicator& comm, Threads threads)
      : plan_(plan), step_(step), arenas_(arenas), comm_(comm), threads_(threads) {}

  const float* in(int i) const { return reinterpret_cast<const float*>(Address(step_.ins[i])); }
  const int32_t* in_i32(int i) const {
    return reinterpret_cast<const int32_t*>(Address(step_.ins[i]));
  }
  float* out(int i) const { return reinterpret_cast<float*>(Address(step_.outs[i])); }
  int32_t* out_i32(int i) const { return reinterpret_cast<int32_t*>(Address(step_.outs[i])); }
  int64_t i(int k) const { return step_.ints[k]; }
  float f(int k) const { return static_cast<float>(step_.floats[k]); }
  // For the collectives: the ranks, and how the sequence is laid out over them.
  comm::Communicator& comm() const { return comm_; }
  const plan::Mesh& mesh() const { return plan_.mesh; }
  // What the kernels may split their work over.
  Threads threads() const { return threads_; }

 private:
  std::byte* Address(uint32_t buffer) const {
    const plan::Buffer& b = plan_.buffers[buffer];
    return arenas_[static_cast<int>(b.arena)] + b.offset;
  }

  const plan::Plan& plan_;
  const plan::Step& step_;
  const ArenaBases& arenas_;
  comm::Communicator& comm_;
  Threads threads_;
};

// Expert indices are data (a plan may route them through any i32 buffer), so they are checked
// before a kernel uses them to address weights.
absl::Status CheckExpertIndices(const int32_t* indices, int64_t count, int64_t experts) {
  for (int64_t i = 0; i < count; ++i) {
    if (indices[i] < 0 || indices[i] >= experts) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "expert index %d at position %d is outside [0, %d)", indices[i], i, experts));
    }
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// The wrappers, in KernelTable.def's order. Argument comments follow the table.

// gemm's and gemm_add's ints (trans_a, trans_b, m, n, k); dense operands: the row stride is the
// stored matrix's column count.
struct GemmShape {
  bool trans_a, trans_b;
  int64_t m, n, k;
  explicit GemmShape(const Args& a)
      : trans_a(a.i(0) != 0), trans_b(a.i(1) != 0), m(a.i(2)), n(a.i(3)), k(a.i(4)) {}
  // out = alpha op(a) op(b) + beta out.
  void Run(const Args& a, float beta, float* out) const {
    gemm<float>(trans_a, trans_b, m, n, k, a.f(0), a.in(0), trans_a ? m : k, a.in(1),
                trans_b ? k : n, beta, out, n, a.threads());
  }
};

// ins: a, b. outs: c. ints: trans_a, trans_b, m, n, k. floats: alpha.
absl::Status RunGemm(const Args& a) {
  GemmShape(a).Run(a, 0.0f, a.out(0));
  return absl::OkStatus();
}

// ins: a, b, c. outs: out. ints, floats: gemm's. out = c, then the product added in (beta 1).
absl::Status RunGemmAdd(const Args& a) {
  const GemmShape g(a);
  if (a.out(0) != a.in(2)) std::copy_n(a.in(2), g.m * g.n, a.out(0));
  g.Run(a, 1.0f, a.out(0));
  return absl::OkStatus();
}

// ins: table, ids. outs: out. ints: tokens, vocab, hidden. floats: multiplier.
absl::Status RunEmbeddingForward(const Args& a) {
  return embedding_forward<float>(a.out(0), a.in_i32(1), a.in(0), a.i(0), a.i(1), a.i(2), a.f(0));
}

// ins: dout, ids. outs: dtable. ints: tokens, vocab, hidden, padding_idx. floats: multiplier.
absl::Status RunEmbeddingBackward(const Args& a) {
  embedding_backward<float>(a.out(0), a.in(0), a.in_i32(1), a.i(0), a.i(1), a.i(2), a.f(0), a.i(3));
  return absl::OkStatus();
}

// ins: x, w. outs: y. ints: rows, dim. floats: eps.
absl::Status RunRmsNormForward(const Args& a) {
  std::vector<float> rstd(a.i(0));  // not kept: the backward recomputes it
  rms_norm_forward<float>(a.out(0), rstd.data(), a.in(0), a.in(1), a.i(0), a.i(1), a.f(0));
  return absl::OkStatus();
}

// ins: dy, x, w. outs: dx, dw. ints: rows, dim. floats: eps.
absl::Status RunRmsNormBackward(const Args& a) {
  const int64_t rows = a.i(0), dim = a.i(1);
  // Recompute rstd with the forward kernel itself, so it is bit-identical to the forward's.
  std::vector<float> y(rows * dim), rstd(rows);
  rms_norm_forward<float>(y.data(), rstd.data(), a.in(1), a.in(2), rows, dim, a.f(0));
  rms_norm_backward<float>(a.out(0), a.out(1), a.in(0), a.in(1), a.in(2), rstd.data(), rows, dim);
  return absl::OkStatus();
}

// ins: y, z, w. outs: out. ints: rows, dim. floats: eps.
absl::Status RunGatedRmsNormForward(const Args& a) {
  std::vector<float> rstd(a.i(0));
  gated_rms_norm_forward<float>(a.out(0), rstd.data(), a.in(0), a.in(1), a.in(2), a.i(0), a.i(1),
                                a.f(0));
  return absl::OkStatus();
}

// ins: dout, y, z, w. outs: dy, dz, dw. ints: rows, dim. floats: eps.
absl::Status RunGatedRmsNormBackward(const Args& a) {
  const int64_t rows = a.i(0), dim = a.i(1);
  std::vector<float> out(rows * dim), rstd(rows);
  gated_rms_norm_forward<float>(out.data(), rstd.data(), a.in(1), a.in(2), a.in(3), rows, dim,
                                a.f(0));
  gated_rms_norm_backward<float>(a.out(0), a.out(1), a.out(2), a.in(0), a.in(1), a.in(2), a.in(3),
                                 rstd.data(), rows, dim);
  return absl::OkStatus();
}

// Elementwise. ints: n. Backward ins: dy, then x (silu, softplus) or y (neg_exp).
absl::Status RunSiluForward(const Args& a) {
  silu_forward<float>(a.out(0), a.in(0), a.i(0));
  return absl::OkStatus();
}
absl::Status RunSiluBackward(const Args& a) {
  silu_backward<float>(a.out(0), a.in(0), a.in(1), a.i(0));
  return absl::OkStatus();
}
absl::Status RunSoftplusForward(const Args& a) {
  softplus_forward<float>(a.out(0), a.in(0), a.i(0));
  return absl::OkStatus();
}
absl::Status RunSoftplusBackward(const Args& a) {
  softplus_backward<float>(a.out(0), a.in(0), a.in(1), a.i(0));
  return absl::OkStatus();
}
absl::Status RunNegExpForward(const Args& a) {
  neg_exp_forward<float>(a.out(0), a.in(0), a.i(0));
  return absl::OkStatus();
}
absl::Status RunNegExpBackward(const Args& a) {
  neg_exp_backward<float>(a.out(0), a.in(0), a.in(1), a.i(0));
  return absl::OkStatus();
}

// ins: x [rows, 2*inner]. outs: y [rows, inner]. ints: rows, inner.
absl::Status RunSwigluForward(const Args& a) {
  swiglu_forward<float>(a.out(0), a.in(0), a.i(0), a.i(1));
  return absl::OkStatus();
}
// ins: dy, x. outs: dx. ints: rows, inner.
absl::Status RunSwigluBackward(const Args& a) {
  swiglu_backward<float>(a.out(0), a.in(0), a.in(1), a.i(0), a.i(1));
  return absl::OkStatus();
}

// y = x * factor. ints: n. floats: factor.
absl::Status RunScale(const Args& a) {
  scale<float>(a.out(0), a.in(0), a.f(0), a.i(0));
  return absl::OkStatus();
}

// y[i] = a[i] op b[i % rhs_n]. ints: n, rhs_n.
absl::Status RunAdd(const Args& a) {
  // The reference bias add is exactly this broadcast, viewed as [n / rhs_n, rhs_n].
  bias_add_forward<float>(a.out(0), a.in(0), a.in(1), a.i(0) / a.i(1), a.i(1));
  return absl::OkStatus();
}
// Multiply and divide have no reference kernel of their own: a plain loop is the reference.
absl::Status RunMul(const Args& a) {
  const int64_t n = a.i(0), rhs_n = a.i(1);
  const float *x = a.in(0), *b = a.in(1);
  float* y = a.out(0);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * b[i % rhs_n];
  return absl::OkStatus();
}
absl::Status RunDiv(const Args& a) {
  const int64_t n = a.i(0), rhs_n = a.i(1);
  const float *x = a.in(0), *b = a.in(1);
  float* y = a.out(0);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] / b[i % rhs_n];
  return absl::OkStatus();
}

// y[c] = sum_r x[r, c]. ints: rows, cols.
absl::Status RunSumLeading(const Args& a) {
  column_sum<float>(a.out(0), a.in(0), a.i(0), a.i(1));
  return absl::OkStatus();
}

// ints: n. floats: value.
absl::Status RunFill(const Args& a) {
  std::fill(a.out(0), a.out(0) + a.i(0), a.f(0));
  return absl::OkStatus();
}

// out[r, :] = in[r, offset : offset + width]. ints: rows, in_cols, offset, width.
absl::Status RunSliceColumns(const Args& a) {
  slice_columns<float>(a.out(0), a.in(0), a.i(0), a.i(1), a.i(2), a.i(3));
  return absl::OkStatus();
}

// out[r, offset : offset + width] = in[r, :]. ints: rows, out_cols, offset, width.
absl::Status RunInsertColumns(const Args& a) {
  slice_columns_backward<float>(a.out(0), a.in(0), a.i(0), a.i(1), a.i(2), a.i(3));
  return absl::OkStatus();
}

// ints: n.
absl::Status RunCopy(const Args& a) {
  std::copy(a.in(0), a.in(0) + a.i(0), a.out(0));
  return absl::OkStatus();
}

// ins: x. outs: y. ints: n. CPU plans are f32 throughout (CpuExecutor refuses others): a copy.
absl::Status RunCast(const Args& a) { return RunCopy(a); }

// ins: x, w, bias[, halo]. outs: y. ints: batch, seq, channels, width, has_halo, silu. Without a
// halo every sequence starts at position 0 (zeros before it). With silu, y = silu(conv): the
// two kernels one after the other, so the same values as the separate silu.forward step.
absl::Status RunCausalConv1dForward(const Args& a) {
  const float* halo = a.i(4) != 0 ? a.in(3) : nullptr;
  causal_conv1d_forward<float>(a.out(0), a.in(0), halo, a.in(1), a.in(2), a.i(0), a.i(1), a.i(2),
                               a.i(3));
  if (a.i(5) != 0) silu_forward<float>(a.out(0), a.out(0), a.i(0) * a.i(1) * a.i(2));
  return absl::OkStatus();
}
// ins: dy, x, w[, halo][, bias]. outs: dx, dw, dbias[, dhalo]. With silu, dy is the gradient
// of silu's output: the conv's output is recomputed and silu.backward taken first (the same
// values as the separate steps).
absl::Status RunCausalConv1dBackward(const Args& a) {
  const bool has_halo = a.i(4) != 0, silu = a.i(5) != 0;
  const float* halo = has_halo ? a.in(3) : nullptr;
  const float* dy = a.in(0);
  std::vector<float> dconv;
  if (silu) {
    const int64_t n = a.i(0) * a.i(1) * a.i(2);
    std::vector<float> conv(n);
    causal_conv1d_forward<float>(conv.data(), a.in(1), halo, a.in(2), a.in(3 + has_halo), a.i(0),
                                 a.i(1), a.i(2), a.i(3));
    dconv.resize(n);
    silu_backward<float>(dconv.data(), dy, conv.data(), n);
    dy = dconv.data();
  }
  causal_conv1d_backward<float>(a.out(0), has_halo ? a.out(3) : nullptr, a.out(1), a.out(2), dy,
                                a.in(1), halo, a.in(2), a.i(0), a.i(1), a.i(2), a.i(3));
  return absl::OkStatus();
}

// ints: batch, seq, heads, head_dim, groups, state, then for the scan's kernels (`chunked`)
// chunk[, has_init[, has_dfinal]]; ssd_add_initial_state is not chunked and has no chunk.
SsdShape SsdShapeOf(const Args& a, bool chunked = true) {
  // A chunk longer than the sequence is one chunk either way; capping it keeps the kernels'
  // per-chunk scratch sized by the data rather than by the number in the plan.
  return SsdShape{.batch = a.i(0),
                  .seq = a.i(1),
                  .heads = a.i(2),
                  .head_dim = a.i(3),
                  .groups = a.i(4),
                  .state = a.i(5),
                  .chunk = chunked ? std::min(a.i(6), a.i(1)) : a.i(1)};
}

// ins: x, dt, A, B, C, D[, init_state]. outs: y, final_state.
absl::Status RunSsdScanForward(const Args& a) {
  const bool has_init = a.i(7) != 0;
  ssd_scan_forward<float>(a.out(0), a.out(1), a.in(0), a.in(1), a.in(2), a.in(3), a.in(4), a.in(5),
                          has_init ? a.in(6) : nullptr, SsdShapeOf(a), a.threads());
  return absl::OkStatus();
}

// ins: dy, x, dt, A, B, C, D[, init_state][, dfinal_state].
// outs: dx, ddt, dA, dB, dC, dD[, dinit_state].
absl::Status RunSsdScanBackward(const Args& a) {
  const bool has_init = a.i(7) != 0, has_dfinal = a.i(8) != 0;
  const float* init_state = has_init ? a.in(7) : nullptr;
  const float* dfinal_state = has_dfinal ? a.in(has_init ? 8 : 7) : nullptr;
  float* dinit_state = has_init ? a.out(6) : nullptr;
  ssd_scan_backward<float>(a.out(0), a.out(1), a.out(2), a.out(3), a.out(4), a.out(5), dinit_state,
                           a.in(0), dfinal_state, a.in(1), a.in(2), a.in(3), a.in(4), a.in(5),
                           a.in(6), init_state, SsdShapeOf(a), a.threads());
  return absl::OkStatus();
}

// ins: x, dt, A, B. outs: final_state. ints: batch, seq, heads, head_dim, groups, state, chunk.
absl::Status RunSsdFinalStateForward(const Args& a) {
  ssd_final_state_forward<float>(a.out(0), a.in(0), a.in(1), a.in(2), a.in(3), SsdShapeOf(a),
                                 a.threads());
  return absl::OkStatus();
}

// ins: dfinal_state, x, dt, A, B. outs: dx, ddt, dA, dB.
absl::Status RunSsdFinalStateBackward(const Args& a) {
  ssd_final_state_backward<float>(a.out(0), a.out(1), a.out(2), a.out(3), a.in(0), a.in(1), a.in(2),
                                  a.in(3), a.in(4), SsdShapeOf(a), a.threads());
  return absl::OkStatus();
}

// ins: dt, A. outs: g. ints: batch, seq, heads.
absl::Status RunSsdLogDecayForward(const Args& a) {
  ssd_log_decay<float>(a.out(0), a.in(0), a.in(1), a.i(0), a.i(1), a.i(2));
  return absl::OkStatus();
}
// ins: dg, dt, A. outs: ddt, dA. ints: batch, seq, heads.
absl::Status RunSsdLogDecayBackward(const Args& a) {
  ssd_log_decay_backward<float>(a.out(0), a.out(1), a.in(0), a.in(1), a.in(2), a.i(0), a.i(1),
                                a.i(2));
  return absl::OkStatus();
}

// ins: y, dt, A, C, init_state. outs: out.
absl::Status RunSsdAddInitialStateForward(const Args& a) {
  ssd_add_initial_state_forward<float>(a.out(0), a.in(0), a.in(1), a.in(2), a.in(3), a.in(4),
                                       SsdShapeOf(a, /*chunked=*/false));
  return absl::OkStatus();
}
// ins: dout, dt, A, C, init_state. outs: ddt, dA, dC, dinit_state.
absl::Status RunSsdAddInitialStateBackward(const Args& a) {
  ssd_add_initial_state_backward<float>(a.out(0), a.out(1), a.out(2), a.out(3), a.in(0), a.in(1),
                                        a.in(2), a.in(3), a.in(4),
                                        SsdShapeOf(a, /*chunked=*/false));
  return absl::OkStatus();
}

// ints: batch, seq, q_heads, kv_heads, head_dim, causal. floats: scale. For attention.forward
// and .backward queries and keys are the same positions, so both start at 0; ring attention
// takes the positions of each piece from the mesh.
AttentionShape AttentionShapeOf(const Args& a) {
  return AttentionShape{.batch = a.i(0),
                        .q_len = a.i(1),
                        .kv_len = a.i(1),
                        .q_heads = a.i(2),
                        .kv_heads = a.i(3),
                        .head_dim = a.i(4)};
}

// ins: q, k, v. outs: out, lse.
absl::Status RunAttentionForward(const Args& a) {
  attention_forward<float>(a.out(0), a.out(1), a.in(0), a.in(1), a.in(2), AttentionShapeOf(a),
                           a.f(0), a.i(5) != 0, /*q_pos0=*/0, /*k_pos0=*/0);
  return absl::OkStatus();
}

// ins: dout, q, k, v, out, lse. outs: dq, dk, dv.
absl::Status RunAttentionBackward(const Args& a) {
  attention_backward<float>(a.out(0), a.out(1), a.out(2), a.in(0), a.in(1), a.in(2), a.in(3),
                            a.in(4), a.in(5), AttentionShapeOf(a), a.f(0), a.i(5) != 0,
                            /*q_pos0=*/0, /*k_pos0=*/0);
  return absl::OkStatus();
}

// ins: logits. outs: gates, experts (i32). ints: tokens, experts, k.
absl::Status RunMoeRouteForward(const Args& a) {
  topk_softmax_forward<float>(a.out(0), a.out_i32(1), a.in(0), a.i(0), a.i(1), a.i(2));
  return absl::OkStatus();
}

// ins: dgates, gates, experts (i32). outs: dlogits. ints: tokens, experts, k.
absl::Status RunMoeRouteBackward(const Args& a) {
  const int64_t tokens = a.i(0), experts = a.i(1), k = a.i(2);
  if (absl::Status s = CheckExpertIndices(a.in_i32(2), tokens * k, experts); !s.ok()) return s;
  topk_softmax_backward<float>(a.out(0), a.in(0), a.in(1), a.in_i32(2), tokens, experts, k);
  return absl::OkStatus();
}

// ins: x, gates, experts (i32), w_in, w_out. outs: out [, kept_h]. ints: tokens, hidden, inner,
// experts, k, keep_h.
absl::Status RunMoeExpertsForward(const Args& a) {
  const int64_t tokens = a.i(0), experts = a.i(3), k = a.i(4);
  if (absl::Status s = CheckExpertIndices(a.in_i32(2), tokens * k, experts); !s.ok()) return s;
  moe_experts_forward<float>(a.out(0), a.in(0), a.in(1), a.in_i32(2), a.in(3), a.in(4), tokens,
                             a.i(1), a.i(2), experts, k, a.threads(),
                             a.i(5) == 1 ? a.out(1) : nullptr);
  return absl::OkStatus();
}

// ins: dout, x, gates, experts (i32), w_in, w_out [, kept_h]. outs: dx, dgates, dw_in, dw_out.
absl::Status RunMoeExpertsBackward(const Args& a) {
  const int64_t tokens = a.i(0), experts = a.i(3), k = a.i(4);
  if (absl::Status s = CheckExpertIndices(a.in_i32(3), tokens * k, experts); !s.ok()) return s;
  moe_experts_backward<float>(a.out(0), a.out(1), a.out(2), a.out(3), a.in(0), a.in(1), a.in(2),
                              a.in_i32(3), a.in(4), a.in(5), tokens, a.i(1), a.i(2), experts, k,
                              a.threads(), a.i(5) == 1 ? a.in(6) : nullptr);
  return absl::OkStatus();
}

// ins: logits, targets (i32). outs: loss_sum, valid_count. ints: tokens, vocab, ignore_index.
absl::Status RunCrossEntropyForward(const Args& a) {
  std::vector<float> lse(a.i(0));  // not kept: the backward recomputes it
  return cross_entropy_forward<float>(a.out(0), a.out(1), lse.data(), a.in(0), a.in_i32(1), a.i(0),
                                      a.i(1), a.i(2));
}

// ins: dloss_sum, logits, targets (i32). outs: dlogits. ints: tokens, vocab, ignore_index.
absl::Status RunCrossEntropyBackward(const Args& a) {
  const int64_t tokens = a.i(0), vocab = a.i(1), ignore_index = a.i(2);
  // Recompute lse with the forward kernel (which also checks the targets again).
  float loss_sum = 0, valid_count = 0;
  std::vector<float> lse(tokens);
  if (absl::Status s = cross_entropy_forward<float>(&loss_sum, &valid_count, lse.data(), a.in(1),
                                                    a.in_i32(2), tokens, vocab, ignore_index);
      !s.ok()) {
    return s;
  }
  cross_entropy_backward<float>(a.out(0), a.in(0), a.in(1), lse.data(), a.in_i32(2), tokens, vocab,
                                ignore_index);
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Collectives (DistKernels.h): every rank of the group runs them.

// ins: x. outs: halo. ints: batch, segs, len, channels, width.
absl::Status RunHaloExchangeForward(const Args& a) {
  halo_exchange_forward(a.comm(), a.mesh(), a.out(0), a.in(0), a.i(0), a.i(1), a.i(2), a.i(3),
                        a.i(4));
  return absl::OkStatus();
}
// ins: dhalo. outs: dx. ints as the forward.
absl::Status RunHaloExchangeBackward(const Args& a) {
  halo_exchange_backward(a.comm(), a.mesh(), a.out(0), a.in(0), a.i(0), a.i(1), a.i(2), a.i(3),
                         a.i(4));
  return absl::OkStatus();
}

// ints: batch, segs, heads, head_dim, state, strategy.
StateScanShape StateScanShapeOf(const Args& a) {
  return StateScanShape{
      .batch = a.i(0), .segs = a.i(1), .heads = a.i(2), .head_dim = a.i(3), .state = a.i(4)};
}
// ins: g, s. outs: s_in.
absl::Status RunStateScanForward(const Args& a) {
  state_scan_forward(a.comm(), a.mesh(), a.out(0), a.in(0), a.in(1), StateScanShapeOf(a),
                     StateScanStrategy(a.i(5)));
  return absl::OkStatus();
}
// ins: ds_in, g, s_in. outs: dg, ds.
absl::Status RunStateScanBackward(const Args& a) {
  state_scan_backward(a.comm(), a.mesh(), a.out(0), a.out(1), a.in(0), a.in(1), a.in(2),
                      StateScanShapeOf(a), StateScanStrategy(a.i(5)));
  return absl::OkStatus();
}

// ins: q, k, v (local). outs: out, lse. ints: batch, seq (local), q_heads, kv_heads, head_dim,
// causal. floats: scale.
absl::Status RunRingAttentionForward(const Args& a) {
  ring_attention_forward(a.comm(), a.mesh(), a.out(0), a.out(1), a.in(0), a.in(1), a.in(2),
                         AttentionShapeOf(a), a.f(0), a.i(5) != 0);
  return absl::OkStatus();
}
// ins: dout, q, k, v, out, lse. outs: dq, dk, dv.
absl::Status RunRingAttentionBackward(const Args& a) {
  ring_attention_backward(a.comm(), a.mesh(), a.out(0), a.out(1), a.out(2), a.in(0), a.in(1),
                          a.in(2), a.in(3), a.in(4), a.in(5), AttentionShapeOf(a), a.f(0),
                          a.i(5) != 0);
  return absl::OkStatus();
}

// ins: x. outs: y. ints: n, group (0 world, 1 cp, 2 dp).
absl::Status RunAllReduce(const Args& a) {
  all_reduce(a.comm(), a.out(0), a.in(0), a.i(0), comm::Group(a.i(1)));
  return absl::OkStatus();
}

// ints: tokens, hidden, inner, experts (global), k, ep.
MoeShape MoeShapeOf(const Args& a) {
  return MoeShape{.tokens = a.i(0),
                  .hidden = a.i(1),
                  .inner = a.i(2),
                  .experts = a.i(3),
                  .k = a.i(4),
                  .ep = a.i(5)};
}
// ins: x, gates, experts (i32, global ids), w_in, w_out (this rank's experts). outs: out.
absl::Status RunMoeExpertsEpForward(const Args& a) {
  return moe_experts_ep_forward(a.comm(), a.out(0), a.in(0), a.in(1), a.in_i32(2), a.in(3), a.in(4),
                                MoeShapeOf(a));
}
// ins: dout, x, gates, experts (i32), w_in, w_out. outs: dx, dgates, dw_in, dw_out.
absl::Status RunMoeExpertsEpBackward(const Args& a) {
  return moe_experts_ep_backward(a.comm(), a.out(0), a.out(1), a.out(2), a.out(3), a.in(0), a.in(1),
                                 a.in(2), a.in_i32(3), a.in(4), a.in(5), MoeShapeOf(a));
}

}  // namespace

absl::Status RunCpuStep(const plan::Plan& plan, size_t step_index, const ArenaBases& arenas,
                        comm::Communicator& comm, Threads threads) {
  const plan::Step& step = plan.steps[step_index];
  const Args args(plan, step, arenas, comm, threads);
  absl::Status status;
  // One case per kernel of the table: a kernel added to KernelTable.txt without a wrapper here
  // fails to compile (RunX is not declared).
  switch (step.kernel) {
#define HCP_RUN_KERNEL(Id, name) \
  case KernelId::Id:             \
    status = Run##Id(args);      \
    break;
    HCP_FOR_EACH_KERNEL(HCP_RUN_KERNEL)
#undef HCP_RUN_KERNEL
  }
  if (!status.ok()) {
    return absl::Status(status.code(),
                        plan::StepLabel(plan, step_index) + ": " + std::string(status.message()));
  }
  return absl::OkStatus();
}

}  // namespace hcp::cpu
