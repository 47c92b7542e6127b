// Helpers the lowering passes share for reasoning about exec buffers.
#pragma once

#include "dialects/exec/ExecOps.h"

namespace hcp {

// The buffer a value is, through its views (null for anything else).
inline exec::BufferOp rootOf(mlir::Value value) {
  while (auto view = value.getDefiningOp<exec::ViewOp>()) value = view.getSource();
  return value.getDefiningOp<exec::BufferOp>();
}

}  // namespace hcp
