// hcp-lower-to-exec: every tensor becomes a buffer, every op one kernel launch.
// RUN: hybridcp-opt %s --split-input-file --hcp-lower-to-exec --verify-diagnostics | FileCheck %s

// A linear layer and its weight gradient: gemm with the weight transposed (y = x W^T), and the
// gradient computed straight into the parameter's gradient buffer (no copy).
// CHECK-LABEL: func.func @train_step()
// CHECK-DAG: %[[IDS:.+]] = exec.buffer inputs "input_ids" : memref<2x3xi32>
// CHECK-DAG: %[[TGT:.+]] = exec.buffer inputs "targets" : memref<2x3xi32>
// CHECK-DAG: %[[W:.+]] = exec.buffer parameters "w" {init = #exec.init<normal>, std = 2.000000e-02 : f64} : memref<8x4xf32>
// CHECK: exec.launch "embedding.forward" ins(%[[W]], %[[IDS]] : {{.+}}) outs(%[[E:.+]] : memref<2x3x4xf32>) {floats = array<f64: 1.000000e+00>, ints = array<i64: 6, 8, 4>}
// CHECK: exec.launch "gemm" ins(%[[E]], %[[W]] : {{.+}}) outs(%[[L:.+]] : memref<2x3x8xf32>) {floats = array<f64: 1.000000e+00>, ints = array<i64: 0, 1, 6, 8, 4>}
// CHECK: exec.launch "cross_entropy.forward" ins(%[[L]], %[[TGT]] : {{.+}}) {{.+}} ints = array<i64: 6, 8, -100>
// CHECK: %[[G:.+]] = exec.buffer gradients "w" : memref<8x4xf32>
// CHECK: exec.launch "gemm" ins(%{{.+}}, %[[E]] : {{.+}}) outs(%[[G]] : memref<8x4xf32>) {floats = array<f64: 1.000000e+00>, ints = array<i64: 1, 0, 8, 4, 6>}
// CHECK-NOT: "copy"
// CHECK: exec.result "loss", %{{.+}} : memref<f32>
func.func @train_step(%ids: tensor<2x3xi32> {model.input = "input_ids"}, %targets: tensor<2x3xi32> {model.input = "targets"}) -> tensor<f32> {
  %w = model.param "w" normal(0.02) : tensor<8x4xf32>
  %e = model.embedding %w, %ids {multiplier = 1.0 : f64} : (tensor<8x4xf32>, tensor<2x3xi32>) -> tensor<2x3x4xf32>
  %l = model.linear %e, %w : (tensor<2x3x4xf32>, tensor<8x4xf32>) -> tensor<2x3x8xf32>
  %s, %c = model.cross_entropy %l, %targets {ignore_index = -100 : i64} : (tensor<2x3x8xf32>, tensor<2x3xi32>) -> (tensor<f32>, tensor<f32>)
  %loss = model.div %s, %c : tensor<f32>, tensor<f32>
  %one = model.fill 1.0 : tensor<f32>
  %ds = model.div %one, %c : tensor<f32>, tensor<f32>
  %dl = model.cross_entropy_grad %ds, %l, %targets {ignore_index = -100 : i64} : (tensor<f32>, tensor<2x3x8xf32>, tensor<2x3xi32>) -> tensor<2x3x8xf32>
  %dw = model.linear_grad_weight %dl, %e : (tensor<2x3x8xf32>, tensor<2x3x4xf32>) -> tensor<8x4xf32>
  model.param_grad "w", %dw : tensor<8x4xf32>
  return %loss : tensor<f32>
}

// -----

// Reshapes are views of the same bytes; a split slices columns; a concat inserts them.
// CHECK-LABEL: func.func @train_step()
// CHECK: exec.launch "slice_columns" ins(%[[X:.+]] : memref<1x2x6xf32>) outs(%[[A:.+]] : memref<1x2x2xf32>) {{.+}} ints = array<i64: 2, 6, 0, 2>
// CHECK: exec.launch "slice_columns" ins(%[[X]] : memref<1x2x6xf32>) outs(%[[B:.+]] : memref<1x2x4xf32>) {{.+}} ints = array<i64: 2, 6, 2, 4>
// CHECK: %[[V:.+]] = exec.view %[[B]] : memref<1x2x4xf32> to memref<1x2x2x2xf32>
// CHECK: exec.launch "insert_columns" ins(%[[B]] : memref<1x2x4xf32>) outs(%[[C:.+]] : memref<1x2x6xf32>) {{.+}} ints = array<i64: 2, 6, 0, 4>
// CHECK: exec.launch "insert_columns" ins(%[[A]] : memref<1x2x2xf32>) outs(%[[C]] : memref<1x2x6xf32>) {{.+}} ints = array<i64: 2, 6, 4, 2>
func.func @train_step(%ids: tensor<1x2xi32> {model.input = "input_ids"}, %targets: tensor<1x2xi32> {model.input = "targets"}) -> tensor<f32> {
  %w = model.param "w" normal(0.02) : tensor<8x6xf32>
  %x = model.embedding %w, %ids {multiplier = 1.0 : f64} : (tensor<8x6xf32>, tensor<1x2xi32>) -> tensor<1x2x6xf32>
  %p:2 = model.split %x [2, 4] : tensor<1x2x6xf32> -> tensor<1x2x2xf32>, tensor<1x2x4xf32>
  %v = model.reshape %p#1 : tensor<1x2x4xf32> -> tensor<1x2x2x2xf32>
  %c = model.concat %p#1, %p#0 : tensor<1x2x4xf32>, tensor<1x2x2xf32> -> tensor<1x2x6xf32>
  %s, %n = model.cross_entropy %c, %targets {ignore_index = -100 : i64} : (tensor<1x2x6xf32>, tensor<1x2xi32>) -> (tensor<f32>, tensor<f32>)
  return %s : tensor<f32>
}

// -----

// The SSD scan's kernel flags record whether an initial state (and, backward, a final-state
// gradient) is passed.
// CHECK-LABEL: func.func @train_step()
// CHECK: exec.launch "ssd_scan.forward" {{.+}} ints = array<i64: 1, 5, 2, 3, 1, 4, 4, 1, 0, 0>
// CHECK: exec.launch "ssd_scan.backward" {{.+}} ints = array<i64: 1, 5, 2, 3, 1, 4, 4, 1, 1, 0, 0>
// CHECK: exec.launch "ssd_scan.backward" {{.+}} ints = array<i64: 1, 5, 2, 3, 1, 4, 4, 0, 0, 0, 0>
func.func @train_step(%ids: tensor<1x5xi32> {model.input = "input_ids"}, %targets: tensor<1x5xi32> {model.input = "targets"}) -> tensor<f32> {
  %x = model.param "x" normal(1.0) : tensor<1x5x2x3xf32>
  %dt = model.param "dt" ones : tensor<1x5x2xf32>
  %A = model.param "A" ones : tensor<2xf32>
  %B = model.param "B" normal(1.0) : tensor<1x5x1x4xf32>
  %D = model.param "D" ones : tensor<2xf32>
  %s0 = model.param "s0" zeros : tensor<1x2x3x4xf32>
  %y, %f = model.ssd_scan %x, %dt, %A, %B, %B, %D init %s0 {chunk_size = 4 : i64} : (tensor<1x5x2x3xf32>, tensor<1x5x2xf32>, tensor<2xf32>, tensor<1x5x1x4xf32>, tensor<1x5x1x4xf32>, tensor<2xf32>, tensor<1x2x3x4xf32>) -> (tensor<1x5x2x3xf32>, tensor<1x2x3x4xf32>)
  %g:7 = model.ssd_scan_grad %y, %x, %dt, %A, %B, %B, %D init %s0 dfinal %f {chunk_size = 4 : i64} : (tensor<1x5x2x3xf32>, tensor<1x5x2x3xf32>, tensor<1x5x2xf32>, tensor<2xf32>, tensor<1x5x1x4xf32>, tensor<1x5x1x4xf32>, tensor<2xf32>, tensor<1x2x3x4xf32>, tensor<1x2x3x4xf32>) -> (tensor<1x5x2x3xf32>, tensor<1x5x2xf32>, tensor<2xf32>, tensor<1x5x1x4xf32>, tensor<1x5x1x4xf32>, tensor<2xf32>, tensor<1x2x3x4xf32>)
  %h:6 = model.ssd_scan_grad %y, %x, %dt, %A, %B, %B, %D {chunk_size = 4 : i64} : (tensor<1x5x2x3xf32>, tensor<1x5x2x3xf32>, tensor<1x5x2xf32>, tensor<2xf32>, tensor<1x5x1x4xf32>, tensor<1x5x1x4xf32>, tensor<2xf32>) -> (tensor<1x5x2x3xf32>, tensor<1x5x2xf32>, tensor<2xf32>, tensor<1x5x1x4xf32>, tensor<1x5x1x4xf32>, tensor<2xf32>)
  %loss = model.fill 0.0 : tensor<f32>
  return %loss : tensor<f32>
}

// -----

// The incoming state's correction and its gradient: the shape ints, no chunk.
// CHECK-LABEL: func.func @train_step()
// CHECK: exec.launch "ssd_add_initial_state.forward" ins({{.+}}) outs({{.+}} : memref<1x5x2x3xf32>) {{.+}} ints = array<i64: 1, 5, 2, 3, 1, 4, 0>}
// CHECK: exec.launch "ssd_add_initial_state.backward" ins({{.+}}) outs({{.+}}) {{.+}} ints = array<i64: 1, 5, 2, 3, 1, 4, 0>}
func.func @train_step(%ids: tensor<1x5xi32> {model.input = "input_ids"}, %targets: tensor<1x5xi32> {model.input = "targets"}) -> tensor<f32> {
  %y = model.param "y" normal(1.0) : tensor<1x5x2x3xf32>
  %dt = model.param "dt" ones : tensor<1x5x2xf32>
  %A = model.param "A" ones : tensor<2xf32>
  %C = model.param "C" normal(1.0) : tensor<1x5x1x4xf32>
  %s = model.param "s" normal(1.0) : tensor<1x2x3x4xf32>
  %o = model.ssd_add_initial_state %y, %dt, %A, %C init %s : (tensor<1x5x2x3xf32>, tensor<1x5x2xf32>, tensor<2xf32>, tensor<1x5x1x4xf32>, tensor<1x2x3x4xf32>) -> tensor<1x5x2x3xf32>
  %g:4 = model.ssd_add_initial_state_grad %o, %dt, %A, %C init %s : (tensor<1x5x2x3xf32>, tensor<1x5x2xf32>, tensor<2xf32>, tensor<1x5x1x4xf32>, tensor<1x2x3x4xf32>) -> (tensor<1x5x2xf32>, tensor<2xf32>, tensor<1x5x1x4xf32>, tensor<1x2x3x4xf32>)
  %loss = model.fill 0.0 : tensor<f32>
  return %loss : tensor<f32>
}

// -----

// The scan's state-only summary and its gradient: the shape ints, no flags.
// CHECK-LABEL: func.func @train_step()
// CHECK: exec.launch "ssd_final_state.forward" ins({{.+}}) outs(%[[F:.+]] : memref<1x2x3x4xf32>) {{.+}} ints = array<i64: 1, 5, 2, 3, 1, 4, 4, 0>}
// CHECK: exec.launch "ssd_final_state.backward" ins(%[[F]], {{.+}}) outs({{.+}}) {{.+}} ints = array<i64: 1, 5, 2, 3, 1, 4, 4, 0>}
func.func @train_step(%ids: tensor<1x5xi32> {model.input = "input_ids"}, %targets: tensor<1x5xi32> {model.input = "targets"}) -> tensor<f32> {
  %x = model.param "x" normal(1.0) : tensor<1x5x2x3xf32>
  %dt = model.param "dt" ones : tensor<1x5x2xf32>
  %A = model.param "A" ones : tensor<2xf32>
  %B = model.param "B" normal(1.0) : tensor<1x5x1x4xf32>
  %f = model.ssd_final_state %x, %dt, %A, %B {chunk_size = 4 : i64} : (tensor<1x5x2x3xf32>, tensor<1x5x2xf32>, tensor<2xf32>, tensor<1x5x1x4xf32>) -> tensor<1x2x3x4xf32>
  %g:4 = model.ssd_final_state_grad %f, %x, %dt, %A, %B {chunk_size = 4 : i64} : (tensor<1x2x3x4xf32>, tensor<1x5x2x3xf32>, tensor<1x5x2xf32>, tensor<2xf32>, tensor<1x5x1x4xf32>) -> (tensor<1x5x2x3xf32>, tensor<1x5x2xf32>, tensor<2xf32>, tensor<1x5x1x4xf32>)
  %loss = model.fill 0.0 : tensor<f32>
  return %loss : tensor<f32>
}

// -----

// Mixed precision: buffers keep their tensors' element types, and a cast is one launch of the
// `cast` kernel between a bf16 and an f32 buffer.
// CHECK-LABEL: func.func @train_step()
// CHECK: %[[W:.+]] = exec.buffer parameters "w" {init = #exec.init<ones>} : memref<4xbf16>
// CHECK: exec.launch "cast" ins(%[[W]] : memref<4xbf16>) outs(%{{.+}} : memref<4xf32>) {floats = array<f64>, ints = array<i64: 4>}
func.func @train_step(%ids: tensor<1x2xi32> {model.input = "input_ids"}, %targets: tensor<1x2xi32> {model.input = "targets"}) -> tensor<f32> {
  %w = model.param "w" ones : tensor<4xbf16>
  %c = model.cast %w : tensor<4xbf16> to tensor<4xf32>
  %loss = model.fill 0.0 : tensor<f32>
  return %loss : tensor<f32>
}

// -----

// Every argument of the step must say which input it is.
// expected-error @+1 {{argument 1 has no model.input name (input_ids or targets)}}
func.func @train_step(%ids: tensor<1x2xi32> {model.input = "input_ids"}, %other: tensor<1x2xi32>) -> tensor<f32> {
  %loss = model.fill 0.0 : tensor<f32>
  return %loss : tensor<f32>
}

// -----

// An op that no kernel computes is refused by name.
func.func private @helper() -> tensor<f32>
func.func @train_step(%ids: tensor<1x2xi32> {model.input = "input_ids"}) -> tensor<f32> {
  // expected-error @+1 {{hcp-lower-to-exec has no kernel for 'func.call'}}
  %loss = func.call @helper() : () -> tensor<f32>
  return %loss : tensor<f32>
}

// -----

// Expert parallelism: dist.moe_experts(_grad) launch the moe_experts_ep kernels (ints tokens,
// hidden, inner, experts (global), k, ep) on this rank's experts; the sharded parameters'
// buffers and gradient buffers carry their shards.
// CHECK-LABEL: func.func @train_step()
// CHECK-DAG: %[[WIN:.+]] = exec.buffer parameters "w_in" {init = #exec.init<normal>, shards = 2 : i64, std = 1.000000e+00 : f64} : memref<2x6x4xf32>
// CHECK-DAG: %[[WOUT:.+]] = exec.buffer parameters "w_out" {init = #exec.init<normal>, shards = 2 : i64, std = 1.000000e+00 : f64} : memref<2x4x3xf32>
// CHECK: exec.launch "moe_experts_ep.forward" ins(%{{.+}}, %{{.+}}, %{{.+}}, %[[WIN]], %[[WOUT]] : {{.+}}) outs(%{{.+}} : memref<1x8x4xf32>) {floats = array<f64>, ints = array<i64: 8, 4, 3, 4, 2, 2>}
// CHECK-DAG: %[[DWIN:.+]] = exec.buffer gradients "w_in" {shards = 2 : i64} : memref<2x6x4xf32>
// CHECK-DAG: %[[DWOUT:.+]] = exec.buffer gradients "w_out" {shards = 2 : i64} : memref<2x4x3xf32>
// CHECK: exec.launch "moe_experts_ep.backward" {{.+}} outs(%{{.+}}, %{{.+}}, %[[DWIN]], %[[DWOUT]] : {{.+}}) {floats = array<f64>, ints = array<i64: 8, 4, 3, 4, 2, 2>}
module attributes {dist.mesh = #dist.mesh<cp = 2, dp = 1, ep = 2>} {
func.func @train_step(%x: tensor<1x8x4xf32> {model.input = "x"}, %g: tensor<1x8x2xf32> {model.input = "gates"}, %i: tensor<1x8x2xi32> {model.input = "experts"}, %dy: tensor<1x8x4xf32> {model.input = "dy"}) -> tensor<1x8x4xf32> {
  %win = model.param "w_in" normal(1.0) shards 2 : tensor<2x6x4xf32>
  %wout = model.param "w_out" normal(1.0) shards 2 : tensor<2x4x3xf32>
  %y = dist.moe_experts %x, %g, %i, %win, %wout {num_experts = 4 : i64, ep = 2 : i64} : (tensor<1x8x4xf32>, tensor<1x8x2xf32>, tensor<1x8x2xi32>, tensor<2x6x4xf32>, tensor<2x4x3xf32>) -> tensor<1x8x4xf32>
  %dx, %dg, %dwin, %dwout = dist.moe_experts_grad %dy, %x, %g, %i, %win, %wout {num_experts = 4 : i64, ep = 2 : i64} : (tensor<1x8x4xf32>, tensor<1x8x4xf32>, tensor<1x8x2xf32>, tensor<1x8x2xi32>, tensor<2x6x4xf32>, tensor<2x4x3xf32>) -> (tensor<1x8x4xf32>, tensor<1x8x2xf32>, tensor<2x6x4xf32>, tensor<2x4x3xf32>)
  model.param_grad "w_in", %dwin : tensor<2x6x4xf32>
  model.param_grad "w_out", %dwout : tensor<2x4x3xf32>
  return %y : tensor<1x8x4xf32>
}
}

// -----

// The load-balancing loss: its kernels, and the reported values as the step's results, after
// every launch (their buffers stay live to the end); the returned objective is no result when a
// "loss" is reported.
// CHECK-LABEL: func.func @train_step()
// CHECK-DAG: %[[AUXSCALE:.+]] = exec.buffer inputs "aux_loss_scale" : memref<f32>
// CHECK: exec.launch "moe_route.forward"
// CHECK: exec.launch "router_load.forward" ins(%[[R:.+]], %[[I:.+]] : {{.+}}) outs(%[[P:.+]], %[[C:.+]] : memref<4xf32>, memref<4xf32>) {floats = array<f64>, ints = array<i64: 4, 4, 2>}
// CHECK: exec.launch "router_aux_loss.forward" ins(%[[P]], %[[C]] : {{.+}}) outs(%[[AUX:.+]] : memref<f32>) {floats = array<f64: 2.500000e-01>, ints = array<i64: 4>}
// CHECK: exec.launch "mul" ins(%[[AUX]], %[[AUXSCALE]] : {{.+}}) outs(%[[SCALED:.+]] : memref<f32>)
// CHECK: exec.launch "router_aux_loss.backward" ins(%{{.+}}, %[[C]] : {{.+}}) outs(%[[DP:.+]] : memref<4xf32>) {floats = array<f64: 2.500000e-01>, ints = array<i64: 4>}
// CHECK: exec.launch "router_load.backward" ins(%[[DP]], %[[R]] : {{.+}}) {{.+}} {floats = array<f64>, ints = array<i64: 4, 4>}
// CHECK: exec.launch "gemm"
// CHECK-NOT: exec.launch
// CHECK: exec.result "loss", %[[LM:.+]] : memref<f32>
// CHECK-NEXT: exec.result "router_aux_loss", %[[SCALED]] : memref<f32>
// CHECK-NOT: exec.result
func.func @train_step(%ids: tensor<1x4xi32> {model.input = "input_ids"}, %targets: tensor<1x4xi32> {model.input = "targets"}, %aux_scale: tensor<f32> {model.input = "aux_loss_scale"}) -> tensor<f32> {
  %w = model.param "w" normal(0.02) : tensor<4x4xf32>
  %e = model.embedding %w, %ids {multiplier = 1.0 : f64} : (tensor<4x4xf32>, tensor<1x4xi32>) -> tensor<1x4x4xf32>
  %r = model.linear %e, %w : (tensor<1x4x4xf32>, tensor<4x4xf32>) -> tensor<1x4x4xf32>
  %g, %i = model.moe_route %r {top_k = 2 : i64} : tensor<1x4x4xf32> -> tensor<1x4x2xf32>, tensor<1x4x2xi32>
  %p, %c = model.router_load %r, %i : (tensor<1x4x4xf32>, tensor<1x4x2xi32>) -> (tensor<4xf32>, tensor<4xf32>)
  %aux = model.router_aux_loss %p, %c {scale = 0.25 : f64} : (tensor<4xf32>, tensor<4xf32>) -> tensor<f32>
  %scaled = model.mul %aux, %aux_scale : tensor<f32>, tensor<f32>
  %s, %n = model.cross_entropy %r, %targets {ignore_index = -100 : i64} : (tensor<1x4x4xf32>, tensor<1x4xi32>) -> (tensor<f32>, tensor<f32>)
  model.report "loss", %s : tensor<f32>
  model.report "router_aux_loss", %scaled : tensor<f32>
  %objective = model.add %s, %scaled : tensor<f32>, tensor<f32>
  %one = model.fill 1.0 : tensor<f32>
  %dp = model.router_aux_loss_grad %one, %c {scale = 0.25 : f64} : (tensor<f32>, tensor<4xf32>) -> tensor<4xf32>
  %dr = model.router_load_grad %dp, %r : (tensor<4xf32>, tensor<1x4x4xf32>) -> tensor<1x4x4xf32>
  %dw = model.linear_grad_weight %dr, %e : (tensor<1x4x4xf32>, tensor<1x4x4xf32>) -> tensor<4x4xf32>
  model.param_grad "w", %dw : tensor<4x4xf32>
  return %objective : tensor<f32>
}
