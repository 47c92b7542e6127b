// Helpers the lowering passes share for reasoning about exec buffers.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "dialects/exec/ExecOps.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/STLFunctionalExtras.h"
#include "llvm/ADT/SmallVector.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"

namespace hcp {

// The buffer a value is, through its views (null for anything else).
inline exec::BufferOp rootOf(mlir::Value value) {
  while (auto view = value.getDefiningOp<exec::ViewOp>()) value = view.getSource();
  return value.getDefiningOp<exec::BufferOp>();
}

// Where a value starts in its buffer, in elements: the sum of its views' offsets.
inline int64_t elementOffsetOf(mlir::Value value) {
  int64_t offset = 0;
  while (auto view = value.getDefiningOp<exec::ViewOp>()) {
    if (std::optional<uint64_t> viewOffset = view.getOffset())
      offset += static_cast<int64_t>(*viewOffset);
    value = view.getSource();
  }
  return offset;
}

// The element count of a buffer or view.
inline int64_t elementsOf(mlir::Value value) {
  return mlir::cast<mlir::MemRefType>(value.getType()).getNumElements();
}

// A buffer's size in bytes.
inline int64_t bytesOf(exec::BufferOp buffer) {
  mlir::MemRefType type = buffer.getType();
  return type.getNumElements() * ((type.getElementTypeBitWidth() + 7) / 8);
}

// Who touches each buffer, in step order: the launches (and results) that read or write it
// directly or through a view.
class Accesses {
 public:
  struct Touch {
    int64_t index;
    bool write;
    mlir::Operation* op;
  };

  explicit Accesses(mlir::func::FuncOp func);

  int64_t position(mlir::Operation* op) const { return position_.lookup(op); }

  // The op at each position, in step order (null where a forgotten op was).
  int64_t size() const { return static_cast<int64_t>(opAt_.size()); }
  mlir::Operation* at(int64_t index) const { return opAt_[index]; }

  // Keeping the accesses current through a rewrite (taking them again would cost the whole
  // function per rewrite): `forget` an op that goes, before it is erased; `replace` one by the op
  // that takes its place (a new one, or itself with new operands).
  void forget(mlir::Operation* op);
  void replace(mlir::Operation* op, mlir::Operation* replacement);

  // Moves the buffer and views that define `value` before `op` (a launch) where they come after
  // it (where a buffer is declared does not matter: hcp-plan-memory places it by the launches
  // touching it). Without asking the block for its order, which every move invalidates.
  void defineBefore(mlir::Value value, mlir::Operation* op);

  // Every touch of `value`'s buffer, in step order (none for a value that is not a buffer).
  std::vector<Touch> touches(mlir::Value value) const;

  // The one launch other than `writer` that touches `value`'s buffer, if it only reads it, comes
  // after `writer`, and no other op touches it (nor does `writer` read it).
  exec::LaunchOp soleReader(mlir::Value value, exec::LaunchOp writer) const;

  // Every op after `writer` that touches `value`'s activation buffer, if `writer` is the first
  // to touch it, all the others only read it, and there is at least one.
  std::vector<exec::LaunchOp> onlyReaders(mlir::Value value, exec::LaunchOp writer) const;

  // Whether any op in positions [from, to) writes `value`'s buffer (reads too when `any`).
  bool touchedBetween(mlir::Value value, int64_t from, int64_t to, bool any) const;

 private:
  void record(mlir::Operation* op, int64_t index);
  // For a buffer or view: the position of the first other op after it (size() if none).
  int64_t slotOf(mlir::Operation* def);

  llvm::DenseMap<mlir::Operation*, int64_t> position_;
  std::vector<mlir::Operation*> opAt_;
  llvm::DenseMap<mlir::Operation*, std::vector<Touch>> touches_;
  llvm::DenseMap<mlir::Operation*, llvm::SmallVector<mlir::Operation*, 4>> buffersOf_;
  llvm::DenseMap<mlir::Operation*, int64_t> slot_;  // buffers and views
};

// Erases views and buffers nothing uses any more.
void eraseDeadBuffers(mlir::func::FuncOp func);

// Offers every launch of `func`, in order, to `tryFold`, which returns whether it rewrote
// something there, keeping `accesses` current (Accesses::forget and record); the offers go on
// after the rewrite, and sweeps over the function repeat until one folds nothing (a rewrite must
// leave nothing `tryFold` would rewrite again where it was, so this ends). A launch a rewrite
// puts at a later position is offered in the same sweep, at an earlier one in the next. Then the
// buffers nothing uses any more are erased.
void foldUntilDone(mlir::func::FuncOp func,
                   llvm::function_ref<bool(exec::LaunchOp, Accesses&)> tryFold);

}  // namespace hcp
