// hcp-reduce-loss: every rank computes the global loss of the sequence.
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
  }
};

}  // namespace
}  // namespace hcp
