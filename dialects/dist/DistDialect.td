// The `dist` dialect: the device mesh, how the sequence is split over context-parallel ranks,
// and the collectives that cross shard boundaries, in the per-rank program (local shapes).
#ifndef HYBRIDCP_DIST_DIALECT_TD
#define HYBRIDCP_DIST_DIALECT_TD

include "mlir/IR/AttrTypeBase.td"
include "mlir/IR/EnumAttr.td"
include "mlir/IR/OpBase.td"

def Dist_Dialect : Dialect {
  let name = "dist";
  let cppNamespace = "::hcp::dist";
  let summary = "meshes, sequence layouts and collectives for context parallelism";
  let useDefaultAttributePrinterParser = 1;
}

def Dist_LayoutKind : I32EnumAttr<"LayoutKind", "how the sequence is split over cp ranks", [
  // Rank r holds tokens [r*S/cp, (r+1)*S/cp).
  I32EnumAttrCase<"Contiguous", 0, "contiguous">,
  // 2*cp pieces; rank r holds pieces r and 2*cp-1-r (in that order): causal attention work is
  // balanced, and Mamba treats the 2*cp pieces as segments in sequence order.
  I32EnumAttrCase<"Zigzag", 1, "zigzag">
]> {
  let cppNamespace = "::hcp::dist";
  let genSpecializedAttr = 0;
}
def Dist_LayoutKindAttr : EnumAttr<Dist_Dialect, Dist_LayoutKind, "layout_kind"> {
  let assemblyFormat = "`<` $value `>`";
}

def Dist_StateScanStrategy : I32EnumAttr<"StateScanStrategy", "how Mamba states cross ranks", [
  // All-gather every segment's (log-decay, state) summary; each rank combines its prefix.
  I32EnumAttrCase<"AllGather", 0, "allgather">,
  // Send/receive along the chain of segments, cp - 1 hops on the critical path.
  I32EnumAttrCase<"Chain", 1, "chain">
]> {
  let cppNamespace = "::hcp::dist";
  let genSpecializedAttr = 0;
}
def Dist_StateScanStrategyAttr : EnumAttr<Dist_Dialect, Dist_StateScanStrategy, "strategy"> {
  let assemblyFormat = "`<` $value `>`";
}

def Dist_ReduceGroup : I32EnumAttr<"ReduceGroup", "the ranks a reduction spans", [
  I32EnumAttrCase<"World", 0, "world">,
  // The cp ranks that share one sequence.
  I32EnumAttrCase<"Cp", 1, "cp">,
  // The dp ranks that hold the same sequence shard of different sequences.
  I32EnumAttrCase<"Dp", 2, "dp">
]> {
  let cppNamespace = "::hcp::dist";
  let genSpecializedAttr = 0;
}
def Dist_ReduceGroupAttr : EnumAttr<Dist_Dialect, Dist_ReduceGroup, "group"> {
  let assemblyFormat = "`<` $value `>`";
}

class Dist_Attr<string name, string mnemonicName> : AttrDef<Dist_Dialect, name> {
  let mnemonic = mnemonicName;
}

def Dist_MeshAttr : Dist_Attr<"Mesh", "mesh"> {
  let summary = "the ranks: cp x dp (ep groups live inside them)";
  let description = [{
    `#dist.mesh<cp = 4, dp = 2, ep = 8>`: cp * dp ranks; world rank = dp_index * cp + cp_index.
    Expert parallelism cuts the world into groups of `ep` consecutive world ranks, each holding
    1/ep of every MoE layer's experts (expert index = world rank % ep); `ep` (1 when absent:
    every rank holds every expert) divides cp * dp.
  }];
  let parameters = (ins "int64_t":$cp, "int64_t":$dp, DefaultValuedParameter<"int64_t", "1">:$ep);
  let assemblyFormat = "`<` struct(params) `>`";
  let genVerifyDecl = 1;
  let builders = [
    AttrBuilder<(ins "int64_t":$cp, "int64_t":$dp), [{ return $_get($_ctxt, cp, dp, 1); }]>
  ];
  let extraClassDeclaration = [{
    int64_t world() const { return getCp() * getDp(); }
  }];
}

def Dist_SequenceLayoutAttr : Dist_Attr<"SequenceLayout", "sequence"> {
  let summary = "how the global sequence maps onto a rank's local tokens";
  let description = [{
    `#dist.sequence<zigzag, cp = 4, seq = 8192>`: the global sequence of `seq` tokens is cut into
    `segments()` pieces (cp contiguous, 2*cp zigzag) of `segmentLength()` tokens; rank r holds
    `segmentsPerRank()` of them, concatenated in sequence order of their piece index as listed.
  }];
  let parameters = (ins "LayoutKind":$kind, "int64_t":$cp, "int64_t":$seq);
  let assemblyFormat = "`<` $kind `,` `cp` `=` $cp `,` `seq` `=` $seq `>`";
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    int64_t segmentsPerRank() const { return getKind() == LayoutKind::Zigzag ? 2 : 1; }
    int64_t segments() const { return getCp() * segmentsPerRank(); }
    int64_t segmentLength() const { return getSeq() / segments(); }
    int64_t localLength() const { return getSeq() / getCp(); }
  }];
}

class Dist_Op<string mnemonic, list<Trait> traits = []> : Op<Dist_Dialect, mnemonic, traits>;

def Dist_FloatTensor : RankedTensorOf<[F32, BF16]>;
def Dist_IndexTensor : RankedTensorOf<[I32]>;

#endif  // HYBRIDCP_DIST_DIALECT_TD
