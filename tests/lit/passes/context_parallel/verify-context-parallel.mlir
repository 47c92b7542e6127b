// hcp-verify-context-parallel: each op that reads across shard edges and was not rewritten is
// reported.
// RUN: hybridcp-opt %s --split-input-file --hcp-verify-context-parallel --verify-diagnostics

// A conv without a halo.
module attributes {dist.sequence = #dist.sequence<contiguous, cp = 2, seq = 16>} {
func.func @conv(%x: tensor<2x8x10xf32>, %w: tensor<10x1x4xf32>, %b: tensor<10xf32>) -> tensor<2x8x10xf32> {
  // expected-error @+1 {{conv1d of a sharded program without a halo exchange (run hcp-insert-halo-exchange)}}
  %y = model.causal_conv1d %x, %w, %b : (tensor<2x8x10xf32>, tensor<10x1x4xf32>, tensor<10xf32>) -> tensor<2x8x10xf32>
  return %y : tensor<2x8x10xf32>
}
}

// -----

// A scan without state passing.
module attributes {dist.sequence = #dist.sequence<contiguous, cp = 2, seq = 16>} {
func.func @scan(%x: tensor<1x8x2x3xf32>, %dt: tensor<1x8x2xf32>, %A: tensor<2xf32>, %B: tensor<1x8x1x4xf32>, %D: tensor<2xf32>) -> tensor<1x8x2x3xf32> {
  // expected-error @+1 {{SSD scan of a sharded program without state passing (run hcp-insert-state-scan)}}
  %y, %f = model.ssd_scan %x, %dt, %A, %B, %B, %D {chunk_size = 4 : i64} : (tensor<1x8x2x3xf32>, tensor<1x8x2xf32>, tensor<2xf32>, tensor<1x8x1x4xf32>, tensor<1x8x1x4xf32>, tensor<2xf32>) -> (tensor<1x8x2x3xf32>, tensor<1x2x3x4xf32>)
  return %y : tensor<1x8x2x3xf32>
}
}

// -----

// A scan split by hcp-insert-state-scan passes: the summary (model.ssd_final_state) is local work,
// and the rescan takes its initial state from dist.state_scan.
module attributes {dist.sequence = #dist.sequence<contiguous, cp = 2, seq = 16>} {
func.func @split_scan(%x: tensor<1x8x2x3xf32>, %dt: tensor<1x8x2xf32>, %A: tensor<2xf32>, %B: tensor<1x8x1x4xf32>, %D: tensor<2xf32>) -> tensor<1x8x2x3xf32> {
  %s = model.ssd_final_state %x, %dt, %A, %B {chunk_size = 4 : i64} : (tensor<1x8x2x3xf32>, tensor<1x8x2xf32>, tensor<2xf32>, tensor<1x8x1x4xf32>) -> tensor<1x2x3x4xf32>
  %g = model.ssd_log_decay %dt, %A : (tensor<1x8x2xf32>, tensor<2xf32>) -> tensor<1x2xf32>
  %in = dist.state_scan %g, %s {layout = #dist.sequence<contiguous, cp = 2, seq = 16>, strategy = #dist.strategy<chain>} : (tensor<1x2xf32>, tensor<1x2x3x4xf32>) -> tensor<1x2x3x4xf32>
  %y, %f = model.ssd_scan %x, %dt, %A, %B, %B, %D init %in {chunk_size = 4 : i64} : (tensor<1x8x2x3xf32>, tensor<1x8x2xf32>, tensor<2xf32>, tensor<1x8x1x4xf32>, tensor<1x8x1x4xf32>, tensor<2xf32>, tensor<1x2x3x4xf32>) -> (tensor<1x8x2x3xf32>, tensor<1x2x3x4xf32>)
  return %y : tensor<1x8x2x3xf32>
}
}

// -----

// The default split: one scan from a zero start, its outputs corrected by the incoming state.
module attributes {dist.sequence = #dist.sequence<contiguous, cp = 2, seq = 16>} {
func.func @corrected_scan(%x: tensor<1x8x2x3xf32>, %dt: tensor<1x8x2xf32>, %A: tensor<2xf32>, %B: tensor<1x8x1x4xf32>, %D: tensor<2xf32>) -> tensor<1x8x2x3xf32> {
  %g = model.ssd_log_decay %dt, %A : (tensor<1x8x2xf32>, tensor<2xf32>) -> tensor<1x2xf32>
  %y0, %s = model.ssd_scan %x, %dt, %A, %B, %B, %D {chunk_size = 4 : i64} : (tensor<1x8x2x3xf32>, tensor<1x8x2xf32>, tensor<2xf32>, tensor<1x8x1x4xf32>, tensor<1x8x1x4xf32>, tensor<2xf32>) -> (tensor<1x8x2x3xf32>, tensor<1x2x3x4xf32>)
  %in = dist.state_scan %g, %s {layout = #dist.sequence<contiguous, cp = 2, seq = 16>, strategy = #dist.strategy<chain>} : (tensor<1x2xf32>, tensor<1x2x3x4xf32>) -> tensor<1x2x3x4xf32>
  %y = model.ssd_add_initial_state %y0, %dt, %A, %B init %in : (tensor<1x8x2x3xf32>, tensor<1x8x2xf32>, tensor<2xf32>, tensor<1x8x1x4xf32>, tensor<1x2x3x4xf32>) -> tensor<1x8x2x3xf32>
  return %y : tensor<1x8x2x3xf32>
}
}

// -----

// The same scan's outputs used as they are: the incoming state's part is missing.
module attributes {dist.sequence = #dist.sequence<contiguous, cp = 2, seq = 16>} {
func.func @uncorrected_scan(%x: tensor<1x8x2x3xf32>, %dt: tensor<1x8x2xf32>, %A: tensor<2xf32>, %B: tensor<1x8x1x4xf32>, %D: tensor<2xf32>) -> tensor<1x8x2x3xf32> {
  %g = model.ssd_log_decay %dt, %A : (tensor<1x8x2xf32>, tensor<2xf32>) -> tensor<1x2xf32>
  // expected-error @+1 {{the outputs of an SSD scan from a zero start are used without the incoming state's part (model.ssd_add_initial_state)}}
  %y0, %s = model.ssd_scan %x, %dt, %A, %B, %B, %D {chunk_size = 4 : i64} : (tensor<1x8x2x3xf32>, tensor<1x8x2xf32>, tensor<2xf32>, tensor<1x8x1x4xf32>, tensor<1x8x1x4xf32>, tensor<2xf32>) -> (tensor<1x8x2x3xf32>, tensor<1x2x3x4xf32>)
  %in = dist.state_scan %g, %s {layout = #dist.sequence<contiguous, cp = 2, seq = 16>, strategy = #dist.strategy<chain>} : (tensor<1x2xf32>, tensor<1x2x3x4xf32>) -> tensor<1x2x3x4xf32>
  return %y0 : tensor<1x8x2x3xf32>
}
}

// -----

// Local-only attention.
module attributes {dist.sequence = #dist.sequence<contiguous, cp = 2, seq = 16>} {
func.func @attention(%q: tensor<1x8x4x4xf32>) -> tensor<1x8x4x4xf32> {
  // expected-error @+1 {{attention of a sharded program sees only local keys (run hcp-insert-ring-attention)}}
  %o, %lse = model.attention %q, %q, %q {causal, scale = 0.125 : f64} : (tensor<1x8x4x4xf32>, tensor<1x8x4x4xf32>, tensor<1x8x4x4xf32>) -> (tensor<1x8x4x4xf32>, tensor<1x4x8xf32>)
  return %o : tensor<1x8x4x4xf32>
}
}

// -----

// A partial loss used as if it were global.
module attributes {dist.sequence = #dist.sequence<contiguous, cp = 2, seq = 8>} {
func.func @loss(%logits: tensor<1x4x8xf32>, %targets: tensor<1x4xi32>) -> tensor<f32> {
  // expected-error @+1 {{a rank's partial loss is used without summing it over the ranks (run hcp-reduce-loss)}}
  %s, %c = model.cross_entropy %logits, %targets {ignore_index = -100 : i64} : (tensor<1x4x8xf32>, tensor<1x4xi32>) -> (tensor<f32>, tensor<f32>)
  %loss = model.div %s, %c : tensor<f32>, tensor<f32>
  return %loss : tensor<f32>
}
}

// -----

// A rank's routing statistics used by the load-balancing loss as if they were global.
module attributes {dist.sequence = #dist.sequence<contiguous, cp = 2, seq = 8>} {
func.func @router_aux_loss(%logits: tensor<1x4x4xf32>, %i: tensor<1x4x2xi32>) -> tensor<f32> {
  %p, %c = model.router_load %logits, %i : (tensor<1x4x4xf32>, tensor<1x4x2xi32>) -> (tensor<4xf32>, tensor<4xf32>)
  // expected-error @+1 {{the load-balancing loss reads a rank's routing statistics without summing them over the ranks (run hcp-reduce-loss)}}
  %aux = model.router_aux_loss %p, %c {scale = 0.0625 : f64} : (tensor<4xf32>, tensor<4xf32>) -> tensor<f32>
  return %aux : tensor<f32>
}
}
