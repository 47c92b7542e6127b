// hcp-fuse-norm-residual: dh = dh_above + rms_norm.backward(...) becomes one rms_norm.backward
// that adds dh_above in, only when nothing else can see the difference.
// RUN: hybridcp-opt %s --split-input-file --hcp-fuse-norm-residual | FileCheck %s

// A block's backward: the norm's input gradient only feeds the residual add. The norm takes
// the residual's gradient (has_residual 1) and writes the sum; dx and the add are gone.
// CHECK-LABEL: func.func @block
// CHECK-DAG: %[[DY:.*]] = exec.buffer activations "dy"
// CHECK-DAG: %[[X:.*]] = exec.buffer activations "x"
// CHECK-DAG: %[[W:.*]] = exec.buffer parameters "w"
// CHECK-DAG: %[[ABOVE:.*]] = exec.buffer activations "above"
// CHECK-DAG: %[[DH:.*]] = exec.buffer activations "dh"
// CHECK-DAG: %[[DW:.*]] = exec.buffer gradients "w"
// CHECK: exec.launch "rms_norm.backward" ins(%[[DY]], %[[X]], %[[W]], %[[ABOVE]] : {{.*}}) outs(%[[DH]], %[[DW]] : {{.*}}) {floats = array<f64: 1.000000e-05>, ints = array<i64: 4, 8, 1>}
// CHECK-NOT: exec.launch "add"
// CHECK-NOT: "dx"
// CHECK: exec.result "dh"
func.func @block() {
  %dy = exec.buffer activations "dy" : memref<4x8xf32>
  %x = exec.buffer activations "x" : memref<4x8xf32>
  %w = exec.buffer parameters "w" {init = #exec.init<ones>} : memref<8xf32>
  %above = exec.buffer activations "above" : memref<4x8xf32>
  exec.launch "fill" outs(%dy : memref<4x8xf32>) {ints = array<i64: 32>, floats = array<f64: 1.0>}
  exec.launch "fill" outs(%x : memref<4x8xf32>) {ints = array<i64: 32>, floats = array<f64: 1.0>}
  exec.launch "fill" outs(%above : memref<4x8xf32>) {ints = array<i64: 32>, floats = array<f64: 1.0>}
  %dx = exec.buffer activations "dx" : memref<4x8xf32>
  %dw = exec.buffer gradients "w" : memref<8xf32>
  exec.launch "rms_norm.backward" ins(%dy, %x, %w : memref<4x8xf32>, memref<4x8xf32>, memref<8xf32>) outs(%dx, %dw : memref<4x8xf32>, memref<8xf32>) {ints = array<i64: 4, 8, 0>, floats = array<f64: 1.0e-5>}
  %dh = exec.buffer activations "dh" : memref<4x8xf32>
  exec.launch "add" ins(%above, %dx : memref<4x8xf32>, memref<4x8xf32>) outs(%dh : memref<4x8xf32>) {ints = array<i64: 32, 32>, floats = array<f64>}
  exec.result "dh", %dh : memref<4x8xf32>
  return
}

// -----

// The residual's gradient is written after the norm: the norm cannot read it there. Left alone.
// CHECK-LABEL: func.func @residual_later
// CHECK: exec.launch "rms_norm.backward" {{.*}} ints = array<i64: 4, 8, 0>
// CHECK: exec.launch "fill"
// CHECK: exec.launch "add"
func.func @residual_later() {
  %dy = exec.buffer activations "dy" : memref<4x8xf32>
  %x = exec.buffer activations "x" : memref<4x8xf32>
  %w = exec.buffer parameters "w" {init = #exec.init<ones>} : memref<8xf32>
  %above = exec.buffer activations "above" : memref<4x8xf32>
  exec.launch "fill" outs(%dy : memref<4x8xf32>) {ints = array<i64: 32>, floats = array<f64: 1.0>}
  exec.launch "fill" outs(%x : memref<4x8xf32>) {ints = array<i64: 32>, floats = array<f64: 1.0>}
  %dx = exec.buffer activations "dx" : memref<4x8xf32>
  %dw = exec.buffer gradients "w" : memref<8xf32>
  exec.launch "rms_norm.backward" ins(%dy, %x, %w : memref<4x8xf32>, memref<4x8xf32>, memref<8xf32>) outs(%dx, %dw : memref<4x8xf32>, memref<8xf32>) {ints = array<i64: 4, 8, 0>, floats = array<f64: 1.0e-5>}
  exec.launch "fill" outs(%above : memref<4x8xf32>) {ints = array<i64: 32>, floats = array<f64: 1.0>}
  %dh = exec.buffer activations "dh" : memref<4x8xf32>
  exec.launch "add" ins(%above, %dx : memref<4x8xf32>, memref<4x8xf32>) outs(%dh : memref<4x8xf32>) {ints = array<i64: 32, 32>, floats = array<f64>}
  exec.result "dh", %dh : memref<4x8xf32>
  return
}

// -----

// dx is also read by something else: it must be stored. Left alone.
// CHECK-LABEL: func.func @dx_read_twice
// CHECK: exec.launch "rms_norm.backward" {{.*}} ints = array<i64: 4, 8, 0>
// CHECK: exec.launch "add"
func.func @dx_read_twice() {
  %dy = exec.buffer activations "dy" : memref<4x8xf32>
  %x = exec.buffer activations "x" : memref<4x8xf32>
  %w = exec.buffer parameters "w" {init = #exec.init<ones>} : memref<8xf32>
  %above = exec.buffer activations "above" : memref<4x8xf32>
  exec.launch "fill" outs(%dy : memref<4x8xf32>) {ints = array<i64: 32>, floats = array<f64: 1.0>}
  exec.launch "fill" outs(%x : memref<4x8xf32>) {ints = array<i64: 32>, floats = array<f64: 1.0>}
  exec.launch "fill" outs(%above : memref<4x8xf32>) {ints = array<i64: 32>, floats = array<f64: 1.0>}
  %dx = exec.buffer activations "dx" : memref<4x8xf32>
  %dw = exec.buffer gradients "w" : memref<8xf32>
  exec.launch "rms_norm.backward" ins(%dy, %x, %w : memref<4x8xf32>, memref<4x8xf32>, memref<8xf32>) outs(%dx, %dw : memref<4x8xf32>, memref<8xf32>) {ints = array<i64: 4, 8, 0>, floats = array<f64: 1.0e-5>}
  %dh = exec.buffer activations "dh" : memref<4x8xf32>
  exec.launch "add" ins(%above, %dx : memref<4x8xf32>, memref<4x8xf32>) outs(%dh : memref<4x8xf32>) {ints = array<i64: 32, 32>, floats = array<f64>}
  exec.result "dh", %dh : memref<4x8xf32>
  exec.result "dx", %dx : memref<4x8xf32>
  return
}

// -----

// A broadcasting add (a bias row): not the residual stream. Left alone.
// CHECK-LABEL: func.func @broadcast
// CHECK: exec.launch "rms_norm.backward" {{.*}} ints = array<i64: 4, 8, 0>
// CHECK: exec.launch "add"
func.func @broadcast() {
  %dy = exec.buffer activations "dy" : memref<4x8xf32>
  %x = exec.buffer activations "x" : memref<4x8xf32>
  %w = exec.buffer parameters "w" {init = #exec.init<ones>} : memref<8xf32>
  %bias = exec.buffer parameters "bias" {init = #exec.init<ones>} : memref<8xf32>
  exec.launch "fill" outs(%dy : memref<4x8xf32>) {ints = array<i64: 32>, floats = array<f64: 1.0>}
  exec.launch "fill" outs(%x : memref<4x8xf32>) {ints = array<i64: 32>, floats = array<f64: 1.0>}
  %dx = exec.buffer activations "dx" : memref<4x8xf32>
  %dw = exec.buffer gradients "w" : memref<8xf32>
  exec.launch "rms_norm.backward" ins(%dy, %x, %w : memref<4x8xf32>, memref<4x8xf32>, memref<8xf32>) outs(%dx, %dw : memref<4x8xf32>, memref<8xf32>) {ints = array<i64: 4, 8, 0>, floats = array<f64: 1.0e-5>}
  %dh = exec.buffer activations "dh" : memref<4x8xf32>
  exec.launch "add" ins(%dx, %bias : memref<4x8xf32>, memref<8xf32>) outs(%dh : memref<4x8xf32>) {ints = array<i64: 32, 8>, floats = array<f64>}
  exec.result "dh", %dh : memref<4x8xf32>
  return
}
