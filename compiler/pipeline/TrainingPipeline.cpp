#include "compiler/pipeline/TrainingPipeline.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Pass/PassRegistry.h"
#include "passes/autodiff/Passes.h"
#include "passes/context_parallel/Passes.h"
#include "passes/expert_parallel/Passes.h"
#include "passes/lowering/Passes.h"

namespace hcp {
namespace {

bool isSplit(const TrainingPipelineOptions& options) {
  return options.cp > 1 || options.layout != dist::LayoutKind::Contiguous;
}

// Context parallelism: the sequence split over cp ranks and what crosses shard edges.
void addSequenceSharding(mlir::OpPassManager& pm, const TrainingPipelineOptions& options) {
  ShardSequenceOptions shard;
  shard.cp = options.cp;
  shard.layout = options.layout;
  pm.addPass(createShardSequence(shard));
  pm.addPass(createInsertHaloExchange());
  InsertStateScanOptions scan;
  scan.strategy = options.stateScan;
  scan.incoming = options.incomingState;
  pm.addPass(createInsertStateScan(scan));
  pm.addPass(createInsertRingAttention());
  pm.addPass(createReduceLoss());
  pm.addPass(createVerifyContextParallel());
}

}  // namespace

void buildContextParallelPipeline(mlir::OpPassManager& pm, const TrainingPipelineOptions& options) {
  // The mesh whenever there is more than one rank (the runtime checks the world against it) or
  // experts to split.
  if (options.cp * options.dp > 1 || options.ep > 1) {
    SetMeshOptions mesh;
    mesh.cp = options.cp;
    mesh.dp = options.dp;
    mesh.ep = options.ep;
    pm.addPass(createSetMesh(mesh));
  }
  if (isSplit(options)) addSequenceSharding(pm, options);
  if (options.ep > 1) {
    InsertExpertParallelOptions experts;
    experts.ep = options.ep;
    pm.addPass(createInsertExpertParallel(experts));
  }
}

void buildTrainingPipeline(mlir::OpPassManager& pm, const TrainingPipelineOptions& options) {
  buildContextParallelPipeline(pm, options);
  pm.addNestedPass<mlir::func::FuncOp>(createAutodiff());
  if (options.recompute) {
    RecomputeOptions recompute;
    recompute.recomputeAttention = options.recomputeAttention;
    pm.addNestedPass<mlir::func::FuncOp>(createRecompute(recompute));
  }
  pm.addPass(createLowerToExec());
  pm.addPass(createFuseGemmEpilogue());
  pm.addPass(createSliceGemms());
  pm.addPass(createFuseNormResidual());
  if (options.fuseConvSilu) pm.addPass(createFuseConvSilu());
  if (!options.recomputeExpertH) pm.addPass(createKeepExpertH());
  if (!options.recomputeSsdStates) pm.addPass(createKeepSsdStates());
  pm.addPass(createOverlapCollectives());
  pm.addPass(createPlanMemory());
}

void registerTrainingPipeline() {
  mlir::PassPipelineRegistration<TrainingPipelineOptions>(
      "hcp-training-pipeline",
      "model module -> exec module with planned memory (context parallelism, autodiff, "
      "lowering, memory planning)",
      buildTrainingPipeline);
  mlir::PassPipelineRegistration<TrainingPipelineOptions>(
      "hcp-context-parallel-pipeline",
      "model module -> the forward per-rank program with its collectives (mesh, context and "
      "expert parallelism)",
      buildContextParallelPipeline);
}

}  // namespace hcp
