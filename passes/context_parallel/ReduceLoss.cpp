// hcp-reduce-loss: every rank computes the global loss of the sequence (and the global routing
// statistics of the load-balancing loss).
#include "dialects/dist/DistOps.h"
#include "dialects/model/ModelOps.h"
#include "passes/context_parallel/Passes.h"

namespace hcp {

#define GEN_PASS_DEF_REDUCELOSS
#include "passes/context_parallel/Passes.h.inc"

namespace {

using namespace mlir;

bool onlyReduced(Value value) {
  return llvm::all_of(value.getUsers(),
                      [](Operation* user) { return isa<dist::AllReduceOp>(user); });
}

struct ReduceLossPass : impl::ReduceLossBase<ReduceLossPass> {
  using Base::Base;

  void runOnOperation() override {
    if (!getOperation()->hasAttr(kSequenceAttr)) return;
    auto group = dist::ReduceGroupAttr::get(&getContext(), dist::ReduceGroup::Cp);
    getOperation().walk([&](model::CrossEntropyOp loss) {
      OpBuilder b(loss->getBlock(), std::next(loss->getIterator()));
      for (Value partial : loss->getResults()) {
        if (partial.use_empty() || onlyReduced(partial)) continue;  // unused or already global
        auto global =
            dist::AllReduceOp::create(b, loss.getLoc(), partial.getType(), partial, group);
        partial.replaceAllUsesExcept(global.getResult(), global);
      }
    });
    // The load-balancing loss combines the routing statistics of the whole micro-batch: the
    // rank's sums (over its layers and tokens) are summed over the ranks before it.
    getOperation().walk([&](model::RouterAuxLossOp aux) {
      OpBuilder b(aux);
      for (OpOperand& operand : aux->getOpOperands()) {
        if (operand.get().getDefiningOp<dist::AllReduceOp>()) continue;  // already global
        operand.set(dist::AllReduceOp::create(b, aux.getLoc(), operand.get().getType(),
                                              operand.get(), group));
      }
    });
  }
};

}  // namespace
}  // namespace hcp
