#include "compiler/Registration.h"

#include "compiler/pipeline/TrainingPipeline.h"
#include "dialects/dist/DistDialect.h"
#include "dialects/exec/ExecDialect.h"
#include "dialects/model/ModelAutodiff.h"
#include "dialects/model/ModelDialect.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "passes/autodiff/Passes.h"
#include "passes/context_parallel/Passes.h"
#include "passes/expert_parallel/Passes.h"
#include "passes/lowering/Passes.h"

namespace hcp {

void registerHybridcpDialects(mlir::DialectRegistry& registry) {
  registry
      .insert<model::ModelDialect, dist::DistDialect, exec::ExecDialect, mlir::func::FuncDialect>();
  model::registerDifferentiableOpInterfaces(registry);
}

void registerHybridcpPasses() {
  registerAutodiffPasses();
  registerContextParallelPasses();
  registerExpertParallelPasses();
  registerLoweringPasses();
  registerTrainingPipeline();
}

}  // namespace hcp
