// hcp-insert-ring-attention: attention over the whole sequence from local queries.
#include "dialects/dist/DistOps.h"
#include "dialects/model/ModelOps.h"
#include "mlir/IR/Verifier.h"
#include "passes/context_parallel/Passes.h"

namespace hcp {

#define GEN_PASS_DEF_INSERTRINGATTENTION
#include "passes/context_parallel/Passes.h.inc"

namespace {

using namespace mlir;

struct InsertRingAttentionPass : impl::InsertRingAttentionBase<InsertRingAttentionPass> {
  using Base::Base;

  void runOnOperation() override {
    auto layout = getOperation()->getAttrOfType<dist::SequenceLayoutAttr>(kSequenceAttr);
    if (!layout) return;
    SmallVector<model::AttentionOp> attentions;
    getOperation().walk([&](model::AttentionOp op) { attentions.push_back(op); });
    for (model::AttentionOp attention : attentions) {
      OpBuilder b(attention);
      auto ring = dist::RingAttentionOp::create(
          b, attention.getLoc(), attention.getOut().getType(), attention.getLse().getType(),
          attention.getQ(), attention.getK(), attention.getV(), attention.getPositions(), layout,
          attention.getScaleAttr(), attention.getCausalAttr());
      if (failed(mlir::verify(ring))) return signalPassFailure();
      attention.replaceAllUsesWith(ring.getResults());
      attention.erase();
    }
  }
};

}  // namespace
}  // namespace hcp
