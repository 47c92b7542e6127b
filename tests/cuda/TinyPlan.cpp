#include "tests/cuda/TinyPlan.h"

#include <string>
#include <vector>

#include "runtime/plan/PlanBuilder.h"
#include "runtime/plan/PlanFile.h"

namespace hcp::test {
namespace {

using plan::Arena;
using plan::DType;
using plan::KernelId;
using plan::ParamInit;

// Shapes: the CUDA kernels' (SSD: chunk 256, state 128, head_dim 64; attention: head_dim 64).
constexpr int64_t kBatch = 2, kSeq = 512, kTokens = kBatch * kSeq;
constexpr int64_t kVocab = 512, kHidden = 128;
constexpr int64_t kMambaHeads = 2, kMambaHeadDim = 64, kState = 128, kChunk = 256, kConv = 4;
constexpr int64_t kInner = kMambaHeads * kMambaHeadDim;         // the SSD's x: 128 columns
constexpr int64_t kInProj = kInner + 2 * kState + kMambaHeads;  // [x | B | C | dt] = 386
constexpr int64_t kQHeads = 2, kKvHeads = 1, kHeadDim = 64;
constexpr int64_t kQ = kQHeads * kHeadDim, kKv = kKvHeads * kHeadDim;
constexpr double kEps = 1e-5;

class Builder {
 public:
  explicit Builder(DType d) : d_(d) { b_.set_model("tiny").set_shape(kBatch, kSeq); }

  plan::PlanBuilder& b() { return b_; }
  // An activation of the model's storage type (`d`), or fp32.
  uint32_t Act(const std::string& name, std::vector<int64_t> shape) {
    return b_.Allocate(name, Arena::Activations, std::move(shape), d_);
  }
  uint32_t F32(const std::string& name, std::vector<int64_t> shape) {
    return b_.Allocate(name, Arena::Activations, std::move(shape), DType::F32);
  }
  // A parameter: value and gradient of the storage type (or f32 where the bf16 plans keep it).
  plan::PlanBuilder::ParameterBuffers Param(const std::string& name, std::vector<int64_t> shape,
                                            ParamInit init, double std = 0.0, bool f32 = false) {
    const DType dtype = f32 ? DType::F32 : d_;
    plan::PlanBuilder::ParameterBuffers p;
    p.value = b_.Allocate(name, Arena::Parameters, shape, dtype);
    p.gradient = b_.Allocate(name + ".grad", Arena::Gradients, shape, dtype);
    plan::Parameter parameter;
    parameter.name = name;
    parameter.buffer = p.value;
    parameter.gradient = p.gradient;
    parameter.init = init;
    parameter.std = std;
    b_.AddParameter(std::move(parameter));
    return p;
  }
  // c = a @ b^T (a [m,k], b [n,k]): a linear layer's forward.
  void Linear(uint32_t x, uint32_t w, uint32_t y, int64_t m, int64_t n, int64_t k) {
    b_.AddStep(KernelId::Gemm, {x, w}, {y}, {0, 1, m, n, k}, {1.0});
  }
  // Its backward: dx = dy @ w, dw = dy^T @ x.
  void LinearBackward(uint32_t dy, uint32_t x, uint32_t w, uint32_t dx, uint32_t dw, int64_t m,
                      int64_t n, int64_t k) {
    b_.AddStep(KernelId::Gemm, {dy, w}, {dx}, {0, 0, m, k, n}, {1.0});
    b_.AddStep(KernelId::Gemm, {dy, x}, {dw}, {1, 0, n, k, m}, {1.0});
  }
  void Add(uint32_t a, uint32_t c, uint32_t y, int64_t n, int64_t rhs_n) {
    b_.AddStep(KernelId::Add, {a, c}, {y}, {n, rhs_n});
  }

 private:
  DType d_;
  plan::PlanBuilder b_;
};

}  // namespace

absl::StatusOr<plan::Plan> TinyPlan(DType d) {
  Builder m(d);
  plan::PlanBuilder& b = m.b();
  const auto [ids, targets, loss_scale] = b.AllocateInputs();
  constexpr int64_t T = kTokens, H = kHidden;

  // Parameters (Hugging Face names, Granite 4.0-H style).
  const auto embed = m.Param("model.embed_tokens.weight", {kVocab, H}, ParamInit::Normal, 0.5);
  const auto norm1 = m.Param("model.layers.0.input_layernorm.weight", {H}, ParamInit::Ones);
  const auto in_proj =
      m.Param("model.layers.0.mamba.in_proj.weight", {kInProj, H}, ParamInit::Normal, 0.05);
  const auto conv_w =
      m.Param("model.layers.0.mamba.conv1d.weight", {kInner, kConv}, ParamInit::Normal, 0.3);
  const auto conv_b = m.Param("model.layers.0.mamba.conv1d.bias", {kInner}, ParamInit::Normal, 0.1);
  const auto dt_bias =
      m.Param("model.layers.0.mamba.dt_bias", {kMambaHeads}, ParamInit::Normal, 0.5, true);
  const auto a_log =
      m.Param("model.layers.0.mamba.A_log", {kMambaHeads}, ParamInit::LogArange, 0.0, true);
  const auto d_skip = m.Param("model.layers.0.mamba.D", {kMambaHeads}, ParamInit::Ones, 0.0, true);
  const auto out_proj =
      m.Param("model.layers.0.mamba.out_proj.weight", {H, kInner}, ParamInit::Normal, 0.05);
  const auto norm2 = m.Param("model.layers.1.input_layernorm.weight", {H}, ParamInit::Ones);
  const auto wq =
      m.Param("model.layers.1.self_attn.q_proj.weight", {kQ, H}, ParamInit::Normal, 0.1);
  const auto wk =
      m.Param("model.layers.1.self_attn.k_proj.weight", {kKv, H}, ParamInit::Normal, 0.1);
  const auto wv =
      m.Param("model.layers.1.self_attn.v_proj.weight", {kKv, H}, ParamInit::Normal, 0.1);
  const auto wo =
      m.Param("model.layers.1.self_attn.o_proj.weight", {H, kQ}, ParamInit::Normal, 0.1);
  const auto normf = m.Param("model.norm.weight", {H}, ParamInit::Ones);

  // ---- forward
  const uint32_t x0 = m.Act("x0", {T, H});
  b.AddStep(KernelId::EmbeddingForward, {embed.value, ids}, {x0}, {T, kVocab, H}, {1.0});
  // Mamba.
  const uint32_t h1 = m.Act("h1", {T, H});
  b.AddStep(KernelId::RmsNormForward, {x0, norm1.value}, {h1}, {T, H}, {kEps});
  const uint32_t zx = m.Act("zx", {T, kInProj});
  m.Linear(h1, in_proj.value, zx, T, kInProj, H);
  const uint32_t xr = m.Act("x_raw", {T, kInner}), bm = m.Act("B", {T, kState}),
                 cm = m.Act("C", {T, kState}), dtr = m.Act("dt_raw", {T, kMambaHeads});
  b.AddStep(KernelId::SliceColumns, {zx}, {xr}, {T, kInProj, 0, kInner});
  b.AddStep(KernelId::SliceColumns, {zx}, {bm}, {T, kInProj, kInner, kState});
  b.AddStep(KernelId::SliceColumns, {zx}, {cm}, {T, kInProj, kInner + kState, kState});
  b.AddStep(KernelId::SliceColumns, {zx}, {dtr}, {T, kInProj, kInner + 2 * kState, kMambaHeads});
  const uint32_t xc = m.Act("x_conv", {T, kInner});
  b.AddStep(KernelId::CausalConv1dForward, {xr, conv_w.value, conv_b.value}, {xc},
            {kBatch, kSeq, kInner, kConv, 0});
  const uint32_t dtf = m.F32("dt_f32", {T, kMambaHeads}),
                 dtb = m.F32("dt_biased", {T, kMambaHeads}), dt = m.F32("dt", {T, kMambaHeads}),
                 a = m.F32("A", {kMambaHeads});
  b.AddStep(KernelId::Cast, {dtr}, {dtf}, {T * kMambaHeads});
  m.Add(dtf, dt_bias.value, dtb, T * kMambaHeads, kMambaHeads);
  b.AddStep(KernelId::SoftplusForward, {dtb}, {dt}, {T * kMambaHeads});
  b.AddStep(KernelId::NegExpForward, {a_log.value}, {a}, {kMambaHeads});
  const uint32_t y = m.Act("ssd_y", {T, kInner});
  const uint32_t final_state = m.F32("final_state", {kBatch, kMambaHeads, kMambaHeadDim, kState});
  const std::vector<int64_t> ssd = {kBatch, kSeq, kMambaHeads, kMambaHeadDim, 1, kState, kChunk, 0};
  b.AddStep(KernelId::SsdScanForward, {xc, dt, a, bm, cm, d_skip.value}, {y, final_state}, ssd);
  const uint32_t mo = m.Act("mamba_out", {T, H}), x1 = m.Act("x1", {T, H});
  m.Linear(y, out_proj.value, mo, T, H, kInner);
  m.Add(x0, mo, x1, T * H, T * H);
  // Attention.
  const uint32_t h2 = m.Act("h2", {T, H});
  b.AddStep(KernelId::RmsNormForward, {x1, norm2.value}, {h2}, {T, H}, {kEps});
  const uint32_t q = m.Act("q", {T, kQ}), k = m.Act("k", {T, kKv}), v = m.Act("v", {T, kKv});
  m.Linear(h2, wq.value, q, T, kQ, H);
  m.Linear(h2, wk.value, k, T, kKv, H);
  m.Linear(h2, wv.value, v, T, kKv, H);
  const uint32_t o = m.Act("attn", {T, kQ}), lse = m.F32("lse", {kBatch, kQHeads, kSeq});
  const std::vector<int64_t> attn = {kBatch, kSeq, kQHeads, kKvHeads, kHeadDim, 1};
  b.AddStep(KernelId::AttentionForward, {q, k, v}, {o, lse}, attn, {0.125});
  const uint32_t ao = m.Act("attn_out", {T, H}), x2 = m.Act("x2", {T, H});
  m.Linear(o, wo.value, ao, T, H, kQ);
  m.Add(x1, ao, x2, T * H, T * H);
  // silu, and a round trip through fp32.
  const uint32_t x3 = m.Act("x3", {T, H}), x3f = m.F32("x3_f32", {T, H}), x4 = m.Act("x4", {T, H});
  b.AddStep(KernelId::SiluForward, {x2}, {x3}, {T * H});
  b.AddStep(KernelId::Cast, {x3}, {x3f}, {T * H});
  b.AddStep(KernelId::Cast, {x3f}, {x4}, {T * H});
  // Head and loss.
  const uint32_t hf = m.Act("hf", {T, H}), logits = m.Act("logits", {T, kVocab});
  b.AddStep(KernelId::RmsNormForward, {x4, normf.value}, {hf}, {T, H}, {kEps});
  m.Linear(hf, embed.value, logits, T, kVocab, H);
  const uint32_t loss_sum = m.F32("loss_sum", {1}), valid = m.F32("valid_count", {1}),
                 loss = m.F32("loss", {1});
  b.AddStep(KernelId::CrossEntropyForward, {logits, targets}, {loss_sum, valid},
            {T, kVocab, plan::kIgnoredTarget});
  b.AddStep(KernelId::Mul, {loss_sum, loss_scale}, {loss}, {1, 1});
  b.set_loss(loss);

  // ---- backward
  const uint32_t dloss_sum = m.F32("dloss_sum", {1});
  b.AddStep(KernelId::Copy, {loss_scale}, {dloss_sum}, {1});
  const uint32_t dlogits = m.Act("dlogits", {T, kVocab});
  b.AddStep(KernelId::CrossEntropyBackward, {dloss_sum, logits, targets}, {dlogits},
            {T, kVocab, plan::kIgnoredTarget});
  const uint32_t dhf = m.Act("dhf", {T, H}), dembed_head = m.Act("dembed_head", {kVocab, H});
  m.LinearBackward(dlogits, hf, embed.value, dhf, dembed_head, T, kVocab, H);
  const uint32_t dx4 = m.Act("dx4", {T, H});
  b.AddStep(KernelId::RmsNormBackward, {dhf, x4, normf.value}, {dx4, normf.gradient}, {T, H},
            {kEps});
  const uint32_t dx3f = m.F32("dx3_f32", {T, H}), dx3 = m.Act("dx3", {T, H}),
                 dx2 = m.Act("dx2", {T, H});
  b.AddStep(KernelId::Cast, {dx4}, {dx3f}, {T * H});
  b.AddStep(KernelId::Cast, {dx3f}, {dx3}, {T * H});
  b.AddStep(KernelId::SiluBackward, {dx3, x2}, {dx2}, {T * H});
  // Attention (dx2 flows into the residual x1 and the attention output).
  const uint32_t dout = m.Act("dattn", {T, kQ});
  m.LinearBackward(dx2, o, wo.value, dout, wo.gradient, T, H, kQ);
  const uint32_t dq = m.Act("dq", {T, kQ}), dk = m.Act("dk", {T, kKv}), dv = m.Act("dv", {T, kKv});
  b.AddStep(KernelId::AttentionBackward, {dout, q, k, v, o, lse}, {dq, dk, dv}, attn, {0.125});
  const uint32_t dh2q = m.Act("dh2_q", {T, H}), dh2k = m.Act("dh2_k", {T, H}),
                 dh2v = m.Act("dh2_v", {T, H}), dh2qk = m.Act("dh2_qk", {T, H}),
                 dh2 = m.Act("dh2", {T, H});
  m.LinearBackward(dq, h2, wq.value, dh2q, wq.gradient, T, kQ, H);
  m.LinearBackward(dk, h2, wk.value, dh2k, wk.gradient, T, kKv, H);
  m.LinearBackward(dv, h2, wv.value, dh2v, wv.gradient, T, kKv, H);
  m.Add(dh2q, dh2k, dh2qk, T * H, T * H);
  m.Add(dh2qk, dh2v, dh2, T * H, T * H);
  const uint32_t dx1n = m.Act("dx1_norm", {T, H}), dx1 = m.Act("dx1", {T, H});
  b.AddStep(KernelId::RmsNormBackward, {dh2, x1, norm2.value}, {dx1n, norm2.gradient}, {T, H},
            {kEps});
  m.Add(dx2, dx1n, dx1, T * H, T * H);
  // Mamba.
  const uint32_t dy = m.Act("dssd_y", {T, kInner});
  m.LinearBackward(dx1, y, out_proj.value, dy, out_proj.gradient, T, H, kInner);
  const uint32_t dxc = m.Act("dx_conv", {T, kInner}), ddt = m.F32("ddt", {T, kMambaHeads}),
                 da = m.F32("dA", {kMambaHeads}), dbm = m.Act("dB", {T, kState}),
                 dcm = m.Act("dC", {T, kState});
  std::vector<int64_t> ssd_backward = ssd;
  ssd_backward.push_back(0);  // has_dfinal
  b.AddStep(KernelId::SsdScanBackward, {dy, xc, dt, a, bm, cm, d_skip.value},
            {dxc, ddt, da, dbm, dcm, d_skip.gradient}, ssd_backward);
  b.AddStep(KernelId::NegExpBackward, {da, a}, {a_log.gradient}, {kMambaHeads});
  const uint32_t ddtb = m.F32("ddt_biased", {T, kMambaHeads}),
                 ddtr = m.Act("ddt_raw", {T, kMambaHeads});
  b.AddStep(KernelId::SoftplusBackward, {ddt, dtb}, {ddtb}, {T * kMambaHeads});
  b.AddStep(KernelId::SumLeading, {ddtb}, {dt_bias.gradient}, {T, kMambaHeads});
  b.AddStep(KernelId::Cast, {ddtb}, {ddtr}, {T * kMambaHeads});
  const uint32_t dxr = m.Act("dx_raw", {T, kInner});
  b.AddStep(KernelId::CausalConv1dBackward, {dxc, xr, conv_w.value},
            {dxr, conv_w.gradient, conv_b.gradient}, {kBatch, kSeq, kInner, kConv, 0});
  const uint32_t dzx = m.Act("dzx", {T, kInProj});
  b.AddStep(KernelId::InsertColumns, {dxr}, {dzx}, {T, kInProj, 0, kInner});
  b.AddStep(KernelId::InsertColumns, {dbm}, {dzx}, {T, kInProj, kInner, kState});
  b.AddStep(KernelId::InsertColumns, {dcm}, {dzx}, {T, kInProj, kInner + kState, kState});
  b.AddStep(KernelId::InsertColumns, {ddtr}, {dzx}, {T, kInProj, kInner + 2 * kState, kMambaHeads});
  const uint32_t dh1 = m.Act("dh1", {T, H});
  m.LinearBackward(dzx, h1, in_proj.value, dh1, in_proj.gradient, T, kInProj, H);
  const uint32_t dx0n = m.Act("dx0_norm", {T, H}), dx0 = m.Act("dx0", {T, H});
  b.AddStep(KernelId::RmsNormBackward, {dh1, x0, norm1.value}, {dx0n, norm1.gradient}, {T, H},
            {kEps});
  m.Add(dx1, dx0n, dx0, T * H, T * H);
  // The tied embedding: the lookup's gradient plus the head's.
  const uint32_t dembed_lookup = m.Act("dembed_lookup", {kVocab, H});
  b.AddStep(KernelId::EmbeddingBackward, {dx0, ids}, {dembed_lookup}, {T, kVocab, H, -1}, {1.0});
  m.Add(dembed_lookup, dembed_head, embed.gradient, kVocab * H, kVocab * H);

  absl::StatusOr<std::string> bytes = b.Finish();
  if (!bytes.ok()) return bytes.status();
  return plan::ParsePlan(*bytes, d == DType::BF16 ? "<tiny bf16 plan>" : "<tiny f32 plan>");
}

}  // namespace hcp::test
