// hybridcp-opt: the mlir-opt of this project, with our dialects and passes, for lit tests and
// debugging.
#include "compiler/Registration.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"

int main(int argc, char** argv) {
  mlir::DialectRegistry registry;
  hcp::registerHybridcpDialects(registry);
  hcp::registerHybridcpPasses();
  return mlir::asMainReturnCode(
      mlir::MlirOptMain(argc, argv, "hybridcp optimizer driver\n", registry));
}
