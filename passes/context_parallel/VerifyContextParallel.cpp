// hcp-verify-context-parallel: nothing in a sharded program still reads across a shard edge.
#include "dialects/dist/DistOps.h"
#include "dialects/model/ModelOps.h"
#include "passes/context_parallel/Passes.h"

namespace hcp {

#define GEN_PASS_DEF_VERIFYCONTEXTPARALLEL
#include "passes/context_parallel/Passes.h.inc"

namespace {

using namespace mlir;

bool feedsStateScan(Value state) {
  return llvm::any_of(state.getUsers(),
                      [](Operation* user) { return isa<dist::StateScanOp>(user); });
}

LogicalResult check(Operation* op) {
  if (auto conv = dyn_cast<model::CausalConv1dOp>(op); conv && !conv.getHalo())
    return conv.emitError() << "conv1d of a sharded program without a halo exchange "
                               "(run hcp-insert-halo-exchange)";
  if (auto scan = dyn_cast<model::SsdScanOp>(op)) {
    bool fromScan = scan.getInitState() && scan.getInitState().getDefiningOp<dist::StateScanOp>();
    if (!fromScan && !feedsStateScan(scan.getFinalState()))
      return scan.emitError() << "SSD scan of a sharded program without state passing "
                                 "(run hcp-insert-state-scan)";
    // A segment scanned from a zero start: its outputs lack the incoming state's part.
    if (!scan.getInitState() && llvm::any_of(scan.getY().getUsers(), [](Operation* user) {
          return !isa<model::SsdAddInitialStateOp>(user);
        }))
      return scan.emitError() << "the outputs of an SSD scan from a zero start are used without "
                                 "the incoming state's part (model.ssd_add_initial_state)";
  }
  if (isa<model::AttentionOp>(op))
    return op->emitError() << "attention of a sharded program sees only local keys "
                              "(run hcp-insert-ring-attention)";
  if (isa<model::CrossEntropyOp>(op)) {
    for (Value partial : op->getResults()) {
      for (Operation* user : partial.getUsers()) {
        if (!isa<dist::AllReduceOp>(user))
          return op->emitError() << "a rank's partial loss is used without summing it over the "
                                    "ranks (run hcp-reduce-loss)";
      }
    }
  }
  if (isa<model::RouterAuxLossOp>(op)) {
    for (Value stats : op->getOperands()) {
      if (!stats.getDefiningOp<dist::AllReduceOp>())
        return op->emitError() << "the load-balancing loss reads a rank's routing statistics "
                                  "without summing them over the ranks (run hcp-reduce-loss)";
    }
  }
  return success();
}

struct VerifyContextParallelPass : impl::VerifyContextParallelBase<VerifyContextParallelPass> {
  using Base::Base;

  void runOnOperation() override {
    if (!getOperation()->hasAttr(kSequenceAttr)) return;
    WalkResult result = getOperation().walk([](Operation* op) {
      return failed(check(op)) ? WalkResult::interrupt() : WalkResult::advance();
    });
    if (result.wasInterrupted()) signalPassFailure();
  }
};

}  // namespace
}  // namespace hcp
