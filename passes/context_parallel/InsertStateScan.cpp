// hcp-insert-state-scan: each segment's scan starts from the state the segments before it leave.
#include "dialects/dist/DistOps.h"
#include "dialects/model/ModelOps.h"
#include "passes/context_parallel/Passes.h"
#include "passes/context_parallel/Segments.h"

namespace hcp {

#define GEN_PASS_DEF_INSERTSTATESCAN
#include "passes/context_parallel/Passes.h.inc"

namespace {

using namespace mlir;

// All-gather moves cp states to every rank in one collective: best inside one NVLink domain
// (up to 8 GPUs). Beyond that the chain's one state per hop wins.
dist::StateScanStrategy chooseStrategy(StateScanChoice choice, int64_t cp) {
  if (choice == StateScanChoice::Chain) return dist::StateScanStrategy::Chain;
  if (choice == StateScanChoice::AllGather) return dist::StateScanStrategy::AllGather;
  return cp <= 8 ? dist::StateScanStrategy::AllGather : dist::StateScanStrategy::Chain;
}

struct InsertStateScanPass : impl::InsertStateScanBase<InsertStateScanPass> {
  using Base::Base;

  void runOnOperation() override {
    auto layout = getOperation()->getAttrOfType<dist::SequenceLayoutAttr>(kSequenceAttr);
    if (!layout) return;
    auto chosen =
        dist::StateScanStrategyAttr::get(&getContext(), chooseStrategy(strategy, layout.getCp()));
    SmallVector<model::SsdScanOp> scans;
    getOperation().walk([&](model::SsdScanOp op) {
      // Scans already split: the rescan (initial state from dist.state_scan) and a scan whose
      // final state goes into dist.state_scan (this pass's own, or a summary written by hand).
      bool split = op.getInitState() ||
                   llvm::any_of(op.getFinalState().getUsers(),
                                [](Operation* user) { return isa<dist::StateScanOp>(user); });
      if (!split) scans.push_back(op);
    });
    for (model::SsdScanOp scan : scans) {
      if (!scan.getFinalState().use_empty()) {
        scan.emitError() << "the final state of a scan split over ranks is only on the last "
                            "rank; the training step must not read it";
        return signalPassFailure();
      }
      OpBuilder b(scan);
      Location loc = scan.getLoc();
      Value x = toSegmentRows(b, loc, scan.getX(), layout);
      Value dt = toSegmentRows(b, loc, scan.getDt(), layout);
      Value B = toSegmentRows(b, loc, scan.getB(), layout);
      Value C = toSegmentRows(b, loc, scan.getC(), layout);
      // Packed documents: no state passes across a document start (ssd_log_decay gives such a
      // segment -infinity, the correction and the scans stop at the start).
      Value positions =
          scan.getPositions() ? toSegmentRows(b, loc, scan.getPositions(), layout) : Value();
      auto xType = cast<RankedTensorType>(x.getType());
      auto stateType = cast<RankedTensorType>(scan.getFinalState().getType());
      SmallVector<int64_t> rowsState(stateType.getShape());
      rowsState[0] = xType.getShape()[0];
      auto segmentState = RankedTensorType::get(rowsState, stateType.getElementType());
      auto f32 = b.getF32Type();
      auto decayType = RankedTensorType::get({xType.getShape()[0], xType.getShape()[2]}, f32);
      Value g = model::SsdLogDecayOp::create(b, loc, decayType, dt, scan.getA(), positions);
      Value y;
      if (incoming == IncomingState::Correct) {
        // 1. Each segment scanned once from a zero start: its outputs and final state.
        auto local = model::SsdScanOp::create(b, loc, xType, segmentState, x, dt, scan.getA(), B, C,
                                              scan.getD(), /*init_state=*/Value(), positions,
                                              scan.getChunkSizeAttr());
        // 2. The state entering each segment, from every segment before it.
        Value in = dist::StateScanOp::create(b, loc, segmentState, g, local.getFinalState(), layout,
                                             chosen);
        // 3. The outputs that state adds.
        y = model::SsdAddInitialStateOp::create(b, loc, xType, local.getY(), dt, scan.getA(), C, in,
                                                positions);
      } else {
        // 1. Each segment's summary: its final state from a zero start, the state only.
        Value local = model::SsdFinalStateOp::create(b, loc, segmentState, x, dt, scan.getA(), B,
                                                     positions, scan.getChunkSizeAttr());
        Value in = dist::StateScanOp::create(b, loc, segmentState, g, local, layout, chosen);
        // 3. The scan again, from the true incoming state.
        y = model::SsdScanOp::create(b, loc, xType, segmentState, x, dt, scan.getA(), B, C,
                                     scan.getD(), in, positions, scan.getChunkSizeAttr())
                .getY();
      }
      scan.getY().replaceAllUsesWith(fromSegmentRows(b, loc, y, scan.getY().getType()));
      scan.erase();
    }
  }
};

}  // namespace
}  // namespace hcp
