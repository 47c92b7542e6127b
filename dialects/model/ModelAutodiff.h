// The backward rule of every forward `model` op, attached as DifferentiableOpInterface external
// models (the rules live in ModelAutodiff.cpp, next to the dialect, not in the pass).
#pragma once

#include "mlir/IR/DialectRegistry.h"

namespace hcp::model {

// Attaches DifferentiableOpInterface to the `model` ops when the dialect loads.
void registerDifferentiableOpInterfaces(mlir::DialectRegistry& registry);

}  // namespace hcp::model
