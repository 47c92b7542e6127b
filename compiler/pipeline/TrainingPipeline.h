// The compiler's stages for one training step, from the imported `model` module to an `exec`
// module ready to be written as a plan.
#pragma once

#include <cstdint>

#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassOptions.h"
#include "passes/context_parallel/Passes.h"

namespace hcp {

struct TrainingPipelineOptions : mlir::PassPipelineOptions<TrainingPipelineOptions> {
  Option<int64_t> cp{*this, "cp", llvm::cl::desc("context-parallel ranks"), llvm::cl::init(1)};
  Option<int64_t> dp{*this, "dp", llvm::cl::desc("data-parallel groups of cp ranks"),
                     llvm::cl::init(1)};
  Option<int64_t> ep{*this, "ep",
                     llvm::cl::desc("ranks the experts are split over (divides cp * dp)"),
                     llvm::cl::init(1)};
  Option<dist::LayoutKind> layout{*this, "layout", llvm::cl::desc("contiguous or zigzag"),
                                  llvm::cl::init(dist::LayoutKind::Contiguous)};
  Option<StateScanChoice> stateScan{*this, "state-scan", llvm::cl::desc("allgather, chain or auto"),
                                    llvm::cl::init(StateScanChoice::Auto)};
  Option<IncomingState> incomingState{
      *this, "incoming-state",
      llvm::cl::desc("how a split Mamba scan gets its incoming state: correct or rescan"),
      llvm::cl::init(IncomingState::Correct)};
  Option<bool> recompute{*this, "recompute",
                         llvm::cl::desc("recompute each layer's activations in the backward"),
                         llvm::cl::init(false)};
  Option<bool> fuseConvSilu{
      *this, "fuse-conv-silu",
      llvm::cl::desc("fold the SiLU after each causal conv1d into the conv (hcp-fuse-conv-silu)"),
      llvm::cl::init(false)};
  Option<bool> recomputeAttention{
      *this, "recompute-attention",
      llvm::cl::desc("with recompute: recompute attention's output too instead of keeping it"),
      llvm::cl::init(false)};
  Option<bool> recomputeExpertH{
      *this, "recompute-expert-h",
      llvm::cl::desc("recompute the MoE experts' first product in the backward instead of "
                     "keeping it from the forward (skips hcp-keep-expert-h)"),
      llvm::cl::init(false)};
  Option<bool> recomputeSsdStates{
      *this, "recompute-ssd-states",
      llvm::cl::desc("recompute the Mamba scan's chunk states in the backward instead of keeping "
                     "them from the forward (skips hcp-keep-ssd-states)"),
      llvm::cl::init(false)};
};

// [the mesh (cp x dp, ep)] -> [context parallelism: shard the sequence, halo exchange, state
// scan, ring attention, loss over ranks, verify] -> [expert parallelism] -> autodiff ->
// [recompute] -> lower to exec kernels -> GEMM epilogues -> [conv + SiLU] -> [the experts' h
// kept] -> [the scans' chunk states kept] -> collectives beside compute -> plan memory. The
// bracketed stages run only where they have work: the mesh when cp * dp > 1 or ep > 1, context
// parallelism for a split sequence (cp > 1 or zigzag), expert parallelism for ep > 1,
// recomputation and the conv's SiLU fold when asked for, the experts' kept h and the scans' kept
// states unless asked not to. The pass manager
// verifies the module after every pass. Parameter gradients stay per rank: the runtime sums each
// over the ranks that hold a copy once per optimizer step, after gradient accumulation.
void buildTrainingPipeline(mlir::OpPassManager& pm, const TrainingPipelineOptions& options);

// The forward per-rank program: the mesh, context- and expert-parallel stages only.
void buildContextParallelPipeline(mlir::OpPassManager& pm, const TrainingPipelineOptions& options);

// Registers `hcp-training-pipeline` and `hcp-context-parallel-pipeline` for hybridcp-opt.
void registerTrainingPipeline();

}  // namespace hcp
