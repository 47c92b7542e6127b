// Helpers the `model` dialect's verifiers share (ModelOps.cpp, ModelGradOps.cpp): shape checks
// whose messages name the quantity in the model's terms ("B must have shape [2, 8, 1, 16], got
// ...").
#pragma once

#include <string>

#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Operation.h"

namespace hcp::model::checks {

inline mlir::RankedTensorType tensorType(mlir::Value value) {
  return mlir::cast<mlir::RankedTensorType>(value.getType());
}
inline llvm::ArrayRef<int64_t> shapeOf(mlir::Value value) { return tensorType(value).getShape(); }

// "[2, 8192, 1536]" for messages.
std::string formatShape(llvm::ArrayRef<int64_t> shape);
// `shape` with its last dim replaced.
llvm::SmallVector<int64_t> withLastDim(llvm::ArrayRef<int64_t> shape, int64_t last);

// `value` has rank `rank` and a static shape.
mlir::LogicalResult expectRank(mlir::Operation* op, mlir::Value value, int64_t rank,
                               llvm::StringRef what);
mlir::LogicalResult expectShape(mlir::Operation* op, mlir::Value value,
                                llvm::ArrayRef<int64_t> expected, llvm::StringRef what);
// Packed documents: `positions` (null: none) is [batch, seq] of `like` [batch, seq, ...].
mlir::LogicalResult expectPositions(mlir::Operation* op, mlir::Value positions, mlir::Value like);
mlir::LogicalResult expectSameElementType(mlir::Operation* op, mlir::Value a, mlir::Value b,
                                          llvm::StringRef whatA, llvm::StringRef whatB);

// The sizes of an SSD scan's operands: x [batch, seq, heads, head_dim], B [batch, seq, groups,
// state], dt [batch, seq, heads], A [heads], groups dividing heads. The scan ops and their
// gradients check these alike (verifySsdOperands); the state shape is stateShape().
struct SsdDims {
  int64_t batch, seq, heads, headDim, groups, state;
  llvm::SmallVector<int64_t> stateShape() const { return {batch, heads, headDim, state}; }
};
// `x` [batch, seq, heads, head_dim] and `B` [batch, seq, groups, state] as the scan's (named
// `xName` and `bName` in the messages), dt [batch, seq, heads], A [heads].
mlir::FailureOr<SsdDims> verifySsdOperands(mlir::Operation* op, mlir::Value x, mlir::Value dt,
                                           mlir::Value A, mlir::Value B,
                                           llvm::StringRef xName = "x",
                                           llvm::StringRef bName = "B");
// model.ssd_add_initial_state's operands (and its gradient's): y [batch, seq, heads, head_dim],
// dt, A and C as the scan's, init_state [batch, heads, head_dim, state] in f32.
mlir::FailureOr<SsdDims> verifyInitialStateOperands(mlir::Operation* op, mlir::Value y,
                                                    mlir::Value dt, mlir::Value A, mlir::Value C,
                                                    mlir::Value initState);

}  // namespace hcp::model::checks
