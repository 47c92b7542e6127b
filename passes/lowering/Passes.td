// Lowering from the `model` dialect (tensors) to the `exec` dialect (kernel launches over
// statically placed buffers), and memory planning.
#ifndef HYBRIDCP_LOWERING_PASSES_TD
#define HYBRIDCP_LOWERING_PASSES_TD

include "mlir/Pass/PassBase.td"

def LowerToExec : Pass<"hcp-lower-to-exec", "mlir::ModuleOp"> {
  let summary = "bufferize the training step and pick a kernel for every op";
  let description = [{
    Rewrites the tensor function (after autodiff) into a function without arguments whose body
    declares buffers (parameters, gradients, inputs, activations) and launches one kernel of
    runtime/plan/KernelTable.txt per op. Reshapes become views of the same bytes; values that
    are a parameter's gradient are computed straight into that parameter's gradient buffer.
    Buffers keep their tensors' element types (f32 or bf16; model.cast is a `cast` launch):
    which backend can run the plan is not decided here (`hybridcp compile` checks a bf16 plan
    against the CUDA kernels' rules).
  }];
  let options = [
    Option<"function", "function", "std::string", /*default=*/"\"train_step\"",
           "the function to lower">
  ];
  let dependentDialects = ["::hcp::exec::ExecDialect"];
}

def FuseGemmEpilogue : Pass<"hcp-fuse-gemm-epilogue", "mlir::ModuleOp"> {
  let summary = "fold the scales and adds around GEMMs into them (gemm_add, alpha)";
  let description = [{
    `gemm -> [scale ->] add` chains, where the product (and its scaled copy) is an activation
    that nothing else touches, become one `gemm_add` launch (out = alpha op(a) op(b) + c) at the
    GEMM's place: the scale's factor multiplies alpha, the add's other operand becomes c. The
    residual adds of every layer (hidden + multiplier * projection) and most gradient sums of
    the backward have this shape. The product is then neither stored nor read back, and the sum
    is rounded once instead of three times. When the other operand is written after the GEMM
    (the MoE experts' output, to which the shared MLP's product is added) or the add's output is
    touched in between, the fused launch runs at the add's place instead, if the GEMM's operands
    still hold there what it read and the activations among them that would live longer are no
    larger than the product (the activation peak does not rise). A chain is left alone when its
    add broadcasts, or when neither place works. A scale whose result only GEMMs read as an
    operand, and the MoE experts' backward as its output gradient (the backward's gradient times
    the residual multiplier, before the projections' and the experts' backward), goes into their
    alphas and the experts' `dout_scale` instead, unless its input changes before the last of
    them reads it. A scale that is the only reader of a GEMM's product (the logits divided by
    logits_scaling) or of a `gemm_add`'s sum (the MoE block's output, the experts' plus the shared
    MLP's, times the residual multiplier) goes into that launch's alpha (and beta, which scales
    c), which then writes the scaled values, unless they are touched in between.
  }];
  let statistics = [
    Statistic<"fusedAdds", "fused-adds", "adds folded into a GEMM">,
    Statistic<"fusedScales", "fused-scales", "scales folded into a GEMM's alpha">
  ];
}

def SliceGemms : Pass<"hcp-slice-gemms", "mlir::ModuleOp"> {
  let summary = "compute a GEMM's column slices as GEMMs of their own, and a gradient's column "
                "blocks into its GEMMs block by block";
  let description = [{
    Mamba's in_proj computes z, xBC and dt as one product whose columns are then copied out
    (`slice_columns`), and its backward copies their gradients into one buffer again
    (`insert_columns`) for the two GEMMs of the projection's backward. Those copies go:
    - a `gemm` y = a b^T whose activation y only `slice_columns` launches of whole rows read
      becomes one GEMM per slice, at the product's place, with the weight's rows of that slice
      (an `exec.view` with an offset) and the slice's output as its own;
    - an activation dy written only by `insert_columns` launches that fill each of its columns
      once, then read only as the left operand of GEMMs, is never assembled: dy w (w's rows
      are dy's columns) becomes the sum of the blocks' products, each `gemm_add`ed to the ones
      before it (and to the reader's addend) through partial sums of the output's shape; dy^T x
      becomes one GEMM per block into the output's rows of that block.
    The blocks must still hold at each reader what was inserted, and a slice's output must be
    untouched between the product and the slice. The backward's sum is rounded once per block,
    where the assembled product rounded once in all (bf16 plans: a few more roundings of the
    input gradient; f32 plans: the order of the sum).
  }];
  let statistics = [
    Statistic<"slicedProducts", "sliced-products", "products computed slice by slice">,
    Statistic<"assembledGradients", "assembled-gradients",
              "gradients read block by block instead of assembled">
  ];
}

def FuseNormResidual : Pass<"hcp-fuse-norm-residual", "mlir::ModuleOp"> {
  let summary = "add the residual stream's gradient inside the RMSNorm backward";
  let description = [{
    Every pre-norm block's backward ends with dh = dh_above + rms_norm.backward(...): the
    residual stream's gradient added to the norm's input gradient. Where an
    `rms_norm.backward`'s dx is an activation only an `add` of the same size reads, the norm
    takes the add's other operand as `dresidual` (its has_residual flag) and writes the sum
    where the add wrote, at its own place: dx is then neither stored nor read back and the sum
    is rounded once. Left alone when the other operand is written between the two launches,
    the add's output is touched in between or is one of the norm's operands, or the add
    broadcasts.
  }];
  let statistics = [
    Statistic<"fusedResiduals", "fused-residuals", "residual adds folded into an RMSNorm backward">
  ];
}

def FuseConvSilu : Pass<"hcp-fuse-conv-silu", "mlir::ModuleOp"> {
  let summary = "fold the SiLU after each causal conv1d into the conv's kernels";
  let description = [{
    Mamba's causal conv1d is always followed by a SiLU. Where a `causal_conv1d.forward` writes an
    activation that only `silu.forward` and `silu.backward` read, and the `silu.backward`'s
    result only feeds the `causal_conv1d.backward` of the same input, weight and halo, the conv
    kernels take the SiLU in (their `silu` flag): the forward writes silu(conv) where the
    `silu.forward` wrote, and the backward takes the SiLU output's gradient and recomputes the
    conv output from its input and the bias (an input more). The conv output and its gradient
    are then neither stored nor read back. The conv output is rounded to the storage type
    before the SiLU, as the separate steps do, so the results are theirs. A forward whose SiLU
    has no backward (the first forward of a recomputed layer) folds alone. Nothing folds when
    the buffers involved are touched in between by anything else.
  }];
  let statistics = [
    Statistic<"fusedForwards", "fused-forwards", "SiLU forwards folded into a conv">,
    Statistic<"fusedBackwards", "fused-backwards", "SiLU backwards folded into a conv's">
  ];
}

def KeepExpertH : Pass<"hcp-keep-expert-h", "mlir::ModuleOp"> {
  let summary = "keep the MoE experts' first product from the forward for the backward";
  let description = [{
    `moe_experts.backward` otherwise recomputes what its forward computed: the routing plan,
    the gathered rows and h = W_in[e] x, the experts' first product (a third of the backward's
    GEMM work). This pass pairs each `moe_experts.backward` with the last `moe_experts.forward`
    before it on the same buffers (x, gates, ids, weights; for a recomputed layer, the forward
    that recomputed it) and sets both launches' `keep_h` flag: the forward also writes every
    slot's h to a new activation buffer [tokens, k, 2*inner], which the backward reads instead
    of recomputing the product. The results are the same bit for bit on the GPU (the same
    product of the same rows). A pair is left alone when x, the ids or w_in are written
    between the two. The kept buffer costs k * 2 * inner values per token and MoE layer
    (tiny: 100 MiB per layer at 8192 tokens); `hybridcp compile --recompute-expert-h` skips
    the pass.
  }];
  let statistics = [
    Statistic<"keptLayers", "kept-layers", "MoE layers whose backward reads the kept h">
  ];
}

def KeepSsdStates : Pass<"hcp-keep-ssd-states", "mlir::ModuleOp"> {
  let summary = "keep the Mamba scan's chunk states from the forward for the backward";
  let description = [{
    `ssd_scan.backward` otherwise recomputes the state entering each chunk of the sequence, as
    its forward computed them (on the GPU the chunks' state products and the pass over the
    chunks, about a third of a forward). This pass pairs each `ssd_scan.backward` with the last
    `ssd_scan.forward` before it on the same buffers (x, dt, A, B, the initial state, the
    documents' positions; for a recomputed layer, the forward that recomputed it) and sets both
    launches' `keep_states` flag: the forward also writes the states to a new f32 activation
    buffer [batch, heads, chunks, head_dim, state], which the backward reads instead. The
    results are the same bit for bit (the same states). A pair is left alone when one of those
    inputs is written between the two. The kept states cost heads * head_dim * state f32
    values per chunk and Mamba layer (tiny: 48 MiB per layer per 8192 tokens);
    `hybridcp compile --recompute-ssd-states` skips the pass.
  }];
  let statistics = [
    Statistic<"keptLayers", "kept-layers", "Mamba layers whose backward reads the kept states">
  ];
}

def OverlapCollectives : Pass<"hcp-overlap-collectives", "mlir::ModuleOp"> {
  let summary = "order the launches around halo exchanges and state scans so compute overlaps "
                "them, and schedule the collectives beside the compute stream";
  let description = [{
    The CUDA executor starts a halo exchange or a state scan on its communication stream and
    waits for it only before the first later launch that touches its buffers. This pass gives
    that wait something to hide: between the communicating launches on either side of such a
    collective, the launches it does not need (such as the weight gradients of the layer above,
    whose products feed nothing the scan needs) move right after it, and the launches that need
    it move after every launch that does not (such as the time-step path a halo exchange's conv
    does not feed). Launches only move later, and never past a launch they share a buffer with
    where either writes it, so every buffer sees its reads and writes in the same order and the
    step computes exactly what it did; no launch crosses another collective, so all ranks keep
    issuing them in the same order. Then the schedule, which the plan records and the runtime
    follows: each such collective is marked `beside` and an `exec.join` goes before the first
    later launch that conflicts with it or communicates (or before the return). Runs before
    hcp-plan-memory (the new order's lifetimes are the ones placed, a beside launch's buffers
    live until its join).
  }];
  let statistics = [
    Statistic<"movedAfter", "moved-after", "launches moved after a collective they do not need">,
    Statistic<"movedPast", "moved-past", "launches that need a collective moved past free ones">,
    Statistic<"scheduledBeside", "scheduled-beside",
              "collectives scheduled beside the compute stream">
  ];
}

def PlanMemory : Pass<"hcp-plan-memory", "mlir::ModuleOp"> {
  let summary = "place activation buffers in one arena by liveness";
  let description = [{
    Gives every activation buffer a byte offset so that buffers whose lifetimes overlap never
    share bytes (lifetimes run from the first to the last launch that touches the buffer or a
    view of it), placing the largest buffers first, each at the lowest free offset. Parameters,
    gradients and inputs are laid out one after another in program order, expert-parallel
    (`shards`) parameters and gradients after all the others, so that the runtime sums the
    replicated gradients (over every rank) and the sharded ones (over the ranks holding the same
    experts) with one all-reduce of a contiguous range each. Records the bytes of each arena as the module attribute
    `exec.arena_bytes` = [parameters, gradients, activations, inputs]; the activation figure is
    the step's peak activation memory.
  }];
  let options = [
    Option<"alignment", "alignment", "int64_t", /*default=*/"256", "byte alignment of every buffer">
  ];
  let statistics = [
    Statistic<"activationBytes", "activation-bytes", "peak activation bytes">,
    Statistic<"activationBuffers", "activation-buffers", "activation buffers placed">
  ];
}

#endif  // HYBRIDCP_LOWERING_PASSES_TD
