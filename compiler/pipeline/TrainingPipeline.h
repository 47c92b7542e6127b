// The compiler's stages for one training step, from the imported `model` module to an `exec`
// module ready to be written as a plan.
#pragma once

#include "mlir/Pass/PassManager.h"

namespace hcp {

// autodiff -> lower to exec kernels -> plan memory. The pass manager verifies the module after
// every pass, so a stage that breaks an invariant stops the pipeline there.
void buildTrainingPipeline(mlir::OpPassManager& pm);

// Registers the pipeline as `hcp-training-pipeline` for hybridcp-opt.
void registerTrainingPipeline();

}  // namespace hcp
