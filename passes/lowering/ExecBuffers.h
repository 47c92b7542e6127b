// Helpers the lowering passes share for reasoning about exec buffers.
#pragma once

#include <cstdint>
#include <vector>

#include "dialects/exec/ExecOps.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/STLFunctionalExtras.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"

namespace hcp {

// The buffer a value is, through its views (null for anything else).
inline exec::BufferOp rootOf(mlir::Value value) {
  while (auto view = value.getDefiningOp<exec::ViewOp>()) value = view.getSource();
  return value.getDefiningOp<exec::BufferOp>();
}

inline bool isKernel(exec::LaunchOp launch, llvm::StringRef kernel) {
  return launch && launch.getKernel() == kernel;
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
  llvm::DenseMap<mlir::Operation*, int64_t> position_;
  llvm::DenseMap<mlir::Operation*, std::vector<Touch>> touches_;
};

// Moves the buffer and views that define `value` before `op` where they come after it (where
// a buffer is declared does not matter: hcp-plan-memory places it by the launches touching it).
void defineBefore(mlir::Value value, mlir::Operation* op);

// Erases views and buffers nothing uses any more.
void eraseDeadBuffers(mlir::func::FuncOp func);

// Offers every launch of `func`, in order, to `tryFold`, which returns whether it rewrote
// something there; after each rewrite the accesses are taken again and the offers start over,
// until nothing folds (a rewrite must leave nothing `tryFold` would rewrite again where it was,
// so this ends). Then the buffers nothing
// uses any more are erased.
void foldUntilDone(mlir::func::FuncOp func,
                   llvm::function_ref<bool(exec::LaunchOp, const Accesses&)> tryFold);

}  // namespace hcp
