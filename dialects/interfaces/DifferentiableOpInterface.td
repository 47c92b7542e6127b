// The interface through which hcp-autodiff asks an op for its backward rule. The `model` dialect
// attaches it to every forward op (dialects/model/ModelAutodiff.cpp); the `dist` dialect's
// collectives implement it with their transposes.
#ifndef HYBRIDCP_DIFFERENTIABLE_OP_INTERFACE_TD
#define HYBRIDCP_DIFFERENTIABLE_OP_INTERFACE_TD

include "mlir/IR/OpBase.td"

def DifferentiableOpInterface : OpInterface<"DifferentiableOpInterface"> {
  let cppNamespace = "::hcp";
  let description = [{
    An op that knows its reverse-mode (vector-Jacobian product) rule. Given the gradients of its
    results, it builds the ops that compute the gradients of its operands, at the builder's
    insertion point (the pass places it after the forward ops, before the function's return).
    Fused ops (the SSD scan, attention, the MoE) emit one hand-written gradient op instead of
    being differentiated through their decomposition.
  }];
  let methods = [
    InterfaceMethod<[{
        Builds the backward of this op at `builder`'s insertion point. `resultGrads` holds one
        entry per result: the gradient of the loss with respect to that result, or a null Value
        when the loss does not depend on it (at least one entry is non-null). `operandGrads`
        arrives holding one null Value per operand; the rule sets the entry of every operand that
        gets a gradient, with exactly that operand's type, and leaves the others null (integer
        operands such as token ids never get one). Returns failure after emitting an error when
        the op cannot be differentiated.
      }],
      "::llvm::LogicalResult", "buildBackward",
      (ins "::mlir::OpBuilder &":$builder,
           "::llvm::ArrayRef<::mlir::Value>":$resultGrads,
           "::llvm::SmallVectorImpl<::mlir::Value> &":$operandGrads)>
  ];
}

#endif  // HYBRIDCP_DIFFERENTIABLE_OP_INTERFACE_TD
