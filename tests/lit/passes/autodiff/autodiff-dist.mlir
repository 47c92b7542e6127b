// hcp-autodiff through the collectives: each dist op's backward is its transpose.
// RUN: hybridcp-opt %s --split-input-file --hcp-autodiff | FileCheck %s

// halo_exchange -> halo_exchange_grad (the halo's gradient goes back to the previous segment),
// added to the conv's own input gradient.
// CHECK-LABEL: func.func @train_step
// CHECK: %{{.+}}, %{{.+}}, %{{.+}}, %[[DHALO:.+]] = model.causal_conv1d_grad %{{.+}}, %{{.+}}, %{{.+}} halo %{{.+}}
// CHECK: %[[BACK:.+]] = dist.halo_exchange_grad %[[DHALO]] {{.+}} : tensor<2x3x10xf32> -> tensor<2x8x10xf32>
// CHECK: model.add %{{.+}}, %[[BACK]]
// CHECK: model.param_grad "x"
module attributes {dist.sequence = #dist.sequence<contiguous, cp = 2, seq = 16>} {
func.func @train_step(%targets: tensor<2x8xi32>) -> tensor<f32> {
  %x = model.param "x" normal(1.0) : tensor<2x8x10xf32>
  %w = model.param "w" normal(1.0) : tensor<10x1x4xf32>
  %b = model.param "b" zeros : tensor<10xf32>
  %h = dist.halo_exchange %x {layout = #dist.sequence<contiguous, cp = 2, seq = 16>, width = 3 : i64} : tensor<2x8x10xf32> -> tensor<2x3x10xf32>
  %y = model.causal_conv1d %x, %w, %b halo %h : (tensor<2x8x10xf32>, tensor<10x1x4xf32>, tensor<10xf32>, tensor<2x3x10xf32>) -> tensor<2x8x10xf32>
  %s, %c = model.cross_entropy %y, %targets {ignore_index = -100 : i64} : (tensor<2x8x10xf32>, tensor<2x8xi32>) -> (tensor<f32>, tensor<f32>)
  return %s : tensor<f32>
}
}

// -----

// state_scan -> state_scan_grad: the incoming states' gradient becomes the summary states'
// gradient (dfinal of model.ssd_final_state, the zero-start summary) and the log-decays'
// (through ssd_log_decay_grad).
// CHECK-LABEL: func.func @train_step
// CHECK: model.ssd_scan_grad {{.+}} init %[[IN:[^ ]+]] {chunk_size
// CHECK: %[[DG:.+]], %[[DS:.+]] = dist.state_scan_grad %{{.+}}, %{{.+}}, %[[IN]] {{.+}} strategy = #dist.strategy<chain>
// CHECK: model.ssd_log_decay_grad %[[DG]]
// CHECK: model.ssd_final_state_grad %[[DS]], %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}} {chunk_size = 4 : i64} : (tensor<1x2x3x4xf32>, tensor<1x8x2x3xf32>, tensor<1x8x2xf32>, tensor<2xf32>, tensor<1x8x1x4xf32>) -> (tensor<1x8x2x3xf32>, tensor<1x8x2xf32>, tensor<2xf32>, tensor<1x8x1x4xf32>)
// CHECK-NOT: model.ssd_scan_grad
module attributes {dist.sequence = #dist.sequence<contiguous, cp = 2, seq = 16>} {
func.func @train_step(%targets: tensor<1x8xi32>) -> tensor<f32> {
  %x = model.param "x" normal(1.0) : tensor<1x8x2x3xf32>
  %dt = model.param "dt" ones : tensor<1x8x2xf32>
  %A = model.param "A" ones : tensor<2xf32>
  %B = model.param "B" normal(1.0) : tensor<1x8x1x4xf32>
  %D = model.param "D" ones : tensor<2xf32>
  %local = model.ssd_final_state %x, %dt, %A, %B {chunk_size = 4 : i64} : (tensor<1x8x2x3xf32>, tensor<1x8x2xf32>, tensor<2xf32>, tensor<1x8x1x4xf32>) -> tensor<1x2x3x4xf32>
  %g = model.ssd_log_decay %dt, %A : (tensor<1x8x2xf32>, tensor<2xf32>) -> tensor<1x2xf32>
  %in = dist.state_scan %g, %local {layout = #dist.sequence<contiguous, cp = 2, seq = 16>, strategy = #dist.strategy<chain>} : (tensor<1x2xf32>, tensor<1x2x3x4xf32>) -> tensor<1x2x3x4xf32>
  %y, %f = model.ssd_scan %x, %dt, %A, %B, %B, %D init %in {chunk_size = 4 : i64} : (tensor<1x8x2x3xf32>, tensor<1x8x2xf32>, tensor<2xf32>, tensor<1x8x1x4xf32>, tensor<1x8x1x4xf32>, tensor<2xf32>, tensor<1x2x3x4xf32>) -> (tensor<1x8x2x3xf32>, tensor<1x2x3x4xf32>)
  %logits = model.reshape %y : tensor<1x8x2x3xf32> -> tensor<1x8x6xf32>
  %s, %c = model.cross_entropy %logits, %targets {ignore_index = -100 : i64} : (tensor<1x8x6xf32>, tensor<1x8xi32>) -> (tensor<f32>, tensor<f32>)
  return %s : tensor<f32>
}
}

// -----

// The default split (one scan from a zero start, corrected by the incoming state): y's gradient
// passes through the correction to the scan; the correction's own gradient gives the incoming
// state's, which state_scan_grad turns into the zero-start scan's dfinal.
// CHECK-LABEL: func.func @train_step
// CHECK: %{{.+}}, %{{.+}}, %{{.+}}, %[[DIN:.+]] = model.ssd_add_initial_state_grad %[[DY:[^,]+]], %{{.+}}, %{{.+}}, %{{.+}} init %[[IN:[^ ]+]] :
// CHECK: %[[DG:.+]], %[[DS:.+]] = dist.state_scan_grad %[[DIN]], %{{.+}}, %[[IN]]
// CHECK: model.ssd_scan_grad %[[DY]], {{.+}} dfinal %[[DS]] {chunk_size = 4 : i64}
// CHECK-NOT: model.ssd_scan_grad
module attributes {dist.sequence = #dist.sequence<contiguous, cp = 2, seq = 16>} {
func.func @train_step(%targets: tensor<1x8xi32>) -> tensor<f32> {
  %x = model.param "x" normal(1.0) : tensor<1x8x2x3xf32>
  %dt = model.param "dt" ones : tensor<1x8x2xf32>
  %A = model.param "A" ones : tensor<2xf32>
  %B = model.param "B" normal(1.0) : tensor<1x8x1x4xf32>
  %D = model.param "D" ones : tensor<2xf32>
  %g = model.ssd_log_decay %dt, %A : (tensor<1x8x2xf32>, tensor<2xf32>) -> tensor<1x2xf32>
  %y0, %local = model.ssd_scan %x, %dt, %A, %B, %B, %D {chunk_size = 4 : i64} : (tensor<1x8x2x3xf32>, tensor<1x8x2xf32>, tensor<2xf32>, tensor<1x8x1x4xf32>, tensor<1x8x1x4xf32>, tensor<2xf32>) -> (tensor<1x8x2x3xf32>, tensor<1x2x3x4xf32>)
  %in = dist.state_scan %g, %local {layout = #dist.sequence<contiguous, cp = 2, seq = 16>, strategy = #dist.strategy<chain>} : (tensor<1x2xf32>, tensor<1x2x3x4xf32>) -> tensor<1x2x3x4xf32>
  %y = model.ssd_add_initial_state %y0, %dt, %A, %B init %in : (tensor<1x8x2x3xf32>, tensor<1x8x2xf32>, tensor<2xf32>, tensor<1x8x1x4xf32>, tensor<1x2x3x4xf32>) -> tensor<1x8x2x3xf32>
  %logits = model.reshape %y : tensor<1x8x2x3xf32> -> tensor<1x8x6xf32>
  %s, %c = model.cross_entropy %logits, %targets {ignore_index = -100 : i64} : (tensor<1x8x6xf32>, tensor<1x8xi32>) -> (tensor<f32>, tensor<f32>)
  return %s : tensor<f32>
}
}

// -----

// ring_attention -> ring_attention_grad from the final out and lse; all_reduce's transpose is
// the identity (its result is replicated): no collective appears for it in the backward.
// CHECK-LABEL: func.func @train_step
// CHECK: %[[O:.+]], %[[L:.+]] = dist.ring_attention
// CHECK: dist.all_reduce
// CHECK-NOT: dist.all_reduce
// CHECK: dist.ring_attention_grad %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}}, %[[O]], %[[L]]
module attributes {dist.sequence = #dist.sequence<zigzag, cp = 2, seq = 16>} {
func.func @train_step(%targets: tensor<1x8xi32>) -> tensor<f32> {
  %q = model.param "q" normal(1.0) : tensor<1x8x2x4xf32>
  %o, %l = dist.ring_attention %q, %q, %q {causal, layout = #dist.sequence<zigzag, cp = 2, seq = 16>, scale = 0.5 : f64} : (tensor<1x8x2x4xf32>, tensor<1x8x2x4xf32>, tensor<1x8x2x4xf32>) -> (tensor<1x8x2x4xf32>, tensor<1x2x8xf32>)
  %logits = model.reshape %o : tensor<1x8x2x4xf32> -> tensor<1x8x8xf32>
  %s, %c = model.cross_entropy %logits, %targets {ignore_index = -100 : i64} : (tensor<1x8x8xf32>, tensor<1x8xi32>) -> (tensor<f32>, tensor<f32>)
  %r = dist.all_reduce %s <cp> : tensor<f32>
  return %r : tensor<f32>
}
}

// -----

// moe_experts (experts split over ep = 2) -> moe_experts_grad: dx and dgates for this rank's
// tokens, and this rank's experts' weight gradients, which go to the sharded parameters.
// CHECK-LABEL: func.func @train_step
// CHECK: %[[WIN:.+]] = model.param "w_in" normal(1.000000e+00) shards 2 : tensor<2x6x4xf32>
// CHECK: %[[WOUT:.+]] = model.param "w_out" normal(1.000000e+00) shards 2 : tensor<2x4x3xf32>
// CHECK: %[[DX:.+]], %[[DG:.+]], %[[DWIN:.+]], %[[DWOUT:.+]] = dist.moe_experts_grad %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}}, %[[WIN]], %[[WOUT]] {ep = 2 : i64, num_experts = 4 : i64}
// CHECK-DAG: model.param_grad "w_in", %[[DWIN]] : tensor<2x6x4xf32>
// CHECK-DAG: model.param_grad "w_out", %[[DWOUT]] : tensor<2x4x3xf32>
// CHECK-DAG: model.moe_route_grad %[[DG]]
module attributes {dist.mesh = #dist.mesh<cp = 2, dp = 1, ep = 2>} {
func.func @train_step(%targets: tensor<1x8xi32>) -> tensor<f32> {
  %x = model.param "x" normal(1.0) : tensor<1x8x4xf32>
  %router = model.param "router" normal(1.0) : tensor<4x4xf32>
  %logits = model.linear %x, %router : (tensor<1x8x4xf32>, tensor<4x4xf32>) -> tensor<1x8x4xf32>
  %g, %i = model.moe_route %logits {top_k = 2 : i64} : tensor<1x8x4xf32> -> tensor<1x8x2xf32>, tensor<1x8x2xi32>
  %win = model.param "w_in" normal(1.0) shards 2 : tensor<2x6x4xf32>
  %wout = model.param "w_out" normal(1.0) shards 2 : tensor<2x4x3xf32>
  %y = dist.moe_experts %x, %g, %i, %win, %wout {num_experts = 4 : i64, ep = 2 : i64} : (tensor<1x8x4xf32>, tensor<1x8x2xf32>, tensor<1x8x2xi32>, tensor<2x6x4xf32>, tensor<2x4x3xf32>) -> tensor<1x8x4xf32>
  %s, %c = model.cross_entropy %y, %targets {ignore_index = -100 : i64} : (tensor<1x8x4xf32>, tensor<1x8xi32>) -> (tensor<f32>, tensor<f32>)
  return %s : tensor<f32>
}
}
