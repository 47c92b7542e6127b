#include "compiler/import/ModelImporter.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "dialects/model/ModelOps.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Verifier.h"

namespace hcp {
namespace {

using namespace mlir;

// Builds the ops of one training step; holds the builder state so each layer reads as a recipe.
class ModelBuilder {
 public:
  ModelBuilder(MLIRContext& context, const GraniteConfig& config, const ImportOptions& options)
      : b_(&context),
        config_(config),
        batch_(options.micro_batch),
        seq_(options.seq),
        aux_coefficient_(config.has_experts() ? options.router_aux_loss : 0),
        documents_(options.documents) {
    act_ = options.dtype == ActivationType::kBF16 ? Type(b_.getBF16Type()) : b_.getF32Type();
  }

  OwningOpRef<ModuleOp> Build() {
    Location loc = b_.getUnknownLoc();
    OwningOpRef<ModuleOp> module = ModuleOp::create(loc);
    b_.setInsertionPointToEnd(module->getBody());
    auto tokens = RankedTensorType::get({batch_, seq_}, b_.getI32Type());
    auto scalar = RankedTensorType::get({}, b_.getF32Type());
    SmallVector<Type> inputs = {tokens, tokens, scalar};
    if (aux_coefficient_ > 0) inputs.push_back(scalar);
    if (documents_) inputs.push_back(tokens);
    auto func =
        func::FuncOp::create(b_, loc, kTrainStepFunction, b_.getFunctionType(inputs, {scalar}));
    func.setArgAttr(0, "model.input", b_.getStringAttr("input_ids"));
    func.setArgAttr(1, "model.input", b_.getStringAttr("targets"));
    func.setArgAttr(2, "model.input", b_.getStringAttr("loss_scale"));
    if (aux_coefficient_ > 0) func.setArgAttr(3, "model.input", b_.getStringAttr("aux_loss_scale"));
    // Packed documents: each token's position in its document (Hugging Face's position_ids).
    if (documents_) {
      func.setArgAttr(inputs.size() - 1, "model.input", b_.getStringAttr("position_ids"));
    }
    b_.setInsertionPointToStart(func.addEntryBlock());
    if (documents_) positions_ = func.getArgument(inputs.size() - 1);
    Value loss = Loss(func.getArgument(0), func.getArgument(1), func.getArgument(2));
    if (aux_coefficient_ > 0) loss = WithRouterAuxLoss(loss, func.getArgument(3));
    func::ReturnOp::create(b_, loc, loss);
    return module;
  }

 private:
  // --- helpers ---------------------------------------------------------------------------------
  RankedTensorType Act(ArrayRef<int64_t> shape) { return RankedTensorType::get(shape, act_); }
  RankedTensorType F32(ArrayRef<int64_t> shape) {
    return RankedTensorType::get(shape, b_.getF32Type());
  }
  Location Loc(const std::string& name) { return NameLoc::get(b_.getStringAttr(name)); }

  // A parameter stored in the activation type, or (f32 = true) always in f32.
  Value Param(const std::string& name, ArrayRef<int64_t> shape, model::ParamInit init,
              bool f32 = false) {
    FloatAttr std = init == model::ParamInit::Normal ? b_.getF64FloatAttr(config_.initializer_range)
                                                     : FloatAttr();
    return model::ParamOp::create(b_, Loc(name), f32 ? F32(shape) : Act(shape),
                                  b_.getStringAttr(name),
                                  model::ParamInitAttr::get(b_.getContext(), init), std,
                                  /*shards=*/IntegerAttr());
  }
  Value Weight(const std::string& name, ArrayRef<int64_t> shape) {
    return Param(name, shape, model::ParamInit::Normal);
  }
  Value Linear(Value x, Value weight) {
    auto in = cast<RankedTensorType>(x.getType());
    SmallVector<int64_t> shape(in.getShape());
    shape.back() = cast<RankedTensorType>(weight.getType()).getShape()[0];
    return model::LinearOp::create(b_, loc_, Act(shape), x, weight);
  }
  Value RmsNorm(Value x, const std::string& weight_name) {
    Value w = Param(weight_name, {config_.hidden_size}, model::ParamInit::Ones);
    return model::RmsNormOp::create(b_, loc_, x.getType(), x, w,
                                    b_.getF64FloatAttr(config_.rms_norm_eps));
  }
  Value Scale(Value x, double factor) {
    return model::ScaleOp::create(b_, loc_, x.getType(), x, b_.getF64FloatAttr(factor));
  }
  Value Add(Value a, Value b) { return model::AddOp::create(b_, loc_, a.getType(), a, b); }
  Value Reshape(Value x, ArrayRef<int64_t> shape) {
    return model::ReshapeOp::create(b_, loc_, Act(shape), x);
  }
  SmallVector<Value> Split(Value x, ArrayRef<int64_t> sizes) {
    auto in = cast<RankedTensorType>(x.getType());
    SmallVector<Type> types;
    for (int64_t size : sizes) {
      SmallVector<int64_t> shape(in.getShape());
      shape.back() = size;
      types.push_back(Act(shape));
    }
    auto op = model::SplitOp::create(b_, loc_, types, x, b_.getDenseI64ArrayAttr(sizes));
    return SmallVector<Value>(op.getResults());
  }

  // --- the model --------------------------------------------------------------------------------
  // The loss of one micro-batch is its summed token loss times `loss_scale`, which the runtime
  // sets to 1 / (valid tokens of the whole optimizer step: every micro-batch of every rank).
  // Every rank's and micro-batch's contribution to the loss and to each gradient is then scaled
  // at its source, and all the splits (cp, dp, ep, accumulation) just sum.
  Value Loss(Value ids, Value targets, Value loss_scale) {
    const int64_t h = config_.hidden_size;
    loc_ = Loc("model.embed_tokens");
    Value embed = Weight("model.embed_tokens.weight", {config_.vocab_size, h});
    IntegerAttr padding;
    if (config_.pad_token_id) padding = b_.getI64IntegerAttr(*config_.pad_token_id);
    Value hidden =
        model::EmbeddingOp::create(b_, loc_, Act({batch_, seq_, h}), embed, ids,
                                   b_.getF64FloatAttr(config_.embedding_multiplier), padding);
    for (int64_t i = 0; i < config_.num_layers; ++i) hidden = Layer(hidden, i);

    loc_ = Loc("model.norm");
    hidden = RmsNorm(hidden, "model.norm.weight");
    loc_ = Loc("lm_head");
    Value head =
        config_.tie_word_embeddings ? embed : Weight("lm_head.weight", {config_.vocab_size, h});
    Value logits = Scale(Linear(hidden, head), 1.0 / config_.logits_scaling);
    auto loss = model::CrossEntropyOp::create(b_, Loc("loss"), F32({}), F32({}), logits, targets,
                                              b_.getI64IntegerAttr(kIgnoreIndex));
    return model::MulOp::create(b_, loc_, F32({}), loss.getLossSum(), loss_scale);
  }

  // The objective loss + coefficient * aux_loss_scale * aux, where aux is transformers'
  // load-balancing loss of this micro-batch: every MoE layer's routing statistics summed
  // (router_load, one per layer) and combined with scale experts / rows^2 over the layers' rows.
  // The runtime sets aux_loss_scale to 1 / (micro-batches of the optimizer step, over every dp
  // rank): the step's aux is the mean of its micro-batches'. Both parts are reported by name.
  Value WithRouterAuxLoss(Value lm_loss, Value aux_loss_scale) {
    loc_ = Loc("router_aux_loss");
    Value probs = router_probs_.front(), picks = router_picks_.front();
    for (size_t i = 1; i < router_probs_.size(); ++i) {
      probs = Add(probs, router_probs_[i]);
      picks = Add(picks, router_picks_[i]);
    }
    const double rows = static_cast<double>(router_probs_.size()) * batch_ * seq_;
    Value aux = model::RouterAuxLossOp::create(
        b_, loc_, F32({}), probs, picks, b_.getF64FloatAttr(config_.num_experts / (rows * rows)));
    aux = model::MulOp::create(b_, loc_, F32({}), aux, aux_loss_scale);
    model::ReportOp::create(b_, loc_, b_.getStringAttr("loss"), lm_loss);
    model::ReportOp::create(b_, loc_, b_.getStringAttr("router_aux_loss"), aux);
    return Add(lm_loss, Scale(aux, aux_coefficient_));
  }

  // r = h; h = r + m * Mixer(norm(h)); r = h; h = r + m * FFN(norm(h))
  Value Layer(Value hidden, int64_t index) {
    std::string prefix = absl::StrCat("model.layers.", index, ".");
    bool mamba = config_.layers[index] == LayerKind::kMamba;
    loc_ = Loc(prefix + (mamba ? "mamba" : "self_attn"));
    Value x = RmsNorm(hidden, prefix + "input_layernorm.weight");
    Value mixed = mamba ? Mamba(x, prefix + "mamba.") : Attention(x, prefix + "self_attn.");
    hidden = Add(hidden, Scale(mixed, config_.residual_multiplier));

    loc_ = Loc(prefix + "mlp");
    x = RmsNorm(hidden, prefix + "post_attention_layernorm.weight");
    // The router before the shared MLP: a GPU run copies the expert ids to the host as soon as
    // they exist, and the shared MLP keeps the GPU busy while the experts wait for them.
    model::MoeRouteOp route;
    if (config_.has_experts()) route = Route(x, prefix + "block_sparse_moe.");
    if (route && aux_coefficient_ > 0) {
      const int64_t e = config_.num_experts;
      auto load = model::RouterLoadOp::create(b_, loc_, F32({e}), F32({e}), route.getLogits(),
                                              route.getExperts());
      router_probs_.push_back(load.getProbs());
      router_picks_.push_back(load.getPicks());
    }
    Value ffn = SharedMlp(x, prefix + "shared_mlp.");
    if (config_.has_experts()) ffn = Add(Experts(x, route, prefix + "block_sparse_moe."), ffn);
    return Add(hidden, Scale(ffn, config_.residual_multiplier));
  }

  Value Mamba(Value x, const std::string& p) {
    const GraniteConfig& c = config_;
    const int64_t heads = c.mamba_heads, dim = c.mamba_head_dim, inner = c.mamba_inner();
    const int64_t groups = c.mamba_groups, state = c.mamba_state, conv = c.mamba_conv_dim();
    Value proj = Linear(x, Weight(p + "in_proj.weight", {c.mamba_in_proj_dim(), c.hidden_size}));
    SmallVector<Value> zxbcdt = Split(proj, {inner, conv, heads});  // z, xBC, dt in this order
    Value z = zxbcdt[0], dt = zxbcdt[2];

    Value conv_w = Weight(p + "conv1d.weight", {conv, 1, c.mamba_conv_width});
    Value conv_b = Param(p + "conv1d.bias", {conv}, model::ParamInit::Zeros);
    Value xbc =
        model::CausalConv1dOp::create(b_, loc_, zxbcdt[1].getType(), zxbcdt[1], conv_w, conv_b,
                                      /*halo=*/Value(), positions_);
    xbc = model::SiluOp::create(b_, loc_, xbc);
    SmallVector<Value> parts = Split(xbc, {inner, groups * state, groups * state});
    Value xs = Reshape(parts[0], {batch_, seq_, heads, dim});
    Value B = Reshape(parts[1], {batch_, seq_, groups, state});
    Value C = Reshape(parts[2], {batch_, seq_, groups, state});

    // Mixed precision: dt, its bias, A and D stay f32 whatever the activation type (dt's
    // cumulative sums and the decays exp(dt A) lose too much in bf16).
    const bool f32 = true;
    if (act_ != b_.getF32Type())
      dt =
          model::CastOp::create(b_, loc_, F32(cast<RankedTensorType>(dt.getType()).getShape()), dt);
    dt = Add(dt, Param(p + "dt_bias", {heads}, model::ParamInit::Ones, f32));
    dt = model::SoftplusOp::create(b_, loc_, dt);
    Value A = model::NegExpOp::create(
        b_, loc_, Param(p + "A_log", {heads}, model::ParamInit::LogArange, f32));
    Value D = Param(p + "D", {heads}, model::ParamInit::Ones, f32);
    auto scan = model::SsdScanOp::create(b_, loc_, Act({batch_, seq_, heads, dim}),
                                         F32({batch_, heads, dim, state}), xs, dt, A, B, C, D,
                                         /*init_state=*/Value(), positions_,
                                         b_.getI64IntegerAttr(c.mamba_chunk));
    Value y = Reshape(scan.getY(), {batch_, seq_, inner});
    y = model::GatedRmsNormOp::create(b_, loc_, y.getType(), y, z,
                                      Param(p + "norm.weight", {inner}, model::ParamInit::Ones),
                                      b_.getF64FloatAttr(c.rms_norm_eps));
    return Linear(y, Weight(p + "out_proj.weight", {c.hidden_size, inner}));
  }

  Value Attention(Value x, const std::string& p) {
    const GraniteConfig& c = config_;
    const int64_t h = c.hidden_size, d = c.head_dim, q_width = c.num_heads * d,
                  kv_width = c.num_kv_heads * d;
    Value q = Reshape(Linear(x, Weight(p + "q_proj.weight", {q_width, h})),
                      {batch_, seq_, c.num_heads, d});
    Value k = Reshape(Linear(x, Weight(p + "k_proj.weight", {kv_width, h})),
                      {batch_, seq_, c.num_kv_heads, d});
    Value v = Reshape(Linear(x, Weight(p + "v_proj.weight", {kv_width, h})),
                      {batch_, seq_, c.num_kv_heads, d});
    auto attention = model::AttentionOp::create(
        b_, loc_, q.getType(), F32({batch_, c.num_heads, seq_}), q, k, v, positions_,
        b_.getF64FloatAttr(c.attention_multiplier), b_.getUnitAttr());
    Value out = Reshape(attention.getOut(), {batch_, seq_, q_width});
    return Linear(out, Weight(p + "o_proj.weight", {h, q_width}));
  }

  Value SharedMlp(Value x, const std::string& p) {
    const int64_t h = config_.hidden_size, width = config_.shared_width;
    Value up = Linear(x, Weight(p + "input_linear.weight", {2 * width, h}));
    Value act = model::SwigluOp::create(b_, loc_, Act({batch_, seq_, width}), up);
    return Linear(act, Weight(p + "output_linear.weight", {h, width}));
  }

  model::MoeRouteOp Route(Value x, const std::string& p) {
    const GraniteConfig& c = config_;
    const int64_t h = c.hidden_size, e = c.num_experts, k = c.experts_per_token;
    Value logits = Linear(x, Weight(p + "router.layer.weight", {e, h}));
    // The gates are f32 whatever the activation type (they weigh the experts' outputs).
    return model::MoeRouteOp::create(b_, loc_, F32({batch_, seq_, k}),
                                     RankedTensorType::get({batch_, seq_, k}, b_.getI32Type()),
                                     logits, b_.getI64IntegerAttr(k));
  }

  Value Experts(Value x, model::MoeRouteOp route, const std::string& p) {
    const GraniteConfig& c = config_;
    const int64_t h = c.hidden_size, e = c.num_experts, w = c.expert_width;
    // Separate statements: argument evaluation order would make the IR order compiler-dependent.
    Value input_weight = Weight(p + "input_linear.weight", {e, 2 * w, h});
    Value output_weight = Weight(p + "output_linear.weight", {e, h, w});
    return model::MoeExpertsOp::create(b_, loc_, x.getType(), x, route.getGates(),
                                       route.getExperts(), input_weight, output_weight);
  }

  OpBuilder b_;
  const GraniteConfig& config_;
  int64_t batch_, seq_;
  double aux_coefficient_;                          // 0: no load-balancing loss
  bool documents_;                                  // packed documents: positions_ is the input
  Value positions_;                                 // position_ids [batch, seq], or null
  SmallVector<Value> router_probs_, router_picks_;  // each MoE layer's router_load
  Type act_;
  Location loc_ = UnknownLoc::get(b_.getContext());
};

}  // namespace

absl::StatusOr<double> RouterAuxLossCoefficient(const GraniteConfig& config,
                                                std::optional<double> given) {
  if (given) {
    if (!(*given >= 0) || !std::isfinite(*given)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--router-aux-loss %g: the load-balancing loss's coefficient is a number >= 0 (0 "
          "turns it off)",
          *given));
    }
    if (*given > 0 && !config.has_experts()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--router-aux-loss %g balances the experts of a mixture-of-experts model, but %s has "
          "none (it is dense)",
          *given, config.source));
    }
    return *given;
  }
  return config.has_experts() && config.output_router_logits ? config.router_aux_loss_coef : 0.0;
}

absl::StatusOr<OwningOpRef<ModuleOp>> ImportModel(MLIRContext& context, const GraniteConfig& config,
                                                  const ImportOptions& options) {
  if (options.seq <= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--seq must be positive, got %d", options.seq));
  }
  if (options.micro_batch <= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--micro-batch must be positive, got %d", options.micro_batch));
  }
  // The widest activation, [tokens, width] in f32, bounds every size the passes derive: beyond
  // 1 PiB no machine holds it (and the element counts would near int64's end).
  const GraniteConfig& c = config;
  const double width =
      std::max({static_cast<double>(c.vocab_size), static_cast<double>(c.mamba_in_proj_dim()),
                2.0 * c.shared_width, 2.0 * c.experts_per_token * c.expert_width});
  const double bytes = static_cast<double>(options.seq) * options.micro_batch * width * 4;
  if (bytes > 0x1p50) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--seq %d with --micro-batch %d: one activation of %s ([tokens, %.0f] in f32) would take "
        "%.3g TiB, beyond any machine",
        options.seq, options.micro_batch, config.source, width, bytes / 0x1p40));
  }
  context.loadDialect<model::ModelDialect, func::FuncDialect>();
  OwningOpRef<ModuleOp> module = ModelBuilder(context, config, options).Build();
  if (failed(verify(*module))) {
    return absl::InternalError(absl::StrFormat(
        "%s: the imported model does not verify (a bug in the importer)", config.source));
  }
  return module;
}

}  // namespace hcp
