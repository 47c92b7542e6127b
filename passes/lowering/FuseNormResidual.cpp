// hcp-fuse-norm-residual: the residual stream's gradient added to an RMSNorm's input gradient
// goes into the norm's backward (its has_residual flag).
#include <optional>

#include "dialects/exec/ExecOps.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "passes/lowering/ExecBuffers.h"
#include "passes/lowering/LaunchArgs.h"
#include "passes/lowering/Passes.h"

namespace hcp {

#define GEN_PASS_DEF_FUSENORMRESIDUAL
#include "passes/lowering/Passes.h.inc"

namespace {

using namespace mlir;

using NormArgs = plan::RmsNormBackwardArgs<Value>;

int64_t elementsOf(Value value) { return cast<MemRefType>(value.getType()).getNumElements(); }

// Folds the add that is the only reader of `launch`'s dx, if `launch` is an rms_norm.backward
// without a residual yet and the fold is safe (see Passes.td). Returns whether it folded.
bool foldResidual(exec::LaunchOp launch, Accesses& accesses) {
  std::optional<NormArgs> norm = decodeLaunch<plan::RmsNormBackwardArgs>(launch);
  if (!norm || norm->has_residual) return false;
  const int64_t elements = norm->rows * norm->dim;
  if (elementsOf(norm->dx) != elements) return false;
  exec::LaunchOp next = accesses.soleReader(norm->dx, launch);
  std::optional<plan::AddArgs<Value>> add = decodeLaunch<plan::AddArgs>(next);
  if (!add || add->n != elements || add->rhs_n != elements) return false;
  if (rootOf(add->a) == rootOf(add->b)) return false;
  const Value residual = rootOf(add->a) == rootOf(norm->dx) ? add->b : add->a;
  if (elementsOf(residual) != elements || elementsOf(add->y) != elements) return false;
  // The norm reads the residual and writes the sum where it ran: both must hold there what the
  // add read and nothing may look at the sum's buffer in between, which is none of the norm's
  // operands.
  const int64_t from = accesses.position(launch), to = accesses.position(next);
  if (accesses.touchedBetween(residual, from + 1, to, /*any=*/false) ||
      accesses.touchedBetween(add->y, from, to, /*any=*/true)) {
    return false;
  }
  exec::BufferOp sum = rootOf(add->y);
  for (Value operand : {norm->dy, norm->x, norm->w, norm->dw, residual}) {
    if (rootOf(operand) == sum) return false;
  }
  if (rootOf(residual) == rootOf(norm->dw)) return false;
  accesses.defineBefore(residual, launch);
  accesses.defineBefore(add->y, launch);
  norm->has_residual = true;
  norm->dresidual = residual;
  norm->dx = add->y;
  updateLaunch(launch, *norm);
  accesses.replace(launch, launch);
  accesses.forget(next);
  next.erase();
  return true;
}

struct FuseNormResidualPass : impl::FuseNormResidualBase<FuseNormResidualPass> {
  void runOnOperation() override {
    for (auto func : getOperation().getOps<func::FuncOp>()) {
      foldUntilDone(func, [&](exec::LaunchOp launch, Accesses& accesses) {
        if (!foldResidual(launch, accesses)) return false;
        ++fusedResiduals;
        return true;
      });
    }
  }
};

}  // namespace
}  // namespace hcp
