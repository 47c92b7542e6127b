// hcp-autodiff: reverse-mode differentiation of the training step, on tensors.
//
// One sweep over the forward ops in reverse. Each op whose results have a gradient builds the
// gradients of its operands through DifferentiableOpInterface (the `model` rules are in
// dialects/model/ModelAutodiff.cpp); gradients of values read several times are summed with
// model.add in the order the sweep meets the uses. A parameter's gradient is complete when the
// sweep reaches the model.param itself (it comes before all its uses), so its model.param_grad is
// emitted there, as early in the backward as possible.
#include "dialects/interfaces/DifferentiableOpInterface.h"
#include "dialects/model/ModelAutodiff.h"
#include "dialects/model/ModelOps.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/STLExtras.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "passes/autodiff/Passes.h"

namespace hcp {

#define GEN_PASS_DEF_AUTODIFF
#include "passes/autodiff/Passes.h.inc"

namespace {

using namespace mlir;

// Records every op the backward creates, so that the cleanup at the end touches only those.
struct CreatedOps : OpBuilder::Listener {
  void notifyOperationInserted(Operation* op, OpBuilder::InsertPoint) override {
    ops.push_back(op);
  }
  SmallVector<Operation*> ops;
};

bool isFloatTensor(Value value) {
  auto type = dyn_cast<RankedTensorType>(value.getType());
  return type && isa<FloatType>(type.getElementType());
}

// Values that depend on a parameter: only these can carry a gradient worth keeping (the token
// ids and the valid-token count, say, never do).
DenseSet<Value> activeValues(ArrayRef<Operation*> forward) {
  DenseSet<Value> active;
  for (Operation* op : forward) {
    bool reads = isa<model::ParamOp>(op) ||
                 llvm::any_of(op->getOperands(), [&](Value v) { return active.contains(v); });
    if (!reads) continue;
    for (Value result : op->getResults())
      if (isFloatTensor(result)) active.insert(result);
  }
  return active;
}

class Differentiator {
 public:
  Differentiator(func::FuncOp func, func::ReturnOp ret) : func_(func), builder_(ret) {
    builder_.setListener(&created_);
  }

  // Appends the backward before `ret`. Emits an error and fails on the first op without a rule
  // or with a failing rule; reports every parameter without a gradient.
  LogicalResult run(ArrayRef<Operation*> forward, Value loss) {
    DenseSet<Value> active = activeValues(forward);
    if (!active.contains(loss))
      return func_.emitError() << "the loss of '" << func_.getSymName()
                               << "' does not depend on any parameter: nothing to differentiate";
    grads_[loss] = model::FillOp::create(builder_, loss.getLoc(), loss.getType(),
                                         builder_.getF64FloatAttr(1.0));

    bool missing = false;
    SmallVector<Value> resultGrads, operandGrads;
    for (Operation* op : llvm::reverse(forward)) {
      resultGrads.clear();
      for (Value result : op->getResults()) resultGrads.push_back(grads_.lookup(result));
      if (llvm::none_of(resultGrads, [](Value g) { return bool(g); })) {
        if (auto param = dyn_cast<model::ParamOp>(op)) {
          param.emitError() << "parameter '" << param.getName()
                            << "' gets no gradient: the loss does not depend on it";
          missing = true;
        }
        continue;
      }
      auto rule = dyn_cast<DifferentiableOpInterface>(op);
      if (!rule)
        return op->emitOpError()
               << "has no backward rule (DifferentiableOpInterface): hcp-autodiff cannot "
                  "differentiate through it";
      operandGrads.assign(op->getNumOperands(), Value());
      if (failed(rule.buildBackward(builder_, resultGrads, operandGrads))) return failure();
      if (operandGrads.size() != op->getNumOperands())
        return op->emitOpError() << "backward rule returned " << operandGrads.size()
                                 << " operand gradients for " << op->getNumOperands()
                                 << " operands";
      for (auto [i, operand, grad] : llvm::enumerate(op->getOperands(), operandGrads)) {
        if (!grad || !active.contains(operand)) continue;
        if (grad.getType() != operand.getType())
          return op->emitOpError() << "backward rule gave operand #" << i << " a gradient of type "
                                   << grad.getType() << ", expected " << operand.getType();
        accumulate(operand, grad, op->getLoc());
      }
      for (Value result : op->getResults()) grads_.erase(result);
    }
    if (missing) return failure();
    removeUnusedGradients();
    return success();
  }

  int64_t numParamGrads() const { return numParamGrads_; }
  int64_t numBackwardOps() const { return numBackwardOps_; }

 private:
  // The gradient of a value read several times is the sum over its uses.
  void accumulate(Value value, Value grad, Location loc) {
    auto [it, inserted] = grads_.try_emplace(value, grad);
    if (inserted) return;
    it->second = model::AddOp::create(builder_, loc, value.getType(), it->second, grad);
  }

  // Rules build every operand's gradient; the ones nobody reads (the gradient of the valid-token
  // count, of split pieces feeding a dropped gradient...) are erased, consumers first.
  void removeUnusedGradients() {
    for (Operation* op : llvm::reverse(created_.ops)) {
      if (isOpTriviallyDead(op)) {
        op->erase();
        continue;
      }
      ++numBackwardOps_;
      if (isa<model::ParamGradOp>(op)) ++numParamGrads_;
    }
  }

  func::FuncOp func_;
  CreatedOps created_;
  OpBuilder builder_;
  DenseMap<Value, Value> grads_;
  int64_t numParamGrads_ = 0, numBackwardOps_ = 0;
};

struct Autodiff : impl::AutodiffBase<Autodiff> {
  using Base::Base;

  // The rules are attached by the dialect registry extension; asking for it here makes the pass
  // work in any context that loads the model dialect.
  void getDependentDialects(DialectRegistry& registry) const override {
    Base::getDependentDialects(registry);
    model::registerDifferentiableOpInterfaces(registry);
  }

  void runOnOperation() override {
    func::FuncOp func = getOperation();
    if (func.getSymName() != functionName) return;
    if (func.isExternal()) {
      func.emitError() << "function '" << functionName << "' has no body to differentiate";
      return signalPassFailure();
    }
    if (!llvm::hasSingleElement(func.getBody())) {
      func.emitError() << "hcp-autodiff differentiates straight-line code; '" << functionName
                       << "' has " << func.getBody().getBlocks().size() << " blocks";
      return signalPassFailure();
    }
    Block& block = func.front();
    auto ret = dyn_cast<func::ReturnOp>(block.getTerminator());
    auto lossType = ret && ret.getNumOperands() == 1
                        ? dyn_cast<RankedTensorType>(ret.getOperand(0).getType())
                        : RankedTensorType();
    if (!lossType || lossType.getRank() != 0 || !isa<FloatType>(lossType.getElementType())) {
      func.emitError() << "function '" << functionName
                       << "' must return exactly one scalar loss (a 0-d float tensor)";
      return signalPassFailure();
    }
    SmallVector<Operation*> forward;
    for (Operation& op : block.without_terminator()) {
      if (op.getNumRegions() != 0) {
        op.emitOpError() << "has regions: hcp-autodiff differentiates straight-line code only";
        return signalPassFailure();
      }
      if (isa<model::ParamGradOp>(op)) {
        op.emitOpError() << "'" << functionName
                         << "' already has parameter gradients: hcp-autodiff runs once";
        return signalPassFailure();
      }
      forward.push_back(&op);
    }

    Differentiator differentiator(func, ret);
    if (failed(differentiator.run(forward, ret.getOperand(0)))) return signalPassFailure();
    numParamGrads += differentiator.numParamGrads();
    numBackwardOps += differentiator.numBackwardOps();
  }
};

}  // namespace
}  // namespace hcp
