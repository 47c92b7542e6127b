// Every verifier error of the `model` dialect, with the message a user sees.
// RUN: hybridcp-opt %s --split-input-file --verify-diagnostics

// A normal initialiser needs a positive std.
func.func @param_without_std() -> tensor<4x4xf32> {
  // expected-error @+1 {{parameter 'w' is initialised from a normal distribution and needs a positive std}}
  %0 = model.param "w" normal : tensor<4x4xf32>
  return %0 : tensor<4x4xf32>
}

// -----

// std makes sense only for the normal initialiser.
func.func @std_on_ones() -> tensor<4xf32> {
  // expected-error @+1 {{parameter 'w': std only applies to normal init}}
  %0 = model.param "w" ones(0.5) : tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// A parameter needs a name.
func.func @unnamed_param() -> tensor<4xf32> {
  // expected-error @+1 {{parameter needs a checkpoint name}}
  %0 = model.param "" ones : tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// A_log's initialiser is one value per head: rank 1 only.
func.func @log_arange_rank() -> tensor<4x2xf32> {
  // expected-error @+1 {{parameter 'A': log_arange init needs rank 1}}
  %0 = model.param "A" log_arange : tensor<4x2xf32>
  return %0 : tensor<4x2xf32>
}

// -----

// A parameter splits into at least one shard.
func.func @zero_shards() -> tensor<4x2xf32> {
  // expected-error @+1 {{parameter 'w' must have at least 1 shard, got 0}}
  %0 = model.param "w" normal(0.5) shards 0 : tensor<4x2xf32>
  return %0 : tensor<4x2xf32>
}

// -----

// Shards are rows along dim 0: a scalar has none.
func.func @scalar_shards() -> tensor<f32> {
  // expected-error @+1 {{parameter 's' is a scalar: only a tensor splits into shards (along dim 0)}}
  %0 = model.param "s" ones shards 2 : tensor<f32>
  return %0 : tensor<f32>
}

// -----

// The embedding output is [batch, seq, hidden].
func.func @embedding_shape(%t: tensor<8x4xf32>, %ids: tensor<2x5xi32>) -> tensor<2x5x3xf32> {
  // expected-error @+1 {{embedding output must have shape [2, 5, 4], got [2, 5, 3]}}
  %0 = model.embedding %t, %ids {multiplier = 1.0 : f64} : (tensor<8x4xf32>, tensor<2x5xi32>) -> tensor<2x5x3xf32>
  return %0 : tensor<2x5x3xf32>
}

// -----

// The padding token must be in the vocabulary.
func.func @embedding_padding(%t: tensor<8x4xf32>, %ids: tensor<2x5xi32>) -> tensor<2x5x4xf32> {
  // expected-error @+1 {{padding_idx 8 is outside the vocabulary of 8 tokens}}
  %0 = model.embedding %t, %ids {multiplier = 1.0 : f64, padding_idx = 8 : i64} : (tensor<8x4xf32>, tensor<2x5xi32>) -> tensor<2x5x4xf32>
  return %0 : tensor<2x5x4xf32>
}

// -----

// Token ids are [batch, seq].
func.func @embedding_ids_rank(%t: tensor<8x4xf32>, %ids: tensor<10xi32>) -> tensor<2x5x4xf32> {
  // expected-error @+1 {{token ids must have rank 2, got shape [10]}}
  %0 = model.embedding %t, %ids {multiplier = 1.0 : f64} : (tensor<8x4xf32>, tensor<10xi32>) -> tensor<2x5x4xf32>
  return %0 : tensor<2x5x4xf32>
}

// -----

// The table and the output share a dtype.
func.func @embedding_dtype(%t: tensor<8x4xbf16>, %ids: tensor<2x5xi32>) -> tensor<2x5x4xf32> {
  // expected-error @+1 {{embedding table and output must have the same element type, got 'bf16' and 'f32'}}
  %0 = model.embedding %t, %ids {multiplier = 1.0 : f64} : (tensor<8x4xbf16>, tensor<2x5xi32>) -> tensor<2x5x4xf32>
  return %0 : tensor<2x5x4xf32>
}

// -----

// The norm weight covers the normalised dim.
func.func @rms_norm_weight(%x: tensor<2x5x4xf32>, %w: tensor<3xf32>) -> tensor<2x5x4xf32> {
  // expected-error @+1 {{norm weight has 3 entries but the normalised dim has 4}}
  %0 = model.rms_norm %x, %w {eps = 1.0e-5 : f64} : tensor<2x5x4xf32>, tensor<3xf32>
  return %0 : tensor<2x5x4xf32>
}

// -----

// eps must be positive.
func.func @rms_norm_eps(%x: tensor<2x5x4xf32>, %w: tensor<4xf32>) -> tensor<2x5x4xf32> {
  // expected-error @+1 {{eps must be positive}}
  %0 = model.rms_norm %x, %w {eps = 0.0 : f64} : tensor<2x5x4xf32>, tensor<4xf32>
  return %0 : tensor<2x5x4xf32>
}

// -----

// A linear weight is [out, in] and must match the input's last dim.
func.func @linear_in(%x: tensor<2x5x4xf32>, %w: tensor<6x3xf32>) -> tensor<2x5x6xf32> {
  // expected-error @+1 {{weight [6, 3] expects inputs of size 3 but the input's last dim is 4}}
  %0 = model.linear %x, %w : (tensor<2x5x4xf32>, tensor<6x3xf32>) -> tensor<2x5x6xf32>
  return %0 : tensor<2x5x6xf32>
}

// -----

// The output of a linear layer has the weight's out dim.
func.func @linear_out(%x: tensor<2x5x4xf32>, %w: tensor<6x4xf32>) -> tensor<2x5x5xf32> {
  // expected-error @+1 {{linear output must have shape [2, 5, 6], got [2, 5, 5]}}
  %0 = model.linear %x, %w : (tensor<2x5x4xf32>, tensor<6x4xf32>) -> tensor<2x5x5xf32>
  return %0 : tensor<2x5x5xf32>
}

// -----

// A linear weight is a matrix.
func.func @linear_rank(%x: tensor<2x5x4xf32>, %w: tensor<4xf32>) -> tensor<2x5x4xf32> {
  // expected-error @+1 {{linear weight must have rank 2, got shape [4]}}
  %0 = model.linear %x, %w : (tensor<2x5x4xf32>, tensor<4xf32>) -> tensor<2x5x4xf32>
  return %0 : tensor<2x5x4xf32>
}

// -----

// Broadcasting is over leading dims only.
func.func @add_broadcast(%a: tensor<2x5x4xf32>, %b: tensor<5xf32>) -> tensor<2x5x4xf32> {
  // expected-error @+1 {{rhs shape [5] must equal the trailing dims of lhs shape [2, 5, 4]}}
  %0 = model.add %a, %b : tensor<2x5x4xf32>, tensor<5xf32>
  return %0 : tensor<2x5x4xf32>
}

// -----

// Operands of a binary op share a dtype.
func.func @mul_dtype(%a: tensor<4xf32>, %b: tensor<4xbf16>) -> tensor<4xf32> {
  // expected-error @+1 {{lhs and rhs must have the same element type, got 'f32' and 'bf16'}}
  %0 = model.mul %a, %b : tensor<4xf32>, tensor<4xbf16>
  return %0 : tensor<4xf32>
}

// -----

// Split sizes must cover the last dim exactly.
func.func @split_total(%x: tensor<2x6xf32>) -> tensor<2x2xf32> {
  // expected-error @+1 {{split sizes add up to 5 but the last dim is 6}}
  %0:2 = model.split %x [2, 3] : tensor<2x6xf32> -> tensor<2x2xf32>, tensor<2x3xf32>
  return %0#0 : tensor<2x2xf32>
}

// -----

// One size per result.
func.func @split_count(%x: tensor<2x6xf32>) -> tensor<2x2xf32> {
  // expected-error @+1 {{3 sizes given for 2 results}}
  %0:2 = model.split %x [2, 2, 2] : tensor<2x6xf32> -> tensor<2x2xf32>, tensor<2x2xf32>
  return %0#0 : tensor<2x2xf32>
}

// -----

// Each piece has its size as last dim.
func.func @split_piece(%x: tensor<2x6xf32>) -> tensor<2x2xf32> {
  // expected-error @+1 {{split piece must have shape [2, 4], got [2, 3]}}
  %0:2 = model.split %x [2, 4] : tensor<2x6xf32> -> tensor<2x2xf32>, tensor<2x3xf32>
  return %0#0 : tensor<2x2xf32>
}

// -----

// Sizes are positive.
func.func @split_zero(%x: tensor<2x6xf32>) -> tensor<2x0xf32> {
  // expected-error @+1 {{split sizes must be positive, got 0}}
  %0:2 = model.split %x [0, 6] : tensor<2x6xf32> -> tensor<2x0xf32>, tensor<2x6xf32>
  return %0#0 : tensor<2x0xf32>
}

// -----

// A reshape keeps the number of elements.
func.func @reshape_count(%x: tensor<2x6xf32>) -> tensor<2x2x2xf32> {
  // expected-error @+1 {{cannot reshape [2, 6] (12 elements) to [2, 2, 2] (8 elements)}}
  %0 = model.reshape %x : tensor<2x6xf32> -> tensor<2x2x2xf32>
  return %0 : tensor<2x2x2xf32>
}

// -----

// A reshape keeps the dtype.
func.func @reshape_dtype(%x: tensor<2x6xf32>) -> tensor<12xbf16> {
  // expected-error @+1 {{reshape cannot change the element type}}
  %0 = model.reshape %x : tensor<2x6xf32> -> tensor<12xbf16>
  return %0 : tensor<12xbf16>
}

// -----

// SwiGLU packs gate and up halves in the last dim.
func.func @swiglu_odd(%x: tensor<2x5xf32>) -> tensor<2x2xf32> {
  // expected-error @+1 {{the packed gate|up dim must be even, got shape [2, 5]}}
  %0 = model.swiglu %x : tensor<2x5xf32> -> tensor<2x2xf32>
  return %0 : tensor<2x2xf32>
}

// -----

// SwiGLU halves the last dim.
func.func @swiglu_out(%x: tensor<2x6xf32>) -> tensor<2x6xf32> {
  // expected-error @+1 {{swiglu output must have shape [2, 3], got [2, 6]}}
  %0 = model.swiglu %x : tensor<2x6xf32> -> tensor<2x6xf32>
  return %0 : tensor<2x6xf32>
}

// -----

// The conv weight is depthwise: [channels, 1, width].
func.func @conv_weight(%x: tensor<1x7x10xf32>, %w: tensor<10x2x4xf32>, %b: tensor<10xf32>) -> tensor<1x7x10xf32> {
  // expected-error @+1 {{depthwise conv weight must be [10, 1, width], got [10, 2, 4]}}
  %0 = model.causal_conv1d %x, %w, %b : (tensor<1x7x10xf32>, tensor<10x2x4xf32>, tensor<10xf32>) -> tensor<1x7x10xf32>
  return %0 : tensor<1x7x10xf32>
}

// -----

// One bias per channel.
func.func @conv_bias(%x: tensor<1x7x10xf32>, %w: tensor<10x1x4xf32>, %b: tensor<9xf32>) -> tensor<1x7x10xf32> {
  // expected-error @+1 {{conv bias must have shape [10], got [9]}}
  %0 = model.causal_conv1d %x, %w, %b : (tensor<1x7x10xf32>, tensor<10x1x4xf32>, tensor<9xf32>) -> tensor<1x7x10xf32>
  return %0 : tensor<1x7x10xf32>
}

// -----

// The conv input is [batch, seq, channels].
func.func @conv_rank(%x: tensor<7x10xf32>, %w: tensor<10x1x4xf32>, %b: tensor<10xf32>) -> tensor<7x10xf32> {
  // expected-error @+1 {{conv input [batch, seq, channels] must have rank 3, got shape [7, 10]}}
  %0 = model.causal_conv1d %x, %w, %b : (tensor<7x10xf32>, tensor<10x1x4xf32>, tensor<10xf32>) -> tensor<7x10xf32>
  return %0 : tensor<7x10xf32>
}

// -----

// Mamba groups must divide the heads.
func.func @ssd_groups(%x: tensor<1x7x4x2xf32>, %dt: tensor<1x7x4xf32>, %A: tensor<4xf32>, %B: tensor<1x7x3x3xf32>, %D: tensor<4xf32>) -> tensor<1x7x4x2xf32> {
  // expected-error @+1 {{3 groups do not divide 4 heads}}
  %y, %f = model.ssd_scan %x, %dt, %A, %B, %B, %D {chunk_size = 4 : i64} : (tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x3x3xf32>, tensor<1x7x3x3xf32>, tensor<4xf32>) -> (tensor<1x7x4x2xf32>, tensor<1x4x2x3xf32>)
  return %y : tensor<1x7x4x2xf32>
}

// -----

// dt has one value per token and head.
func.func @ssd_dt(%x: tensor<1x7x4x2xf32>, %dt: tensor<1x7x2xf32>, %A: tensor<4xf32>, %B: tensor<1x7x2x3xf32>, %D: tensor<4xf32>) -> tensor<1x7x4x2xf32> {
  // expected-error @+1 {{dt must have shape [1, 7, 4], got [1, 7, 2]}}
  %y, %f = model.ssd_scan %x, %dt, %A, %B, %B, %D {chunk_size = 4 : i64} : (tensor<1x7x4x2xf32>, tensor<1x7x2xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x7x2x3xf32>, tensor<4xf32>) -> (tensor<1x7x4x2xf32>, tensor<1x4x2x3xf32>)
  return %y : tensor<1x7x4x2xf32>
}

// -----

// B covers the same tokens as x.
func.func @ssd_b_seq(%x: tensor<1x7x4x2xf32>, %dt: tensor<1x7x4xf32>, %A: tensor<4xf32>, %B: tensor<1x6x2x3xf32>, %D: tensor<4xf32>) -> tensor<1x7x4x2xf32> {
  // expected-error @+1 {{B [1, 6, 2, 3] must match x's batch and sequence [1, 7]}}
  %y, %f = model.ssd_scan %x, %dt, %A, %B, %B, %D {chunk_size = 4 : i64} : (tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x6x2x3xf32>, tensor<1x6x2x3xf32>, tensor<4xf32>) -> (tensor<1x7x4x2xf32>, tensor<1x4x2x3xf32>)
  return %y : tensor<1x7x4x2xf32>
}

// -----

// The state is [batch, heads, head_dim, state].
func.func @ssd_state(%x: tensor<1x7x4x2xf32>, %dt: tensor<1x7x4xf32>, %A: tensor<4xf32>, %B: tensor<1x7x2x3xf32>, %D: tensor<4xf32>, %s: tensor<1x4x3x2xf32>) -> tensor<1x7x4x2xf32> {
  // expected-error @+1 {{initial state must have shape [1, 4, 2, 3], got [1, 4, 3, 2]}}
  %y, %f = model.ssd_scan %x, %dt, %A, %B, %B, %D init %s {chunk_size = 4 : i64} : (tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x7x2x3xf32>, tensor<4xf32>, tensor<1x4x3x2xf32>) -> (tensor<1x7x4x2xf32>, tensor<1x4x2x3xf32>)
  return %y : tensor<1x7x4x2xf32>
}

// -----

// The chunk size is positive.
func.func @ssd_chunk(%x: tensor<1x7x4x2xf32>, %dt: tensor<1x7x4xf32>, %A: tensor<4xf32>, %B: tensor<1x7x2x3xf32>, %D: tensor<4xf32>) -> tensor<1x7x4x2xf32> {
  // expected-error @+1 {{chunk size must be positive}}
  %y, %f = model.ssd_scan %x, %dt, %A, %B, %B, %D {chunk_size = 0 : i64} : (tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x7x2x3xf32>, tensor<4xf32>) -> (tensor<1x7x4x2xf32>, tensor<1x4x2x3xf32>)
  return %y : tensor<1x7x4x2xf32>
}

// -----

// The correction's C covers the same tokens as y.
func.func @ssd_add_initial_state_c_seq(%y: tensor<1x7x4x2xf32>, %dt: tensor<1x7x4xf32>, %A: tensor<4xf32>, %C: tensor<1x6x2x3xf32>, %s: tensor<1x4x2x3xf32>) -> tensor<1x7x4x2xf32> {
  // expected-error @+1 {{C [1, 6, 2, 3] must match y's batch and sequence [1, 7]}}
  %o = model.ssd_add_initial_state %y, %dt, %A, %C init %s : (tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x6x2x3xf32>, tensor<1x4x2x3xf32>) -> tensor<1x7x4x2xf32>
  return %o : tensor<1x7x4x2xf32>
}

// -----

// The correction's groups must divide the heads.
func.func @ssd_add_initial_state_groups(%y: tensor<1x7x4x2xf32>, %dt: tensor<1x7x4xf32>, %A: tensor<4xf32>, %C: tensor<1x7x3x3xf32>, %s: tensor<1x4x2x3xf32>) -> tensor<1x7x4x2xf32> {
  // expected-error @+1 {{3 groups do not divide 4 heads}}
  %o = model.ssd_add_initial_state %y, %dt, %A, %C init %s : (tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x3x3xf32>, tensor<1x4x2x3xf32>) -> tensor<1x7x4x2xf32>
  return %o : tensor<1x7x4x2xf32>
}

// -----

// The incoming state is [batch, heads, head_dim, state].
func.func @ssd_add_initial_state_state(%y: tensor<1x7x4x2xf32>, %dt: tensor<1x7x4xf32>, %A: tensor<4xf32>, %C: tensor<1x7x2x3xf32>, %s: tensor<1x4x3x2xf32>) -> tensor<1x7x4x2xf32> {
  // expected-error @+1 {{initial state must have shape [1, 4, 2, 3], got [1, 4, 3, 2]}}
  %o = model.ssd_add_initial_state %y, %dt, %A, %C init %s : (tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x4x3x2xf32>) -> tensor<1x7x4x2xf32>
  return %o : tensor<1x7x4x2xf32>
}

// -----

// The incoming state is f32 like every SSD state.
func.func @ssd_add_initial_state_state_dtype(%y: tensor<1x7x4x2xf32>, %dt: tensor<1x7x4xf32>, %A: tensor<4xf32>, %C: tensor<1x7x2x3xf32>, %s: tensor<1x4x2x3xbf16>) -> tensor<1x7x4x2xf32> {
  // expected-error @+1 {{initial state must be f32, like the scan's states}}
  %o = model.ssd_add_initial_state %y, %dt, %A, %C init %s : (tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x4x2x3xbf16>) -> tensor<1x7x4x2xf32>
  return %o : tensor<1x7x4x2xf32>
}

// -----

// The result has y's type.
func.func @ssd_add_initial_state_result(%y: tensor<1x7x4x2xf32>, %dt: tensor<1x7x4xf32>, %A: tensor<4xf32>, %C: tensor<1x7x2x3xf32>, %s: tensor<1x4x2x3xf32>) -> tensor<1x7x4x2xbf16> {
  // expected-error @+1 {{all of {y, result} have same type}}
  %o = model.ssd_add_initial_state %y, %dt, %A, %C init %s : (tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x4x2x3xf32>) -> tensor<1x7x4x2xbf16>
  return %o : tensor<1x7x4x2xbf16>
}

// -----

// The summary's B covers the same tokens as x.
func.func @ssd_final_state_b_seq(%x: tensor<1x7x4x2xf32>, %dt: tensor<1x7x4xf32>, %A: tensor<4xf32>, %B: tensor<1x6x2x3xf32>) -> tensor<1x4x2x3xf32> {
  // expected-error @+1 {{B [1, 6, 2, 3] must match x's batch and sequence [1, 7]}}
  %f = model.ssd_final_state %x, %dt, %A, %B {chunk_size = 4 : i64} : (tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x6x2x3xf32>) -> tensor<1x4x2x3xf32>
  return %f : tensor<1x4x2x3xf32>
}

// -----

// The summary's groups must divide the heads.
func.func @ssd_final_state_groups(%x: tensor<1x7x4x2xf32>, %dt: tensor<1x7x4xf32>, %A: tensor<4xf32>, %B: tensor<1x7x3x3xf32>) -> tensor<1x4x2x3xf32> {
  // expected-error @+1 {{3 groups do not divide 4 heads}}
  %f = model.ssd_final_state %x, %dt, %A, %B {chunk_size = 4 : i64} : (tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x3x3xf32>) -> tensor<1x4x2x3xf32>
  return %f : tensor<1x4x2x3xf32>
}

// -----

// The summary's dt has one value per token and head.
func.func @ssd_final_state_dt(%x: tensor<1x7x4x2xf32>, %dt: tensor<1x7x2xf32>, %A: tensor<4xf32>, %B: tensor<1x7x2x3xf32>) -> tensor<1x4x2x3xf32> {
  // expected-error @+1 {{dt must have shape [1, 7, 4], got [1, 7, 2]}}
  %f = model.ssd_final_state %x, %dt, %A, %B {chunk_size = 4 : i64} : (tensor<1x7x4x2xf32>, tensor<1x7x2xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>) -> tensor<1x4x2x3xf32>
  return %f : tensor<1x4x2x3xf32>
}

// -----

// The summary's state is [batch, heads, head_dim, state].
func.func @ssd_final_state_shape(%x: tensor<1x7x4x2xf32>, %dt: tensor<1x7x4xf32>, %A: tensor<4xf32>, %B: tensor<1x7x2x3xf32>) -> tensor<1x4x3x2xf32> {
  // expected-error @+1 {{final state must have shape [1, 4, 2, 3], got [1, 4, 3, 2]}}
  %f = model.ssd_final_state %x, %dt, %A, %B {chunk_size = 4 : i64} : (tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>) -> tensor<1x4x3x2xf32>
  return %f : tensor<1x4x3x2xf32>
}

// -----

// The summary's state is f32 like every SSD state, whatever the activation type.
func.func @ssd_final_state_dtype(%x: tensor<1x7x4x2xf32>, %dt: tensor<1x7x4xf32>, %A: tensor<4xf32>, %B: tensor<1x7x2x3xf32>) -> tensor<1x4x2x3xbf16> {
  // expected-error @+1 {{final state must be f32}}
  %f = model.ssd_final_state %x, %dt, %A, %B {chunk_size = 4 : i64} : (tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>) -> tensor<1x4x2x3xbf16>
  return %f : tensor<1x4x2x3xbf16>
}

// -----

// The summary's chunk size is positive.
func.func @ssd_final_state_chunk(%x: tensor<1x7x4x2xf32>, %dt: tensor<1x7x4xf32>, %A: tensor<4xf32>, %B: tensor<1x7x2x3xf32>) -> tensor<1x4x2x3xf32> {
  // expected-error @+1 {{chunk size must be positive}}
  %f = model.ssd_final_state %x, %dt, %A, %B {chunk_size = 0 : i64} : (tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>) -> tensor<1x4x2x3xf32>
  return %f : tensor<1x4x2x3xf32>
}

// -----

// The gated norm's weight covers the Mamba inner dim.
func.func @gated_norm_weight(%y: tensor<1x7x8xf32>, %z: tensor<1x7x8xf32>, %w: tensor<4xf32>) -> tensor<1x7x8xf32> {
  // expected-error @+1 {{norm weight has 4 entries but the normalised dim has 8}}
  %0 = model.gated_rms_norm %y, %z, %w {eps = 1.0e-5 : f64} : tensor<1x7x8xf32>, tensor<4xf32>
  return %0 : tensor<1x7x8xf32>
}

// -----

// KV heads must divide query heads (grouped-query attention).
func.func @attention_gqa(%q: tensor<2x6x4x8xf32>, %k: tensor<2x6x3x8xf32>) -> tensor<2x6x4x8xf32> {
  // expected-error @+1 {{3 kv heads do not divide 4 query heads}}
  %o, %lse = model.attention %q, %k, %k {causal, scale = 0.125 : f64} : (tensor<2x6x4x8xf32>, tensor<2x6x3x8xf32>, tensor<2x6x3x8xf32>) -> (tensor<2x6x4x8xf32>, tensor<2x4x6xf32>)
  return %o : tensor<2x6x4x8xf32>
}

// -----

// Keys and queries share batch, sequence and head dim.
func.func @attention_head_dim(%q: tensor<2x6x4x8xf32>, %k: tensor<2x6x2x4xf32>) -> tensor<2x6x4x8xf32> {
  // expected-error @+1 {{k [2, 6, 2, 4] does not match q [2, 6, 4, 8] in batch, sequence or head_dim}}
  %o, %lse = model.attention %q, %k, %k {causal, scale = 0.125 : f64} : (tensor<2x6x4x8xf32>, tensor<2x6x2x4xf32>, tensor<2x6x2x4xf32>) -> (tensor<2x6x4x8xf32>, tensor<2x4x6xf32>)
  return %o : tensor<2x6x4x8xf32>
}

// -----

// The log-sum-exp is [batch, heads, seq] in f32.
func.func @attention_lse(%q: tensor<2x6x4x8xf32>, %k: tensor<2x6x2x8xf32>) -> tensor<2x6x4x8xf32> {
  // expected-error @+1 {{log-sum-exp must have shape [2, 4, 6], got [2, 6, 4]}}
  %o, %lse = model.attention %q, %k, %k {causal, scale = 0.125 : f64} : (tensor<2x6x4x8xf32>, tensor<2x6x2x8xf32>, tensor<2x6x2x8xf32>) -> (tensor<2x6x4x8xf32>, tensor<2x6x4xf32>)
  return %o : tensor<2x6x4x8xf32>
}

// -----

// top_k cannot exceed the number of experts.
func.func @route_topk(%l: tensor<1x5x4xf32>) -> tensor<1x5x6xf32> {
  // expected-error @+1 {{top_k 6 must be between 1 and the 4 experts}}
  %g, %i = model.moe_route %l {top_k = 6 : i64} : tensor<1x5x4xf32> -> tensor<1x5x6xf32>, tensor<1x5x6xi32>
  return %g : tensor<1x5x6xf32>
}

// -----

// Expert input weights are [experts, 2*width, hidden].
func.func @experts_in(%x: tensor<1x5x4xf32>, %g: tensor<1x5x2xf32>, %i: tensor<1x5x2xi32>, %win: tensor<6x10x3xf32>, %wout: tensor<6x4x5xf32>) -> tensor<1x5x4xf32> {
  // expected-error @+1 {{expert input weight must be [experts, 2*width, 4], got [6, 10, 3]}}
  %o = model.moe_experts %x, %g, %i, %win, %wout : (tensor<1x5x4xf32>, tensor<1x5x2xf32>, tensor<1x5x2xi32>, tensor<6x10x3xf32>, tensor<6x4x5xf32>) -> tensor<1x5x4xf32>
  return %o : tensor<1x5x4xf32>
}

// -----

// Expert output weights are [experts, hidden, width].
func.func @experts_out(%x: tensor<1x5x4xf32>, %g: tensor<1x5x2xf32>, %i: tensor<1x5x2xi32>, %win: tensor<6x10x4xf32>, %wout: tensor<6x4x4xf32>) -> tensor<1x5x4xf32> {
  // expected-error @+1 {{expert output weight must have shape [6, 4, 5], got [6, 4, 4]}}
  %o = model.moe_experts %x, %g, %i, %win, %wout : (tensor<1x5x4xf32>, tensor<1x5x2xf32>, tensor<1x5x2xi32>, tensor<6x10x4xf32>, tensor<6x4x4xf32>) -> tensor<1x5x4xf32>
  return %o : tensor<1x5x4xf32>
}

// -----

// Gates are [tokens..., k].
func.func @experts_gates(%x: tensor<1x5x4xf32>, %g: tensor<1x4x2xf32>, %i: tensor<1x4x2xi32>, %win: tensor<6x10x4xf32>, %wout: tensor<6x4x5xf32>) -> tensor<1x5x4xf32> {
  // expected-error @+1 {{gates [1, 4, 2] must be [tokens..., k] for input [1, 5, 4]}}
  %o = model.moe_experts %x, %g, %i, %win, %wout : (tensor<1x5x4xf32>, tensor<1x4x2xf32>, tensor<1x4x2xi32>, tensor<6x10x4xf32>, tensor<6x4x5xf32>) -> tensor<1x5x4xf32>
  return %o : tensor<1x5x4xf32>
}

// -----

// A token cannot pick more experts than exist.
func.func @experts_k(%x: tensor<1x5x4xf32>, %g: tensor<1x5x8xf32>, %i: tensor<1x5x8xi32>, %win: tensor<6x10x4xf32>, %wout: tensor<6x4x5xf32>) -> tensor<1x5x4xf32> {
  // expected-error @+1 {{each token picks 8 experts but there are only 6}}
  %o = model.moe_experts %x, %g, %i, %win, %wout : (tensor<1x5x4xf32>, tensor<1x5x8xf32>, tensor<1x5x8xi32>, tensor<6x10x4xf32>, tensor<6x4x5xf32>) -> tensor<1x5x4xf32>
  return %o : tensor<1x5x4xf32>
}

// -----

// Targets are one per position.
func.func @loss_targets(%l: tensor<2x5x8xf32>, %t: tensor<2x4xi32>) -> tensor<f32> {
  // expected-error @+1 {{targets must have shape [2, 5], got [2, 4]}}
  %s, %c = model.cross_entropy %l, %t {ignore_index = -100 : i64} : (tensor<2x5x8xf32>, tensor<2x4xi32>) -> (tensor<f32>, tensor<f32>)
  return %s : tensor<f32>
}

// -----

// A cast keeps the shape.
func.func @cast_reshapes(%x: tensor<2x8xbf16>) -> tensor<16xf32> {
  // expected-error @+1 {{cast result must have shape [2, 8], got [16]}}
  %0 = model.cast %x : tensor<2x8xbf16> to tensor<16xf32>
  return %0 : tensor<16xf32>
}

// -----

// The picks are one per token and slot.
func.func @router_load_picks(%l: tensor<1x5x6xf32>, %i: tensor<1x4x2xi32>) -> tensor<6xf32> {
  // expected-error @+1 {{expert indices [1, 4, 2] must be [tokens..., k] for router logits [1, 5, 6]}}
  %p, %c = model.router_load %l, %i : (tensor<1x5x6xf32>, tensor<1x4x2xi32>) -> (tensor<6xf32>, tensor<6xf32>)
  return %p : tensor<6xf32>
}

// -----

// The statistics have one value per expert.
func.func @router_load_experts(%l: tensor<1x5x6xf32>, %i: tensor<1x5x2xi32>) -> tensor<4xf32> {
  // expected-error @+1 {{summed probabilities must have shape [6], got [4]}}
  %p, %c = model.router_load %l, %i : (tensor<1x5x6xf32>, tensor<1x5x2xi32>) -> (tensor<4xf32>, tensor<6xf32>)
  return %p : tensor<4xf32>
}

// -----

// The load-balancing loss's scale, experts / rows^2, is positive.
func.func @router_aux_loss_scale(%p: tensor<6xf32>, %c: tensor<6xf32>) -> tensor<f32> {
  // expected-error @+1 {{scale (experts / rows^2) must be a positive number, got 0}}
  %aux = model.router_aux_loss %p, %c {scale = 0.0 : f64} : (tensor<6xf32>, tensor<6xf32>) -> tensor<f32>
  return %aux : tensor<f32>
}

// -----

// Probabilities and picks cover the same experts.
func.func @router_aux_loss_sizes(%p: tensor<6xf32>, %c: tensor<4xf32>) -> tensor<f32> {
  // expected-error @+1 {{expert picks must have shape [6], got [4]}}
  %aux = model.router_aux_loss %p, %c {scale = 1.0 : f64} : (tensor<6xf32>, tensor<4xf32>) -> tensor<f32>
  return %aux : tensor<f32>
}

// -----

// A reported value has a name.
func.func @report_unnamed(%x: tensor<f32>) {
  // expected-error @+1 {{a reported value needs a name}}
  model.report "", %x : tensor<f32>
  return
}

// -----

// Document positions are one per token of the data.
func.func @positions_shape(%x: tensor<1x6x4xf32>, %w: tensor<4x1x3xf32>, %b: tensor<4xf32>, %pos: tensor<1x5xi32>) -> tensor<1x6x4xf32> {
  // expected-error @+1 {{document positions (position_ids [batch, seq]) must have shape [1, 6], got [1, 5]}}
  %y = model.causal_conv1d %x, %w, %b positions %pos : (tensor<1x6x4xf32>, tensor<4x1x3xf32>, tensor<4xf32>, tensor<1x5xi32>) -> tensor<1x6x4xf32>
  return %y : tensor<1x6x4xf32>
}
