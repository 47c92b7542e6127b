// Mamba ops see a rank's segments as batch rows: [batch, segs * len, ...] is the same bytes as
// [batch * segs, len, ...] (row = b * segs + k), so a scan or a conv over the rows treats each
// segment as its own sequence. Shared by the Mamba CP passes.
#pragma once

#include "dialects/dist/DistDialect.h"
#include "dialects/model/ModelOps.h"
#include "mlir/IR/Builders.h"

namespace hcp {

// [batch, local_seq, rest...] -> [batch * segs, len, rest...] (no op when segs is 1).
inline mlir::Value toSegmentRows(mlir::OpBuilder& b, mlir::Location loc, mlir::Value value,
                                 dist::SequenceLayoutAttr layout) {
  auto type = mlir::cast<mlir::RankedTensorType>(value.getType());
  int64_t segs = layout.segmentsPerRank();
  if (segs == 1) return value;
  llvm::SmallVector<int64_t> shape(type.getShape());
  shape[0] *= segs;
  shape[1] /= segs;
  return model::ReshapeOp::create(b, loc, mlir::RankedTensorType::get(shape, type.getElementType()),
                                  value);
}

// Back to `type` ([batch, local_seq, rest...]).
inline mlir::Value fromSegmentRows(mlir::OpBuilder& b, mlir::Location loc, mlir::Value value,
                                   mlir::Type type) {
  if (value.getType() == type) return value;
  return model::ReshapeOp::create(b, loc, type, value);
}

}  // namespace hcp
