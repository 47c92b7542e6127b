// hcp-keep-expert-h: a moe_experts.backward reads its forward's first product (kept in a new
// activation buffer) instead of recomputing it, when nothing it depends on changes in between.
// RUN: hybridcp-opt %s --split-input-file --hcp-keep-expert-h | FileCheck %s

// A MoE layer, forward and backward: both get keep_h, the forward writes the kept h
// [tokens, k, 2*inner] after its output, the backward reads it after its other inputs.
// CHECK-LABEL: func.func @forward_and_backward
// CHECK-DAG: %[[OUT:.*]] = exec.buffer activations "out"
// CHECK-DAG: %[[KEPT:.*]] = exec.buffer activations "out.kept_h" : memref<4x2x4xf32>
// CHECK: exec.launch "moe_experts.forward" ins({{.*}}) outs(%[[OUT]], %[[KEPT]] : {{.*}}) {floats = array<f64>, ints = array<i64: 4, 3, 2, 3, 2, 1>}
// CHECK: exec.launch "moe_experts.backward" ins(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %[[KEPT]] : {{.*}}) {{.*}}ints = array<i64: 4, 3, 2, 3, 2, 1>}
// CHECK-NOT: ints = array<i64: 4, 3, 2, 3, 2, 0>
func.func @forward_and_backward() {
  %x = exec.buffer activations "x" : memref<4x3xf32>
  %gates = exec.buffer activations "gates" : memref<4x2xf32>
  %ids = exec.buffer activations "ids" : memref<4x2xi32>
  %w_in = exec.buffer parameters "w_in" {init = #exec.init<ones>} : memref<3x4x3xf32>
  %w_out = exec.buffer parameters "w_out" {init = #exec.init<ones>} : memref<3x3x2xf32>
  %out = exec.buffer activations "out" : memref<4x3xf32>
  exec.launch "moe_experts.forward" ins(%x, %gates, %ids, %w_in, %w_out : memref<4x3xf32>, memref<4x2xf32>, memref<4x2xi32>, memref<3x4x3xf32>, memref<3x3x2xf32>) outs(%out : memref<4x3xf32>) {ints = array<i64: 4, 3, 2, 3, 2, 0>, floats = array<f64>}
  %dout = exec.buffer activations "dout" : memref<4x3xf32>
  exec.launch "scale" ins(%out : memref<4x3xf32>) outs(%dout : memref<4x3xf32>) {ints = array<i64: 12>, floats = array<f64: 2.0>}
  %dx = exec.buffer activations "dx" : memref<4x3xf32>
  %dgates = exec.buffer activations "dgates" : memref<4x2xf32>
  %dw_in = exec.buffer gradients "w_in" : memref<3x4x3xf32>
  %dw_out = exec.buffer gradients "w_out" : memref<3x3x2xf32>
  exec.launch "moe_experts.backward" ins(%dout, %x, %gates, %ids, %w_in, %w_out : memref<4x3xf32>, memref<4x3xf32>, memref<4x2xf32>, memref<4x2xi32>, memref<3x4x3xf32>, memref<3x3x2xf32>) outs(%dx, %dgates, %dw_in, %dw_out : memref<4x3xf32>, memref<4x2xf32>, memref<3x4x3xf32>, memref<3x3x2xf32>) {ints = array<i64: 4, 3, 2, 3, 2, 0>, floats = array<f64: 1.0>}
  exec.result "dx", %dx : memref<4x3xf32>
  return
}

// -----

// A recomputed layer: the backward pairs with the forward that recomputed its input (x2), the
// last one before it; the first forward keeps nothing.
// CHECK-LABEL: func.func @recomputed
// CHECK: %[[X2:.*]] = exec.buffer activations "x2"
// CHECK: exec.launch "moe_experts.forward" {{.*}}ints = array<i64: 4, 3, 2, 3, 2, 0>}
// CHECK: %[[KEPT:.*]] = exec.buffer activations "out2.kept_h"
// CHECK: exec.launch "moe_experts.forward" ins(%[[X2]], {{.*}}) outs(%{{.*}}, %[[KEPT]] : {{.*}}) {{.*}}ints = array<i64: 4, 3, 2, 3, 2, 1>}
// CHECK: exec.launch "moe_experts.backward" ins({{.*}}, %[[KEPT]] : {{.*}}) {{.*}}ints = array<i64: 4, 3, 2, 3, 2, 1>}
func.func @recomputed() {
  %x = exec.buffer activations "x" : memref<4x3xf32>
  %x2 = exec.buffer activations "x2" : memref<4x3xf32>
  %gates = exec.buffer activations "gates" : memref<4x2xf32>
  %ids = exec.buffer activations "ids" : memref<4x2xi32>
  %w_in = exec.buffer parameters "w_in" {init = #exec.init<ones>} : memref<3x4x3xf32>
  %w_out = exec.buffer parameters "w_out" {init = #exec.init<ones>} : memref<3x3x2xf32>
  %out = exec.buffer activations "out" : memref<4x3xf32>
  exec.launch "moe_experts.forward" ins(%x, %gates, %ids, %w_in, %w_out : memref<4x3xf32>, memref<4x2xf32>, memref<4x2xi32>, memref<3x4x3xf32>, memref<3x3x2xf32>) outs(%out : memref<4x3xf32>) {ints = array<i64: 4, 3, 2, 3, 2, 0>, floats = array<f64>}
  exec.launch "scale" ins(%x : memref<4x3xf32>) outs(%x2 : memref<4x3xf32>) {ints = array<i64: 12>, floats = array<f64: 1.0>}
  %out2 = exec.buffer activations "out2" : memref<4x3xf32>
  exec.launch "moe_experts.forward" ins(%x2, %gates, %ids, %w_in, %w_out : memref<4x3xf32>, memref<4x2xf32>, memref<4x2xi32>, memref<3x4x3xf32>, memref<3x3x2xf32>) outs(%out2 : memref<4x3xf32>) {ints = array<i64: 4, 3, 2, 3, 2, 0>, floats = array<f64>}
  %dx = exec.buffer activations "dx" : memref<4x3xf32>
  %dgates = exec.buffer activations "dgates" : memref<4x2xf32>
  %dw_in = exec.buffer gradients "w_in" : memref<3x4x3xf32>
  %dw_out = exec.buffer gradients "w_out" : memref<3x3x2xf32>
  exec.launch "moe_experts.backward" ins(%out, %x2, %gates, %ids, %w_in, %w_out : memref<4x3xf32>, memref<4x3xf32>, memref<4x2xf32>, memref<4x2xi32>, memref<3x4x3xf32>, memref<3x3x2xf32>) outs(%dx, %dgates, %dw_in, %dw_out : memref<4x3xf32>, memref<4x2xf32>, memref<3x4x3xf32>, memref<3x3x2xf32>) {ints = array<i64: 4, 3, 2, 3, 2, 0>, floats = array<f64: 1.0>}
  exec.result "dx", %dx : memref<4x3xf32>
  return
}

// -----

// The expert ids change between the forward and the backward: the kept h would be another
// routing's, so nothing is kept.
// CHECK-LABEL: func.func @ids_written_between
// CHECK-NOT: kept_h
// CHECK: exec.launch "moe_experts.forward" {{.*}}ints = array<i64: 4, 3, 2, 3, 2, 0>}
// CHECK: exec.launch "moe_experts.backward" {{.*}}ints = array<i64: 4, 3, 2, 3, 2, 0>}
func.func @ids_written_between() {
  %x = exec.buffer activations "x" : memref<4x3xf32>
  %gates = exec.buffer activations "gates" : memref<4x2xf32>
  %ids = exec.buffer activations "ids" : memref<4x2xi32>
  %w_in = exec.buffer parameters "w_in" {init = #exec.init<ones>} : memref<3x4x3xf32>
  %w_out = exec.buffer parameters "w_out" {init = #exec.init<ones>} : memref<3x3x2xf32>
  %out = exec.buffer activations "out" : memref<4x3xf32>
  exec.launch "moe_experts.forward" ins(%x, %gates, %ids, %w_in, %w_out : memref<4x3xf32>, memref<4x2xf32>, memref<4x2xi32>, memref<3x4x3xf32>, memref<3x3x2xf32>) outs(%out : memref<4x3xf32>) {ints = array<i64: 4, 3, 2, 3, 2, 0>, floats = array<f64>}
  %logits = exec.buffer activations "logits" : memref<4x3xf32>
  exec.launch "moe_route.forward" ins(%logits : memref<4x3xf32>) outs(%gates, %ids : memref<4x2xf32>, memref<4x2xi32>) {ints = array<i64: 4, 3, 2>, floats = array<f64>}
  %dx = exec.buffer activations "dx" : memref<4x3xf32>
  %dgates = exec.buffer activations "dgates" : memref<4x2xf32>
  %dw_in = exec.buffer gradients "w_in" : memref<3x4x3xf32>
  %dw_out = exec.buffer gradients "w_out" : memref<3x3x2xf32>
  exec.launch "moe_experts.backward" ins(%out, %x, %gates, %ids, %w_in, %w_out : memref<4x3xf32>, memref<4x3xf32>, memref<4x2xf32>, memref<4x2xi32>, memref<3x4x3xf32>, memref<3x3x2xf32>) outs(%dx, %dgates, %dw_in, %dw_out : memref<4x3xf32>, memref<4x2xf32>, memref<3x4x3xf32>, memref<3x3x2xf32>) {ints = array<i64: 4, 3, 2, 3, 2, 0>, floats = array<f64: 1.0>}
  exec.result "dx", %dx : memref<4x3xf32>
  return
}

// -----

// A forward without a backward (an evaluation step) keeps nothing.
// CHECK-LABEL: func.func @forward_only
// CHECK-NOT: kept_h
// CHECK: exec.launch "moe_experts.forward" {{.*}}ints = array<i64: 4, 3, 2, 3, 2, 0>}
func.func @forward_only() {
  %x = exec.buffer activations "x" : memref<4x3xf32>
  %gates = exec.buffer activations "gates" : memref<4x2xf32>
  %ids = exec.buffer activations "ids" : memref<4x2xi32>
  %w_in = exec.buffer parameters "w_in" {init = #exec.init<ones>} : memref<3x4x3xf32>
  %w_out = exec.buffer parameters "w_out" {init = #exec.init<ones>} : memref<3x3x2xf32>
  %out = exec.buffer activations "out" : memref<4x3xf32>
  exec.launch "moe_experts.forward" ins(%x, %gates, %ids, %w_in, %w_out : memref<4x3xf32>, memref<4x2xf32>, memref<4x2xi32>, memref<3x4x3xf32>, memref<3x3x2xf32>) outs(%out : memref<4x3xf32>) {ints = array<i64: 4, 3, 2, 3, 2, 0>, floats = array<f64>}
  exec.result "out", %out : memref<4x3xf32>
  return
}
