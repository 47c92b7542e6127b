// Gradient ops of the `model` dialect: what hcp-autodiff emits for the backward of a training
// step. Each forward op's rule (ModelAutodiff.cpp) maps onto one of these or onto forward ops
// (scale, add, mul, div, reshape). Same tensor semantics and shapes as the forward ops; every
// gradient has exactly the type of the value it is the gradient of. Verifiers in
// ModelGradOps.cpp. Included at the end of ModelOps.td.
#ifndef HYBRIDCP_MODEL_GRAD_OPS_TD
#define HYBRIDCP_MODEL_GRAD_OPS_TD

include "dialects/model/ModelDialect.td"
include "mlir/Interfaces/SideEffectInterfaces.td"

//===------------------------------------------------------------------------------------------===//
// Constants, broadcasting and splitting
//===------------------------------------------------------------------------------------------===//

def Model_FillOp : Model_Op<"fill", [Pure]> {
  let summary = "a tensor with every element equal to `value`";
  let description = [{
    `%seed = model.fill 1.000000e+00 : tensor<f32>` seeds the loss gradient; `model.fill 0.0`
    stands for the gradient of a split piece the loss does not depend on.
  }];
  let arguments = (ins F64Attr:$value);
  let results = (outs Model_FloatTensor:$result);
  let assemblyFormat = "$value attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def Model_SumLeadingOp : Model_Op<"sum_leading", [Pure]> {
  let summary = "sum over the leading dims, keeping the trailing dims of the result";
  let description = [{
    `result[j...] = sum_i x[i..., j...]` where the result's shape is a trailing part of x's:
    the backward of broadcasting a bias over [batch, seq, ...], e.g.
    `model.sum_leading %d : tensor<2x8x48xf32> -> tensor<48xf32>`.
  }];
  let arguments = (ins Model_FloatTensor:$x);
  let results = (outs Model_FloatTensor:$result);
  let assemblyFormat = "$x attr-dict `:` type($x) `->` type($result)";
  let hasVerifier = 1;
}

def Model_ConcatOp : Model_Op<"concat", [Pure]> {
  let summary = "concatenate along the last dim (the backward of model.split)";
  let arguments = (ins Variadic<Model_FloatTensor>:$pieces);
  let results = (outs Model_FloatTensor:$result);
  let assemblyFormat = "$pieces attr-dict `:` type($pieces) `->` type($result)";
  let hasVerifier = 1;
}

//===------------------------------------------------------------------------------------------===//
// Token-local gradients
//===------------------------------------------------------------------------------------------===//

def Model_LinearGradInputOp : Model_Op<"linear_grad_input", [Pure]> {
  let summary = "dx = dy W for y = x W^T (W stored [out, in])";
  let description = [{
    dy [..., out], w [out, in] -> dx [..., in] (the shape of the forward input).
  }];
  let arguments = (ins Model_FloatTensor:$dy, Model_FloatTensor:$w);
  let results = (outs Model_FloatTensor:$dx);
  let assemblyFormat = "$dy `,` $w attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Model_LinearGradWeightOp : Model_Op<"linear_grad_weight", [Pure]> {
  let summary = "dW = dy^T x summed over every leading dim, for y = x W^T";
  let description = [{
    dy [..., out], x [..., in] (same leading dims) -> dw [out, in]:
    `dw[n, k] = sum_i dy[i..., n] x[i..., k]`.
  }];
  let arguments = (ins Model_FloatTensor:$dy, Model_FloatTensor:$x);
  let results = (outs Model_FloatTensor:$dw);
  let assemblyFormat = "$dy `,` $x attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Model_EmbeddingGradOp : Model_Op<"embedding_grad", [Pure]> {
  let summary = "scatter-add of the output gradient into the table rows the tokens read";
  let description = [{
    dy [b, s, hidden], ids [b, s] -> dtable [vocab, hidden] (vocab from the result type):
    `dtable[v] = multiplier * sum over (i, t) with ids[i, t] = v of dy[i, t]`; the row
    `padding_idx`, when set, stays zero.
  }];
  let arguments = (ins Model_FloatTensor:$dy, Model_TokenTensor:$ids, F64Attr:$multiplier,
                       OptionalAttr<I64Attr>:$padding_idx);
  let results = (outs Model_FloatTensor:$dtable);
  let assemblyFormat = "$dy `,` $ids attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Model_RmsNormGradOp : Model_Op<"rms_norm_grad", [Pure]> {
  let summary = "gradients of y = x * rsqrt(mean(x^2, -1) + eps) * w";
  let description = [{
    With r = rsqrt(mean(x^2) + eps) and n = x r per row (fp32):
    `dx = r (dy w - n mean(dy w n))`, `dw = sum over rows of dy n`.
  }];
  let arguments = (ins Model_FloatTensor:$dy, Model_FloatTensor:$x, Model_FloatTensor:$w,
                       F64Attr:$eps);
  let results = (outs Model_FloatTensor:$dx, Model_FloatTensor:$dw);
  let assemblyFormat = "$dy `,` $x `,` $w attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Model_GatedRmsNormGradOp : Model_Op<"gated_rms_norm_grad", [Pure]> {
  let summary = "gradients of RMSNorm(y * silu(gate)) * w with respect to y, gate and w";
  let arguments = (ins Model_FloatTensor:$dout, Model_FloatTensor:$y, Model_FloatTensor:$gate,
                       Model_FloatTensor:$w, F64Attr:$eps);
  let results = (outs Model_FloatTensor:$dy, Model_FloatTensor:$dgate, Model_FloatTensor:$dw);
  let assemblyFormat = [{
    $dout `,` $y `,` $gate `,` $w attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Model_SiluGradOp : Model_Op<"silu_grad", [Pure, SameOperandsAndResultType]> {
  let summary = "dx = dy * sigmoid(x) * (1 + x * (1 - sigmoid(x)))";
  let arguments = (ins Model_FloatTensor:$dy, Model_FloatTensor:$x);
  let results = (outs Model_FloatTensor:$dx);
  let assemblyFormat = "$dy `,` $x attr-dict `:` type($dx)";
}

def Model_SoftplusGradOp : Model_Op<"softplus_grad", [Pure, SameOperandsAndResultType]> {
  let summary = "dx = dy * sigmoid(x); dy itself above 20, where softplus is the identity";
  let arguments = (ins Model_FloatTensor:$dy, Model_FloatTensor:$x);
  let results = (outs Model_FloatTensor:$dx);
  let assemblyFormat = "$dy `,` $x attr-dict `:` type($dx)";
}

def Model_NegExpGradOp : Model_Op<"neg_exp_grad", [Pure, SameOperandsAndResultType]> {
  let summary = "dx = dy * y for y = -exp(x): reads the forward result, not its input";
  let arguments = (ins Model_FloatTensor:$dy, Model_FloatTensor:$y);
  let results = (outs Model_FloatTensor:$dx);
  let assemblyFormat = "$dy `,` $y attr-dict `:` type($dx)";
}

def Model_SwigluGradOp : Model_Op<"swiglu_grad", [Pure]> {
  let summary = "gradient of silu(a) * b with respect to the packed [a | b]";
  let description = [{
    dy [..., width], x [..., 2*width] -> dx [..., 2*width]:
    `dx = [dy * b * silu'(a) | dy * silu(a)]`.
  }];
  let arguments = (ins Model_FloatTensor:$dy, Model_FloatTensor:$x);
  let results = (outs Model_FloatTensor:$dx);
  let assemblyFormat = "$dy `,` $x attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

//===------------------------------------------------------------------------------------------===//
// Mamba2 mixer gradients
//===------------------------------------------------------------------------------------------===//

def Model_CausalConv1dGradOp : Model_Op<"causal_conv1d_grad", [Pure, AttrSizedOperandSegments]> {
  let summary = "gradients of the causal depthwise conv1d with bias";
  let description = [{
    dy, x [batch, seq, channels], w [channels, 1, width], optional halo -> dx (x's shape), dw
    (w's shape), dbias [channels], and dhalo (the halo's shape) exactly when the halo is given:
    `dx[t] = sum_j w[j] dy[t + (width-1) - j]` (zero past the end),
    `dw[c, 0, j] = sum_t dy[t, c] x[t - (width-1) + j, c]` (halo rows before t = 0),
    `dbias = sum_t dy[t]`; with `positions`, only the terms model.causal_conv1d's take.
  }];
  let arguments = (ins Model_FloatTensor:$dy, Model_FloatTensor:$x, Model_FloatTensor:$w,
                       Optional<Model_FloatTensor>:$halo, Optional<Model_TokenTensor>:$positions);
  let results = (outs Model_FloatTensor:$dx, Model_FloatTensor:$dw, Model_FloatTensor:$dbias,
                      Optional<Model_FloatTensor>:$dhalo);
  let assemblyFormat = [{
    $dy `,` $x `,` $w (`halo` $halo^)? (`positions` $positions^)? attr-dict `:`
    functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Model_SsdLogDecayGradOp : Model_Op<"ssd_log_decay_grad", [Pure]> {
  let summary = "gradients of ssd_log_decay";
  let description = [{
    dg [b, heads], dt [b, s, heads], A [heads] -> ddt (dt's shape) = dg[b, h] * A[h] at every t,
    dA [heads] = sum_{b,t} dg[b, h] * dt[b, t, h].
  }];
  let arguments = (ins Model_FloatTensor:$dg, Model_FloatTensor:$dt, Model_FloatTensor:$A);
  let results = (outs Model_FloatTensor:$ddt, Model_FloatTensor:$dA);
  let assemblyFormat = "$dg `,` $dt `,` $A attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Model_SsdScanGradOp : Model_Op<"ssd_scan_grad", [Pure, AttrSizedOperandSegments]> {
  let summary = "gradients of the chunked SSD scan (reverse scan over the chunks)";
  let description = [{
    Operands as model.ssd_scan's plus dy (the gradient of y) first and, when the final state
    gets a gradient, `dfinal` [b, heads, head_dim, state] (f32). Results: dx, ddt, dA, dB, dC,
    dD with the shapes of x, dt, A, B, C, D, and `dinit` (init_state's type) exactly when
    `init` is given. The reverse scan runs from the last chunk to the first: the state
    gradient entering the last chunk is dfinal (zero without it) and the one leaving the first
    chunk is dinit.
  }];
  let arguments = (ins Model_FloatTensor:$dy, Model_FloatTensor:$x, Model_FloatTensor:$dt,
                       Model_FloatTensor:$A, Model_FloatTensor:$B, Model_FloatTensor:$C,
                       Model_FloatTensor:$D, Optional<Model_FloatTensor>:$init_state,
                       Optional<Model_FloatTensor>:$dfinal, Optional<Model_TokenTensor>:$positions,
                       I64Attr:$chunk_size);
  let results = (outs Model_FloatTensor:$dx, Model_FloatTensor:$ddt, Model_FloatTensor:$dA,
                      Model_FloatTensor:$dB, Model_FloatTensor:$dC, Model_FloatTensor:$dD,
                      Optional<Model_FloatTensor>:$dinit);
  let assemblyFormat = [{
    $dy `,` $x `,` $dt `,` $A `,` $B `,` $C `,` $D (`init` $init_state^)? (`dfinal` $dfinal^)?
    (`positions` $positions^)? attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Model_SsdAddInitialStateGradOp : Model_Op<"ssd_add_initial_state_grad", [Pure]> {
  let summary = "gradients of model.ssd_add_initial_state other than y's";
  let description = [{
    dresult and model.ssd_add_initial_state's dt, A, C, init_state -> ddt, dA, dC, dinit with
    their shapes (y's gradient is dresult itself). With `q_t = init_state C_t` and
    `w_t = exp(Acs_t) <dresult_t, q_t>`: `dinit = sum_t exp(Acs_t) dresult_t C_t^T`,
    `dC_t = sum_{h in g} exp(Acs_t) init_state^T dresult_t`, `ddt_u = A_h sum_{t>=u} w_t`,
    `dA_h = sum_{b,t} w_t sum_{u<=t} dt_u`.
  }];
  let arguments = (ins Model_FloatTensor:$dresult, Model_FloatTensor:$dt, Model_FloatTensor:$A,
                       Model_FloatTensor:$C, Model_FloatTensor:$init_state,
                       Optional<Model_TokenTensor>:$positions);
  let results = (outs Model_FloatTensor:$ddt, Model_FloatTensor:$dA, Model_FloatTensor:$dC,
                      Model_FloatTensor:$dinit);
  let assemblyFormat = [{
    $dresult `,` $dt `,` $A `,` $C `init` $init_state (`positions` $positions^)? attr-dict `:`
    functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Model_SsdFinalStateGradOp : Model_Op<"ssd_final_state_grad", [Pure]> {
  let summary = "gradients of model.ssd_final_state";
  let description = [{
    `dfinal` [b, heads, head_dim, state] (f32) and model.ssd_final_state's operands -> dx, ddt,
    dA, dB with the shapes of x, dt, A, B: model.ssd_scan_grad's with dy = 0 and no initial
    state. With dy = 0 only the state gradient flows: G_{last chunk} = dfinal and
    G_{c-1} = exp(a_last^(c)) G_c, so none of the scan's intra-chunk output gradient is needed.
  }];
  let arguments = (ins Model_FloatTensor:$dfinal, Model_FloatTensor:$x, Model_FloatTensor:$dt,
                       Model_FloatTensor:$A, Model_FloatTensor:$B,
                       Optional<Model_TokenTensor>:$positions, I64Attr:$chunk_size);
  let results = (outs Model_FloatTensor:$dx, Model_FloatTensor:$ddt, Model_FloatTensor:$dA,
                      Model_FloatTensor:$dB);
  let assemblyFormat = [{
    $dfinal `,` $x `,` $dt `,` $A `,` $B (`positions` $positions^)? attr-dict `:`
    functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

//===------------------------------------------------------------------------------------------===//
// Attention gradient
//===------------------------------------------------------------------------------------------===//

def Model_AttentionGradOp : Model_Op<"attention_grad", [Pure]> {
  let summary = "flash-attention backward: dq, dk, dv from dout, the inputs, out and lse";
  let description = [{
    Recomputes `P = exp(q k^T * scale - lse)` block by block; `D = rowsum(dout * out)`,
    `dS = P (dout v^T - D)`, `dq = dS k * scale`, `dk = dS^T q * scale`, `dv = P^T dout`, with
    the query heads of a group summed into their kv head for dk and dv. Shapes as
    model.attention: dout and out like q, lse [b, heads, s] in f32.
  }];
  let arguments = (ins Model_FloatTensor:$dout, Model_FloatTensor:$q, Model_FloatTensor:$k,
                       Model_FloatTensor:$v, Model_FloatTensor:$out, Model_FloatTensor:$lse,
                       Optional<Model_TokenTensor>:$positions, F64Attr:$scale, UnitAttr:$causal);
  let results = (outs Model_FloatTensor:$dq, Model_FloatTensor:$dk, Model_FloatTensor:$dv);
  let assemblyFormat = [{
    $dout `,` $q `,` $k `,` $v `,` $out `,` $lse (`positions` $positions^)? attr-dict `:`
    functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

//===------------------------------------------------------------------------------------------===//
// Mixture-of-experts gradients
//===------------------------------------------------------------------------------------------===//

def Model_MoeRouteGradOp : Model_Op<"moe_route_grad", [Pure]> {
  let summary = "gradient of the router logits through the softmax over the top-k";
  let description = [{
    dgates, gates, experts [tokens..., k] -> dlogits [tokens..., experts] (the experts dim from
    the result type): at the selected experts `dlogits = gates * (dgates - sum_j dgates_j
    gates_j)`, zero elsewhere (top-k selection itself has no gradient).
  }];
  let arguments = (ins Model_FloatTensor:$dgates, Model_FloatTensor:$gates,
                       Model_TokenTensor:$experts);
  let results = (outs Model_FloatTensor:$dlogits);
  let assemblyFormat = [{
    $dgates `,` $gates `,` $experts attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Model_MoeExpertsGradOp : Model_Op<"moe_experts_grad", [Pure]> {
  let summary = "gradients of the routed expert MLPs: dx, dgates, dW_in, dW_out";
  let description = [{
    Per token t and slot j with e = experts[t, j], u = silu(a) * b, `[a | b] = W_in[e] x[t]`:
    `dgates[t, j] = dout[t] . (W_out[e] u)`, `dW_out[e] += gates[t, j] dout[t] u^T`,
    `d[a | b] = swiglu_grad(gates[t, j] W_out[e]^T dout[t])`, `dW_in[e] += d[a|b] x[t]^T`,
    `dx[t] += W_in[e]^T d[a | b]`. Shapes as model.moe_experts.
  }];
  let arguments = (ins Model_FloatTensor:$dout, Model_FloatTensor:$x, Model_FloatTensor:$gates,
                       Model_TokenTensor:$experts, Model_FloatTensor:$w_in,
                       Model_FloatTensor:$w_out);
  let results = (outs Model_FloatTensor:$dx, Model_FloatTensor:$dgates, Model_FloatTensor:$dw_in,
                      Model_FloatTensor:$dw_out);
  let assemblyFormat = [{
    $dout `,` $x `,` $gates `,` $experts `,` $w_in `,` $w_out attr-dict `:`
    functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Model_RouterLoadGradOp : Model_Op<"router_load_grad", [Pure]> {
  let summary = "gradient of the router logits through the summed softmax";
  let description = [{
    dprobs [experts], logits [tokens..., experts] -> dlogits [tokens..., experts]:
    `dlogits[t] = s * (dprobs - sum_e s_e dprobs_e)` with `s = softmax(logits[t])`.
  }];
  let arguments = (ins Model_Vector:$dprobs, Model_FloatTensor:$logits);
  let results = (outs Model_FloatTensor:$dlogits);
  let assemblyFormat = "$dprobs `,` $logits attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Model_RouterAuxLossGradOp : Model_Op<"router_aux_loss_grad", [Pure]> {
  let summary = "gradient of the load-balancing loss with respect to the summed probabilities";
  let description = [{ `dprobs[e] = dloss * scale * picks[e]` (picks, a count, has none). }];
  let arguments = (ins Model_Scalar:$dloss, Model_Vector:$picks, F64Attr:$scale);
  let results = (outs Model_Vector:$dprobs);
  let assemblyFormat = "$dloss `,` $picks attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

//===------------------------------------------------------------------------------------------===//
// Loss gradient and parameter gradients
//===------------------------------------------------------------------------------------------===//

def Model_CrossEntropyGradOp : Model_Op<"cross_entropy_grad", [Pure]> {
  let summary = "gradient of the summed cross-entropy with respect to the logits";
  let description = [{
    `dlogits[t] = dloss_sum * (softmax(logits[t]) - onehot(targets[t]))` at valid positions,
    zero where `targets[t] = ignore_index`. valid_count carries no gradient.
  }];
  let arguments = (ins Model_Scalar:$dloss_sum, Model_FloatTensor:$logits,
                       Model_TokenTensor:$targets, I64Attr:$ignore_index);
  let results = (outs Model_FloatTensor:$dlogits);
  let assemblyFormat = [{
    $dloss_sum `,` $logits `,` $targets attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Model_ParamGradOp : Model_Op<"param_grad", [MemoryEffects<[MemWrite]>]> {
  let summary = "the gradient of the parameter `name` (a sink: the optimizer reads it)";
  let description = [{
    `model.param_grad "model.norm.weight", %g : tensor<1536xf32>`: hcp-autodiff emits exactly
    one per model.param, with the parameter's type, summing every use's contribution. It writes
    memory (the gradient buffer) so that no cleanup removes it.
  }];
  let arguments = (ins StrAttr:$name, Model_FloatTensor:$grad);
  let assemblyFormat = "$name `,` $grad attr-dict `:` type($grad)";
  let hasVerifier = 1;
}

#endif  // HYBRIDCP_MODEL_GRAD_OPS_TD
