#include "dialects/model/VerifyHelpers.h"

#include "llvm/ADT/STLExtras.h"

using namespace mlir;

namespace hcp::model::checks {

std::string formatShape(ArrayRef<int64_t> shape) {
  std::string text = "[";
  for (auto [i, dim] : llvm::enumerate(shape)) {
    if (i) text += ", ";
    text += ShapedType::isDynamic(dim) ? "?" : std::to_string(dim);
  }
  return text + "]";
}

SmallVector<int64_t> withLastDim(ArrayRef<int64_t> shape, int64_t last) {
  SmallVector<int64_t> result(shape);
  result.back() = last;
  return result;
}

LogicalResult expectRank(Operation* op, Value value, int64_t rank, StringRef what) {
  if (tensorType(value).getRank() != rank) {
    return op->emitOpError() << what << " must have rank " << rank << ", got shape "
                             << formatShape(shapeOf(value));
  }
  if (!tensorType(value).hasStaticShape()) {
    return op->emitOpError() << what << " must have a static shape, got "
                             << formatShape(shapeOf(value));
  }
  return success();
}

LogicalResult expectShape(Operation* op, Value value, ArrayRef<int64_t> expected, StringRef what) {
  if (shapeOf(value) != expected) {
    return op->emitOpError() << what << " must have shape " << formatShape(expected) << ", got "
                             << formatShape(shapeOf(value));
  }
  return success();
}

LogicalResult expectPositions(Operation* op, Value positions, Value like) {
  if (!positions) return success();
  ArrayRef<int64_t> shape = shapeOf(like);
  if (shape.size() < 2) return op->emitOpError() << "packed documents need [batch, seq, ...] data";
  return expectShape(op, positions, {shape[0], shape[1]},
                     "document positions (position_ids [batch, seq])");
}

LogicalResult expectSameElementType(Operation* op, Value a, Value b, StringRef whatA,
                                    StringRef whatB) {
  if (tensorType(a).getElementType() != tensorType(b).getElementType()) {
    return op->emitOpError() << whatA << " and " << whatB
                             << " must have the same element type, got "
                             << tensorType(a).getElementType() << " and "
                             << tensorType(b).getElementType();
  }
  return success();
}

mlir::FailureOr<SsdDims> verifySsdOperands(mlir::Operation* op, mlir::Value x, mlir::Value dt,
                                           mlir::Value A, mlir::Value B, llvm::StringRef xName,
                                           llvm::StringRef bName) {
  if (mlir::failed(expectRank(op, x, 4, (xName + " [batch, seq, heads, head_dim]").str())) ||
      mlir::failed(expectRank(op, B, 4, (bName + " [batch, seq, groups, state]").str())))
    return mlir::failure();
  llvm::ArrayRef<int64_t> xs = shapeOf(x), bs = shapeOf(B);
  const SsdDims d{xs[0], xs[1], xs[2], xs[3], bs[2], bs[3]};
  if (bs[0] != d.batch || bs[1] != d.seq)
    return op->emitOpError() << bName << " " << formatShape(bs) << " must match " << xName
                             << "'s batch and sequence " << formatShape(xs.take_front(2));
  if (d.heads % d.groups != 0)
    return op->emitOpError() << d.groups << " groups do not divide " << d.heads << " heads";
  if (mlir::failed(expectShape(op, dt, {d.batch, d.seq, d.heads}, "dt")) ||
      mlir::failed(expectShape(op, A, {d.heads}, "A")))
    return mlir::failure();
  return d;
}

mlir::FailureOr<SsdDims> verifyInitialStateOperands(mlir::Operation* op, mlir::Value y,
                                                    mlir::Value dt, mlir::Value A, mlir::Value C,
                                                    mlir::Value initState) {
  mlir::FailureOr<SsdDims> d = verifySsdOperands(op, y, dt, A, C, "y", "C");
  if (mlir::failed(d) || mlir::failed(expectShape(op, initState, d->stateShape(), "initial state")))
    return mlir::failure();
  if (!tensorType(initState).getElementType().isF32())
    return op->emitOpError() << "initial state must be f32, like the scan's states";
  return d;
}

}  // namespace hcp::model::checks
