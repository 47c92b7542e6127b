#include "compiler/Registration.h"

#include "dialects/exec/ExecDialect.h"
#include "dialects/model/ModelDialect.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"

namespace hcp {

void registerHybridcpDialects(mlir::DialectRegistry& registry) {
  registry.insert<model::ModelDialect, exec::ExecDialect, mlir::func::FuncDialect>();
}

void registerHybridcpPasses() {}

}  // namespace hcp
