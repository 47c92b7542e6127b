// hcp-keep-ssd-states: an ssd_scan.backward reads the chunk states its forward computed (kept in
// a new f32 activation buffer) instead of recomputing them, when nothing they depend on changes
// in between.
// RUN: hybridcp-opt %s --split-input-file --hcp-keep-ssd-states | FileCheck %s

// A Mamba layer, forward and backward: both get keep_states; the forward writes the states
// [batch, heads, ceil(seq / chunk), head_dim, state] (5 tokens in chunks of 4: 2 chunks) after
// its outputs, the backward reads them after its other inputs.
// CHECK-LABEL: func.func @forward_and_backward
// CHECK: %[[KEPT:.*]] = exec.buffer activations "y.chunk_states" : memref<1x2x2x3x4xf32>
// CHECK: exec.launch "ssd_scan.forward" ins({{.*}}) outs(%{{.*}}, %{{.*}}, %[[KEPT]] : {{.*}}) {{.*}}ints = array<i64: 1, 5, 2, 3, 1, 4, 4, 0, 0, 1>}
// CHECK: exec.launch "ssd_scan.backward" ins(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %[[KEPT]] : {{.*}}) {{.*}}ints = array<i64: 1, 5, 2, 3, 1, 4, 4, 0, 0, 0, 1>}
func.func @forward_and_backward() {
  %x = exec.buffer activations "x" : memref<1x5x2x3xf32>
  %dt = exec.buffer activations "dt" : memref<1x5x2xf32>
  %A = exec.buffer activations "A" : memref<2xf32>
  %B = exec.buffer activations "B" : memref<1x5x1x4xf32>
  %C = exec.buffer activations "C" : memref<1x5x1x4xf32>
  %D = exec.buffer activations "D" : memref<2xf32>
  %y = exec.buffer activations "y" : memref<1x5x2x3xf32>
  %fs = exec.buffer activations "final" : memref<1x2x3x4xf32>
  exec.launch "ssd_scan.forward" ins(%x, %dt, %A, %B, %C, %D : memref<1x5x2x3xf32>, memref<1x5x2xf32>, memref<2xf32>, memref<1x5x1x4xf32>, memref<1x5x1x4xf32>, memref<2xf32>) outs(%y, %fs : memref<1x5x2x3xf32>, memref<1x2x3x4xf32>) {ints = array<i64: 1, 5, 2, 3, 1, 4, 4, 0, 0, 0>, floats = array<f64>}
  %dx = exec.buffer activations "dx" : memref<1x5x2x3xf32>
  %ddt = exec.buffer activations "ddt" : memref<1x5x2xf32>
  %dA = exec.buffer activations "dA" : memref<2xf32>
  %dB = exec.buffer activations "dB" : memref<1x5x1x4xf32>
  %dC = exec.buffer activations "dC" : memref<1x5x1x4xf32>
  %dD = exec.buffer activations "dD" : memref<2xf32>
  exec.launch "ssd_scan.backward" ins(%y, %x, %dt, %A, %B, %C, %D : memref<1x5x2x3xf32>, memref<1x5x2x3xf32>, memref<1x5x2xf32>, memref<2xf32>, memref<1x5x1x4xf32>, memref<1x5x1x4xf32>, memref<2xf32>) outs(%dx, %ddt, %dA, %dB, %dC, %dD : memref<1x5x2x3xf32>, memref<1x5x2xf32>, memref<2xf32>, memref<1x5x1x4xf32>, memref<1x5x1x4xf32>, memref<2xf32>) {ints = array<i64: 1, 5, 2, 3, 1, 4, 4, 0, 0, 0, 0>, floats = array<f64>}
  exec.result "dx", %dx : memref<1x5x2x3xf32>
  return
}

// -----

// A recomputed layer: the backward pairs with the forward that recomputed it on x2, the last one
// before it; the first forward keeps nothing.
// CHECK-LABEL: func.func @recomputed
// CHECK: exec.launch "ssd_scan.forward" {{.*}}ints = array<i64: 1, 5, 2, 3, 1, 4, 4, 0, 0, 0>}
// CHECK: %[[KEPT:.*]] = exec.buffer activations "y2.chunk_states"
// CHECK: exec.launch "ssd_scan.forward" {{.*}}outs(%{{.*}}, %{{.*}}, %[[KEPT]] : {{.*}}) {{.*}}ints = array<i64: 1, 5, 2, 3, 1, 4, 4, 0, 0, 1>}
// CHECK: exec.launch "ssd_scan.backward" ins({{.*}}, %[[KEPT]] : {{.*}}) {{.*}}ints = array<i64: 1, 5, 2, 3, 1, 4, 4, 0, 0, 0, 1>}
func.func @recomputed() {
  %x = exec.buffer activations "x" : memref<1x5x2x3xf32>
  %dt = exec.buffer activations "dt" : memref<1x5x2xf32>
  %A = exec.buffer activations "A" : memref<2xf32>
  %B = exec.buffer activations "B" : memref<1x5x1x4xf32>
  %C = exec.buffer activations "C" : memref<1x5x1x4xf32>
  %D = exec.buffer activations "D" : memref<2xf32>
  %y = exec.buffer activations "y" : memref<1x5x2x3xf32>
  %fs = exec.buffer activations "final" : memref<1x2x3x4xf32>
  exec.launch "ssd_scan.forward" ins(%x, %dt, %A, %B, %C, %D : memref<1x5x2x3xf32>, memref<1x5x2xf32>, memref<2xf32>, memref<1x5x1x4xf32>, memref<1x5x1x4xf32>, memref<2xf32>) outs(%y, %fs : memref<1x5x2x3xf32>, memref<1x2x3x4xf32>) {ints = array<i64: 1, 5, 2, 3, 1, 4, 4, 0, 0, 0>, floats = array<f64>}
  %x2 = exec.buffer activations "x2" : memref<1x5x2x3xf32>
  exec.launch "scale" ins(%x : memref<1x5x2x3xf32>) outs(%x2 : memref<1x5x2x3xf32>) {ints = array<i64: 30>, floats = array<f64: 1.0>}
  %y2 = exec.buffer activations "y2" : memref<1x5x2x3xf32>
  %fs2 = exec.buffer activations "final2" : memref<1x2x3x4xf32>
  exec.launch "ssd_scan.forward" ins(%x2, %dt, %A, %B, %C, %D : memref<1x5x2x3xf32>, memref<1x5x2xf32>, memref<2xf32>, memref<1x5x1x4xf32>, memref<1x5x1x4xf32>, memref<2xf32>) outs(%y2, %fs2 : memref<1x5x2x3xf32>, memref<1x2x3x4xf32>) {ints = array<i64: 1, 5, 2, 3, 1, 4, 4, 0, 0, 0>, floats = array<f64>}
  %dx = exec.buffer activations "dx" : memref<1x5x2x3xf32>
  %ddt = exec.buffer activations "ddt" : memref<1x5x2xf32>
  %dA = exec.buffer activations "dA" : memref<2xf32>
  %dB = exec.buffer activations "dB" : memref<1x5x1x4xf32>
  %dC = exec.buffer activations "dC" : memref<1x5x1x4xf32>
  %dD = exec.buffer activations "dD" : memref<2xf32>
  exec.launch "ssd_scan.backward" ins(%y2, %x2, %dt, %A, %B, %C, %D : memref<1x5x2x3xf32>, memref<1x5x2x3xf32>, memref<1x5x2xf32>, memref<2xf32>, memref<1x5x1x4xf32>, memref<1x5x1x4xf32>, memref<2xf32>) outs(%dx, %ddt, %dA, %dB, %dC, %dD : memref<1x5x2x3xf32>, memref<1x5x2xf32>, memref<2xf32>, memref<1x5x1x4xf32>, memref<1x5x1x4xf32>, memref<2xf32>) {ints = array<i64: 1, 5, 2, 3, 1, 4, 4, 0, 0, 0, 0>, floats = array<f64>}
  exec.result "dx", %dx : memref<1x5x2x3xf32>
  return
}

// -----

// dt changes between the forward and the backward: the kept states would be another scan's, so
// nothing is kept.
// CHECK-LABEL: func.func @dt_written_between
// CHECK-NOT: chunk_states
// CHECK: exec.launch "ssd_scan.forward" {{.*}}ints = array<i64: 1, 5, 2, 3, 1, 4, 4, 0, 0, 0>}
// CHECK: exec.launch "ssd_scan.backward" {{.*}}ints = array<i64: 1, 5, 2, 3, 1, 4, 4, 0, 0, 0, 0>}
func.func @dt_written_between() {
  %x = exec.buffer activations "x" : memref<1x5x2x3xf32>
  %dt = exec.buffer activations "dt" : memref<1x5x2xf32>
  %A = exec.buffer activations "A" : memref<2xf32>
  %B = exec.buffer activations "B" : memref<1x5x1x4xf32>
  %C = exec.buffer activations "C" : memref<1x5x1x4xf32>
  %D = exec.buffer activations "D" : memref<2xf32>
  %y = exec.buffer activations "y" : memref<1x5x2x3xf32>
  %fs = exec.buffer activations "final" : memref<1x2x3x4xf32>
  exec.launch "ssd_scan.forward" ins(%x, %dt, %A, %B, %C, %D : memref<1x5x2x3xf32>, memref<1x5x2xf32>, memref<2xf32>, memref<1x5x1x4xf32>, memref<1x5x1x4xf32>, memref<2xf32>) outs(%y, %fs : memref<1x5x2x3xf32>, memref<1x2x3x4xf32>) {ints = array<i64: 1, 5, 2, 3, 1, 4, 4, 0, 0, 0>, floats = array<f64>}
  exec.launch "scale" ins(%y : memref<1x5x2x3xf32>) outs(%x : memref<1x5x2x3xf32>) {ints = array<i64: 30>, floats = array<f64: 1.0>}
  exec.launch "fill" outs(%dt : memref<1x5x2xf32>) {ints = array<i64: 10>, floats = array<f64: 0.5>}
  %dx = exec.buffer activations "dx" : memref<1x5x2x3xf32>
  %ddt = exec.buffer activations "ddt" : memref<1x5x2xf32>
  %dA = exec.buffer activations "dA" : memref<2xf32>
  %dB = exec.buffer activations "dB" : memref<1x5x1x4xf32>
  %dC = exec.buffer activations "dC" : memref<1x5x1x4xf32>
  %dD = exec.buffer activations "dD" : memref<2xf32>
  exec.launch "ssd_scan.backward" ins(%y, %x, %dt, %A, %B, %C, %D : memref<1x5x2x3xf32>, memref<1x5x2x3xf32>, memref<1x5x2xf32>, memref<2xf32>, memref<1x5x1x4xf32>, memref<1x5x1x4xf32>, memref<2xf32>) outs(%dx, %ddt, %dA, %dB, %dC, %dD : memref<1x5x2x3xf32>, memref<1x5x2xf32>, memref<2xf32>, memref<1x5x1x4xf32>, memref<1x5x1x4xf32>, memref<2xf32>) {ints = array<i64: 1, 5, 2, 3, 1, 4, 4, 0, 0, 0, 0>, floats = array<f64>}
  exec.result "dx", %dx : memref<1x5x2x3xf32>
  return
}

// -----

// The backward of another scan (its x is not the forward's): nothing is kept.
// CHECK-LABEL: func.func @other_input
// CHECK-NOT: chunk_states
// CHECK: exec.launch "ssd_scan.backward" {{.*}}ints = array<i64: 1, 5, 2, 3, 1, 4, 4, 0, 0, 0, 0>}
func.func @other_input() {
  %x = exec.buffer activations "x" : memref<1x5x2x3xf32>
  %dt = exec.buffer activations "dt" : memref<1x5x2xf32>
  %A = exec.buffer activations "A" : memref<2xf32>
  %B = exec.buffer activations "B" : memref<1x5x1x4xf32>
  %C = exec.buffer activations "C" : memref<1x5x1x4xf32>
  %D = exec.buffer activations "D" : memref<2xf32>
  %y = exec.buffer activations "y" : memref<1x5x2x3xf32>
  %fs = exec.buffer activations "final" : memref<1x2x3x4xf32>
  exec.launch "ssd_scan.forward" ins(%x, %dt, %A, %B, %C, %D : memref<1x5x2x3xf32>, memref<1x5x2xf32>, memref<2xf32>, memref<1x5x1x4xf32>, memref<1x5x1x4xf32>, memref<2xf32>) outs(%y, %fs : memref<1x5x2x3xf32>, memref<1x2x3x4xf32>) {ints = array<i64: 1, 5, 2, 3, 1, 4, 4, 0, 0, 0>, floats = array<f64>}
  %x2 = exec.buffer activations "x2" : memref<1x5x2x3xf32>
  exec.launch "scale" ins(%x : memref<1x5x2x3xf32>) outs(%x2 : memref<1x5x2x3xf32>) {ints = array<i64: 30>, floats = array<f64: 1.0>}
  %dx = exec.buffer activations "dx" : memref<1x5x2x3xf32>
  %ddt = exec.buffer activations "ddt" : memref<1x5x2xf32>
  %dA = exec.buffer activations "dA" : memref<2xf32>
  %dB = exec.buffer activations "dB" : memref<1x5x1x4xf32>
  %dC = exec.buffer activations "dC" : memref<1x5x1x4xf32>
  %dD = exec.buffer activations "dD" : memref<2xf32>
  exec.launch "ssd_scan.backward" ins(%y, %x2, %dt, %A, %B, %C, %D : memref<1x5x2x3xf32>, memref<1x5x2x3xf32>, memref<1x5x2xf32>, memref<2xf32>, memref<1x5x1x4xf32>, memref<1x5x1x4xf32>, memref<2xf32>) outs(%dx, %ddt, %dA, %dB, %dC, %dD : memref<1x5x2x3xf32>, memref<1x5x2xf32>, memref<2xf32>, memref<1x5x1x4xf32>, memref<1x5x1x4xf32>, memref<2xf32>) {ints = array<i64: 1, 5, 2, 3, 1, 4, 4, 0, 0, 0, 0>, floats = array<f64>}
  exec.result "dx", %dx : memref<1x5x2x3xf32>
  return
}
