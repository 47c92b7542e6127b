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

#endif  // HYBRIDCP_AUTODIFF_PASSES_TD
