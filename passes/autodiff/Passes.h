// Automatic differentiation passes (hcp-autodiff).
#pragma once

#include "dialects/model/ModelDialect.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Pass/Pass.h"

namespace hcp {

#define GEN_PASS_DECL
#include "passes/autodiff/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "passes/autodiff/Passes.h.inc"

}  // namespace hcp
