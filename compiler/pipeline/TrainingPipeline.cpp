#include "compiler/pipeline/TrainingPipeline.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Pass/PassRegistry.h"
#include "passes/autodiff/Passes.h"
#include "passes/lowering/Passes.h"

namespace hcp {

void buildTrainingPipeline(mlir::OpPassManager& pm) {
  pm.addNestedPass<mlir::func::FuncOp>(createAutodiff());
  pm.addPass(createLowerToExec());
  pm.addPass(createPlanMemory());
}

void registerTrainingPipeline() {
  mlir::PassPipelineRegistration<>(
      "hcp-training-pipeline",
      "model module -> exec module with planned memory (autodiff, lowering, memory planning)",
      [](mlir::OpPassManager& pm) { buildTrainingPipeline(pm); });
}

}  // namespace hcp
