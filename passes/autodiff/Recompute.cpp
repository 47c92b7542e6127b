// hcp-recompute: activation recomputation, one decoder layer at a time.
//
// After hcp-autodiff the backward reads forward values directly, so every activation of every
// layer stays alive from the forward to its layer's backward: peak memory grows with the depth.
// This pass keeps only each layer's checkpoints and recomputes the rest where the backward needs
// it. For each decoder layer L (the forward ops whose location is "model.layers.L. ..."):
//   - a value of L that a forward op outside L reads (the residual stream between layers) is a
//     checkpoint and stays as it is; so do parameters, inputs and values outside any layer;
//   - every other value of L that the backward reads is computed again by a clone of the forward
//     ops it needs (only those), placed right before the first backward op that reads a value of
//     L, and the backward reads the clones.
// The forward values then die inside the layer's forward, and the clones inside its backward,
// which hcp-plan-memory turns into a lower peak. The clones are the same ops on the same inputs,
// so the step's results do not change. Collectives inside a layer (halo exchange, state scan,
// ring attention, expert all-to-alls) run again with their ops; attention's own results are kept
// (Passes.td).
#include <optional>
#include <string>

#include "dialects/dist/DistOps.h"
#include "dialects/model/ModelOps.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/MapVector.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "passes/autodiff/Passes.h"

namespace hcp {

#define GEN_PASS_DEF_RECOMPUTE
#include "passes/autodiff/Passes.h.inc"

namespace {

using namespace mlir;

// The layer index of a forward op from its location ("model.layers.12.mamba" -> 12).
std::optional<int64_t> layerOf(Operation* op) {
  auto name = dyn_cast<NameLoc>(op->getLoc());
  if (!name) return std::nullopt;
  StringRef text = name.getName().getValue();
  if (!text.consume_front("model.layers.")) return std::nullopt;
  int64_t layer = 0;
  if (text.consumeInteger(10, layer) || !text.starts_with(".")) return std::nullopt;
  return layer;
}

class Recomputation {
 public:
  Recomputation(func::FuncOp func, bool recomputeAttention)
      : func_(func), recomputeAttention_(recomputeAttention) {}

  LogicalResult run(int64_t& clonedOps) {
    Block& body = func_.getBody().front();
    auto ret = dyn_cast<func::ReturnOp>(body.getTerminator());
    if (!ret || ret.getNumOperands() != 1 || !ret.getOperand(0).getDefiningOp())
      return func_.emitError() << "hcp-recompute expects a training step that returns its loss";
    // The forward ends with the op that computes the returned loss (hcp-autodiff appends the
    // backward after it).
    Operation* lastForward = ret.getOperand(0).getDefiningOp();
    bool inForward = true;
    for (Operation& op : body) {
      if (inForward) {
        forward_.insert(&op);
        if (std::optional<int64_t> layer = layerOf(&op); layer && !isa<model::ParamOp>(op))
          layers_[*layer].push_back(&op);
      } else if (!isa<func::ReturnOp>(op)) {
        backward_.push_back(&op);
      }
      if (&op == lastForward) inForward = false;
    }
    // The backward's reads of each layer's values, in program order: one walk over the backward
    // for all layers (one per layer would make the pass quadratic in the layers).
    DenseMap<Operation*, int64_t> layerOfOp;
    for (auto& [layer, ops] : layers_) {
      for (Operation* op : ops) layerOfOp[op] = layer;
    }
    DenseMap<int64_t, SmallVector<OpOperand*>> backwardReads;
    for (Operation* op : backward_) {
      for (OpOperand& operand : op->getOpOperands()) {
        auto layer = layerOfOp.find(operand.get().getDefiningOp());
        if (layer != layerOfOp.end()) backwardReads[layer->second].push_back(&operand);
      }
    }
    for (auto& [layer, ops] : layers_) clonedOps += recomputeLayer(ops, backwardReads[layer]);
    return success();
  }

 private:
  // Clones what the backward needs of one layer's forward, given the backward's reads of the
  // layer's values; returns how many ops it cloned.
  int64_t recomputeLayer(ArrayRef<Operation*> ops, ArrayRef<OpOperand*> reads) {
    DenseSet<Operation*> inLayer(ops.begin(), ops.end());
    // Checkpoints: values of the layer that forward ops outside it read.
    DenseSet<Value> checkpoints;
    for (Operation* op : ops) {
      for (Value result : op->getResults()) {
        for (Operation* user : result.getUsers()) {
          if (forward_.contains(user) && !inLayer.contains(user)) checkpoints.insert(result);
        }
      }
    }
    // Attention's output and log-sum-exp (Passes.td says why).
    if (!recomputeAttention_) {
      for (Operation* op : ops) {
        if (!isa<model::AttentionOp, dist::RingAttentionOp>(op)) continue;
        for (Value result : op->getResults()) checkpoints.insert(result);
      }
    }
    auto recomputed = [&](Value value) {
      Operation* def = value.getDefiningOp();
      return def && inLayer.contains(def) && !checkpoints.contains(value);
    };
    // The values the backward reads, and the first backward op that reads one.
    Operation* firstUse = nullptr;
    SmallVector<Value> wanted;
    DenseSet<Value> seen;
    for (OpOperand* read : reads) {
      Value operand = read->get();
      if (!recomputed(operand)) continue;
      if (!firstUse) firstUse = read->getOwner();
      if (seen.insert(operand).second) wanted.push_back(operand);
    }
    if (!firstUse) return 0;
    // The ops those values need, within the layer.
    DenseSet<Operation*> needed;
    SmallVector<Value> work(wanted);
    while (!work.empty()) {
      Value value = work.pop_back_val();
      Operation* def = value.getDefiningOp();
      if (!needed.insert(def).second) continue;
      for (Value operand : def->getOperands()) {
        if (recomputed(operand)) work.push_back(operand);
      }
    }
    // Clone them in program order before the first use, then point the backward at the clones.
    OpBuilder builder(firstUse);
    IRMapping mapping;
    int64_t cloned = 0;
    for (Operation* op : ops) {
      if (!needed.contains(op)) continue;
      builder.clone(*op, mapping);
      ++cloned;
    }
    for (OpOperand* read : reads) {
      if (recomputed(read->get())) read->set(mapping.lookup(read->get()));
    }
    return cloned;
  }

  func::FuncOp func_;
  bool recomputeAttention_;
  DenseSet<Operation*> forward_;
  SmallVector<Operation*> backward_;
  // Forward ops per layer, in program order (MapVector: layers in order, for stable output).
  llvm::MapVector<int64_t, SmallVector<Operation*>> layers_;
};

struct RecomputePass : impl::RecomputeBase<RecomputePass> {
  using RecomputeBase::RecomputeBase;

  void runOnOperation() override {
    func::FuncOp func = getOperation();
    if (func.getName() != functionName) return;
    int64_t cloned = 0;
    if (failed(Recomputation(func, recomputeAttention).run(cloned))) return signalPassFailure();
    numClonedOps += cloned;
  }
};

}  // namespace
}  // namespace hcp
