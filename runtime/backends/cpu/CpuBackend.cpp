#include "runtime/backends/cpu/CpuBackend.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "runtime/backends/cpu/Collectives.h"
#include "runtime/kernels/cpu/Kernels.h"
#include "runtime/support/Status.h"

namespace hcp::cpu {
namespace {

using plan::KernelId;

// A buffer of a step as the CPU kernels take it: CPU plans are f32 (int32 for token and expert
// ids), which ValidatePlan and CpuExecutor have checked.
struct HostBuffer {
  std::byte* bytes = nullptr;
  float* f32() const { return reinterpret_cast<float*>(bytes); }
  int32_t* i32() const { return reinterpret_cast<int32_t*>(bytes); }
};

// What a wrapper has at hand: the step's arguments by name, and the ranks and threads.
class Args {
 public:
  Args(const plan::Plan& plan, const plan::Step& step, const ArenaBases& arenas,
       comm::Communicator& comm, Threads threads)
      : plan_(plan), step_(step), arenas_(arenas), comm_(comm), threads_(threads) {}

  // The step's arguments as its kernel's struct: Get<plan::RmsNormForwardArgs>().
  template <template <typename> class Kernel>
  Kernel<HostBuffer> Get() const {
    return plan::DecodeStep<Kernel>(step_, [this](uint32_t buffer) {
      const plan::Buffer& b = plan_.buffers[buffer];
      return HostBuffer{arenas_[static_cast<int>(b.arena)] + b.offset};
    });
  }
  // For the collectives: the ranks, and how the sequence is laid out over them.
  comm::Communicator& comm() const { return comm_; }
  const plan::Mesh& mesh() const { return plan_.mesh; }
  // What the kernels may split their work over.
  Threads threads() const { return threads_; }

 private:
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
// The wrappers, in KernelTable.txt's order: each reads its kernel's struct by name.

// gemm's and gemm_add's product; dense operands: the row stride is the stored matrix's column
// count. out = alpha op(a) op(b) + beta out.
template <typename Kernel>
void RunProduct(const Kernel& g, float beta, float* out, Threads threads) {
  gemm<float>(g.trans_a, g.trans_b, g.m, g.n, g.k, static_cast<float>(g.alpha), g.a.f32(),
              g.trans_a ? g.m : g.k, g.b.f32(), g.trans_b ? g.k : g.n, beta, out, g.n, threads);
}

absl::Status RunGemm(const Args& a) {
  const auto g = a.Get<plan::GemmArgs>();
  RunProduct(g, 0.0f, g.c.f32(), a.threads());
  return absl::OkStatus();
}

// out = c, then the product added in (times beta).
absl::Status RunGemmAdd(const Args& a) {
  const auto g = a.Get<plan::GemmAddArgs>();
  if (g.out.f32() != g.c.f32()) std::copy_n(g.c.f32(), g.m * g.n, g.out.f32());
  RunProduct(g, static_cast<float>(g.beta), g.out.f32(), a.threads());
  return absl::OkStatus();
}

absl::Status RunEmbeddingForward(const Args& a) {
  const auto k = a.Get<plan::EmbeddingForwardArgs>();
  return embedding_forward<float>(k.out.f32(), k.ids.i32(), k.table.f32(), k.tokens, k.vocab,
                                  k.hidden, static_cast<float>(k.multiplier));
}

absl::Status RunEmbeddingBackward(const Args& a) {
  const auto k = a.Get<plan::EmbeddingBackwardArgs>();
  embedding_backward<float>(k.dtable.f32(), k.dout.f32(), k.ids.i32(), k.tokens, k.vocab, k.hidden,
                            static_cast<float>(k.multiplier), k.padding_idx);
  return absl::OkStatus();
}

absl::Status RunRmsNormForward(const Args& a) {
  const auto k = a.Get<plan::RmsNormForwardArgs>();
  std::vector<float> rstd(k.rows);  // not kept: the backward recomputes it
  rms_norm_forward<float>(k.y.f32(), rstd.data(), k.x.f32(), k.w.f32(), k.rows, k.dim,
                          static_cast<float>(k.eps));
  return absl::OkStatus();
}

absl::Status RunRmsNormBackward(const Args& a) {
  const auto k = a.Get<plan::RmsNormBackwardArgs>();
  // Recompute rstd with the forward kernel itself, so it is bit-identical to the forward's.
  std::vector<float> y(k.rows * k.dim), rstd(k.rows);
  rms_norm_forward<float>(y.data(), rstd.data(), k.x.f32(), k.w.f32(), k.rows, k.dim,
                          static_cast<float>(k.eps));
  rms_norm_backward<float>(k.dx.f32(), k.dw.f32(), k.dy.f32(), k.x.f32(), k.w.f32(), rstd.data(),
                           k.rows, k.dim);
  // The residual stream's gradient, added as the `add` step it replaces would (the same f32
  // sums).
  if (k.has_residual) {
    float* dx = k.dx.f32();
    const float* dresidual = k.dresidual.f32();
    for (int64_t i = 0; i < k.rows * k.dim; ++i) dx[i] += dresidual[i];
  }
  return absl::OkStatus();
}

absl::Status RunGatedRmsNormForward(const Args& a) {
  const auto k = a.Get<plan::GatedRmsNormForwardArgs>();
  std::vector<float> rstd(k.rows);
  gated_rms_norm_forward<float>(k.out.f32(), rstd.data(), k.y.f32(), k.z.f32(), k.w.f32(), k.rows,
                                k.dim, static_cast<float>(k.eps));
  return absl::OkStatus();
}

absl::Status RunGatedRmsNormBackward(const Args& a) {
  const auto k = a.Get<plan::GatedRmsNormBackwardArgs>();
  std::vector<float> out(k.rows * k.dim), rstd(k.rows);
  gated_rms_norm_forward<float>(out.data(), rstd.data(), k.y.f32(), k.z.f32(), k.w.f32(), k.rows,
                                k.dim, static_cast<float>(k.eps));
  gated_rms_norm_backward<float>(k.dy.f32(), k.dz.f32(), k.dw.f32(), k.dout.f32(), k.y.f32(),
                                 k.z.f32(), k.w.f32(), rstd.data(), k.rows, k.dim);
  return absl::OkStatus();
}

absl::Status RunSiluForward(const Args& a) {
  const auto k = a.Get<plan::SiluForwardArgs>();
  silu_forward<float>(k.y.f32(), k.x.f32(), k.n);
  return absl::OkStatus();
}
absl::Status RunSiluBackward(const Args& a) {
  const auto k = a.Get<plan::SiluBackwardArgs>();
  silu_backward<float>(k.dx.f32(), k.dy.f32(), k.x.f32(), k.n);
  return absl::OkStatus();
}
absl::Status RunSoftplusForward(const Args& a) {
  const auto k = a.Get<plan::SoftplusForwardArgs>();
  softplus_forward<float>(k.y.f32(), k.x.f32(), k.n);
  return absl::OkStatus();
}
absl::Status RunSoftplusBackward(const Args& a) {
  const auto k = a.Get<plan::SoftplusBackwardArgs>();
  softplus_backward<float>(k.dx.f32(), k.dy.f32(), k.x.f32(), k.n);
  return absl::OkStatus();
}
absl::Status RunNegExpForward(const Args& a) {
  const auto k = a.Get<plan::NegExpForwardArgs>();
  neg_exp_forward<float>(k.y.f32(), k.x.f32(), k.n);
  return absl::OkStatus();
}
absl::Status RunNegExpBackward(const Args& a) {
  const auto k = a.Get<plan::NegExpBackwardArgs>();
  neg_exp_backward<float>(k.dx.f32(), k.dy.f32(), k.y.f32(), k.n);
  return absl::OkStatus();
}

absl::Status RunSwigluForward(const Args& a) {
  const auto k = a.Get<plan::SwigluForwardArgs>();
  swiglu_forward<float>(k.y.f32(), k.x.f32(), k.rows, k.inner);
  return absl::OkStatus();
}
absl::Status RunSwigluBackward(const Args& a) {
  const auto k = a.Get<plan::SwigluBackwardArgs>();
  swiglu_backward<float>(k.dx.f32(), k.dy.f32(), k.x.f32(), k.rows, k.inner);
  return absl::OkStatus();
}

absl::Status RunScale(const Args& a) {
  const auto k = a.Get<plan::ScaleArgs>();
  scale<float>(k.y.f32(), k.x.f32(), static_cast<float>(k.factor), k.n);
  return absl::OkStatus();
}

absl::Status RunAdd(const Args& a) {
  const auto k = a.Get<plan::AddArgs>();
  // The reference bias add is exactly this broadcast, viewed as [n / rhs_n, rhs_n].
  bias_add_forward<float>(k.y.f32(), k.a.f32(), k.b.f32(), k.n / k.rhs_n, k.rhs_n);
  return absl::OkStatus();
}
// Multiply and divide have no reference kernel of their own: a plain loop is the reference.
absl::Status RunMul(const Args& a) {
  const auto k = a.Get<plan::MulArgs>();
  const float *x = k.a.f32(), *b = k.b.f32();
  float* y = k.y.f32();
  for (int64_t i = 0; i < k.n; ++i) y[i] = x[i] * b[i % k.rhs_n];
  return absl::OkStatus();
}
absl::Status RunDiv(const Args& a) {
  const auto k = a.Get<plan::DivArgs>();
  const float *x = k.a.f32(), *b = k.b.f32();
  float* y = k.y.f32();
  for (int64_t i = 0; i < k.n; ++i) y[i] = x[i] / b[i % k.rhs_n];
  return absl::OkStatus();
}

absl::Status RunSumLeading(const Args& a) {
  const auto k = a.Get<plan::SumLeadingArgs>();
  column_sum<float>(k.y.f32(), k.x.f32(), k.rows, k.cols);
  return absl::OkStatus();
}

absl::Status RunFill(const Args& a) {
  const auto k = a.Get<plan::FillArgs>();
  std::fill(k.y.f32(), k.y.f32() + k.n, static_cast<float>(k.value));
  return absl::OkStatus();
}

absl::Status RunSliceColumns(const Args& a) {
  const auto k = a.Get<plan::SliceColumnsArgs>();
  slice_columns<float>(k.out.f32(), k.in.f32(), k.rows, k.in_cols, k.offset, k.width);
  return absl::OkStatus();
}

absl::Status RunInsertColumns(const Args& a) {
  const auto k = a.Get<plan::InsertColumnsArgs>();
  slice_columns_backward<float>(k.out.f32(), k.in.f32(), k.rows, k.out_cols, k.offset, k.width);
  return absl::OkStatus();
}

absl::Status RunCopy(const Args& a) {
  const auto k = a.Get<plan::CopyArgs>();
  std::copy(k.x.f32(), k.x.f32() + k.n, k.y.f32());
  return absl::OkStatus();
}

// CPU plans are f32 throughout (CpuExecutor refuses others): a copy.
absl::Status RunCast(const Args& a) {
  const auto k = a.Get<plan::CastArgs>();
  std::copy(k.x.f32(), k.x.f32() + k.n, k.y.f32());
  return absl::OkStatus();
}

// Without a halo every sequence starts at position 0 (zeros before it). With silu, y =
// silu(conv): the two kernels one after the other, so the same values as the separate
// silu.forward step.
// Packed documents: the step's positions (Kernels.h), or null for one document.
template <typename Kernel>
const int32_t* PositionsOf(const Kernel& k) {
  return k.documents ? k.positions.i32() : nullptr;
}

absl::Status RunCausalConv1dForward(const Args& a) {
  const auto k = a.Get<plan::CausalConv1dForwardArgs>();
  const float* halo = k.has_halo ? k.halo.f32() : nullptr;
  causal_conv1d_forward<float>(k.y.f32(), k.x.f32(), halo, k.w.f32(), k.bias.f32(), k.batch, k.seq,
                               k.channels, k.width, PositionsOf(k));
  if (k.silu) silu_forward<float>(k.y.f32(), k.y.f32(), k.batch * k.seq * k.channels);
  return absl::OkStatus();
}
// With silu, dy is the gradient of silu's output: the conv's output is recomputed and
// silu.backward taken first (the same values as the separate steps).
absl::Status RunCausalConv1dBackward(const Args& a) {
  const auto k = a.Get<plan::CausalConv1dBackwardArgs>();
  const float* halo = k.has_halo ? k.halo.f32() : nullptr;
  const float* dy = k.dy.f32();
  std::vector<float> dconv;
  if (k.silu) {
    const int64_t n = k.batch * k.seq * k.channels;
    std::vector<float> conv(n);
    causal_conv1d_forward<float>(conv.data(), k.x.f32(), halo, k.w.f32(), k.bias.f32(), k.batch,
                                 k.seq, k.channels, k.width, PositionsOf(k));
    dconv.resize(n);
    silu_backward<float>(dconv.data(), dy, conv.data(), n);
    dy = dconv.data();
  }
  causal_conv1d_backward<float>(k.dx.f32(), k.has_halo ? k.dhalo.f32() : nullptr, k.dw.f32(),
                                k.dbias.f32(), dy, k.x.f32(), halo, k.w.f32(), k.batch, k.seq,
                                k.channels, k.width, PositionsOf(k));
  return absl::OkStatus();
}

// The SSD kernels' shape. A chunk longer than the sequence is one chunk either way; capping it
// keeps the kernels' per-chunk scratch sized by the data rather than by the number in the plan.
// ssd_add_initial_state is not chunked (chunk = seq).
template <typename Kernel>
SsdShape SsdShapeOf(const Kernel& k, int64_t chunk) {
  return SsdShape{.batch = k.batch,
                  .seq = k.seq,
                  .heads = k.heads,
                  .head_dim = k.head_dim,
                  .groups = k.groups,
                  .state = k.state,
                  .chunk = std::min(chunk, k.seq)};
}

absl::Status RunSsdScanForward(const Args& a) {
  const auto k = a.Get<plan::SsdScanForwardArgs>();
  ssd_scan_forward<float>(
      k.y.f32(), k.final_state.f32(), k.x.f32(), k.dt.f32(), k.A.f32(), k.B.f32(), k.C.f32(),
      k.D.f32(), k.has_init ? k.init_state.f32() : nullptr, SsdShapeOf(k, k.chunk), a.threads(),
      PositionsOf(k), k.keep_states ? k.chunk_states.f32() : nullptr);
  return absl::OkStatus();
}

absl::Status RunSsdScanBackward(const Args& a) {
  const auto k = a.Get<plan::SsdScanBackwardArgs>();
  ssd_scan_backward<float>(
      k.dx.f32(), k.ddt.f32(), k.dA.f32(), k.dB.f32(), k.dC.f32(), k.dD.f32(),
      k.has_init ? k.dinit_state.f32() : nullptr, k.dy.f32(),
      k.has_dfinal ? k.dfinal_state.f32() : nullptr, k.x.f32(), k.dt.f32(), k.A.f32(), k.B.f32(),
      k.C.f32(), k.D.f32(), k.has_init ? k.init_state.f32() : nullptr, SsdShapeOf(k, k.chunk),
      a.threads(), PositionsOf(k), k.keep_states ? k.chunk_states.f32() : nullptr);
  return absl::OkStatus();
}

absl::Status RunSsdFinalStateForward(const Args& a) {
  const auto k = a.Get<plan::SsdFinalStateForwardArgs>();
  ssd_final_state_forward<float>(k.final_state.f32(), k.x.f32(), k.dt.f32(), k.A.f32(), k.B.f32(),
                                 SsdShapeOf(k, k.chunk), a.threads(), PositionsOf(k));
  return absl::OkStatus();
}

absl::Status RunSsdFinalStateBackward(const Args& a) {
  const auto k = a.Get<plan::SsdFinalStateBackwardArgs>();
  ssd_final_state_backward<float>(k.dx.f32(), k.ddt.f32(), k.dA.f32(), k.dB.f32(),
                                  k.dfinal_state.f32(), k.x.f32(), k.dt.f32(), k.A.f32(), k.B.f32(),
                                  SsdShapeOf(k, k.chunk), a.threads(), PositionsOf(k));
  return absl::OkStatus();
}

absl::Status RunSsdLogDecayForward(const Args& a) {
  const auto k = a.Get<plan::SsdLogDecayForwardArgs>();
  ssd_log_decay<float>(k.g.f32(), k.dt.f32(), k.A.f32(), k.batch, k.seq, k.heads, PositionsOf(k));
  return absl::OkStatus();
}
absl::Status RunSsdLogDecayBackward(const Args& a) {
  const auto k = a.Get<plan::SsdLogDecayBackwardArgs>();
  ssd_log_decay_backward<float>(k.ddt.f32(), k.dA.f32(), k.dg.f32(), k.dt.f32(), k.A.f32(), k.batch,
                                k.seq, k.heads);
  return absl::OkStatus();
}

absl::Status RunSsdAddInitialStateForward(const Args& a) {
  const auto k = a.Get<plan::SsdAddInitialStateForwardArgs>();
  ssd_add_initial_state_forward<float>(k.out.f32(), k.y.f32(), k.dt.f32(), k.A.f32(), k.C.f32(),
                                       k.init_state.f32(), SsdShapeOf(k, k.seq), PositionsOf(k));
  return absl::OkStatus();
}
absl::Status RunSsdAddInitialStateBackward(const Args& a) {
  const auto k = a.Get<plan::SsdAddInitialStateBackwardArgs>();
  ssd_add_initial_state_backward<float>(k.ddt.f32(), k.dA.f32(), k.dC.f32(), k.dinit_state.f32(),
                                        k.dout.f32(), k.dt.f32(), k.A.f32(), k.C.f32(),
                                        k.init_state.f32(), SsdShapeOf(k, k.seq), PositionsOf(k));
  return absl::OkStatus();
}

// For attention.forward and .backward queries and keys are the same positions, so both start
// at 0; ring attention takes the positions of each piece from the mesh.
template <typename Kernel>
AttentionShape AttentionShapeOf(const Kernel& k) {
  return AttentionShape{.batch = k.batch,
                        .q_len = k.seq,
                        .kv_len = k.seq,
                        .q_heads = k.q_heads,
                        .kv_heads = k.kv_heads,
                        .head_dim = k.head_dim};
}

absl::Status RunAttentionForward(const Args& a) {
  const auto k = a.Get<plan::AttentionForwardArgs>();
  attention_forward<float>(k.out.f32(), k.lse.f32(), k.q.f32(), k.k.f32(), k.v.f32(),
                           AttentionShapeOf(k), static_cast<float>(k.scale), k.causal,
                           /*q_pos0=*/0, /*k_pos0=*/0, PositionsOf(k));
  return absl::OkStatus();
}

absl::Status RunAttentionBackward(const Args& a) {
  const auto k = a.Get<plan::AttentionBackwardArgs>();
  attention_backward<float>(k.dq.f32(), k.dk.f32(), k.dv.f32(), k.dout.f32(), k.q.f32(), k.k.f32(),
                            k.v.f32(), k.out.f32(), k.lse.f32(), AttentionShapeOf(k),
                            static_cast<float>(k.scale), k.causal, /*q_pos0=*/0, /*k_pos0=*/0,
                            PositionsOf(k));
  return absl::OkStatus();
}

absl::Status RunMoeRouteForward(const Args& a) {
  const auto k = a.Get<plan::MoeRouteForwardArgs>();
  topk_softmax_forward<float>(k.gates.f32(), k.expert_ids.i32(), k.logits.f32(), k.tokens,
                              k.experts, k.k);
  return absl::OkStatus();
}

absl::Status RunMoeRouteBackward(const Args& a) {
  const auto k = a.Get<plan::MoeRouteBackwardArgs>();
  HCP_RETURN_IF_ERROR(CheckExpertIndices(k.expert_ids.i32(), k.tokens * k.k, k.experts));
  topk_softmax_backward<float>(k.dlogits.f32(), k.dgates.f32(), k.gates.f32(), k.expert_ids.i32(),
                               k.tokens, k.experts, k.k);
  return absl::OkStatus();
}

absl::Status RunMoeExpertsForward(const Args& a) {
  const auto k = a.Get<plan::MoeExpertsForwardArgs>();
  HCP_RETURN_IF_ERROR(CheckExpertIndices(k.expert_ids.i32(), k.tokens * k.k, k.experts));
  moe_experts_forward<float>(k.out.f32(), k.x.f32(), k.gates.f32(), k.expert_ids.i32(),
                             k.w_in.f32(), k.w_out.f32(), k.tokens, k.hidden, k.inner, k.experts,
                             k.k, a.threads(), k.keep_h ? k.kept_h.f32() : nullptr);
  return absl::OkStatus();
}

absl::Status RunMoeExpertsBackward(const Args& a) {
  const auto k = a.Get<plan::MoeExpertsBackwardArgs>();
  HCP_RETURN_IF_ERROR(CheckExpertIndices(k.expert_ids.i32(), k.tokens * k.k, k.experts));
  // dout as the scale step the plan folded in would have left it (the same f32 products).
  const float* dout = k.dout.f32();
  std::vector<float> scaled;
  if (k.dout_scale != 1.0) {
    scaled.resize(k.tokens * k.hidden);
    scale<float>(scaled.data(), dout, static_cast<float>(k.dout_scale), k.tokens * k.hidden);
    dout = scaled.data();
  }
  moe_experts_backward<float>(k.dx.f32(), k.dgates.f32(), k.dw_in.f32(), k.dw_out.f32(), dout,
                              k.x.f32(), k.gates.f32(), k.expert_ids.i32(), k.w_in.f32(),
                              k.w_out.f32(), k.tokens, k.hidden, k.inner, k.experts, k.k,
                              a.threads(), k.keep_h ? k.kept_h.f32() : nullptr);
  return absl::OkStatus();
}

absl::Status RunCrossEntropyForward(const Args& a) {
  const auto k = a.Get<plan::CrossEntropyForwardArgs>();
  std::vector<float> lse(k.tokens);  // not kept: the backward recomputes it
  return cross_entropy_forward<float>(k.loss_sum.f32(), k.valid_count.f32(), lse.data(),
                                      k.logits.f32(), k.targets.i32(), k.tokens, k.vocab,
                                      k.ignore_index);
}

absl::Status RunCrossEntropyBackward(const Args& a) {
  const auto k = a.Get<plan::CrossEntropyBackwardArgs>();
  // Recompute lse with the forward kernel (which also checks the targets again).
  float loss_sum = 0, valid_count = 0;
  std::vector<float> lse(k.tokens);
  HCP_RETURN_IF_ERROR(cross_entropy_forward<float>(&loss_sum, &valid_count, lse.data(),
                                                   k.logits.f32(), k.targets.i32(), k.tokens,
                                                   k.vocab, k.ignore_index));
  cross_entropy_backward<float>(k.dlogits.f32(), k.dloss_sum.f32(), k.logits.f32(), lse.data(),
                                k.targets.i32(), k.tokens, k.vocab, k.ignore_index);
  return absl::OkStatus();
}

absl::Status RunRouterLoadForward(const Args& a) {
  const auto k = a.Get<plan::RouterLoadForwardArgs>();
  return router_load_forward<float>(k.probs.f32(), k.picks.f32(), k.logits.f32(),
                                    k.expert_ids.i32(), k.tokens, k.experts, k.k);
}

absl::Status RunRouterLoadBackward(const Args& a) {
  const auto k = a.Get<plan::RouterLoadBackwardArgs>();
  router_load_backward<float>(k.dlogits.f32(), k.dprobs.f32(), k.logits.f32(), k.tokens, k.experts);
  return absl::OkStatus();
}

absl::Status RunRouterAuxLossForward(const Args& a) {
  const auto k = a.Get<plan::RouterAuxLossForwardArgs>();
  router_aux_loss_forward<float>(k.loss.f32(), k.probs.f32(), k.picks.f32(), k.experts,
                                 static_cast<float>(k.scale));
  return absl::OkStatus();
}

absl::Status RunRouterAuxLossBackward(const Args& a) {
  const auto k = a.Get<plan::RouterAuxLossBackwardArgs>();
  router_aux_loss_backward<float>(k.dprobs.f32(), k.dloss.f32(), k.picks.f32(), k.experts,
                                  static_cast<float>(k.scale));
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Collectives (Collectives.h): every rank of the group runs them.

absl::Status RunHaloExchangeForward(const Args& a) {
  const auto k = a.Get<plan::HaloExchangeForwardArgs>();
  halo_exchange_forward(a.comm(), a.mesh(), k.halo.f32(), k.x.f32(), k.batch, k.segs, k.len,
                        k.channels, k.width);
  return absl::OkStatus();
}
absl::Status RunHaloExchangeBackward(const Args& a) {
  const auto k = a.Get<plan::HaloExchangeBackwardArgs>();
  halo_exchange_backward(a.comm(), a.mesh(), k.dx.f32(), k.dhalo.f32(), k.batch, k.segs, k.len,
                         k.channels, k.width);
  return absl::OkStatus();
}

template <typename Kernel>
StateScanShape StateScanShapeOf(const Kernel& k) {
  return StateScanShape{
      .batch = k.batch, .segs = k.segs, .heads = k.heads, .head_dim = k.head_dim, .state = k.state};
}
absl::Status RunStateScanForward(const Args& a) {
  const auto k = a.Get<plan::StateScanForwardArgs>();
  state_scan_forward(a.comm(), a.mesh(), k.s_in.f32(), k.g.f32(), k.s.f32(), StateScanShapeOf(k),
                     StateScanStrategy(k.strategy));
  return absl::OkStatus();
}
absl::Status RunStateScanBackward(const Args& a) {
  const auto k = a.Get<plan::StateScanBackwardArgs>();
  state_scan_backward(a.comm(), a.mesh(), k.dg.f32(), k.ds.f32(), k.ds_in.f32(), k.g.f32(),
                      k.s_in.f32(), StateScanShapeOf(k), StateScanStrategy(k.strategy));
  return absl::OkStatus();
}

// q, k, v are the rank's local part (seq = the local sequence).
absl::Status RunRingAttentionForward(const Args& a) {
  const auto k = a.Get<plan::RingAttentionForwardArgs>();
  ring_attention_forward(a.comm(), a.mesh(), k.out.f32(), k.lse.f32(), k.q.f32(), k.k.f32(),
                         k.v.f32(), AttentionShapeOf(k), static_cast<float>(k.scale), k.causal,
                         PositionsOf(k));
  return absl::OkStatus();
}
absl::Status RunRingAttentionBackward(const Args& a) {
  const auto k = a.Get<plan::RingAttentionBackwardArgs>();
  ring_attention_backward(a.comm(), a.mesh(), k.dq.f32(), k.dk.f32(), k.dv.f32(), k.dout.f32(),
                          k.q.f32(), k.k.f32(), k.v.f32(), k.out.f32(), k.lse.f32(),
                          AttentionShapeOf(k), static_cast<float>(k.scale), k.causal,
                          PositionsOf(k));
  return absl::OkStatus();
}

absl::Status RunAllReduce(const Args& a) {
  const auto k = a.Get<plan::AllReduceArgs>();
  all_reduce(a.comm(), k.y.f32(), k.x.f32(), k.n, comm::Group(k.group));
  return absl::OkStatus();
}

template <typename Kernel>
MoeShape MoeShapeOf(const Kernel& k) {
  return MoeShape{.tokens = k.tokens,
                  .hidden = k.hidden,
                  .inner = k.inner,
                  .experts = k.experts,
                  .k = k.k,
                  .ep = k.ep};
}
// The weights are this rank's experts; the expert ids are global.
absl::Status RunMoeExpertsEpForward(const Args& a) {
  const auto k = a.Get<plan::MoeExpertsEpForwardArgs>();
  return moe_experts_ep_forward(a.comm(), k.out.f32(), k.x.f32(), k.gates.f32(), k.expert_ids.i32(),
                                k.w_in.f32(), k.w_out.f32(), MoeShapeOf(k));
}
absl::Status RunMoeExpertsEpBackward(const Args& a) {
  const auto k = a.Get<plan::MoeExpertsEpBackwardArgs>();
  return moe_experts_ep_backward(a.comm(), k.dx.f32(), k.dgates.f32(), k.dw_in.f32(),
                                 k.dw_out.f32(), k.dout.f32(), k.x.f32(), k.gates.f32(),
                                 k.expert_ids.i32(), k.w_in.f32(), k.w_out.f32(), MoeShapeOf(k));
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
