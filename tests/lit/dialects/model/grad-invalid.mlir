// Every verifier error of the `model` gradient ops, with the message a user sees.
// RUN: hybridcp-opt %s --split-input-file --verify-diagnostics

// A fill needs a static shape.
func.func @fill_dynamic() {
  // expected-error @+1 {{fill needs a static shape}}
  %r = model.fill 0.0 : tensor<?x4xf32>
  return
}

// -----

// sum_leading keeps a trailing part of the input's shape.
func.func @sum_leading_not_trailing(%a0: tensor<2x5x6xf32>) {
  // expected-error @+1 {{result shape [5] must equal the trailing dims of input shape [2, 5, 6]}}
  %r = model.sum_leading %a0 : tensor<2x5x6xf32> -> tensor<5xf32>
  return
}

// -----

// sum_leading keeps the element type.
func.func @sum_leading_dtype(%a0: tensor<2x6xf32>) {
  // expected-error @+1 {{input and result must have the same element type, got 'f32' and 'bf16'}}
  %r = model.sum_leading %a0 : tensor<2x6xf32> -> tensor<6xbf16>
  return
}

// -----

// concat needs at least one piece.
func.func @concat_nothing() {
  // expected-error @+1 {{needs at least one piece}}
  %r = "model.concat"() : () -> tensor<2x4xf32>
  return
}

// -----

// Scalars have no last dim to concatenate along.
func.func @concat_scalars(%a0: tensor<f32>) {
  // expected-error @+1 {{cannot concatenate scalars}}
  %r = model.concat %a0 : tensor<f32> -> tensor<f32>
  return
}

// -----

// Pieces must agree in every dim but the last.
func.func @concat_leading(%a0: tensor<2x3xf32>, %a1: tensor<3x2xf32>) {
  // expected-error @+1 {{piece 1 has shape [3, 2] but every piece must match the result [2, 5] in all dims but the last}}
  %r = model.concat %a0, %a1 : tensor<2x3xf32>, tensor<3x2xf32> -> tensor<2x5xf32>
  return
}

// -----

// Pieces have the result's element type.
func.func @concat_dtype(%a0: tensor<2x3xf32>, %a1: tensor<2x2xbf16>) {
  // expected-error @+1 {{pieces and result must have the same element type, got 'bf16' and 'f32'}}
  %r = model.concat %a0, %a1 : tensor<2x3xf32>, tensor<2x2xbf16> -> tensor<2x5xf32>
  return
}

// -----

// The pieces' last dims add up to the result's.
func.func @concat_sizes(%a0: tensor<2x3xf32>, %a1: tensor<2x2xf32>) {
  // expected-error @+1 {{pieces add up to 5 along the last dim but the result has 6}}
  %r = model.concat %a0, %a1 : tensor<2x3xf32>, tensor<2x2xf32> -> tensor<2x6xf32>
  return
}

// -----

// The linear weight is [out, in].
func.func @lgi_weight_rank(%a0: tensor<2x6xf32>, %a1: tensor<6xf32>) {
  // expected-error @+1 {{linear weight must have rank 2, got shape [6]}}
  %r = model.linear_grad_input %a0, %a1 : (tensor<2x6xf32>, tensor<6xf32>) -> tensor<2x4xf32>
  return
}

// -----

// Weights have static shapes.
func.func @lgi_weight_dynamic(%a0: tensor<2x6xf32>, %a1: tensor<?x4xf32>) {
  // expected-error @+1 {{linear weight must have a static shape, got [?, 4]}}
  %r = model.linear_grad_input %a0, %a1 : (tensor<2x6xf32>, tensor<?x4xf32>) -> tensor<2x4xf32>
  return
}

// -----

// The output gradient has the outputs as its last dim.
func.func @lgi_scalar(%a0: tensor<f32>, %a1: tensor<6x4xf32>) {
  // expected-error @+1 {{output gradient must have at least one dim}}
  %r = model.linear_grad_input %a0, %a1 : (tensor<f32>, tensor<6x4xf32>) -> tensor<2x4xf32>
  return
}

// -----

// The output gradient's last dim is the weight's number of outputs.
func.func @lgi_outputs(%a0: tensor<2x5xf32>, %a1: tensor<6x4xf32>) {
  // expected-error @+1 {{weight [6, 4] has 6 outputs but the output gradient's last dim is 5}}
  %r = model.linear_grad_input %a0, %a1 : (tensor<2x5xf32>, tensor<6x4xf32>) -> tensor<2x4xf32>
  return
}

// -----

// dx has the input's shape: dy's with the weight's input size last.
func.func @lgi_result(%a0: tensor<2x6xf32>, %a1: tensor<6x4xf32>) {
  // expected-error @+1 {{input gradient must have shape [2, 4], got [2, 6]}}
  %r = model.linear_grad_input %a0, %a1 : (tensor<2x6xf32>, tensor<6x4xf32>) -> tensor<2x6xf32>
  return
}

// -----

// dy and the weight share the element type.
func.func @lgi_weight_dtype(%a0: tensor<2x6xf32>, %a1: tensor<6x4xbf16>) {
  // expected-error @+1 {{output gradient and weight must have the same element type, got 'f32' and 'bf16'}}
  %r = model.linear_grad_input %a0, %a1 : (tensor<2x6xf32>, tensor<6x4xbf16>) -> tensor<2x4xf32>
  return
}

// -----

// dx has dy's element type.
func.func @lgi_result_dtype(%a0: tensor<2x6xf32>, %a1: tensor<6x4xf32>) {
  // expected-error @+1 {{output gradient and input gradient must have the same element type, got 'f32' and 'bf16'}}
  %r = model.linear_grad_input %a0, %a1 : (tensor<2x6xf32>, tensor<6x4xf32>) -> tensor<2x4xbf16>
  return
}

// -----

// The weight gradient is [out, in].
func.func @lgw_rank(%a0: tensor<2x6xf32>, %a1: tensor<2x4xf32>) {
  // expected-error @+1 {{weight gradient must have rank 2, got shape [24]}}
  %r = model.linear_grad_weight %a0, %a1 : (tensor<2x6xf32>, tensor<2x4xf32>) -> tensor<24xf32>
  return
}

// -----

// dy and x come from the same tokens.
func.func @lgw_leading(%a0: tensor<2x6xf32>, %a1: tensor<3x4xf32>) {
  // expected-error @+1 {{output gradient [2, 6] and input [3, 4] must agree in every dim but the last}}
  %r = model.linear_grad_weight %a0, %a1 : (tensor<2x6xf32>, tensor<3x4xf32>) -> tensor<6x4xf32>
  return
}

// -----

// dW is [dy's last dim, x's last dim].
func.func @lgw_shape(%a0: tensor<2x6xf32>, %a1: tensor<2x4xf32>) {
  // expected-error @+1 {{weight gradient must have shape [6, 4], got [4, 6]}}
  %r = model.linear_grad_weight %a0, %a1 : (tensor<2x6xf32>, tensor<2x4xf32>) -> tensor<4x6xf32>
  return
}

// -----

// dy and x share the element type.
func.func @lgw_input_dtype(%a0: tensor<2x6xf32>, %a1: tensor<2x4xbf16>) {
  // expected-error @+1 {{output gradient and input must have the same element type, got 'f32' and 'bf16'}}
  %r = model.linear_grad_weight %a0, %a1 : (tensor<2x6xf32>, tensor<2x4xbf16>) -> tensor<6x4xf32>
  return
}

// -----

// dW has dy's element type.
func.func @lgw_result_dtype(%a0: tensor<2x6xf32>, %a1: tensor<2x4xf32>) {
  // expected-error @+1 {{output gradient and weight gradient must have the same element type, got 'f32' and 'bf16'}}
  %r = model.linear_grad_weight %a0, %a1 : (tensor<2x6xf32>, tensor<2x4xf32>) -> tensor<6x4xbf16>
  return
}

// -----

// The output gradient is [batch, seq, hidden].
func.func @emb_dy_rank(%a0: tensor<10x4xf32>, %a1: tensor<2x5xi32>) {
  // expected-error @+1 {{output gradient [batch, seq, hidden] must have rank 3, got shape [10, 4]}}
  %r = model.embedding_grad %a0, %a1 {multiplier = 1.0 : f64} : (tensor<10x4xf32>, tensor<2x5xi32>) -> tensor<8x4xf32>
  return
}

// -----

// Token ids are [batch, seq].
func.func @emb_ids_rank(%a0: tensor<2x5x4xf32>, %a1: tensor<10xi32>) {
  // expected-error @+1 {{token ids must have rank 2, got shape [10]}}
  %r = model.embedding_grad %a0, %a1 {multiplier = 1.0 : f64} : (tensor<2x5x4xf32>, tensor<10xi32>) -> tensor<8x4xf32>
  return
}

// -----

// The table gradient is [vocab, hidden].
func.func @emb_table_rank(%a0: tensor<2x5x4xf32>, %a1: tensor<2x5xi32>) {
  // expected-error @+1 {{table gradient [vocab, hidden] must have rank 2, got shape [32]}}
  %r = model.embedding_grad %a0, %a1 {multiplier = 1.0 : f64} : (tensor<2x5x4xf32>, tensor<2x5xi32>) -> tensor<32xf32>
  return
}

// -----

// One token id per output position.
func.func @emb_ids_shape(%a0: tensor<2x5x4xf32>, %a1: tensor<2x4xi32>) {
  // expected-error @+1 {{token ids must have shape [2, 5], got [2, 4]}}
  %r = model.embedding_grad %a0, %a1 {multiplier = 1.0 : f64} : (tensor<2x5x4xf32>, tensor<2x4xi32>) -> tensor<8x4xf32>
  return
}

// -----

// The table rows have the hidden size.
func.func @emb_hidden(%a0: tensor<2x5x4xf32>, %a1: tensor<2x5xi32>) {
  // expected-error @+1 {{table gradient [8, 3] must have the hidden size 4 of the output gradient}}
  %r = model.embedding_grad %a0, %a1 {multiplier = 1.0 : f64} : (tensor<2x5x4xf32>, tensor<2x5xi32>) -> tensor<8x3xf32>
  return
}

// -----

// The padding row must be inside the vocabulary.
func.func @emb_padding(%a0: tensor<2x5x4xf32>, %a1: tensor<2x5xi32>) {
  // expected-error @+1 {{padding_idx 8 is outside the vocabulary of 8 tokens}}
  %r = model.embedding_grad %a0, %a1 {multiplier = 1.0 : f64, padding_idx = 8 : i64} : (tensor<2x5x4xf32>, tensor<2x5xi32>) -> tensor<8x4xf32>
  return
}

// -----

// A negative padding row is outside the vocabulary too.
func.func @emb_padding_negative(%a0: tensor<2x5x4xf32>, %a1: tensor<2x5xi32>) {
  // expected-error @+1 {{padding_idx -1 is outside the vocabulary of 8 tokens}}
  %r = model.embedding_grad %a0, %a1 {multiplier = 1.0 : f64, padding_idx = -1 : i64} : (tensor<2x5x4xf32>, tensor<2x5xi32>) -> tensor<8x4xf32>
  return
}

// -----

// The table gradient has the output gradient's element type.
func.func @emb_dtype(%a0: tensor<2x5x4xf32>, %a1: tensor<2x5xi32>) {
  // expected-error @+1 {{output gradient and table gradient must have the same element type, got 'f32' and 'bf16'}}
  %r = model.embedding_grad %a0, %a1 {multiplier = 1.0 : f64} : (tensor<2x5x4xf32>, tensor<2x5xi32>) -> tensor<8x4xbf16>
  return
}

// -----

// The norm weight is one entry per normalised element.
func.func @rms_weight_rank(%a0: tensor<2x5x4xf32>, %a1: tensor<2x5x4xf32>, %a2: tensor<1x4xf32>) {
  // expected-error @+1 {{norm weight must have rank 1, got shape [1, 4]}}
  %r:2 = model.rms_norm_grad %a0, %a1, %a2 {eps = 1.0e-5 : f64} : (tensor<2x5x4xf32>, tensor<2x5x4xf32>, tensor<1x4xf32>) -> (tensor<2x5x4xf32>, tensor<1x4xf32>)
  return
}

// -----

// The norm weight covers the last dim.
func.func @rms_weight_size(%a0: tensor<2x5x4xf32>, %a1: tensor<2x5x4xf32>, %a2: tensor<3xf32>) {
  // expected-error @+1 {{norm weight has 3 entries but the normalised dim has 4}}
  %r:2 = model.rms_norm_grad %a0, %a1, %a2 {eps = 1.0e-5 : f64} : (tensor<2x5x4xf32>, tensor<2x5x4xf32>, tensor<3xf32>) -> (tensor<2x5x4xf32>, tensor<3xf32>)
  return
}

// -----

// eps keeps the rsqrt finite.
func.func @rms_eps(%a0: tensor<2x5x4xf32>, %a1: tensor<2x5x4xf32>, %a2: tensor<4xf32>) {
  // expected-error @+1 {{eps must be positive}}
  %r:2 = model.rms_norm_grad %a0, %a1, %a2 {eps = 0.0 : f64} : (tensor<2x5x4xf32>, tensor<2x5x4xf32>, tensor<4xf32>) -> (tensor<2x5x4xf32>, tensor<4xf32>)
  return
}

// -----

// The output gradient has the input's type.
func.func @rms_dy(%a0: tensor<2x5x4xbf16>, %a1: tensor<2x5x4xf32>, %a2: tensor<4xf32>) {
  // expected-error @+1 {{output gradient must have the type of the input (tensor<2x5x4xf32>), got tensor<2x5x4xbf16>}}
  %r:2 = model.rms_norm_grad %a0, %a1, %a2 {eps = 1.0e-5 : f64} : (tensor<2x5x4xbf16>, tensor<2x5x4xf32>, tensor<4xf32>) -> (tensor<2x5x4xf32>, tensor<4xf32>)
  return
}

// -----

// dx has the input's type.
func.func @rms_dx(%a0: tensor<2x5x4xf32>, %a1: tensor<2x5x4xf32>, %a2: tensor<4xf32>) {
  // expected-error @+1 {{input gradient must have the type of the input (tensor<2x5x4xf32>), got tensor<2x4x4xf32>}}
  %r:2 = model.rms_norm_grad %a0, %a1, %a2 {eps = 1.0e-5 : f64} : (tensor<2x5x4xf32>, tensor<2x5x4xf32>, tensor<4xf32>) -> (tensor<2x4x4xf32>, tensor<4xf32>)
  return
}

// -----

// dw has the weight's type.
func.func @rms_dw(%a0: tensor<2x5x4xf32>, %a1: tensor<2x5x4xf32>, %a2: tensor<4xf32>) {
  // expected-error @+1 {{weight gradient must have the type of the weight (tensor<4xf32>), got tensor<4xbf16>}}
  %r:2 = model.rms_norm_grad %a0, %a1, %a2 {eps = 1.0e-5 : f64} : (tensor<2x5x4xf32>, tensor<2x5x4xf32>, tensor<4xf32>) -> (tensor<2x5x4xf32>, tensor<4xbf16>)
  return
}

// -----

// The gated norm's weight is one entry per element of the last dim.
func.func @grms_weight_rank(%a0: tensor<2x5x4xf32>, %a1: tensor<2x5x4xf32>, %a2: tensor<2x5x4xf32>, %a3: tensor<2x2xf32>) {
  // expected-error @+1 {{norm weight must have rank 1, got shape [2, 2]}}
  %r:3 = model.gated_rms_norm_grad %a0, %a1, %a2, %a3 {eps = 1.0e-5 : f64} : (tensor<2x5x4xf32>, tensor<2x5x4xf32>, tensor<2x5x4xf32>, tensor<2x2xf32>) -> (tensor<2x5x4xf32>, tensor<2x5x4xf32>, tensor<2x2xf32>)
  return
}

// -----

// The gated norm's weight covers the whole last dim (d_in).
func.func @grms_weight_size(%a0: tensor<2x5x4xf32>, %a1: tensor<2x5x4xf32>, %a2: tensor<2x5x4xf32>, %a3: tensor<2xf32>) {
  // expected-error @+1 {{norm weight has 2 entries but the normalised dim has 4}}
  %r:3 = model.gated_rms_norm_grad %a0, %a1, %a2, %a3 {eps = 1.0e-5 : f64} : (tensor<2x5x4xf32>, tensor<2x5x4xf32>, tensor<2x5x4xf32>, tensor<2xf32>) -> (tensor<2x5x4xf32>, tensor<2x5x4xf32>, tensor<2xf32>)
  return
}

// -----

// eps keeps the gated norm's rsqrt finite.
func.func @grms_eps(%a0: tensor<2x5x4xf32>, %a1: tensor<2x5x4xf32>, %a2: tensor<2x5x4xf32>, %a3: tensor<4xf32>) {
  // expected-error @+1 {{eps must be positive}}
  %r:3 = model.gated_rms_norm_grad %a0, %a1, %a2, %a3 {eps = -1.0 : f64} : (tensor<2x5x4xf32>, tensor<2x5x4xf32>, tensor<2x5x4xf32>, tensor<4xf32>) -> (tensor<2x5x4xf32>, tensor<2x5x4xf32>, tensor<4xf32>)
  return
}

// -----

// The gate z has y's type.
func.func @grms_gate(%a0: tensor<2x5x4xf32>, %a1: tensor<2x5x4xf32>, %a2: tensor<2x5x2xf32>, %a3: tensor<4xf32>) {
  // expected-error @+1 {{gate must have the type of y (tensor<2x5x4xf32>), got tensor<2x5x2xf32>}}
  %r:3 = model.gated_rms_norm_grad %a0, %a1, %a2, %a3 {eps = 1.0e-5 : f64} : (tensor<2x5x4xf32>, tensor<2x5x4xf32>, tensor<2x5x2xf32>, tensor<4xf32>) -> (tensor<2x5x4xf32>, tensor<2x5x2xf32>, tensor<4xf32>)
  return
}

// -----

// The output gradient has y's type.
func.func @grms_dout(%a0: tensor<1x5x4xf32>, %a1: tensor<2x5x4xf32>, %a2: tensor<2x5x4xf32>, %a3: tensor<4xf32>) {
  // expected-error @+1 {{output gradient must have the type of y (tensor<2x5x4xf32>), got tensor<1x5x4xf32>}}
  %r:3 = model.gated_rms_norm_grad %a0, %a1, %a2, %a3 {eps = 1.0e-5 : f64} : (tensor<1x5x4xf32>, tensor<2x5x4xf32>, tensor<2x5x4xf32>, tensor<4xf32>) -> (tensor<2x5x4xf32>, tensor<2x5x4xf32>, tensor<4xf32>)
  return
}

// -----

// dy has y's type.
func.func @grms_dy(%a0: tensor<2x5x4xf32>, %a1: tensor<2x5x4xf32>, %a2: tensor<2x5x4xf32>, %a3: tensor<4xf32>) {
  // expected-error @+1 {{y gradient must have the type of y (tensor<2x5x4xf32>), got tensor<2x5x4xbf16>}}
  %r:3 = model.gated_rms_norm_grad %a0, %a1, %a2, %a3 {eps = 1.0e-5 : f64} : (tensor<2x5x4xf32>, tensor<2x5x4xf32>, tensor<2x5x4xf32>, tensor<4xf32>) -> (tensor<2x5x4xbf16>, tensor<2x5x4xf32>, tensor<4xf32>)
  return
}

// -----

// dgate has the gate's type.
func.func @grms_dgate(%a0: tensor<2x5x4xf32>, %a1: tensor<2x5x4xf32>, %a2: tensor<2x5x4xf32>, %a3: tensor<4xf32>) {
  // expected-error @+1 {{gate gradient must have the type of the gate (tensor<2x5x4xf32>), got tensor<2x5x4xbf16>}}
  %r:3 = model.gated_rms_norm_grad %a0, %a1, %a2, %a3 {eps = 1.0e-5 : f64} : (tensor<2x5x4xf32>, tensor<2x5x4xf32>, tensor<2x5x4xf32>, tensor<4xf32>) -> (tensor<2x5x4xf32>, tensor<2x5x4xbf16>, tensor<4xf32>)
  return
}

// -----

// The gated norm's dw has the weight's type.
func.func @grms_dw(%a0: tensor<2x5x4xf32>, %a1: tensor<2x5x4xf32>, %a2: tensor<2x5x4xf32>, %a3: tensor<4xf32>) {
  // expected-error @+1 {{weight gradient must have the type of the weight (tensor<4xf32>), got tensor<4xbf16>}}
  %r:3 = model.gated_rms_norm_grad %a0, %a1, %a2, %a3 {eps = 1.0e-5 : f64} : (tensor<2x5x4xf32>, tensor<2x5x4xf32>, tensor<2x5x4xf32>, tensor<4xf32>) -> (tensor<2x5x4xf32>, tensor<2x5x4xf32>, tensor<4xbf16>)
  return
}

// -----

// Elementwise gradients have one type for dy, x and dx.
func.func @silu_grad_types(%a0: tensor<2x6xf32>, %a1: tensor<2x6xbf16>) {
  // expected-error @+1 {{requires the same type for all operands and results}}
  %r = "model.silu_grad"(%a0, %a1) : (tensor<2x6xf32>, tensor<2x6xbf16>) -> tensor<2x6xf32>
  return
}

// -----

// SwiGLU's packed gate|up dim is even.
func.func @swiglu_odd(%a0: tensor<2x2xf32>, %a1: tensor<2x5xf32>) {
  // expected-error @+1 {{the packed gate|up dim must be even, got shape [2, 5]}}
  %r = model.swiglu_grad %a0, %a1 : (tensor<2x2xf32>, tensor<2x5xf32>) -> tensor<2x5xf32>
  return
}

// -----

// dy has half the packed width.
func.func @swiglu_dy(%a0: tensor<2x6xf32>, %a1: tensor<2x6xf32>) {
  // expected-error @+1 {{output gradient must have shape [2, 3], got [2, 6]}}
  %r = model.swiglu_grad %a0, %a1 : (tensor<2x6xf32>, tensor<2x6xf32>) -> tensor<2x6xf32>
  return
}

// -----

// dx has the packed input's type.
func.func @swiglu_dx(%a0: tensor<2x3xf32>, %a1: tensor<2x6xf32>) {
  // expected-error @+1 {{input gradient must have the type of the packed input (tensor<2x6xf32>), got tensor<2x3xf32>}}
  %r = model.swiglu_grad %a0, %a1 : (tensor<2x3xf32>, tensor<2x6xf32>) -> tensor<2x3xf32>
  return
}

// -----

// dy has the input's element type.
func.func @swiglu_dtype(%a0: tensor<2x3xbf16>, %a1: tensor<2x6xf32>) {
  // expected-error @+1 {{output gradient and input must have the same element type, got 'bf16' and 'f32'}}
  %r = model.swiglu_grad %a0, %a1 : (tensor<2x3xbf16>, tensor<2x6xf32>) -> tensor<2x6xf32>
  return
}

// -----

// The conv input is [batch, seq, channels].
func.func @conv_x_rank(%a0: tensor<7x10xf32>, %a1: tensor<7x10xf32>, %a2: tensor<10x1x4xf32>) {
  // expected-error @+1 {{conv input [batch, seq, channels] must have rank 3, got shape [7, 10]}}
  %r:3 = model.causal_conv1d_grad %a0, %a1, %a2 : (tensor<7x10xf32>, tensor<7x10xf32>, tensor<10x1x4xf32>) -> (tensor<7x10xf32>, tensor<10x1x4xf32>, tensor<10xf32>)
  return
}

// -----

// The conv weight is [channels, 1, width].
func.func @conv_w_rank(%a0: tensor<1x7x10xf32>, %a1: tensor<1x7x10xf32>, %a2: tensor<10x4xf32>) {
  // expected-error @+1 {{conv weight [channels, 1, width] must have rank 3, got shape [10, 4]}}
  %r:3 = model.causal_conv1d_grad %a0, %a1, %a2 : (tensor<1x7x10xf32>, tensor<1x7x10xf32>, tensor<10x4xf32>) -> (tensor<1x7x10xf32>, tensor<10x4xf32>, tensor<10xf32>)
  return
}

// -----

// The conv is depthwise: one filter per channel.
func.func @conv_w_shape(%a0: tensor<1x7x10xf32>, %a1: tensor<1x7x10xf32>, %a2: tensor<8x1x4xf32>) {
  // expected-error @+1 {{depthwise conv weight must be [10, 1, width], got [8, 1, 4]}}
  %r:3 = model.causal_conv1d_grad %a0, %a1, %a2 : (tensor<1x7x10xf32>, tensor<1x7x10xf32>, tensor<8x1x4xf32>) -> (tensor<1x7x10xf32>, tensor<8x1x4xf32>, tensor<10xf32>)
  return
}

// -----

// The conv's output gradient has the input's type.
func.func @conv_dy(%a0: tensor<1x6x10xf32>, %a1: tensor<1x7x10xf32>, %a2: tensor<10x1x4xf32>) {
  // expected-error @+1 {{output gradient must have the type of the input (tensor<1x7x10xf32>), got tensor<1x6x10xf32>}}
  %r:3 = model.causal_conv1d_grad %a0, %a1, %a2 : (tensor<1x6x10xf32>, tensor<1x7x10xf32>, tensor<10x1x4xf32>) -> (tensor<1x7x10xf32>, tensor<10x1x4xf32>, tensor<10xf32>)
  return
}

// -----

// The conv's dx has the input's type.
func.func @conv_dx(%a0: tensor<1x7x10xf32>, %a1: tensor<1x7x10xf32>, %a2: tensor<10x1x4xf32>) {
  // expected-error @+1 {{input gradient must have the type of the input (tensor<1x7x10xf32>), got tensor<1x7x10xbf16>}}
  %r:3 = model.causal_conv1d_grad %a0, %a1, %a2 : (tensor<1x7x10xf32>, tensor<1x7x10xf32>, tensor<10x1x4xf32>) -> (tensor<1x7x10xbf16>, tensor<10x1x4xf32>, tensor<10xf32>)
  return
}

// -----

// The conv's dw keeps the checkpoint's [C, 1, K] shape.
func.func @conv_dw(%a0: tensor<1x7x10xf32>, %a1: tensor<1x7x10xf32>, %a2: tensor<10x1x4xf32>) {
  // expected-error @+1 {{weight gradient must have the type of the weight (tensor<10x1x4xf32>), got tensor<10x4xf32>}}
  %r:3 = model.causal_conv1d_grad %a0, %a1, %a2 : (tensor<1x7x10xf32>, tensor<1x7x10xf32>, tensor<10x1x4xf32>) -> (tensor<1x7x10xf32>, tensor<10x4xf32>, tensor<10xf32>)
  return
}

// -----

// The conv's bias gradient is one entry per channel.
func.func @conv_db(%a0: tensor<1x7x10xf32>, %a1: tensor<1x7x10xf32>, %a2: tensor<10x1x4xf32>) {
  // expected-error @+1 {{bias gradient must have shape [10], got [4]}}
  %r:3 = model.causal_conv1d_grad %a0, %a1, %a2 : (tensor<1x7x10xf32>, tensor<1x7x10xf32>, tensor<10x1x4xf32>) -> (tensor<1x7x10xf32>, tensor<10x1x4xf32>, tensor<4xf32>)
  return
}

// -----

// The conv's bias gradient has the activations' element type.
func.func @conv_db_dtype(%a0: tensor<1x7x10xf32>, %a1: tensor<1x7x10xf32>, %a2: tensor<10x1x4xf32>) {
  // expected-error @+1 {{bias gradient and input must have the same element type, got 'bf16' and 'f32'}}
  %r:3 = model.causal_conv1d_grad %a0, %a1, %a2 : (tensor<1x7x10xf32>, tensor<1x7x10xf32>, tensor<10x1x4xf32>) -> (tensor<1x7x10xf32>, tensor<10x1x4xf32>, tensor<10xbf16>)
  return
}

// -----

// x is [batch, seq, heads, head_dim].
func.func @ssd_x_rank(%a0: tensor<1x7x8xf32>, %a1: tensor<1x7x8xf32>, %a2: tensor<1x7x4xf32>, %a3: tensor<4xf32>, %a4: tensor<1x7x2x3xf32>, %a5: tensor<1x7x2x3xf32>, %a6: tensor<4xf32>) {
  // expected-error @+1 {{x [batch, seq, heads, head_dim] must have rank 4, got shape [1, 7, 8]}}
  %r:6 = model.ssd_scan_grad %a0, %a1, %a2, %a3, %a4, %a5, %a6 {chunk_size = 4 : i64} : (tensor<1x7x8xf32>, tensor<1x7x8xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x7x2x3xf32>, tensor<4xf32>) -> (tensor<1x7x8xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x7x2x3xf32>, tensor<4xf32>)
  return
}

// -----

// B is [batch, seq, groups, state].
func.func @ssd_b_rank(%a0: tensor<1x7x4x2xf32>, %a1: tensor<1x7x4x2xf32>, %a2: tensor<1x7x4xf32>, %a3: tensor<4xf32>, %a4: tensor<1x7x6xf32>, %a5: tensor<1x7x6xf32>, %a6: tensor<4xf32>) {
  // expected-error @+1 {{B [batch, seq, groups, state] must have rank 4, got shape [1, 7, 6]}}
  %r:6 = model.ssd_scan_grad %a0, %a1, %a2, %a3, %a4, %a5, %a6 {chunk_size = 4 : i64} : (tensor<1x7x4x2xf32>, tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x6xf32>, tensor<1x7x6xf32>, tensor<4xf32>) -> (tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x6xf32>, tensor<1x7x6xf32>, tensor<4xf32>)
  return
}

// -----

// B covers the same tokens as x.
func.func @ssd_b_seq(%a0: tensor<1x7x4x2xf32>, %a1: tensor<1x7x4x2xf32>, %a2: tensor<1x7x4xf32>, %a3: tensor<4xf32>, %a4: tensor<1x6x2x3xf32>, %a5: tensor<1x6x2x3xf32>, %a6: tensor<4xf32>) {
  // expected-error @+1 {{B [1, 6, 2, 3] must match x's batch and sequence [1, 7]}}
  %r:6 = model.ssd_scan_grad %a0, %a1, %a2, %a3, %a4, %a5, %a6 {chunk_size = 4 : i64} : (tensor<1x7x4x2xf32>, tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x6x2x3xf32>, tensor<1x6x2x3xf32>, tensor<4xf32>) -> (tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x6x2x3xf32>, tensor<1x6x2x3xf32>, tensor<4xf32>)
  return
}

// -----

// Groups divide the heads.
func.func @ssd_groups(%a0: tensor<1x7x4x2xf32>, %a1: tensor<1x7x4x2xf32>, %a2: tensor<1x7x4xf32>, %a3: tensor<4xf32>, %a4: tensor<1x7x3x3xf32>, %a5: tensor<1x7x3x3xf32>, %a6: tensor<4xf32>) {
  // expected-error @+1 {{3 groups do not divide 4 heads}}
  %r:6 = model.ssd_scan_grad %a0, %a1, %a2, %a3, %a4, %a5, %a6 {chunk_size = 4 : i64} : (tensor<1x7x4x2xf32>, tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x3x3xf32>, tensor<1x7x3x3xf32>, tensor<4xf32>) -> (tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x3x3xf32>, tensor<1x7x3x3xf32>, tensor<4xf32>)
  return
}

// -----

// dt is one step per token and head.
func.func @ssd_dt(%a0: tensor<1x7x4x2xf32>, %a1: tensor<1x7x4x2xf32>, %a2: tensor<1x7x2xf32>, %a3: tensor<4xf32>, %a4: tensor<1x7x2x3xf32>, %a5: tensor<1x7x2x3xf32>, %a6: tensor<4xf32>) {
  // expected-error @+1 {{dt must have shape [1, 7, 4], got [1, 7, 2]}}
  %r:6 = model.ssd_scan_grad %a0, %a1, %a2, %a3, %a4, %a5, %a6 {chunk_size = 4 : i64} : (tensor<1x7x4x2xf32>, tensor<1x7x4x2xf32>, tensor<1x7x2xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x7x2x3xf32>, tensor<4xf32>) -> (tensor<1x7x4x2xf32>, tensor<1x7x2xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x7x2x3xf32>, tensor<4xf32>)
  return
}

// -----

// A is one decay rate per head.
func.func @ssd_A(%a0: tensor<1x7x4x2xf32>, %a1: tensor<1x7x4x2xf32>, %a2: tensor<1x7x4xf32>, %a3: tensor<2xf32>, %a4: tensor<1x7x2x3xf32>, %a5: tensor<1x7x2x3xf32>, %a6: tensor<4xf32>) {
  // expected-error @+1 {{A must have shape [4], got [2]}}
  %r:6 = model.ssd_scan_grad %a0, %a1, %a2, %a3, %a4, %a5, %a6 {chunk_size = 4 : i64} : (tensor<1x7x4x2xf32>, tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<2xf32>, tensor<1x7x2x3xf32>, tensor<1x7x2x3xf32>, tensor<4xf32>) -> (tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<2xf32>, tensor<1x7x2x3xf32>, tensor<1x7x2x3xf32>, tensor<4xf32>)
  return
}

// -----

// C has B's shape.
func.func @ssd_C(%a0: tensor<1x7x4x2xf32>, %a1: tensor<1x7x4x2xf32>, %a2: tensor<1x7x4xf32>, %a3: tensor<4xf32>, %a4: tensor<1x7x2x3xf32>, %a5: tensor<1x7x2x2xf32>, %a6: tensor<4xf32>) {
  // expected-error @+1 {{C must have shape [1, 7, 2, 3], got [1, 7, 2, 2]}}
  %r:6 = model.ssd_scan_grad %a0, %a1, %a2, %a3, %a4, %a5, %a6 {chunk_size = 4 : i64} : (tensor<1x7x4x2xf32>, tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x7x2x2xf32>, tensor<4xf32>) -> (tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x7x2x2xf32>, tensor<4xf32>)
  return
}

// -----

// D is one skip weight per head.
func.func @ssd_D(%a0: tensor<1x7x4x2xf32>, %a1: tensor<1x7x4x2xf32>, %a2: tensor<1x7x4xf32>, %a3: tensor<4xf32>, %a4: tensor<1x7x2x3xf32>, %a5: tensor<1x7x2x3xf32>, %a6: tensor<3xf32>) {
  // expected-error @+1 {{D must have shape [4], got [3]}}
  %r:6 = model.ssd_scan_grad %a0, %a1, %a2, %a3, %a4, %a5, %a6 {chunk_size = 4 : i64} : (tensor<1x7x4x2xf32>, tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x7x2x3xf32>, tensor<3xf32>) -> (tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x7x2x3xf32>, tensor<3xf32>)
  return
}

// -----

// The initial state is [batch, heads, head_dim, state].
func.func @ssd_init(%a0: tensor<1x7x4x2xf32>, %a1: tensor<1x7x4x2xf32>, %a2: tensor<1x7x4xf32>, %a3: tensor<4xf32>, %a4: tensor<1x7x2x3xf32>, %a5: tensor<1x7x2x3xf32>, %a6: tensor<4xf32>, %a7: tensor<1x4x3x2xf32>) {
  // expected-error @+1 {{initial state must have shape [1, 4, 2, 3], got [1, 4, 3, 2]}}
  %r:7 = model.ssd_scan_grad %a0, %a1, %a2, %a3, %a4, %a5, %a6 init %a7 {chunk_size = 4 : i64} : (tensor<1x7x4x2xf32>, tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x7x2x3xf32>, tensor<4xf32>, tensor<1x4x3x2xf32>) -> (tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x7x2x3xf32>, tensor<4xf32>, tensor<1x4x3x2xf32>)
  return
}

// -----

// The final state's gradient has the final state's shape.
func.func @ssd_dfinal(%a0: tensor<1x7x4x2xf32>, %a1: tensor<1x7x4x2xf32>, %a2: tensor<1x7x4xf32>, %a3: tensor<4xf32>, %a4: tensor<1x7x2x3xf32>, %a5: tensor<1x7x2x3xf32>, %a6: tensor<4xf32>, %a7: tensor<1x4x2x2xf32>) {
  // expected-error @+1 {{final state gradient must have shape [1, 4, 2, 3], got [1, 4, 2, 2]}}
  %r:6 = model.ssd_scan_grad %a0, %a1, %a2, %a3, %a4, %a5, %a6 dfinal %a7 {chunk_size = 4 : i64} : (tensor<1x7x4x2xf32>, tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x7x2x3xf32>, tensor<4xf32>, tensor<1x4x2x2xf32>) -> (tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x7x2x3xf32>, tensor<4xf32>)
  return
}

// -----

// States are f32, and so is the final state's gradient.
func.func @ssd_dfinal_dtype(%a0: tensor<1x7x4x2xf32>, %a1: tensor<1x7x4x2xf32>, %a2: tensor<1x7x4xf32>, %a3: tensor<4xf32>, %a4: tensor<1x7x2x3xf32>, %a5: tensor<1x7x2x3xf32>, %a6: tensor<4xf32>, %a7: tensor<1x4x2x3xbf16>) {
  // expected-error @+1 {{final state gradient must be f32, like the final state}}
  %r:6 = model.ssd_scan_grad %a0, %a1, %a2, %a3, %a4, %a5, %a6 dfinal %a7 {chunk_size = 4 : i64} : (tensor<1x7x4x2xf32>, tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x7x2x3xf32>, tensor<4xf32>, tensor<1x4x2x3xbf16>) -> (tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x7x2x3xf32>, tensor<4xf32>)
  return
}

// -----

// The y gradient has x's type.
func.func @ssd_dy(%a0: tensor<1x7x4x2xbf16>, %a1: tensor<1x7x4x2xf32>, %a2: tensor<1x7x4xf32>, %a3: tensor<4xf32>, %a4: tensor<1x7x2x3xf32>, %a5: tensor<1x7x2x3xf32>, %a6: tensor<4xf32>) {
  // expected-error @+1 {{y gradient must have the type of x (tensor<1x7x4x2xf32>), got tensor<1x7x4x2xbf16>}}
  %r:6 = model.ssd_scan_grad %a0, %a1, %a2, %a3, %a4, %a5, %a6 {chunk_size = 4 : i64} : (tensor<1x7x4x2xbf16>, tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x7x2x3xf32>, tensor<4xf32>) -> (tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x7x2x3xf32>, tensor<4xf32>)
  return
}

// -----

// dx has x's type.
func.func @ssd_dx(%a0: tensor<1x7x4x2xf32>, %a1: tensor<1x7x4x2xf32>, %a2: tensor<1x7x4xf32>, %a3: tensor<4xf32>, %a4: tensor<1x7x2x3xf32>, %a5: tensor<1x7x2x3xf32>, %a6: tensor<4xf32>) {
  // expected-error @+1 {{x gradient must have the type of x (tensor<1x7x4x2xf32>), got tensor<1x7x8xf32>}}
  %r:6 = model.ssd_scan_grad %a0, %a1, %a2, %a3, %a4, %a5, %a6 {chunk_size = 4 : i64} : (tensor<1x7x4x2xf32>, tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x7x2x3xf32>, tensor<4xf32>) -> (tensor<1x7x8xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x7x2x3xf32>, tensor<4xf32>)
  return
}

// -----

// ddt has dt's type.
func.func @ssd_ddt(%a0: tensor<1x7x4x2xf32>, %a1: tensor<1x7x4x2xf32>, %a2: tensor<1x7x4xf32>, %a3: tensor<4xf32>, %a4: tensor<1x7x2x3xf32>, %a5: tensor<1x7x2x3xf32>, %a6: tensor<4xf32>) {
  // expected-error @+1 {{dt gradient must have the type of dt (tensor<1x7x4xf32>), got tensor<1x7x4xbf16>}}
  %r:6 = model.ssd_scan_grad %a0, %a1, %a2, %a3, %a4, %a5, %a6 {chunk_size = 4 : i64} : (tensor<1x7x4x2xf32>, tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x7x2x3xf32>, tensor<4xf32>) -> (tensor<1x7x4x2xf32>, tensor<1x7x4xbf16>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x7x2x3xf32>, tensor<4xf32>)
  return
}

// -----

// dA has A's type.
func.func @ssd_dA(%a0: tensor<1x7x4x2xf32>, %a1: tensor<1x7x4x2xf32>, %a2: tensor<1x7x4xf32>, %a3: tensor<4xf32>, %a4: tensor<1x7x2x3xf32>, %a5: tensor<1x7x2x3xf32>, %a6: tensor<4xf32>) {
  // expected-error @+1 {{A gradient must have the type of A (tensor<4xf32>), got tensor<1xf32>}}
  %r:6 = model.ssd_scan_grad %a0, %a1, %a2, %a3, %a4, %a5, %a6 {chunk_size = 4 : i64} : (tensor<1x7x4x2xf32>, tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x7x2x3xf32>, tensor<4xf32>) -> (tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<1xf32>, tensor<1x7x2x3xf32>, tensor<1x7x2x3xf32>, tensor<4xf32>)
  return
}

// -----

// dB has B's type.
func.func @ssd_dB(%a0: tensor<1x7x4x2xf32>, %a1: tensor<1x7x4x2xf32>, %a2: tensor<1x7x4xf32>, %a3: tensor<4xf32>, %a4: tensor<1x7x2x3xf32>, %a5: tensor<1x7x2x3xf32>, %a6: tensor<4xf32>) {
  // expected-error @+1 {{B gradient must have the type of B (tensor<1x7x2x3xf32>), got tensor<1x7x6xf32>}}
  %r:6 = model.ssd_scan_grad %a0, %a1, %a2, %a3, %a4, %a5, %a6 {chunk_size = 4 : i64} : (tensor<1x7x4x2xf32>, tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x7x2x3xf32>, tensor<4xf32>) -> (tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x6xf32>, tensor<1x7x2x3xf32>, tensor<4xf32>)
  return
}

// -----

// dC has C's type.
func.func @ssd_dC(%a0: tensor<1x7x4x2xf32>, %a1: tensor<1x7x4x2xf32>, %a2: tensor<1x7x4xf32>, %a3: tensor<4xf32>, %a4: tensor<1x7x2x3xf32>, %a5: tensor<1x7x2x3xf32>, %a6: tensor<4xf32>) {
  // expected-error @+1 {{C gradient must have the type of C (tensor<1x7x2x3xf32>), got tensor<1x7x6xf32>}}
  %r:6 = model.ssd_scan_grad %a0, %a1, %a2, %a3, %a4, %a5, %a6 {chunk_size = 4 : i64} : (tensor<1x7x4x2xf32>, tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x7x2x3xf32>, tensor<4xf32>) -> (tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x7x6xf32>, tensor<4xf32>)
  return
}

// -----

// dD has D's type.
func.func @ssd_dD(%a0: tensor<1x7x4x2xf32>, %a1: tensor<1x7x4x2xf32>, %a2: tensor<1x7x4xf32>, %a3: tensor<4xf32>, %a4: tensor<1x7x2x3xf32>, %a5: tensor<1x7x2x3xf32>, %a6: tensor<4xf32>) {
  // expected-error @+1 {{D gradient must have the type of D (tensor<4xf32>), got tensor<4xbf16>}}
  %r:6 = model.ssd_scan_grad %a0, %a1, %a2, %a3, %a4, %a5, %a6 {chunk_size = 4 : i64} : (tensor<1x7x4x2xf32>, tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x7x2x3xf32>, tensor<4xf32>) -> (tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x7x2x3xf32>, tensor<4xbf16>)
  return
}

// -----

// An initial state gets a gradient: the seventh result.
func.func @ssd_missing_dinit(%a0: tensor<1x7x4x2xf32>, %a1: tensor<1x7x4x2xf32>, %a2: tensor<1x7x4xf32>, %a3: tensor<4xf32>, %a4: tensor<1x7x2x3xf32>, %a5: tensor<1x7x2x3xf32>, %a6: tensor<4xf32>, %a7: tensor<1x4x2x3xf32>) {
  // expected-error @+1 {{an initial state needs an initial state gradient result}}
  %r:6 = model.ssd_scan_grad %a0, %a1, %a2, %a3, %a4, %a5, %a6 init %a7 {chunk_size = 4 : i64} : (tensor<1x7x4x2xf32>, tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x7x2x3xf32>, tensor<4xf32>, tensor<1x4x2x3xf32>) -> (tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x7x2x3xf32>, tensor<4xf32>)
  return
}

// -----

// Without an initial state there is no initial state gradient.
func.func @ssd_extra_dinit(%a0: tensor<1x7x4x2xf32>, %a1: tensor<1x7x4x2xf32>, %a2: tensor<1x7x4xf32>, %a3: tensor<4xf32>, %a4: tensor<1x7x2x3xf32>, %a5: tensor<1x7x2x3xf32>, %a6: tensor<4xf32>) {
  // expected-error @+1 {{an initial state gradient result needs an initial state}}
  %r:7 = model.ssd_scan_grad %a0, %a1, %a2, %a3, %a4, %a5, %a6 {chunk_size = 4 : i64} : (tensor<1x7x4x2xf32>, tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x7x2x3xf32>, tensor<4xf32>) -> (tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x7x2x3xf32>, tensor<4xf32>, tensor<1x4x2x3xf32>)
  return
}

// -----

// dinit has the initial state's type.
func.func @ssd_dinit(%a0: tensor<1x7x4x2xf32>, %a1: tensor<1x7x4x2xf32>, %a2: tensor<1x7x4xf32>, %a3: tensor<4xf32>, %a4: tensor<1x7x2x3xf32>, %a5: tensor<1x7x2x3xf32>, %a6: tensor<4xf32>, %a7: tensor<1x4x2x3xf32>) {
  // expected-error @+1 {{initial state gradient must have the type of the initial state (tensor<1x4x2x3xf32>), got tensor<1x4x2x3xbf16>}}
  %r:7 = model.ssd_scan_grad %a0, %a1, %a2, %a3, %a4, %a5, %a6 init %a7 {chunk_size = 4 : i64} : (tensor<1x7x4x2xf32>, tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x7x2x3xf32>, tensor<4xf32>, tensor<1x4x2x3xf32>) -> (tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x7x2x3xf32>, tensor<4xf32>, tensor<1x4x2x3xbf16>)
  return
}

// -----

// Chunks hold at least one position.
func.func @ssd_chunk(%a0: tensor<1x7x4x2xf32>, %a1: tensor<1x7x4x2xf32>, %a2: tensor<1x7x4xf32>, %a3: tensor<4xf32>, %a4: tensor<1x7x2x3xf32>, %a5: tensor<1x7x2x3xf32>, %a6: tensor<4xf32>) {
  // expected-error @+1 {{chunk size must be positive}}
  %r:6 = model.ssd_scan_grad %a0, %a1, %a2, %a3, %a4, %a5, %a6 {chunk_size = 0 : i64} : (tensor<1x7x4x2xf32>, tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x7x2x3xf32>, tensor<4xf32>) -> (tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x7x2x3xf32>, tensor<4xf32>)
  return
}

// -----

// The correction gradient's dt has one value per token and head.
func.func @ssd_add_initial_state_grad_dt(%d: tensor<1x7x4x2xf32>, %dt: tensor<1x7x2xf32>, %A: tensor<4xf32>, %C: tensor<1x7x2x3xf32>, %s: tensor<1x4x2x3xf32>) {
  // expected-error @+1 {{dt must have shape [1, 7, 4], got [1, 7, 2]}}
  %r:4 = model.ssd_add_initial_state_grad %d, %dt, %A, %C init %s : (tensor<1x7x4x2xf32>, tensor<1x7x2xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x4x2x3xf32>) -> (tensor<1x7x2xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x4x2x3xf32>)
  return
}

// -----

// The C gradient has C's type.
func.func @ssd_add_initial_state_grad_dc(%d: tensor<1x7x4x2xf32>, %dt: tensor<1x7x4xf32>, %A: tensor<4xf32>, %C: tensor<1x7x2x3xf32>, %s: tensor<1x4x2x3xf32>) {
  // expected-error @+1 {{C gradient must have the type of C (tensor<1x7x2x3xf32>), got tensor<1x7x2x3xbf16>}}
  %r:4 = model.ssd_add_initial_state_grad %d, %dt, %A, %C init %s : (tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x4x2x3xf32>) -> (tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xbf16>, tensor<1x4x2x3xf32>)
  return
}

// -----

// The initial state's gradient has its type.
func.func @ssd_add_initial_state_grad_dinit(%d: tensor<1x7x4x2xf32>, %dt: tensor<1x7x4xf32>, %A: tensor<4xf32>, %C: tensor<1x7x2x3xf32>, %s: tensor<1x4x2x3xf32>) {
  // expected-error @+1 {{initial state gradient must have the type of the initial state (tensor<1x4x2x3xf32>), got tensor<1x4x2x3xbf16>}}
  %r:4 = model.ssd_add_initial_state_grad %d, %dt, %A, %C init %s : (tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x4x2x3xf32>) -> (tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x4x2x3xbf16>)
  return
}

// -----

// The summary gradient's B covers the same tokens as x.
func.func @ssd_final_state_b_seq(%df: tensor<1x4x2x3xf32>, %x: tensor<1x7x4x2xf32>, %dt: tensor<1x7x4xf32>, %A: tensor<4xf32>, %B: tensor<1x6x2x3xf32>) {
  // expected-error @+1 {{B [1, 6, 2, 3] must match x's batch and sequence [1, 7]}}
  %r:4 = model.ssd_final_state_grad %df, %x, %dt, %A, %B {chunk_size = 4 : i64} : (tensor<1x4x2x3xf32>, tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x6x2x3xf32>) -> (tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x6x2x3xf32>)
  return
}

// -----

// The summary gradient's groups must divide the heads.
func.func @ssd_final_state_groups(%df: tensor<1x4x2x3xf32>, %x: tensor<1x7x4x2xf32>, %dt: tensor<1x7x4xf32>, %A: tensor<4xf32>, %B: tensor<1x7x3x3xf32>) {
  // expected-error @+1 {{3 groups do not divide 4 heads}}
  %r:4 = model.ssd_final_state_grad %df, %x, %dt, %A, %B {chunk_size = 4 : i64} : (tensor<1x4x2x3xf32>, tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x3x3xf32>) -> (tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x3x3xf32>)
  return
}

// -----

// The final state's gradient has the final state's shape.
func.func @ssd_final_state_dfinal(%df: tensor<1x4x3x2xf32>, %x: tensor<1x7x4x2xf32>, %dt: tensor<1x7x4xf32>, %A: tensor<4xf32>, %B: tensor<1x7x2x3xf32>) {
  // expected-error @+1 {{final state gradient must have shape [1, 4, 2, 3], got [1, 4, 3, 2]}}
  %r:4 = model.ssd_final_state_grad %df, %x, %dt, %A, %B {chunk_size = 4 : i64} : (tensor<1x4x3x2xf32>, tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>) -> (tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>)
  return
}

// -----

// The final state's gradient is f32, like the final state.
func.func @ssd_final_state_dfinal_dtype(%df: tensor<1x4x2x3xbf16>, %x: tensor<1x7x4x2xf32>, %dt: tensor<1x7x4xf32>, %A: tensor<4xf32>, %B: tensor<1x7x2x3xf32>) {
  // expected-error @+1 {{final state gradient must be f32, like the final state}}
  %r:4 = model.ssd_final_state_grad %df, %x, %dt, %A, %B {chunk_size = 4 : i64} : (tensor<1x4x2x3xbf16>, tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>) -> (tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>)
  return
}

// -----

// The x gradient has x's type.
func.func @ssd_final_state_dx(%df: tensor<1x4x2x3xf32>, %x: tensor<1x7x4x2xf32>, %dt: tensor<1x7x4xf32>, %A: tensor<4xf32>, %B: tensor<1x7x2x3xf32>) {
  // expected-error @+1 {{x gradient must have the type of x (tensor<1x7x4x2xf32>), got tensor<1x7x4x2xbf16>}}
  %r:4 = model.ssd_final_state_grad %df, %x, %dt, %A, %B {chunk_size = 4 : i64} : (tensor<1x4x2x3xf32>, tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>) -> (tensor<1x7x4x2xbf16>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>)
  return
}

// -----

// The dt gradient has dt's type.
func.func @ssd_final_state_ddt(%df: tensor<1x4x2x3xf32>, %x: tensor<1x7x4x2xf32>, %dt: tensor<1x7x4xf32>, %A: tensor<4xf32>, %B: tensor<1x7x2x3xf32>) {
  // expected-error @+1 {{dt gradient must have the type of dt (tensor<1x7x4xf32>), got tensor<1x7x4xbf16>}}
  %r:4 = model.ssd_final_state_grad %df, %x, %dt, %A, %B {chunk_size = 4 : i64} : (tensor<1x4x2x3xf32>, tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>) -> (tensor<1x7x4x2xf32>, tensor<1x7x4xbf16>, tensor<4xf32>, tensor<1x7x2x3xf32>)
  return
}

// -----

// The A gradient has A's type.
func.func @ssd_final_state_dA(%df: tensor<1x4x2x3xf32>, %x: tensor<1x7x4x2xf32>, %dt: tensor<1x7x4xf32>, %A: tensor<4xf32>, %B: tensor<1x7x2x3xf32>) {
  // expected-error @+1 {{A gradient must have the type of A (tensor<4xf32>), got tensor<1xf32>}}
  %r:4 = model.ssd_final_state_grad %df, %x, %dt, %A, %B {chunk_size = 4 : i64} : (tensor<1x4x2x3xf32>, tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>) -> (tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<1xf32>, tensor<1x7x2x3xf32>)
  return
}

// -----

// The B gradient has B's type.
func.func @ssd_final_state_dB(%df: tensor<1x4x2x3xf32>, %x: tensor<1x7x4x2xf32>, %dt: tensor<1x7x4xf32>, %A: tensor<4xf32>, %B: tensor<1x7x2x3xf32>) {
  // expected-error @+1 {{B gradient must have the type of B (tensor<1x7x2x3xf32>), got tensor<1x7x6xf32>}}
  %r:4 = model.ssd_final_state_grad %df, %x, %dt, %A, %B {chunk_size = 4 : i64} : (tensor<1x4x2x3xf32>, tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>) -> (tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x6xf32>)
  return
}

// -----

// The summary gradient's chunk size is positive.
func.func @ssd_final_state_chunk(%df: tensor<1x4x2x3xf32>, %x: tensor<1x7x4x2xf32>, %dt: tensor<1x7x4xf32>, %A: tensor<4xf32>, %B: tensor<1x7x2x3xf32>) {
  // expected-error @+1 {{chunk size must be positive}}
  %r:4 = model.ssd_final_state_grad %df, %x, %dt, %A, %B {chunk_size = 0 : i64} : (tensor<1x4x2x3xf32>, tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>) -> (tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>)
  return
}

// -----

// q is [batch, seq, heads, head_dim].
func.func @att_q_rank(%a0: tensor<2x6x32xf32>, %a1: tensor<2x6x32xf32>, %a2: tensor<2x6x2x8xf32>, %a3: tensor<2x6x2x8xf32>, %a4: tensor<2x6x32xf32>, %a5: tensor<2x4x6xf32>) {
  // expected-error @+1 {{q [batch, seq, heads, head_dim] must have rank 4, got shape [2, 6, 32]}}
  %r:3 = model.attention_grad %a0, %a1, %a2, %a3, %a4, %a5 {causal, scale = 0.125 : f64} : (tensor<2x6x32xf32>, tensor<2x6x32xf32>, tensor<2x6x2x8xf32>, tensor<2x6x2x8xf32>, tensor<2x6x32xf32>, tensor<2x4x6xf32>) -> (tensor<2x6x32xf32>, tensor<2x6x2x8xf32>, tensor<2x6x2x8xf32>)
  return
}

// -----

// k is [batch, seq, kv_heads, head_dim].
func.func @att_k_rank(%a0: tensor<2x6x4x8xf32>, %a1: tensor<2x6x4x8xf32>, %a2: tensor<2x6x16xf32>, %a3: tensor<2x6x16xf32>, %a4: tensor<2x6x4x8xf32>, %a5: tensor<2x4x6xf32>) {
  // expected-error @+1 {{k [batch, seq, kv_heads, head_dim] must have rank 4, got shape [2, 6, 16]}}
  %r:3 = model.attention_grad %a0, %a1, %a2, %a3, %a4, %a5 {causal, scale = 0.125 : f64} : (tensor<2x6x4x8xf32>, tensor<2x6x4x8xf32>, tensor<2x6x16xf32>, tensor<2x6x16xf32>, tensor<2x6x4x8xf32>, tensor<2x4x6xf32>) -> (tensor<2x6x4x8xf32>, tensor<2x6x16xf32>, tensor<2x6x16xf32>)
  return
}

// -----

// k matches q in batch, sequence and head_dim.
func.func @att_k_shape(%a0: tensor<2x6x4x8xf32>, %a1: tensor<2x6x4x8xf32>, %a2: tensor<2x6x2x4xf32>, %a3: tensor<2x6x2x4xf32>, %a4: tensor<2x6x4x8xf32>, %a5: tensor<2x4x6xf32>) {
  // expected-error @+1 {{k [2, 6, 2, 4] does not match q [2, 6, 4, 8] in batch, sequence or head_dim}}
  %r:3 = model.attention_grad %a0, %a1, %a2, %a3, %a4, %a5 {causal, scale = 0.125 : f64} : (tensor<2x6x4x8xf32>, tensor<2x6x4x8xf32>, tensor<2x6x2x4xf32>, tensor<2x6x2x4xf32>, tensor<2x6x4x8xf32>, tensor<2x4x6xf32>) -> (tensor<2x6x4x8xf32>, tensor<2x6x2x4xf32>, tensor<2x6x2x4xf32>)
  return
}

// -----

// kv heads divide the query heads.
func.func @att_gqa(%a0: tensor<2x6x4x8xf32>, %a1: tensor<2x6x4x8xf32>, %a2: tensor<2x6x3x8xf32>, %a3: tensor<2x6x3x8xf32>, %a4: tensor<2x6x4x8xf32>, %a5: tensor<2x4x6xf32>) {
  // expected-error @+1 {{3 kv heads do not divide 4 query heads}}
  %r:3 = model.attention_grad %a0, %a1, %a2, %a3, %a4, %a5 {causal, scale = 0.125 : f64} : (tensor<2x6x4x8xf32>, tensor<2x6x4x8xf32>, tensor<2x6x3x8xf32>, tensor<2x6x3x8xf32>, tensor<2x6x4x8xf32>, tensor<2x4x6xf32>) -> (tensor<2x6x4x8xf32>, tensor<2x6x3x8xf32>, tensor<2x6x3x8xf32>)
  return
}

// -----

// v has k's type.
func.func @att_v(%a0: tensor<2x6x4x8xf32>, %a1: tensor<2x6x4x8xf32>, %a2: tensor<2x6x2x8xf32>, %a3: tensor<2x6x2x8xbf16>, %a4: tensor<2x6x4x8xf32>, %a5: tensor<2x4x6xf32>) {
  // expected-error @+1 {{v must have the type of k (tensor<2x6x2x8xf32>), got tensor<2x6x2x8xbf16>}}
  %r:3 = model.attention_grad %a0, %a1, %a2, %a3, %a4, %a5 {causal, scale = 0.125 : f64} : (tensor<2x6x4x8xf32>, tensor<2x6x4x8xf32>, tensor<2x6x2x8xf32>, tensor<2x6x2x8xbf16>, tensor<2x6x4x8xf32>, tensor<2x4x6xf32>) -> (tensor<2x6x4x8xf32>, tensor<2x6x2x8xf32>, tensor<2x6x2x8xf32>)
  return
}

// -----

// The forward output has q's type.
func.func @att_out(%a0: tensor<2x6x4x8xf32>, %a1: tensor<2x6x4x8xf32>, %a2: tensor<2x6x2x8xf32>, %a3: tensor<2x6x2x8xf32>, %a4: tensor<2x6x4x8xbf16>, %a5: tensor<2x4x6xf32>) {
  // expected-error @+1 {{attention output must have the type of q (tensor<2x6x4x8xf32>), got tensor<2x6x4x8xbf16>}}
  %r:3 = model.attention_grad %a0, %a1, %a2, %a3, %a4, %a5 {causal, scale = 0.125 : f64} : (tensor<2x6x4x8xf32>, tensor<2x6x4x8xf32>, tensor<2x6x2x8xf32>, tensor<2x6x2x8xf32>, tensor<2x6x4x8xbf16>, tensor<2x4x6xf32>) -> (tensor<2x6x4x8xf32>, tensor<2x6x2x8xf32>, tensor<2x6x2x8xf32>)
  return
}

// -----

// The output gradient has q's type.
func.func @att_dout(%a0: tensor<2x5x4x8xf32>, %a1: tensor<2x6x4x8xf32>, %a2: tensor<2x6x2x8xf32>, %a3: tensor<2x6x2x8xf32>, %a4: tensor<2x6x4x8xf32>, %a5: tensor<2x4x6xf32>) {
  // expected-error @+1 {{output gradient must have the type of q (tensor<2x6x4x8xf32>), got tensor<2x5x4x8xf32>}}
  %r:3 = model.attention_grad %a0, %a1, %a2, %a3, %a4, %a5 {causal, scale = 0.125 : f64} : (tensor<2x5x4x8xf32>, tensor<2x6x4x8xf32>, tensor<2x6x2x8xf32>, tensor<2x6x2x8xf32>, tensor<2x6x4x8xf32>, tensor<2x4x6xf32>) -> (tensor<2x6x4x8xf32>, tensor<2x6x2x8xf32>, tensor<2x6x2x8xf32>)
  return
}

// -----

// The log-sum-exp is [batch, heads, seq].
func.func @att_lse(%a0: tensor<2x6x4x8xf32>, %a1: tensor<2x6x4x8xf32>, %a2: tensor<2x6x2x8xf32>, %a3: tensor<2x6x2x8xf32>, %a4: tensor<2x6x4x8xf32>, %a5: tensor<2x6x4xf32>) {
  // expected-error @+1 {{log-sum-exp must have shape [2, 4, 6], got [2, 6, 4]}}
  %r:3 = model.attention_grad %a0, %a1, %a2, %a3, %a4, %a5 {causal, scale = 0.125 : f64} : (tensor<2x6x4x8xf32>, tensor<2x6x4x8xf32>, tensor<2x6x2x8xf32>, tensor<2x6x2x8xf32>, tensor<2x6x4x8xf32>, tensor<2x6x4xf32>) -> (tensor<2x6x4x8xf32>, tensor<2x6x2x8xf32>, tensor<2x6x2x8xf32>)
  return
}

// -----

// The log-sum-exp is f32.
func.func @att_lse_dtype(%a0: tensor<2x6x4x8xf32>, %a1: tensor<2x6x4x8xf32>, %a2: tensor<2x6x2x8xf32>, %a3: tensor<2x6x2x8xf32>, %a4: tensor<2x6x4x8xf32>, %a5: tensor<2x4x6xbf16>) {
  // expected-error @+1 {{log-sum-exp must be f32}}
  %r:3 = model.attention_grad %a0, %a1, %a2, %a3, %a4, %a5 {causal, scale = 0.125 : f64} : (tensor<2x6x4x8xf32>, tensor<2x6x4x8xf32>, tensor<2x6x2x8xf32>, tensor<2x6x2x8xf32>, tensor<2x6x4x8xf32>, tensor<2x4x6xbf16>) -> (tensor<2x6x4x8xf32>, tensor<2x6x2x8xf32>, tensor<2x6x2x8xf32>)
  return
}

// -----

// dq has q's type.
func.func @att_dq(%a0: tensor<2x6x4x8xf32>, %a1: tensor<2x6x4x8xf32>, %a2: tensor<2x6x2x8xf32>, %a3: tensor<2x6x2x8xf32>, %a4: tensor<2x6x4x8xf32>, %a5: tensor<2x4x6xf32>) {
  // expected-error @+1 {{q gradient must have the type of q (tensor<2x6x4x8xf32>), got tensor<2x6x2x8xf32>}}
  %r:3 = model.attention_grad %a0, %a1, %a2, %a3, %a4, %a5 {causal, scale = 0.125 : f64} : (tensor<2x6x4x8xf32>, tensor<2x6x4x8xf32>, tensor<2x6x2x8xf32>, tensor<2x6x2x8xf32>, tensor<2x6x4x8xf32>, tensor<2x4x6xf32>) -> (tensor<2x6x2x8xf32>, tensor<2x6x2x8xf32>, tensor<2x6x2x8xf32>)
  return
}

// -----

// dk has k's (kv heads') type.
func.func @att_dk(%a0: tensor<2x6x4x8xf32>, %a1: tensor<2x6x4x8xf32>, %a2: tensor<2x6x2x8xf32>, %a3: tensor<2x6x2x8xf32>, %a4: tensor<2x6x4x8xf32>, %a5: tensor<2x4x6xf32>) {
  // expected-error @+1 {{k gradient must have the type of k (tensor<2x6x2x8xf32>), got tensor<2x6x4x8xf32>}}
  %r:3 = model.attention_grad %a0, %a1, %a2, %a3, %a4, %a5 {causal, scale = 0.125 : f64} : (tensor<2x6x4x8xf32>, tensor<2x6x4x8xf32>, tensor<2x6x2x8xf32>, tensor<2x6x2x8xf32>, tensor<2x6x4x8xf32>, tensor<2x4x6xf32>) -> (tensor<2x6x4x8xf32>, tensor<2x6x4x8xf32>, tensor<2x6x2x8xf32>)
  return
}

// -----

// dv has v's type.
func.func @att_dv(%a0: tensor<2x6x4x8xf32>, %a1: tensor<2x6x4x8xf32>, %a2: tensor<2x6x2x8xf32>, %a3: tensor<2x6x2x8xf32>, %a4: tensor<2x6x4x8xf32>, %a5: tensor<2x4x6xf32>) {
  // expected-error @+1 {{v gradient must have the type of v (tensor<2x6x2x8xf32>), got tensor<2x6x2x8xbf16>}}
  %r:3 = model.attention_grad %a0, %a1, %a2, %a3, %a4, %a5 {causal, scale = 0.125 : f64} : (tensor<2x6x4x8xf32>, tensor<2x6x4x8xf32>, tensor<2x6x2x8xf32>, tensor<2x6x2x8xf32>, tensor<2x6x4x8xf32>, tensor<2x4x6xf32>) -> (tensor<2x6x4x8xf32>, tensor<2x6x2x8xf32>, tensor<2x6x2x8xbf16>)
  return
}

// -----

// Gates have a top-k dim.
func.func @route_scalar(%a0: tensor<f32>, %a1: tensor<f32>, %a2: tensor<i32>) {
  // expected-error @+1 {{gates need a top-k dim}}
  %r = model.moe_route_grad %a0, %a1, %a2 : (tensor<f32>, tensor<f32>, tensor<i32>) -> tensor<1x5x6xf32>
  return
}

// -----

// dgates has the gates' type.
func.func @route_dgates(%a0: tensor<1x5x3xf32>, %a1: tensor<1x5x2xf32>, %a2: tensor<1x5x2xi32>) {
  // expected-error @+1 {{gates gradient must have the type of the gates (tensor<1x5x2xf32>), got tensor<1x5x3xf32>}}
  %r = model.moe_route_grad %a0, %a1, %a2 : (tensor<1x5x3xf32>, tensor<1x5x2xf32>, tensor<1x5x2xi32>) -> tensor<1x5x6xf32>
  return
}

// -----

// One expert index per gate.
func.func @route_experts(%a0: tensor<1x5x2xf32>, %a1: tensor<1x5x2xf32>, %a2: tensor<1x5x3xi32>) {
  // expected-error @+1 {{expert indices must have shape [1, 5, 2], got [1, 5, 3]}}
  %r = model.moe_route_grad %a0, %a1, %a2 : (tensor<1x5x2xf32>, tensor<1x5x2xf32>, tensor<1x5x3xi32>) -> tensor<1x5x6xf32>
  return
}

// -----

// The router logits' gradient is [tokens..., experts].
func.func @route_logits(%a0: tensor<1x5x2xf32>, %a1: tensor<1x5x2xf32>, %a2: tensor<1x5x2xi32>) {
  // expected-error @+1 {{router logits gradient [5, 6] must be [tokens..., experts] for gates [1, 5, 2]}}
  %r = model.moe_route_grad %a0, %a1, %a2 : (tensor<1x5x2xf32>, tensor<1x5x2xf32>, tensor<1x5x2xi32>) -> tensor<5x6xf32>
  return
}

// -----

// A token cannot pick more experts than there are.
func.func @route_topk(%a0: tensor<1x5x2xf32>, %a1: tensor<1x5x2xf32>, %a2: tensor<1x5x2xi32>) {
  // expected-error @+1 {{each token picks 2 experts but there are only 1}}
  %r = model.moe_route_grad %a0, %a1, %a2 : (tensor<1x5x2xf32>, tensor<1x5x2xf32>, tensor<1x5x2xi32>) -> tensor<1x5x1xf32>
  return
}


// -----

// The expert input weight is [experts, 2*width, hidden].
func.func @exp_win_rank(%a0: tensor<1x5x4xf32>, %a1: tensor<1x5x4xf32>, %a2: tensor<1x5x2xf32>, %a3: tensor<1x5x2xi32>, %a4: tensor<60x4xf32>, %a5: tensor<6x4x5xf32>) {
  // expected-error @+1 {{expert input weight [experts, 2*width, hidden] must have rank 3, got shape [60, 4]}}
  %r:4 = model.moe_experts_grad %a0, %a1, %a2, %a3, %a4, %a5 : (tensor<1x5x4xf32>, tensor<1x5x4xf32>, tensor<1x5x2xf32>, tensor<1x5x2xi32>, tensor<60x4xf32>, tensor<6x4x5xf32>) -> (tensor<1x5x4xf32>, tensor<1x5x2xf32>, tensor<60x4xf32>, tensor<6x4x5xf32>)
  return
}

// -----

// The expert output weight is [experts, hidden, width].
func.func @exp_wout_rank(%a0: tensor<1x5x4xf32>, %a1: tensor<1x5x4xf32>, %a2: tensor<1x5x2xf32>, %a3: tensor<1x5x2xi32>, %a4: tensor<6x10x4xf32>, %a5: tensor<24x5xf32>) {
  // expected-error @+1 {{expert output weight [experts, hidden, width] must have rank 3, got shape [24, 5]}}
  %r:4 = model.moe_experts_grad %a0, %a1, %a2, %a3, %a4, %a5 : (tensor<1x5x4xf32>, tensor<1x5x4xf32>, tensor<1x5x2xf32>, tensor<1x5x2xi32>, tensor<6x10x4xf32>, tensor<24x5xf32>) -> (tensor<1x5x4xf32>, tensor<1x5x2xf32>, tensor<6x10x4xf32>, tensor<24x5xf32>)
  return
}

// -----

// Tokens have a hidden dim.
func.func @exp_scalar(%a0: tensor<f32>, %a1: tensor<f32>, %a2: tensor<1x5x2xf32>, %a3: tensor<1x5x2xi32>, %a4: tensor<6x10x4xf32>, %a5: tensor<6x4x5xf32>) {
  // expected-error @+1 {{input must have a hidden dim}}
  %r:4 = model.moe_experts_grad %a0, %a1, %a2, %a3, %a4, %a5 : (tensor<f32>, tensor<f32>, tensor<1x5x2xf32>, tensor<1x5x2xi32>, tensor<6x10x4xf32>, tensor<6x4x5xf32>) -> (tensor<f32>, tensor<1x5x2xf32>, tensor<6x10x4xf32>, tensor<6x4x5xf32>)
  return
}

// -----

// Expert inputs are the hidden size; the gate|up rows are even.
func.func @exp_win_shape(%a0: tensor<1x5x4xf32>, %a1: tensor<1x5x4xf32>, %a2: tensor<1x5x2xf32>, %a3: tensor<1x5x2xi32>, %a4: tensor<6x9x4xf32>, %a5: tensor<6x4x5xf32>) {
  // expected-error @+1 {{expert input weight must be [experts, 2*width, 4], got [6, 9, 4]}}
  %r:4 = model.moe_experts_grad %a0, %a1, %a2, %a3, %a4, %a5 : (tensor<1x5x4xf32>, tensor<1x5x4xf32>, tensor<1x5x2xf32>, tensor<1x5x2xi32>, tensor<6x9x4xf32>, tensor<6x4x5xf32>) -> (tensor<1x5x4xf32>, tensor<1x5x2xf32>, tensor<6x9x4xf32>, tensor<6x4x5xf32>)
  return
}

// -----

// The expert output weight maps width back to hidden.
func.func @exp_wout_shape(%a0: tensor<1x5x4xf32>, %a1: tensor<1x5x4xf32>, %a2: tensor<1x5x2xf32>, %a3: tensor<1x5x2xi32>, %a4: tensor<6x10x4xf32>, %a5: tensor<6x4x4xf32>) {
  // expected-error @+1 {{expert output weight must have shape [6, 4, 5], got [6, 4, 4]}}
  %r:4 = model.moe_experts_grad %a0, %a1, %a2, %a3, %a4, %a5 : (tensor<1x5x4xf32>, tensor<1x5x4xf32>, tensor<1x5x2xf32>, tensor<1x5x2xi32>, tensor<6x10x4xf32>, tensor<6x4x4xf32>) -> (tensor<1x5x4xf32>, tensor<1x5x2xf32>, tensor<6x10x4xf32>, tensor<6x4x4xf32>)
  return
}

// -----

// Gates are [tokens..., k].
func.func @exp_gates(%a0: tensor<1x5x4xf32>, %a1: tensor<1x5x4xf32>, %a2: tensor<5x2xf32>, %a3: tensor<1x5x2xi32>, %a4: tensor<6x10x4xf32>, %a5: tensor<6x4x5xf32>) {
  // expected-error @+1 {{gates [5, 2] must be [tokens..., k] for input [1, 5, 4]}}
  %r:4 = model.moe_experts_grad %a0, %a1, %a2, %a3, %a4, %a5 : (tensor<1x5x4xf32>, tensor<1x5x4xf32>, tensor<5x2xf32>, tensor<1x5x2xi32>, tensor<6x10x4xf32>, tensor<6x4x5xf32>) -> (tensor<1x5x4xf32>, tensor<5x2xf32>, tensor<6x10x4xf32>, tensor<6x4x5xf32>)
  return
}

// -----

// A token cannot pick more experts than there are.
func.func @exp_topk(%a0: tensor<1x5x4xf32>, %a1: tensor<1x5x4xf32>, %a2: tensor<1x5x7xf32>, %a3: tensor<1x5x7xi32>, %a4: tensor<6x10x4xf32>, %a5: tensor<6x4x5xf32>) {
  // expected-error @+1 {{each token picks 7 experts but there are only 6}}
  %r:4 = model.moe_experts_grad %a0, %a1, %a2, %a3, %a4, %a5 : (tensor<1x5x4xf32>, tensor<1x5x4xf32>, tensor<1x5x7xf32>, tensor<1x5x7xi32>, tensor<6x10x4xf32>, tensor<6x4x5xf32>) -> (tensor<1x5x4xf32>, tensor<1x5x7xf32>, tensor<6x10x4xf32>, tensor<6x4x5xf32>)
  return
}

// -----

// One expert index per gate.
func.func @exp_indices(%a0: tensor<1x5x4xf32>, %a1: tensor<1x5x4xf32>, %a2: tensor<1x5x2xf32>, %a3: tensor<1x5x1xi32>, %a4: tensor<6x10x4xf32>, %a5: tensor<6x4x5xf32>) {
  // expected-error @+1 {{expert indices must have shape [1, 5, 2], got [1, 5, 1]}}
  %r:4 = model.moe_experts_grad %a0, %a1, %a2, %a3, %a4, %a5 : (tensor<1x5x4xf32>, tensor<1x5x4xf32>, tensor<1x5x2xf32>, tensor<1x5x1xi32>, tensor<6x10x4xf32>, tensor<6x4x5xf32>) -> (tensor<1x5x4xf32>, tensor<1x5x2xf32>, tensor<6x10x4xf32>, tensor<6x4x5xf32>)
  return
}

// -----

// The output gradient has the input's type.
func.func @exp_dout(%a0: tensor<1x5x4xbf16>, %a1: tensor<1x5x4xf32>, %a2: tensor<1x5x2xf32>, %a3: tensor<1x5x2xi32>, %a4: tensor<6x10x4xf32>, %a5: tensor<6x4x5xf32>) {
  // expected-error @+1 {{output gradient must have the type of the input (tensor<1x5x4xf32>), got tensor<1x5x4xbf16>}}
  %r:4 = model.moe_experts_grad %a0, %a1, %a2, %a3, %a4, %a5 : (tensor<1x5x4xbf16>, tensor<1x5x4xf32>, tensor<1x5x2xf32>, tensor<1x5x2xi32>, tensor<6x10x4xf32>, tensor<6x4x5xf32>) -> (tensor<1x5x4xf32>, tensor<1x5x2xf32>, tensor<6x10x4xf32>, tensor<6x4x5xf32>)
  return
}

// -----

// dx has the input's type.
func.func @exp_dx(%a0: tensor<1x5x4xf32>, %a1: tensor<1x5x4xf32>, %a2: tensor<1x5x2xf32>, %a3: tensor<1x5x2xi32>, %a4: tensor<6x10x4xf32>, %a5: tensor<6x4x5xf32>) {
  // expected-error @+1 {{input gradient must have the type of the input (tensor<1x5x4xf32>), got tensor<1x4x4xf32>}}
  %r:4 = model.moe_experts_grad %a0, %a1, %a2, %a3, %a4, %a5 : (tensor<1x5x4xf32>, tensor<1x5x4xf32>, tensor<1x5x2xf32>, tensor<1x5x2xi32>, tensor<6x10x4xf32>, tensor<6x4x5xf32>) -> (tensor<1x4x4xf32>, tensor<1x5x2xf32>, tensor<6x10x4xf32>, tensor<6x4x5xf32>)
  return
}

// -----

// dgates has the gates' type.
func.func @exp_dgates(%a0: tensor<1x5x4xf32>, %a1: tensor<1x5x4xf32>, %a2: tensor<1x5x2xf32>, %a3: tensor<1x5x2xi32>, %a4: tensor<6x10x4xf32>, %a5: tensor<6x4x5xf32>) {
  // expected-error @+1 {{gates gradient must have the type of the gates (tensor<1x5x2xf32>), got tensor<1x5x6xf32>}}
  %r:4 = model.moe_experts_grad %a0, %a1, %a2, %a3, %a4, %a5 : (tensor<1x5x4xf32>, tensor<1x5x4xf32>, tensor<1x5x2xf32>, tensor<1x5x2xi32>, tensor<6x10x4xf32>, tensor<6x4x5xf32>) -> (tensor<1x5x4xf32>, tensor<1x5x6xf32>, tensor<6x10x4xf32>, tensor<6x4x5xf32>)
  return
}

// -----

// dW_in has the expert input weight's type.
func.func @exp_dwin(%a0: tensor<1x5x4xf32>, %a1: tensor<1x5x4xf32>, %a2: tensor<1x5x2xf32>, %a3: tensor<1x5x2xi32>, %a4: tensor<6x10x4xf32>, %a5: tensor<6x4x5xf32>) {
  // expected-error @+1 {{input weight gradient must have the type of the expert input weight (tensor<6x10x4xf32>), got tensor<6x10x4xbf16>}}
  %r:4 = model.moe_experts_grad %a0, %a1, %a2, %a3, %a4, %a5 : (tensor<1x5x4xf32>, tensor<1x5x4xf32>, tensor<1x5x2xf32>, tensor<1x5x2xi32>, tensor<6x10x4xf32>, tensor<6x4x5xf32>) -> (tensor<1x5x4xf32>, tensor<1x5x2xf32>, tensor<6x10x4xbf16>, tensor<6x4x5xf32>)
  return
}

// -----

// dW_out has the expert output weight's type.
func.func @exp_dwout(%a0: tensor<1x5x4xf32>, %a1: tensor<1x5x4xf32>, %a2: tensor<1x5x2xf32>, %a3: tensor<1x5x2xi32>, %a4: tensor<6x10x4xf32>, %a5: tensor<6x4x5xf32>) {
  // expected-error @+1 {{output weight gradient must have the type of the expert output weight (tensor<6x4x5xf32>), got tensor<6x5x4xf32>}}
  %r:4 = model.moe_experts_grad %a0, %a1, %a2, %a3, %a4, %a5 : (tensor<1x5x4xf32>, tensor<1x5x4xf32>, tensor<1x5x2xf32>, tensor<1x5x2xi32>, tensor<6x10x4xf32>, tensor<6x4x5xf32>) -> (tensor<1x5x4xf32>, tensor<1x5x2xf32>, tensor<6x10x4xf32>, tensor<6x5x4xf32>)
  return
}

// -----

// Logits are [batch, seq, vocab].
func.func @ce_logits_rank(%a0: tensor<f32>, %a1: tensor<10x8xf32>, %a2: tensor<2x5xi32>) {
  // expected-error @+1 {{logits [batch, seq, vocab] must have rank 3, got shape [10, 8]}}
  %r = model.cross_entropy_grad %a0, %a1, %a2 {ignore_index = -100 : i64} : (tensor<f32>, tensor<10x8xf32>, tensor<2x5xi32>) -> tensor<10x8xf32>
  return
}

// -----

// Targets are [batch, seq].
func.func @ce_targets_rank(%a0: tensor<f32>, %a1: tensor<2x5x8xf32>, %a2: tensor<10xi32>) {
  // expected-error @+1 {{targets [batch, seq] must have rank 2, got shape [10]}}
  %r = model.cross_entropy_grad %a0, %a1, %a2 {ignore_index = -100 : i64} : (tensor<f32>, tensor<2x5x8xf32>, tensor<10xi32>) -> tensor<2x5x8xf32>
  return
}

// -----

// One target per position.
func.func @ce_targets_shape(%a0: tensor<f32>, %a1: tensor<2x5x8xf32>, %a2: tensor<2x4xi32>) {
  // expected-error @+1 {{targets must have shape [2, 5], got [2, 4]}}
  %r = model.cross_entropy_grad %a0, %a1, %a2 {ignore_index = -100 : i64} : (tensor<f32>, tensor<2x5x8xf32>, tensor<2x4xi32>) -> tensor<2x5x8xf32>
  return
}

// -----

// dlogits has the logits' type.
func.func @ce_dlogits(%a0: tensor<f32>, %a1: tensor<2x5x8xf32>, %a2: tensor<2x5xi32>) {
  // expected-error @+1 {{logits gradient must have the type of the logits (tensor<2x5x8xf32>), got tensor<2x5x8xbf16>}}
  %r = model.cross_entropy_grad %a0, %a1, %a2 {ignore_index = -100 : i64} : (tensor<f32>, tensor<2x5x8xf32>, tensor<2x5xi32>) -> tensor<2x5x8xbf16>
  return
}

// -----

// The summed loss's gradient is an f32 scalar.
func.func @ce_seed(%a0: tensor<1xf32>, %a1: tensor<2x5x8xf32>, %a2: tensor<2x5xi32>) {
  // expected-error @+1 {{must be 0D tensor of 32-bit float values}}
  %r = model.cross_entropy_grad %a0, %a1, %a2 {ignore_index = -100 : i64} : (tensor<1xf32>, tensor<2x5x8xf32>, tensor<2x5xi32>) -> tensor<2x5x8xf32>
  return
}

// -----

// A parameter gradient names its parameter.
func.func @param_grad_name(%a0: tensor<4xf32>) {
  // expected-error @+1 {{parameter gradient needs a checkpoint name}}
  model.param_grad "", %a0 : tensor<4xf32>
  return
}

// -----

// A parameter gradient has the parameter's static shape.
func.func @param_grad_dynamic(%a0: tensor<?xf32>) {
  // expected-error @+1 {{gradient of parameter 'w' must have a static shape}}
  model.param_grad "w", %a0 : tensor<?xf32>
  return
}

// -----

// The logits' gradient has the logits' type.
func.func @router_load_grad_type(%a0: tensor<6xf32>, %a1: tensor<1x5x6xf32>) {
  // expected-error @+1 {{router logits gradient}}
  %r = model.router_load_grad %a0, %a1 : (tensor<6xf32>, tensor<1x5x6xf32>) -> tensor<1x5x6xbf16>
  return
}

// -----

// One probability gradient per expert.
func.func @router_load_grad_experts(%a0: tensor<4xf32>, %a1: tensor<1x5x6xf32>) {
  // expected-error @+1 {{summed probabilities gradient must have shape [6], got [4]}}
  %r = model.router_load_grad %a0, %a1 : (tensor<4xf32>, tensor<1x5x6xf32>) -> tensor<1x5x6xf32>
  return
}
