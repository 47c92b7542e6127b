// Reverse-mode automatic differentiation of the training step.
#ifndef HYBRIDCP_AUTODIFF_PASSES_TD
#define HYBRIDCP_AUTODIFF_PASSES_TD

include "mlir/Pass/PassBase.td"

def Autodiff : Pass<"hcp-autodiff", "mlir::func::FuncOp"> {
  let summary = "append the backward of the training step: one model.param_grad per parameter";
  let description = [{
    The function (by default `train_step`) returns one scalar loss. The pass seeds the loss's
    gradient with `model.fill 1.0`, walks the ops in reverse and asks each one whose results
    have a gradient for its backward rule (DifferentiableOpInterface), summing the gradients of
    values used several times with `model.add` in reverse program order. Every `model.param`
    gets exactly one `model.param_grad` with the sum of all its uses' gradients (the tied
    embedding: lookup plus vocabulary projection). The backward ops go after the forward ops,
    before the return; the function still returns the loss. Gradient ops whose result nothing
    reads (e.g. the loss's gradient with respect to the valid-token count) are removed.
    Fails, naming the op, on an op without a backward rule and, naming the parameter, on a
    parameter the loss does not depend on. Other functions are left alone.
  }];
  let options = [
    Option<"functionName", "function", "std::string", /*default=*/"\"train_step\"",
           "the function to differentiate">
  ];
  let statistics = [
    Statistic<"numParamGrads", "param-grads", "model.param_grad ops emitted">,
    Statistic<"numBackwardOps", "backward-ops", "ops the backward adds (after cleanup)">
  ];
  let dependentDialects = ["::hcp::model::ModelDialect"];
}

def Recompute : Pass<"hcp-recompute", "mlir::func::FuncOp"> {
  let summary = "recompute each decoder layer's activations in the backward (activation checkpointing)";
  let description = [{
    Runs after hcp-autodiff. Each decoder layer (forward ops located at "model.layers.N. ...")
    keeps only its checkpoints: the values forward ops of other layers read (the residual stream).
    Every other value of the layer that the backward reads is computed again by clones of the
    forward ops it needs, placed right before the first backward op that reads one, and the
    backward reads the clones. Peak activation memory then holds the checkpoints plus one layer
    instead of every layer; the results are the same (the clones are the same ops on the same
    inputs), for about one more forward of the layers.

    Attention's results (its output and log-sum-exp, all a FlashAttention-style backward reads
    of it besides q, k and v) are checkpoints too, unless recompute-attention: recomputing them
    costs a whole attention forward, a layer's largest op at long context (tiny at s = 131072:
    about a tenth of the step), for 2 * heads * head_dim + 4 * heads bytes a token. Its q, k and
    v are recomputed (their projections).
  }];
  let options = [
    Option<"functionName", "function", "std::string", /*default=*/"\"train_step\"",
           "the training step function">,
    Option<"recomputeAttention", "recompute-attention", "bool", /*default=*/"false",
           "recompute attention's output and log-sum-exp as well">
  ];
  let statistics = [
    Statistic<"numClonedOps", "cloned-ops", "forward ops cloned into the backward">
  ];
  let dependentDialects = ["::hcp::model::ModelDialect"];
}

#endif  // HYBRIDCP_AUTODIFF_PASSES_TD
