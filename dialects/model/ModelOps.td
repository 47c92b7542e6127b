// Ops of the `model` dialect. Each op's verifier checks shapes, dtypes and divisibility and says
// what is wrong in the model's terms (heads, hidden size, experts), not in MLIR's.
#ifndef HYBRIDCP_MODEL_OPS_TD
#define HYBRIDCP_MODEL_OPS_TD

include "dialects/model/ModelDialect.td"
include "mlir/Interfaces/InferTypeOpInterface.td"
include "mlir/Interfaces/SideEffectInterfaces.td"

//===------------------------------------------------------------------------------------------===//
// Parameters
//===------------------------------------------------------------------------------------------===//

def Model_ParamOp : Model_Op<"param", [Pure]> {
  let summary = "a trainable parameter, by its checkpoint name";
  let description = [{
    `%w = model.param "model.layers.0.mamba.in_proj.weight" normal(0.02) : tensor<6448x1536xf32>`
    The name is the Hugging Face checkpoint name; the shape is the checkpoint's shape. `init` says
    how the runtime initialises it when no checkpoint is loaded (`std` for `normal` only).

    `shards N` (expert parallelism): the value is this rank's part of the checkpoint tensor,
    rows [i * R / N, (i + 1) * R / N) along dim 0 for the rank's expert index i, so the
    checkpoint shape is the result's with dim 0 multiplied by N (`fullShape()`). Initialised
    and loaded so that the values are those rows of the unsharded tensor.
      `%w = model.param "...experts.input_linear.weight" normal(0.02) shards 4 : tensor<16x1024x1536xf32>`
  }];
  let arguments = (ins StrAttr:$name, Model_ParamInit:$init, OptionalAttr<F64Attr>:$std,
                       OptionalAttr<I64Attr>:$shards);
  let results = (outs Model_FloatTensor:$result);
  let assemblyFormat = [{
    $name $init (`(` $std^ `)`)? (`shards` $shards^)? attr-dict `:` type($result)
  }];
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    // The number of parts the checkpoint tensor is split into (1: the whole tensor).
    int64_t numShards() { return getShards() ? *getShards() : 1; }
    // The checkpoint tensor's shape.
    ::llvm::SmallVector<int64_t> fullShape() {
      ::llvm::SmallVector<int64_t> shape(getResult().getType().getShape());
      if (!shape.empty()) shape[0] *= numShards();
      return shape;
    }
  }];
}

//===------------------------------------------------------------------------------------------===//
// Token-local ops
//===------------------------------------------------------------------------------------------===//

def Model_EmbeddingOp : Model_Op<"embedding", [Pure]> {
  let summary = "token embedding lookup times a multiplier";
  let description = [{
    `out[b, s, :] = table[ids[b, s], :] * multiplier`. When `padding_idx` is set, that row of the
    table gets no gradient from the lookup (torch.nn.Embedding's padding_idx).
  }];
  let arguments = (ins Model_FloatTensor:$table, Model_TokenTensor:$ids, F64Attr:$multiplier,
                       OptionalAttr<I64Attr>:$padding_idx);
  let results = (outs Model_FloatTensor:$result);
  let assemblyFormat = "$table `,` $ids attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Model_RmsNormOp : Model_Op<"rms_norm", [Pure, AllTypesMatch<["x", "result"]>]> {
  let summary = "RMSNorm over the last dim, times a weight";
  let description = [{ `y = x * rsqrt(mean(x^2, -1) + eps) * weight`, computed in fp32. }];
  let arguments = (ins Model_FloatTensor:$x, Model_FloatTensor:$weight, F64Attr:$eps);
  let results = (outs Model_FloatTensor:$result);
  let assemblyFormat = "$x `,` $weight attr-dict `:` type($x) `,` type($weight)";
  let hasVerifier = 1;
}

def Model_LinearOp : Model_Op<"linear", [Pure]> {
  let summary = "y = x W^T with W stored [out, in] as in the checkpoint";
  let arguments = (ins Model_FloatTensor:$x, Model_FloatTensor:$weight);
  let results = (outs Model_FloatTensor:$result);
  let assemblyFormat = "$x `,` $weight attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

class Model_UnaryOp<string mnemonic, string summaryText>
    : Model_Op<mnemonic, [Pure, SameOperandsAndResultType]> {
  let summary = summaryText;
  let arguments = (ins Model_FloatTensor:$x);
  let results = (outs Model_FloatTensor:$result);
  let assemblyFormat = "$x attr-dict `:` type($x)";
}

def Model_SiluOp : Model_UnaryOp<"silu", "x * sigmoid(x)">;
def Model_SoftplusOp : Model_UnaryOp<"softplus", "log(1 + exp(x)); x itself above 20">;
def Model_NegExpOp : Model_UnaryOp<"neg_exp", "-exp(x): Mamba2's decay rates A from A_log">;

def Model_CastOp : Model_Op<"cast", [Pure]> {
  let summary = "the same tensor in another float type (bf16 <-> f32)";
  let description = [{
    `%y = model.cast %x : tensor<2x8x4xbf16> to tensor<2x8x4xf32>`. Mixed-precision graphs
    (`--dtype bf16`) store tensors in bf16 and keep the SSD's dt, A and D in f32: the cast sits
    where a bf16 value enters that f32 chain. f32 -> bf16 rounds to nearest even.
  }];
  let arguments = (ins Model_FloatTensor:$x);
  let results = (outs Model_FloatTensor:$result);
  let assemblyFormat = "$x attr-dict `:` type($x) `to` type($result)";
  let hasVerifier = 1;
}

def Model_ScaleOp : Model_Op<"scale", [Pure, SameOperandsAndResultType]> {
  let summary = "multiplication by a constant (residual, logits and embedding multipliers)";
  let arguments = (ins Model_FloatTensor:$x, F64Attr:$factor);
  let results = (outs Model_FloatTensor:$result);
  let assemblyFormat = "$x attr-dict `:` type($x)";
}

class Model_BinaryOp<string mnemonic, string summaryText>
    : Model_Op<mnemonic, [Pure, AllTypesMatch<["lhs", "result"]>]> {
  let summary = summaryText;
  let description = [{
    Elementwise; `rhs` has the shape of `lhs` or of a trailing part of it and is broadcast over
    the leading dims (a per-head bias over [batch, seq, heads], say).
  }];
  let arguments = (ins Model_FloatTensor:$lhs, Model_FloatTensor:$rhs);
  let results = (outs Model_FloatTensor:$result);
  let assemblyFormat = "$lhs `,` $rhs attr-dict `:` type($lhs) `,` type($rhs)";
  let hasVerifier = 1;
}

def Model_AddOp : Model_BinaryOp<"add", "lhs + rhs">;
def Model_MulOp : Model_BinaryOp<"mul", "lhs * rhs">;
def Model_DivOp : Model_BinaryOp<"div", "lhs / rhs">;

def Model_SplitOp : Model_Op<"split", [Pure]> {
  let summary = "split the last dim into consecutive pieces";
  let description = [{
    `%z, %xbc, %dt = model.split %proj [3072, 3328, 48]`: the sizes must add up to the last dim.
  }];
  let arguments = (ins Model_FloatTensor:$x, DenseI64ArrayAttr:$sizes);
  let results = (outs Variadic<Model_FloatTensor>:$pieces);
  let assemblyFormat = "$x $sizes attr-dict `:` type($x) `->` type($pieces)";
  let hasVerifier = 1;
}

def Model_ReshapeOp : Model_Op<"reshape", [Pure]> {
  let summary = "reinterpret the shape (row-major), e.g. [b, s, heads*dim] -> [b, s, heads, dim]";
  let description = [{
    Also of token tensors: context parallelism views a rank's positions [b, segs*len] as
    [b*segs, len] beside the activations it views as segment rows.
  }];
  let arguments = (ins AnyTypeOf<[Model_FloatTensor, Model_TokenTensor]>:$x);
  let results = (outs AnyTypeOf<[Model_FloatTensor, Model_TokenTensor]>:$result);
  let assemblyFormat = "$x attr-dict `:` type($x) `->` type($result)";
  let hasVerifier = 1;
}

def Model_SwigluOp : Model_Op<"swiglu", [Pure]> {
  let summary = "silu(a) * b over a gate-first packed last dim [a | b]";
  let arguments = (ins Model_FloatTensor:$x);
  let results = (outs Model_FloatTensor:$result);
  let assemblyFormat = "$x attr-dict `:` type($x) `->` type($result)";
  let hasVerifier = 1;
}

//===------------------------------------------------------------------------------------------===//
// Mamba2 mixer
//===------------------------------------------------------------------------------------------===//

def Model_CausalConv1dOp : Model_Op<"causal_conv1d", [Pure, AllTypesMatch<["x", "result"]>,
                                                       AttrSizedOperandSegments]> {
  let summary = "causal depthwise conv1d with bias over [batch, seq, channels]";
  let description = [{
    `y[b, t, c] = bias[c] + sum_j w[c, 0, j] * x[b, t - (width-1) + j, c]`. Positions before t = 0
    read the optional `halo` [batch, width-1, channels] (the rows that precede each sequence
    row: the previous segment's tail under context parallelism), zero without it. The weight has
    the checkpoint's shape [channels, 1, width]. Packed documents: with `positions` [batch, seq]
    (each token's position in its document, Hugging Face's position_ids), no term reaches before
    the token's document start, into the halo neither.
  }];
  let arguments = (ins Model_FloatTensor:$x, Model_FloatTensor:$weight, Model_FloatTensor:$bias,
                       Optional<Model_FloatTensor>:$halo, Optional<Model_TokenTensor>:$positions);
  let results = (outs Model_FloatTensor:$result);
  let assemblyFormat = [{
    $x `,` $weight `,` $bias (`halo` $halo^)? (`positions` $positions^)? attr-dict `:`
    functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Model_SsdScanOp : Model_Op<"ssd_scan", [Pure, AttrSizedOperandSegments]> {
  let summary = "Mamba2 chunked state-space scan (SSD) with optional initial state";
  let description = [{
    Per batch row and head h (group g = h / (heads / groups)):
    `S_t = exp(dt_t A_h) S_{t-1} + dt_t x_t B_t^T`, `y_t = S_t C_t + D_h x_t`, computed in chunks
    of `chunk_size` positions (a partial last chunk is fine). Shapes: x [b, s, heads, head_dim],
    dt [b, s, heads] (after softplus), A [heads], B and C [b, s, groups, state], D [heads],
    init_state and final_state [b, heads, head_dim, state]. dt, cumulative sums and states are
    fp32 whatever the activation dtype. Packed documents: with `positions` [b, s] the state
    restarts at each document's first token (position 0); init_state reaches only the tokens
    before the first document start, and final_state is the last document's.
  }];
  let arguments = (ins Model_FloatTensor:$x, Model_FloatTensor:$dt, Model_FloatTensor:$A,
                       Model_FloatTensor:$B, Model_FloatTensor:$C, Model_FloatTensor:$D,
                       Optional<Model_FloatTensor>:$init_state,
                       Optional<Model_TokenTensor>:$positions, I64Attr:$chunk_size);
  let results = (outs Model_FloatTensor:$y, Model_FloatTensor:$final_state);
  let assemblyFormat = [{
    $x `,` $dt `,` $A `,` $B `,` $C `,` $D (`init` $init_state^)? (`positions` $positions^)?
    attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Model_SsdFinalStateOp : Model_Op<"ssd_final_state", [Pure]> {
  let summary = "the final state model.ssd_scan reaches from a zero initial state, without y";
  let description = [{
    Per batch row and head h (group g = h / (heads / groups)):
    `S_t = exp(dt_t A_h) S_{t-1} + dt_t x_t B_t^T` from `S_{-1} = 0`, computed in chunks of
    `chunk_size` positions like model.ssd_scan; the result is the last S, exactly model.ssd_scan's
    final_state without an initial state. Context parallelism summarises each segment with it:
    the outputs y (and so C and D) play no part, and skipping them skips the scan's intra-chunk
    output work. Shapes: x [b, s, heads, head_dim], dt [b, s, heads], A [heads],
    B [b, s, groups, state] -> final_state [b, heads, head_dim, state] (f32).
  }];
  let arguments = (ins Model_FloatTensor:$x, Model_FloatTensor:$dt, Model_FloatTensor:$A,
                       Model_FloatTensor:$B, Optional<Model_TokenTensor>:$positions,
                       I64Attr:$chunk_size);
  let results = (outs Model_FloatTensor:$final_state);
  let assemblyFormat = [{
    $x `,` $dt `,` $A `,` $B (`positions` $positions^)? attr-dict `:`
    functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Model_SsdAddInitialStateOp : Model_Op<"ssd_add_initial_state",
                                         [Pure, AllTypesMatch<["y", "result"]>]> {
  let summary = "adds to a scan from a zero start the outputs its initial state contributes";
  let description = [{
    Per batch row and head h (group g = h / (heads / groups)), with the inclusive cumulative
    log-decay `Acs_t = A_h * sum_{u<=t} dt_u`:
    `result_t = y_t + exp(Acs_t) * init_state C_t`. With y the outputs of model.ssd_scan from a
    zero start, the result is model.ssd_scan's y from `init_state` (the scan is linear in its
    state). Context parallelism scans each segment once from zero, passes the final states
    between segments and corrects the outputs with this, instead of scanning twice.
    Shapes: y [b, s, heads, head_dim], dt [b, s, heads], A [heads], C [b, s, groups, state],
    init_state [b, heads, head_dim, state] (f32).
  }];
  let arguments = (ins Model_FloatTensor:$y, Model_FloatTensor:$dt, Model_FloatTensor:$A,
                       Model_FloatTensor:$C, Model_FloatTensor:$init_state,
                       Optional<Model_TokenTensor>:$positions);
  let results = (outs Model_FloatTensor:$result);
  let assemblyFormat = [{
    $y `,` $dt `,` $A `,` $C `init` $init_state (`positions` $positions^)? attr-dict `:`
    functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Model_SsdLogDecayOp : Model_Op<"ssd_log_decay", [Pure]> {
  let summary = "a segment's total log-decay: g[b, h] = sum_t dt[b, t, h] * A[h]";
  let description = [{
    With the segment's final state from a zero start, this summarises the segment as the affine
    map S_out = exp(g) S_in + S_local that context parallelism passes between segments.
    dt [b, s, heads], A [heads] -> g [b, heads] (f32). With `positions` [b, s] (packed
    documents), -infinity for a row in which a document starts: no state passes through it.
  }];
  let arguments = (ins Model_FloatTensor:$dt, Model_FloatTensor:$A,
                       Optional<Model_TokenTensor>:$positions);
  let results = (outs Model_FloatTensor:$g);
  let assemblyFormat = [{
    $dt `,` $A (`positions` $positions^)? attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Model_GatedRmsNormOp : Model_Op<"gated_rms_norm", [Pure, AllTypesMatch<["y", "gate", "result"]>]> {
  let summary = "Mamba2 output norm: RMSNorm(y * silu(gate)) * weight (gate before norm)";
  let arguments = (ins Model_FloatTensor:$y, Model_FloatTensor:$gate, Model_FloatTensor:$weight,
                       F64Attr:$eps);
  let results = (outs Model_FloatTensor:$result);
  let assemblyFormat = "$y `,` $gate `,` $weight attr-dict `:` type($y) `,` type($weight)";
  let hasVerifier = 1;
}

//===------------------------------------------------------------------------------------------===//
// Attention
//===------------------------------------------------------------------------------------------===//

def Model_AttentionOp : Model_Op<"attention", [Pure]> {
  let summary = "causal grouped-query attention with an explicit softmax scale";
  let description = [{
    q [b, s, heads, d]; k, v [b, s, kv_heads, d]; query head h reads kv head h / (heads / kv_heads).
    `out = softmax(q k^T * scale + causal mask) v` in fp32. `lse` [b, heads, s] is the
    log-sum-exp of each row's scaled scores, the quantity ring attention merges with. With
    `positions` [b, s] (packed documents) a query sees no key before its document's start.
  }];
  let arguments = (ins Model_FloatTensor:$q, Model_FloatTensor:$k, Model_FloatTensor:$v,
                       Optional<Model_TokenTensor>:$positions, F64Attr:$scale, UnitAttr:$causal);
  let results = (outs Model_FloatTensor:$out, Model_FloatTensor:$lse);
  let assemblyFormat = [{
    $q `,` $k `,` $v (`positions` $positions^)? attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

//===------------------------------------------------------------------------------------------===//
// Mixture of experts
//===------------------------------------------------------------------------------------------===//

def Model_MoeRouteOp : Model_Op<"moe_route", [Pure]> {
  let summary = "top-k experts per token; gates = softmax over the k selected router logits";
  let arguments = (ins Model_FloatTensor:$logits, I64Attr:$top_k);
  let results = (outs Model_FloatTensor:$gates, Model_TokenTensor:$experts);
  let assemblyFormat = "$logits attr-dict `:` type($logits) `->` type($gates) `,` type($experts)";
  let hasVerifier = 1;
}

def Model_MoeExpertsOp : Model_Op<"moe_experts", [Pure]> {
  let summary = "routed expert MLPs, combined with their gates";
  let description = [{
    `out[t] = sum_j gates[t, j] * W_out[e] (silu(a) * b)` with `[a | b] = W_in[e] x[t]` and
    `e = experts[t, j]`. W_in [experts, 2*width, hidden] (gate rows first),
    W_out [experts, hidden, width], as in the checkpoint.
  }];
  let arguments = (ins Model_FloatTensor:$x, Model_FloatTensor:$gates, Model_TokenTensor:$experts,
                       Model_FloatTensor:$input_weight, Model_FloatTensor:$output_weight);
  let results = (outs Model_FloatTensor:$result);
  let assemblyFormat = [{
    $x `,` $gates `,` $experts `,` $input_weight `,` $output_weight attr-dict `:`
    functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

//===------------------------------------------------------------------------------------------===//
// Loss
//===------------------------------------------------------------------------------------------===//

def Model_CrossEntropyOp : Model_Op<"cross_entropy", [Pure]> {
  let summary = "summed token cross-entropy and the number of valid tokens";
  let description = [{
    logits [b, s, vocab]; targets [b, s] are already shifted (targets[t] is the token after t);
    positions equal to `ignore_index` count neither in the sum nor in `valid_count`. Returning
    the sum and the count (not their ratio) lets split runs normalise by the global count.
  }];
  let arguments = (ins Model_FloatTensor:$logits, Model_TokenTensor:$targets, I64Attr:$ignore_index);
  let results = (outs Model_Scalar:$loss_sum, Model_Scalar:$valid_count);
  let assemblyFormat = "$logits `,` $targets attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

//===------------------------------------------------------------------------------------------===//
// The MoE load-balancing loss (transformers' load_balancing_loss_func)
//===------------------------------------------------------------------------------------------===//

def Model_Vector : 1DTensorOf<[F32]>;

def Model_RouterLoadOp : Model_Op<"router_load", [Pure]> {
  let summary = "one MoE layer's routing statistics for the load-balancing loss";
  let description = [{
    logits [tokens..., experts], experts [tokens..., k] (model.moe_route's) -> probs [experts],
    the sum over the tokens of softmax(logits[t]) over all experts, and picks [experts], how many
    of the tokens' k slots chose each expert. Both are sums, so the layers' add up and split
    runs all-reduce them; picks, a count, carries no gradient.
  }];
  let arguments = (ins Model_FloatTensor:$logits, Model_TokenTensor:$experts);
  let results = (outs Model_Vector:$probs, Model_Vector:$picks);
  let assemblyFormat = "$logits `,` $experts attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Model_RouterAuxLossOp : Model_Op<"router_aux_loss", [Pure]> {
  let summary = "the load-balancing loss of every MoE layer's summed routing statistics";
  let description = [{
    `loss = scale * sum_e probs[e] * picks[e]` with `scale = experts / rows^2`, rows being every
    MoE layer's tokens of the micro-batch (all ranks' under context parallelism): transformers'
    `experts * sum_e (picks_e / rows) * (probs_e / rows)`.
  }];
  let arguments = (ins Model_Vector:$probs, Model_Vector:$picks, F64Attr:$scale);
  let results = (outs Model_Scalar:$loss);
  let assemblyFormat = [{
    $probs `,` $picks attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Model_ReportOp : Model_Op<"report", [MemoryEffects<[MemWrite]>]> {
  let summary = "a value of the step the runtime reads by name (a sink)";
  let description = [{
    `model.report "router_aux_loss", %aux : tensor<f32>`: the step's result of that name
    (exec.result). `"loss"` names the language-model loss when the function returns more than it
    (the objective with the load-balancing loss added). It writes memory so that no cleanup
    removes it; nothing differentiates through it.
  }];
  let arguments = (ins StrAttr:$name, Model_Scalar:$value);
  let assemblyFormat = "$name `,` $value attr-dict `:` type($value)";
  let hasVerifier = 1;
}

include "dialects/model/ModelGradOps.td"

#endif  // HYBRIDCP_MODEL_OPS_TD
