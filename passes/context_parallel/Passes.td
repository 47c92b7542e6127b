// Context parallelism: split the sequence over cp ranks and insert the communication each
// layer kind needs. Run on the imported (forward) program, before hcp-autodiff: the backward
// of every inserted collective is its transpose.
#ifndef HYBRIDCP_CONTEXT_PARALLEL_PASSES_TD
#define HYBRIDCP_CONTEXT_PARALLEL_PASSES_TD

include "mlir/IR/EnumAttr.td"
include "mlir/Pass/PassBase.td"

// What hcp-insert-state-scan is asked for: a dist.state_scan strategy, or auto to pick one by cp.
def StateScanChoice : I32Enum<"StateScanChoice", "the state-scan strategy asked for", [
  I32EnumCase<"Auto", 0, "auto">,
  I32EnumCase<"AllGather", 1, "allgather">,
  I32EnumCase<"Chain", 2, "chain">
]> {
  let cppNamespace = "::hcp";
}

def IncomingState : I32Enum<"IncomingState", "how a split scan's outputs get the incoming state", [
  I32EnumCase<"Correct", 0, "correct">,
  I32EnumCase<"Rescan", 1, "rescan">
]> {
  let cppNamespace = "::hcp";
}

def SetMesh : Pass<"hcp-set-mesh", "mlir::ModuleOp"> {
  let summary = "record the ranks the program runs on: cp x dp, with ep groups";
  let description = [{
    Sets the module's `dist.mesh` to `#dist.mesh<cp, dp, ep>`, the one record of the world the
    plan runs on (the runtime checks the number of ranks against it): cp ranks share a sequence,
    dp groups of them run different micro-batches, and every ep consecutive ranks split the
    experts of each MoE layer. The training pipeline runs it first whenever cp * dp > 1 or
    ep > 1. Fails, in the user's terms, on an ep that does not divide cp * dp (whether the
    experts split is hcp-insert-expert-parallel's to check).
  }];
  let options = [
    Option<"cp", "cp", "int64_t", /*default=*/"1", "context-parallel ranks">,
    Option<"dp", "dp", "int64_t", /*default=*/"1", "data-parallel groups of cp ranks">,
    Option<"ep", "ep", "int64_t", /*default=*/"1",
           "expert-parallel ranks (consecutive world ranks) the experts are split over">
  ];
  let dependentDialects = ["::hcp::dist::DistDialect"];
}

def ShardSequence : Pass<"hcp-shard-sequence", "mlir::ModuleOp"> {
  let summary = "give every activation its per-rank sequence length";
  let description = [{
    Records the sequence layout (`dist.sequence`) and, unless hcp-set-mesh did, the mesh
    (`dist.mesh`, cp ranks) on the module and
    retypes the training step to local shapes: token ids, targets and every activation get
    seq / cp tokens; parameters and per-sequence states keep their shapes. Token-local ops
    (projections, norms, MoE, elementwise, embedding, the vocabulary projection) are then
    correct as they stand. The ops that cross shard boundaries (conv1d, the SSD scan,
    attention, the loss) are not yet: the hcp-insert-* passes and hcp-reduce-loss fix each kind,
    and hcp-verify-context-parallel checks that none is left. Fails, before anything changes,
    on a sequence that does not split into the layout's pieces.
  }];
  let options = [
    Option<"cp", "cp", "int64_t", /*default=*/"1", "context-parallel ranks">,
    Option<"layout", "layout", "::hcp::dist::LayoutKind",
           /*default=*/"::hcp::dist::LayoutKind::Contiguous",
           "contiguous (rank r: tokens [r*S/cp, (r+1)*S/cp)) or zigzag (2*cp pieces)">,
    Option<"function", "function", "std::string", /*default=*/"\"train_step\"",
           "the training step">
  ];
  let dependentDialects = ["::hcp::dist::DistDialect"];
}

def InsertHaloExchange : Pass<"hcp-insert-halo-exchange", "mlir::ModuleOp"> {
  let summary = "Mamba2 conv1d: each segment reads the tail of the segment before it";
  let description = [{
    Every causal_conv1d without a halo is rewritten over segment rows ([batch * segments per
    rank, segment length, channels]) with `halo = dist.halo_exchange(x)`: the d_conv - 1 rows
    that precede each segment in the sequence (zeros for the first). Its transpose sends the
    halo's gradient back to the predecessor.
  }];
  let dependentDialects = ["::hcp::dist::DistDialect"];
}

def InsertStateScan : Pass<"hcp-insert-state-scan", "mlir::ModuleOp"> {
  let summary = "Mamba2 SSD: pass the recurrent state from segment to segment";
  let description = [{
    Every ssd_scan without an initial state becomes, over segment rows, with `incoming`:
    - correct (the default): one scan, then a correction by the incoming state
        y0, s_loc = ssd_scan(...): each segment from a zero start;
        g = ssd_log_decay(dt, A);  s_in = dist.state_scan(g, s_loc);
        y = ssd_add_initial_state(y0, dt, A, C, init = s_in).
      The backward runs the scan's backward once (s_loc's gradient enters as its dfinal).
    - rescan: a state-only summary, then the scan from the incoming state
        s_loc = ssd_final_state(x, dt, A, B);  g and s_in as above;
        y = ssd_scan(..., init = s_in).
    Under zigzag the 2*cp pieces are segments in sequence order, so no activation is permuted.
    `strategy`: allgather (every rank gathers all (g, s) summaries: one collective, cp states
    received), chain (send/recv along the segments: cp - 1 hops on the critical path), or auto
    (allgather up to 8 ranks, one NVLink domain; chain beyond).
  }];
  let options = [
    Option<"strategy", "strategy", "::hcp::StateScanChoice",
           /*default=*/"::hcp::StateScanChoice::Auto", "allgather, chain or auto">,
    Option<"incoming", "incoming", "::hcp::IncomingState",
           /*default=*/"::hcp::IncomingState::Correct",
           "how the outputs get the incoming state: correct or rescan">
  ];
  let dependentDialects = ["::hcp::dist::DistDialect", "::hcp::model::ModelDialect"];
}

def InsertRingAttention : Pass<"hcp-insert-ring-attention", "mlir::ModuleOp"> {
  let summary = "attention: K/V blocks travel around the cp ring, merged by log-sum-exp";
  let description = [{
    Every model.attention becomes dist.ring_attention over the rank's local queries (blocks in
    a query piece's future are skipped; zigzag balances the causal work). Its transpose sends
    dK/dV home around the ring.
  }];
  let dependentDialects = ["::hcp::dist::DistDialect"];
}

def ReduceLoss : Pass<"hcp-reduce-loss", "mlir::ModuleOp"> {
  let summary = "the loss is the global sum over valid tokens divided by the global count";
  let description = [{
    Sums each cross-entropy's summed loss (and its valid-token count, where the program reads
    it) over the cp group with dist.all_reduce, so every rank of a sequence computes the same
    loss: the sum of the sequence's per-token losses, scaled by the runtime's 1 / (valid tokens
    of the whole step). Labels were shifted on the full sequence before sharding, so no label
    is lost at shard edges. The MoE load-balancing loss's routing statistics (the operands of
    model.router_aux_loss: each rank's sums over its layers and tokens) are summed over the cp
    group the same way, so the loss is the whole micro-batch's.
  }];
  let dependentDialects = ["::hcp::dist::DistDialect"];
}

def VerifyContextParallel : Pass<"hcp-verify-context-parallel", "mlir::ModuleOp"> {
  let summary = "check that no op of a sharded program still reads across shard boundaries";
  let description = [{
    In a module with a sequence layout: every conv1d has a halo, every SSD scan takes its
    initial state from dist.state_scan or hands its final state to one, no model.attention is
    left, and cross-entropy sums and counts reach the loss only through dist.all_reduce.
    Names the first op that breaks this.
  }];
}

#endif  // HYBRIDCP_CONTEXT_PARALLEL_PASSES_TD
