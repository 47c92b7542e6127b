// One place that registers every dialect and pass of hybridcp, for every tool. (MLIR's
// register-everything helpers would pull in all of MLIR.)
#pragma once

#include "mlir/IR/DialectRegistry.h"

namespace hcp {

void registerHybridcpDialects(mlir::DialectRegistry& registry);
void registerHybridcpPasses();

}  // namespace hcp
