// Collectives of context parallelism, in the per-rank program. Each carries the sequence layout
// it works under, declares memory effects (so nothing merges or drops a collective: every rank
// must join every one) and implements its transpose for hcp-autodiff.
#ifndef HYBRIDCP_DIST_OPS_TD
#define HYBRIDCP_DIST_OPS_TD

include "dialects/dist/DistDialect.td"
include "dialects/interfaces/DifferentiableOpInterface.td"
include "mlir/Interfaces/SideEffectInterfaces.td"

// Collectives read and write the communication resource: never reordered, merged or dropped.
defvar Dist_Collective = MemoryEffects<[MemRead, MemWrite]>;

def Dist_HaloExchangeOp : Dist_Op<"halo_exchange", [Dist_Collective,
    DeclareOpInterfaceMethods<DifferentiableOpInterface>]> {
  let summary = "each local segment gets the conv-input tail of the segment before it";
  let description = [{
    x [rows, len, channels] is the rank's conv input, one row per (batch row, local segment)
    (row = b * segments_per_rank + k). The result [rows, width, channels] holds, for each row,
    the last `width` rows of the preceding segment of the sequence; zeros for the first segment.
  }];
  let arguments = (ins Dist_FloatTensor:$x, Dist_SequenceLayoutAttr:$layout, I64Attr:$width);
  let results = (outs Dist_FloatTensor:$halo);
  let assemblyFormat = "$x attr-dict `:` type($x) `->` type($halo)";
  let hasVerifier = 1;
}

def Dist_HaloExchangeGradOp : Dist_Op<"halo_exchange_grad", [Dist_Collective]> {
  let summary = "transpose of halo_exchange: halo gradients go back to the segments they came from";
  let description = [{
    dhalo [rows, width, channels] -> dx [rows, len, channels]: the last `width` rows of each
    segment get the halo gradient of the segment after it; all other rows are zero.
  }];
  let arguments = (ins Dist_FloatTensor:$dhalo, Dist_SequenceLayoutAttr:$layout);
  let results = (outs Dist_FloatTensor:$dx);
  let assemblyFormat = "$dhalo attr-dict `:` type($dhalo) `->` type($dx)";
  let hasVerifier = 1;
}

def Dist_StateScanOp : Dist_Op<"state_scan", [Dist_Collective,
    DeclareOpInterfaceMethods<DifferentiableOpInterface>]> {
  let summary = "Mamba2 state passing over the segments of the sequence";
  let description = [{
    g [rows, heads] (each segment's log-decay) and s [rows, heads, head_dim, state] (its final
    state from a zero start) -> s_in (as s), the state entering each segment:
    `s_in[j] = sum_{i<j} exp(g[i+1] + ... + g[j-1]) s[i]`, over segments in sequence order.
  }];
  let arguments = (ins Dist_FloatTensor:$g, Dist_FloatTensor:$s, Dist_SequenceLayoutAttr:$layout,
                       Dist_StateScanStrategyAttr:$strategy);
  let results = (outs Dist_FloatTensor:$s_in);
  let assemblyFormat = "$g `,` $s attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Dist_StateScanGradOp : Dist_Op<"state_scan_grad", [Dist_Collective]> {
  let summary = "transpose of state_scan: a reverse scan over the segments";
  let description = [{
    ds_in, g, s_in -> dg, ds: `ds[k] = sum_{j>k} exp(g[k+1] + ... + g[j-1]) ds_in[j]` and
    `dg[k] = exp(g[k]) <s_in[k], ds[k]>`.
  }];
  let arguments = (ins Dist_FloatTensor:$ds_in, Dist_FloatTensor:$g, Dist_FloatTensor:$s_in,
                       Dist_SequenceLayoutAttr:$layout, Dist_StateScanStrategyAttr:$strategy);
  let results = (outs Dist_FloatTensor:$dg, Dist_FloatTensor:$ds);
  let assemblyFormat = "$ds_in `,` $g `,` $s_in attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Dist_RingAttentionOp : Dist_Op<"ring_attention", [Dist_Collective,
    DeclareOpInterfaceMethods<DifferentiableOpInterface>]> {
  let summary = "causal attention of local queries over all keys, K/V passed around the cp ring";
  let description = [{
    The local q, k, v [batch, local_seq, heads, head_dim] hold the rank's segments; each step of
    the ring brings another rank's K/V block, whose partial result merges by log-sum-exp; blocks
    entirely in the future of a query piece are skipped. Same results as model.attention on the
    whole sequence, restricted to the local queries. `positions` [batch, local_seq] (packed
    documents): the local queries' positions in their documents, as model.attention's.
  }];
  let arguments = (ins Dist_FloatTensor:$q, Dist_FloatTensor:$k, Dist_FloatTensor:$v,
                       Optional<Dist_IndexTensor>:$positions, Dist_SequenceLayoutAttr:$layout,
                       F64Attr:$scale, UnitAttr:$causal);
  let results = (outs Dist_FloatTensor:$out, Dist_FloatTensor:$lse);
  let assemblyFormat = [{
    $q `,` $k `,` $v (`positions` $positions^)? attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Dist_RingAttentionGradOp : Dist_Op<"ring_attention_grad", [Dist_Collective]> {
  let summary = "transpose of ring_attention: dK/dV travel around the ring back to their owners";
  let arguments = (ins Dist_FloatTensor:$dout, Dist_FloatTensor:$q, Dist_FloatTensor:$k,
                       Dist_FloatTensor:$v, Dist_FloatTensor:$out, Dist_FloatTensor:$lse,
                       Optional<Dist_IndexTensor>:$positions, Dist_SequenceLayoutAttr:$layout,
                       F64Attr:$scale, UnitAttr:$causal);
  let results = (outs Dist_FloatTensor:$dq, Dist_FloatTensor:$dk, Dist_FloatTensor:$dv);
  let assemblyFormat = [{
    $dout `,` $q `,` $k `,` $v `,` $out `,` $lse (`positions` $positions^)? attr-dict `:`
    functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Dist_AllReduceOp : Dist_Op<"all_reduce", [Dist_Collective, AllTypesMatch<["x", "result"]>,
    DeclareOpInterfaceMethods<DifferentiableOpInterface>]> {
  let summary = "sum over a group of ranks";
  let description = [{
    The result is the same on every rank of the group. Its transpose is the identity: the
    result is replicated, so each rank's cotangent of it is already the whole cotangent of the
    sum, which is each rank's own contribution's cotangent (summing again would count it once
    per rank).
  }];
  let arguments = (ins Dist_FloatTensor:$x, Dist_ReduceGroupAttr:$group);
  let results = (outs Dist_FloatTensor:$result);
  let assemblyFormat = "$x $group attr-dict `:` type($x)";
}

//===------------------------------------------------------------------------------------------===//
// Expert parallelism
//===------------------------------------------------------------------------------------------===//

def Dist_MoeExpertsOp : Dist_Op<"moe_experts", [Dist_Collective,
    DeclareOpInterfaceMethods<DifferentiableOpInterface>]> {
  let summary = "routed expert MLPs with the experts split over the ep group";
  let description = [{
    model.moe_experts where this rank holds only experts [i * E/ep, (i + 1) * E/ep) of the
    `experts` = E (global count), i = its expert index (world rank % ep; the ep group is the
    ep consecutive world ranks of the mesh). x [tokens..., hidden], gates and the routed expert
    ids (global, from model.moe_route) [tokens..., k] are the rank's own tokens; input_weight
    [E/ep, 2*width, hidden] and output_weight [E/ep, hidden, width] are its experts. Each (token,
    slot) travels to the rank owning its expert (all-to-all: counts, then payloads), the local
    experts run on what arrived, the outputs come back and are combined with the gates:
    the result equals model.moe_experts over all E experts.
  }];
  let arguments = (ins Dist_FloatTensor:$x, Dist_FloatTensor:$gates, Dist_IndexTensor:$experts,
                       Dist_FloatTensor:$input_weight, Dist_FloatTensor:$output_weight,
                       I64Attr:$num_experts, I64Attr:$ep);
  let results = (outs Dist_FloatTensor:$result);
  let assemblyFormat = [{
    $x `,` $gates `,` $experts `,` $input_weight `,` $output_weight attr-dict `:`
    functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Dist_MoeExpertsGradOp : Dist_Op<"moe_experts_grad", [Dist_Collective]> {
  let summary = "transpose of moe_experts: dout travels to the experts, dx and dgates come back";
  let description = [{
    dout [tokens..., hidden] and the forward's operands -> dx, dgates (this rank's tokens) and
    dw_in, dw_out (this rank's experts, summed over every token of the ep group that reached
    them; the runtime then sums them over the ranks holding the same experts). Each slot's
    dout, gate and x go to the expert's rank; (dgate, the slot's share of dx) return.
  }];
  let arguments = (ins Dist_FloatTensor:$dout, Dist_FloatTensor:$x, Dist_FloatTensor:$gates,
                       Dist_IndexTensor:$experts, Dist_FloatTensor:$w_in,
                       Dist_FloatTensor:$w_out, I64Attr:$num_experts, I64Attr:$ep);
  let results = (outs Dist_FloatTensor:$dx, Dist_FloatTensor:$dgates, Dist_FloatTensor:$dw_in,
                      Dist_FloatTensor:$dw_out);
  let assemblyFormat = [{
    $dout `,` $x `,` $gates `,` $experts `,` $w_in `,` $w_out attr-dict `:`
    functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

#endif  // HYBRIDCP_DIST_OPS_TD
