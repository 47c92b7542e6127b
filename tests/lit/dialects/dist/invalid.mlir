// Verifier errors of the `dist` dialect, in the user's terms.
// RUN: hybridcp-opt %s --split-input-file --verify-diagnostics

// A sequence that does not split into the layout's pieces.
// expected-error @+1 {{sequence length 1000 cannot be split into 16 equal pieces for cp=8 (zigzag)}}
module attributes {dist.sequence = #dist.sequence<zigzag, cp = 8, seq = 1000>} {}

// -----

// cp and dp count ranks.
// expected-error @+1 {{cp and dp must be at least 1, got cp=0 dp=1}}
module attributes {dist.mesh = #dist.mesh<cp = 0, dp = 1>} {}

// -----

// An ep group is ep consecutive ranks of the world: ep divides cp * dp.
// expected-error @+1 {{ep=3 does not divide the 4 ranks of cp=2 x dp=2: an ep group is ep consecutive ranks}}
module attributes {dist.mesh = #dist.mesh<cp = 2, dp = 2, ep = 3>} {}

// -----

// The experts split evenly over the ep group.
func.func @uneven_experts(%x: tensor<6x4xf32>, %g: tensor<6x2xf32>, %i: tensor<6x2xi32>, %win: tensor<2x10x4xf32>, %wout: tensor<2x4x5xf32>) -> tensor<6x4xf32> {
  // expected-error @+1 {{64 experts cannot be split over ep=5 ranks}}
  %y = dist.moe_experts %x, %g, %i, %win, %wout {num_experts = 64 : i64, ep = 5 : i64} : (tensor<6x4xf32>, tensor<6x2xf32>, tensor<6x2xi32>, tensor<2x10x4xf32>, tensor<2x4x5xf32>) -> tensor<6x4xf32>
  return %y : tensor<6x4xf32>
}

// -----

// The weights are this rank's experts: 8 / 4 = 2 of them, not 8.
func.func @whole_weights(%x: tensor<6x4xf32>, %g: tensor<6x2xf32>, %i: tensor<6x2xi32>, %win: tensor<8x10x4xf32>, %wout: tensor<8x4x5xf32>) -> tensor<6x4xf32> {
  // expected-error @+1 {{expert input weight must be [2, 2*width, 4]: this rank's 8/4 experts}}
  %y = dist.moe_experts %x, %g, %i, %win, %wout {num_experts = 8 : i64, ep = 4 : i64} : (tensor<6x4xf32>, tensor<6x2xf32>, tensor<6x2xi32>, tensor<8x10x4xf32>, tensor<8x4x5xf32>) -> tensor<6x4xf32>
  return %y : tensor<6x4xf32>
}

// -----

// A token picks among the global experts: at most num_experts of them.
func.func @too_many_picks(%x: tensor<6x4xf32>, %g: tensor<6x3xf32>, %i: tensor<6x3xi32>, %win: tensor<1x10x4xf32>, %wout: tensor<1x4x5xf32>) -> tensor<6x4xf32> {
  // expected-error @+1 {{each token picks 3 experts but there are 2}}
  %y = dist.moe_experts %x, %g, %i, %win, %wout {num_experts = 2 : i64, ep = 2 : i64} : (tensor<6x4xf32>, tensor<6x3xf32>, tensor<6x3xi32>, tensor<1x10x4xf32>, tensor<1x4x5xf32>) -> tensor<6x4xf32>
  return %y : tensor<6x4xf32>
}

// -----

// The transpose's gradients have their operands' shapes.
func.func @grad_shapes(%x: tensor<6x4xf32>, %g: tensor<6x2xf32>, %i: tensor<6x2xi32>, %win: tensor<2x10x4xf32>, %wout: tensor<2x4x5xf32>) -> tensor<8x10x4xf32> {
  // expected-error @+1 {{input weight gradient and input weight must have the same shape}}
  %dx, %dg, %dwin, %dwout = dist.moe_experts_grad %x, %x, %g, %i, %win, %wout {num_experts = 8 : i64, ep = 4 : i64} : (tensor<6x4xf32>, tensor<6x4xf32>, tensor<6x2xf32>, tensor<6x2xi32>, tensor<2x10x4xf32>, tensor<2x4x5xf32>) -> (tensor<6x4xf32>, tensor<6x2xf32>, tensor<8x10x4xf32>, tensor<2x4x5xf32>)
  return %dwin : tensor<8x10x4xf32>
}

// -----

// A piece shorter than the conv halo (d_conv - 1) cannot feed the next piece.
func.func @short_piece(%x: tensor<2x2x10xf32>) -> tensor<2x3x10xf32> {
  // expected-error @+1 {{pieces of 2 tokens are shorter than the conv halo of 3 tokens (d_conv - 1)}}
  %h = dist.halo_exchange %x {layout = #dist.sequence<zigzag, cp = 4, seq = 16>, width = 3 : i64} : tensor<2x2x10xf32> -> tensor<2x3x10xf32>
  return %h : tensor<2x3x10xf32>
}

// -----

// The conv input's segment length must be the layout's.
func.func @wrong_segment(%x: tensor<2x5x10xf32>) -> tensor<2x3x10xf32> {
  // expected-error @+1 {{conv input has segments of 5 tokens, but 24 tokens in 4 pieces make segments of 6}}
  %h = dist.halo_exchange %x {layout = #dist.sequence<zigzag, cp = 2, seq = 24>, width = 3 : i64} : tensor<2x5x10xf32> -> tensor<2x3x10xf32>
  return %h : tensor<2x3x10xf32>
}

// -----

// Zigzag gives each rank two segments: rows come in pairs.
func.func @odd_rows(%x: tensor<3x6x10xf32>) -> tensor<3x3x10xf32> {
  // expected-error @+1 {{conv input must have one row per batch row and local segment (2 per batch row)}}
  %h = dist.halo_exchange %x {layout = #dist.sequence<zigzag, cp = 2, seq = 24>, width = 3 : i64} : tensor<3x6x10xf32> -> tensor<3x3x10xf32>
  return %h : tensor<3x3x10xf32>
}

// -----

// The log-decays are one per segment row and head.
func.func @decay_shape(%g: tensor<2x3xf32>, %s: tensor<2x4x3x5xf32>) -> tensor<2x4x3x5xf32> {
  // expected-error @+1 {{log-decays must be [rows, heads] = [2, 4]}}
  %r = dist.state_scan %g, %s {layout = #dist.sequence<zigzag, cp = 2, seq = 24>, strategy = #dist.strategy<chain>} : (tensor<2x3xf32>, tensor<2x4x3x5xf32>) -> tensor<2x4x3x5xf32>
  return %r : tensor<2x4x3x5xf32>
}

// -----

// Ring attention works on the rank's local tokens.
func.func @ring_local(%q: tensor<1x24x4x8xf32>) -> tensor<1x24x4x8xf32> {
  // expected-error @+1 {{local sequence of 24 tokens, but the layout gives 12 per rank}}
  %o, %l = dist.ring_attention %q, %q, %q {causal, layout = #dist.sequence<zigzag, cp = 2, seq = 24>, scale = 0.1 : f64} : (tensor<1x24x4x8xf32>, tensor<1x24x4x8xf32>, tensor<1x24x4x8xf32>) -> (tensor<1x24x4x8xf32>, tensor<1x4x24xf32>)
  return %o : tensor<1x24x4x8xf32>
}

// -----

// Grouped-query attention needs kv heads that divide the query heads.
func.func @ring_gqa(%q: tensor<1x12x4x8xf32>, %k: tensor<1x12x3x8xf32>) -> tensor<1x12x4x8xf32> {
  // expected-error @+1 {{3 kv heads do not divide 4 query heads}}
  %o, %l = dist.ring_attention %q, %k, %k {causal, layout = #dist.sequence<zigzag, cp = 2, seq = 24>, scale = 0.1 : f64} : (tensor<1x12x4x8xf32>, tensor<1x12x3x8xf32>, tensor<1x12x3x8xf32>) -> (tensor<1x12x4x8xf32>, tensor<1x4x12xf32>)
  return %o : tensor<1x12x4x8xf32>
}
