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

}  // namespace hcp::model::checks
