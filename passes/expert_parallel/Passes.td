// Expert parallelism: split the experts of every MoE layer over the ep group. Run on the
// per-rank forward program after the context-parallel stages, before hcp-autodiff: the backward
// of the inserted all-to-alls is their transpose (dist.moe_experts_grad).
#ifndef HYBRIDCP_EXPERT_PARALLEL_PASSES_TD
#define HYBRIDCP_EXPERT_PARALLEL_PASSES_TD

include "mlir/Pass/PassBase.td"

def InsertExpertParallel : Pass<"hcp-insert-expert-parallel", "mlir::ModuleOp"> {
  let summary = "every MoE layer's experts split over the ep group, tokens sent to their experts";
  let description = [{
    Every model.moe_experts becomes dist.moe_experts over this rank's experts: its two weight
    parameters become `model.param ... shards ep` of [E/ep, ...] (rows [i*E/ep, (i+1)*E/ep) of the
    checkpoint tensor for expert index i = world rank % ep, so the checkpoint name and shape stay
    known), and the op sends each (token, slot) to the rank of the ep group that owns its expert
    and combines what comes back with the gates. The routing (model.moe_route) stays local and
    unchanged: it picks among all E experts by global id. The module's mesh (hcp-set-mesh) must
    have this ep. Fails, in the user's terms, when ep does not divide a layer's experts ("64
    experts cannot be split over ep=5 ranks") and when ep > 1 meets a model without experts.
  }];
  let options = [
    Option<"ep", "ep", "int64_t", /*default=*/"1",
           "ranks the experts are split over (consecutive world ranks; 1: nothing to do)">
  ];
  let statistics = [
    Statistic<"numLayers", "moe-layers", "MoE layers split over the ep group">
  ];
  let dependentDialects = ["::hcp::dist::DistDialect", "::hcp::model::ModelDialect"];
}

#endif  // HYBRIDCP_EXPERT_PARALLEL_PASSES_TD
