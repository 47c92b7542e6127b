// hcp-insert-halo-exchange: conv1d over segments, each fed the tail of the segment before it.
#include "dialects/dist/DistOps.h"
#include "dialects/model/ModelOps.h"
#include "mlir/IR/Verifier.h"
#include "passes/context_parallel/Passes.h"
#include "passes/context_parallel/Segments.h"

namespace hcp {

#define GEN_PASS_DEF_INSERTHALOEXCHANGE
#include "passes/context_parallel/Passes.h.inc"

namespace {

using namespace mlir;

struct InsertHaloExchangePass : impl::InsertHaloExchangeBase<InsertHaloExchangePass> {
  using Base::Base;

  void runOnOperation() override {
    auto layout = getOperation()->getAttrOfType<dist::SequenceLayoutAttr>(kSequenceAttr);
    if (!layout) return;  // not sharded: nothing crosses a boundary
    SmallVector<model::CausalConv1dOp> convs;
    getOperation().walk([&](model::CausalConv1dOp op) {
      if (!op.getHalo()) convs.push_back(op);
    });
    for (model::CausalConv1dOp conv : convs) {
      OpBuilder b(conv);
      Location loc = conv.getLoc();
      Value x = toSegmentRows(b, loc, conv.getX(), layout);
      int64_t width = cast<RankedTensorType>(conv.getWeight().getType()).getShape()[2] - 1;
      auto xType = cast<RankedTensorType>(x.getType());
      auto haloType = RankedTensorType::get({xType.getShape()[0], width, xType.getShape()[2]},
                                            xType.getElementType());
      auto halo =
          dist::HaloExchangeOp::create(b, loc, haloType, x, layout, b.getI64IntegerAttr(width));
      if (failed(mlir::verify(halo))) return signalPassFailure();
      // Packed documents: the positions viewed as the same segment rows.
      Value positions =
          conv.getPositions() ? toSegmentRows(b, loc, conv.getPositions(), layout) : Value();
      Value y = model::CausalConv1dOp::create(b, loc, xType, x, conv.getWeight(), conv.getBias(),
                                              halo, positions);
      conv.getResult().replaceAllUsesWith(fromSegmentRows(b, loc, y, conv.getType()));
      conv.erase();
    }
  }
};

}  // namespace
}  // namespace hcp
