// hcp-overlap-collectives: around a halo exchange or state scan, the launches it does not need go
// right after it and the launches that need it after those; nothing crosses another collective,
// and no two launches that share a buffer (one writing it) change order. Then the schedule: the
// collective is `beside` the compute stream, and exec.join goes before the first launch that
// needs it, the next collective, or the return.
// RUN: hybridcp-opt %s --split-input-file --hcp-overlap-collectives | FileCheck %s

// The backward of a Mamba layer: a weight gradient (dw) computed before the state scan does not
// feed it and moves after it; the launch producing the scan's input stays before; the scan's
// consumer stays after it (after dw).
// The scan runs beside the weight gradient and is joined before its consumer.
// CHECK-LABEL: func.func @weight_gradient_after_scan
// CHECK: exec.launch "fill" outs(%[[DS_IN:[^ ]*]] :
// CHECK: exec.launch "state_scan.backward" ins(%[[DS_IN]], {{.*}} {beside,
// CHECK-NOT: exec.join
// CHECK: exec.launch "gemm" {{.*}}outs(%[[DW:[^ ]*]] : {{.*}} {floats =
// CHECK-NOT: exec.launch
// CHECK: exec.join
// CHECK-NEXT: exec.launch "silu.backward"
func.func @weight_gradient_after_scan() {
  %x = exec.buffer activations "x" : memref<4x8xf32>
  %dy = exec.buffer activations "dy" : memref<4x8xf32>
  %dw = exec.buffer gradients "w" : memref<8x8xf32>
  exec.launch "gemm" ins(%x, %dy : memref<4x8xf32>, memref<4x8xf32>) outs(%dw : memref<8x8xf32>) {ints = array<i64: 1, 0, 8, 8, 4>, floats = array<f64: 1.0>}
  %ds_in = exec.buffer activations "ds_in" : memref<2x4xf32>
  exec.launch "fill" outs(%ds_in : memref<2x4xf32>) {ints = array<i64: 8>, floats = array<f64: 1.0>}
  %g = exec.buffer activations "g" : memref<2xf32>
  %s_in = exec.buffer activations "s_in" : memref<2x4xf32>
  %dg = exec.buffer activations "dg" : memref<2xf32>
  %ds = exec.buffer activations "ds" : memref<2x4xf32>
  exec.launch "state_scan.backward" ins(%ds_in, %g, %s_in : memref<2x4xf32>, memref<2xf32>, memref<2x4xf32>) outs(%dg, %ds : memref<2xf32>, memref<2x4xf32>) {ints = array<i64: 2, 1, 1, 2, 2, 0>, floats = array<f64>}
  %out = exec.buffer activations "out" : memref<2x4xf32>
  exec.launch "silu.backward" ins(%ds, %ds_in : memref<2x4xf32>, memref<2x4xf32>) outs(%out : memref<2x4xf32>) {ints = array<i64: 8>, floats = array<f64>}
  exec.result "out", %out : memref<2x4xf32>
  return
}

// -----

// The forward of a Mamba layer: the conv needs the halo and moves after the time-step path
// (softplus, neg_exp), which does not; their relative order is kept.
// The exchange is joined before the conv, the first launch that reads the halo.
// CHECK-LABEL: func.func @conv_after_time_step_path
// CHECK: exec.launch "halo_exchange.forward" {{.*}} {beside,
// CHECK-NOT: exec.join
// CHECK: exec.launch "softplus.forward"
// CHECK-NOT: exec.join
// CHECK: exec.launch "neg_exp.forward"
// CHECK-NOT: exec.launch
// CHECK: exec.join
// CHECK-NEXT: exec.launch "causal_conv1d.forward"
// CHECK-NOT: exec.join
// CHECK: exec.launch "silu.forward"
// CHECK-NOT: exec.join
func.func @conv_after_time_step_path() {
  %x = exec.buffer activations "x" : memref<1x8x4xf32>
  %w = exec.buffer parameters "conv.weight" {init = #exec.init<ones>} : memref<4x1x4xf32>
  %b = exec.buffer parameters "conv.bias" {init = #exec.init<zeros>} : memref<4xf32>
  %dt = exec.buffer parameters "dt" {init = #exec.init<ones>} : memref<8x2xf32>
  %halo = exec.buffer activations "halo" : memref<1x3x4xf32>
  exec.launch "halo_exchange.forward" ins(%x : memref<1x8x4xf32>) outs(%halo : memref<1x3x4xf32>) {ints = array<i64: 1, 1, 8, 4, 3>, floats = array<f64>}
  %conv = exec.buffer activations "conv" : memref<1x8x4xf32>
  exec.launch "causal_conv1d.forward" ins(%x, %w, %b, %halo : memref<1x8x4xf32>, memref<4x1x4xf32>, memref<4xf32>, memref<1x3x4xf32>) outs(%conv : memref<1x8x4xf32>) {ints = array<i64: 1, 8, 4, 4, 1, 0, 0>, floats = array<f64>}
  %act = exec.buffer activations "act" : memref<1x8x4xf32>
  exec.launch "silu.forward" ins(%conv : memref<1x8x4xf32>) outs(%act : memref<1x8x4xf32>) {ints = array<i64: 32>, floats = array<f64>}
  %sp = exec.buffer activations "sp" : memref<8x2xf32>
  exec.launch "softplus.forward" ins(%dt : memref<8x2xf32>) outs(%sp : memref<8x2xf32>) {ints = array<i64: 16>, floats = array<f64>}
  %a = exec.buffer activations "a" : memref<8x2xf32>
  exec.launch "neg_exp.forward" ins(%sp : memref<8x2xf32>) outs(%a : memref<8x2xf32>) {ints = array<i64: 16>, floats = array<f64>}
  exec.result "act", %act : memref<1x8x4xf32>
  return
}

// -----

// Another collective is a wall: the launch before the all-reduce stays before it, although the
// halo exchange does not need it; the launch between them moves after the halo exchange.
// Nothing after it needs the exchange: it is joined at the end, before the return.
// CHECK-LABEL: func.func @no_launch_crosses_a_collective
// CHECK: exec.launch "silu.forward" {{.*}}outs(%[[FIRST:[^ ]*]] :
// CHECK: exec.launch "all_reduce" {{.*}} {floats =
// CHECK: exec.launch "halo_exchange.forward" {{.*}} {beside,
// CHECK-NOT: exec.join
// CHECK: exec.launch "softplus.forward"
// CHECK-NEXT: exec.join
// CHECK-NEXT: return
func.func @no_launch_crosses_a_collective() {
  %x = exec.buffer activations "x" : memref<1x8x4xf32>
  %p = exec.buffer parameters "p" {init = #exec.init<ones>} : memref<8xf32>
  %first = exec.buffer activations "first" : memref<8xf32>
  exec.launch "silu.forward" ins(%p : memref<8xf32>) outs(%first : memref<8xf32>) {ints = array<i64: 8>, floats = array<f64>}
  %sum = exec.buffer activations "sum" : memref<8xf32>
  exec.launch "all_reduce" ins(%p : memref<8xf32>) outs(%sum : memref<8xf32>) {ints = array<i64: 8, 1>, floats = array<f64>}
  %second = exec.buffer activations "second" : memref<8xf32>
  exec.launch "softplus.forward" ins(%p : memref<8xf32>) outs(%second : memref<8xf32>) {ints = array<i64: 8>, floats = array<f64>}
  %halo = exec.buffer activations "halo" : memref<1x3x4xf32>
  exec.launch "halo_exchange.forward" ins(%x : memref<1x8x4xf32>) outs(%halo : memref<1x3x4xf32>) {ints = array<i64: 1, 1, 8, 4, 3>, floats = array<f64>}
  return
}

// -----

// Write after read: the launch that reads `t` before the one that overwrites it for the scan
// must stay before that writer, so both stay before the scan, although the reader alone does
// not feed the scan. Through a view, too.
// CHECK-LABEL: func.func @reader_before_overwrite_stays
// CHECK: exec.launch "silu.forward"
// CHECK: exec.launch "softplus.forward"
// CHECK: exec.launch "state_scan.forward"
func.func @reader_before_overwrite_stays() {
  %t = exec.buffer activations "t" : memref<2x4xf32>
  %g = exec.buffer activations "g" : memref<2xf32>
  %p = exec.buffer parameters "p" {init = #exec.init<ones>} : memref<8xf32>
  %r = exec.buffer activations "r" : memref<8xf32>
  %tv = exec.view %t : memref<2x4xf32> to memref<8xf32>
  exec.launch "silu.forward" ins(%tv : memref<8xf32>) outs(%r : memref<8xf32>) {ints = array<i64: 8>, floats = array<f64>}
  exec.launch "softplus.forward" ins(%p : memref<8xf32>) outs(%tv : memref<8xf32>) {ints = array<i64: 8>, floats = array<f64>}
  %s_in = exec.buffer activations "s_in" : memref<2x4xf32>
  exec.launch "state_scan.forward" ins(%g, %t : memref<2xf32>, memref<2x4xf32>) outs(%s_in : memref<2x4xf32>) {ints = array<i64: 2, 1, 1, 2, 2, 0>, floats = array<f64>}
  return
}

// -----

// A launch placed beside one collective stays there: the weight gradient moved after the first
// scan is not pushed on past the second (else every weight gradient would end up at the end of
// the step, and its gradient sum with it).
// Each scan is joined before the next collective at the latest; the second, reading the first's
// ds, waits for it.
// CHECK-LABEL: func.func @placed_launch_stays
// CHECK: exec.launch "state_scan.backward" {{.*}} {beside,
// CHECK-NOT: exec.join
// CHECK: exec.launch "gemm"
// CHECK-NOT: exec.launch
// CHECK: exec.join
// CHECK-NOT: exec.launch
// CHECK: exec.launch "state_scan.backward" {{.*}} {beside,
// CHECK-NOT: exec.launch "gemm"
// CHECK: exec.join
// CHECK-NEXT: return
func.func @placed_launch_stays() {
  %x = exec.buffer activations "x" : memref<4x8xf32>
  %dw = exec.buffer gradients "w" : memref<8x8xf32>
  exec.launch "gemm" ins(%x, %x : memref<4x8xf32>, memref<4x8xf32>) outs(%dw : memref<8x8xf32>) {ints = array<i64: 1, 0, 8, 8, 4>, floats = array<f64: 1.0>}
  %ds_in = exec.buffer activations "ds_in" : memref<2x4xf32>
  %g = exec.buffer activations "g" : memref<2xf32>
  %s_in = exec.buffer activations "s_in" : memref<2x4xf32>
  %dg = exec.buffer activations "dg" : memref<2xf32>
  %ds = exec.buffer activations "ds" : memref<2x4xf32>
  exec.launch "state_scan.backward" ins(%ds_in, %g, %s_in : memref<2x4xf32>, memref<2xf32>, memref<2x4xf32>) outs(%dg, %ds : memref<2xf32>, memref<2x4xf32>) {ints = array<i64: 2, 1, 1, 2, 2, 0>, floats = array<f64>}
  %dg2 = exec.buffer activations "dg2" : memref<2xf32>
  %ds2 = exec.buffer activations "ds2" : memref<2x4xf32>
  exec.launch "state_scan.backward" ins(%ds, %g, %s_in : memref<2x4xf32>, memref<2xf32>, memref<2x4xf32>) outs(%dg2, %ds2 : memref<2xf32>, memref<2x4xf32>) {ints = array<i64: 2, 1, 1, 2, 2, 0>, floats = array<f64>}
  return
}

// -----

// Nothing moves across a result the runtime reads after the step.
// CHECK-LABEL: func.func @results_are_walls
// CHECK: exec.launch "silu.forward"
// CHECK: exec.result "first"
// CHECK: exec.launch "halo_exchange.forward"
func.func @results_are_walls() {
  %x = exec.buffer activations "x" : memref<1x8x4xf32>
  %p = exec.buffer parameters "p" {init = #exec.init<ones>} : memref<8xf32>
  %first = exec.buffer activations "first" : memref<8xf32>
  exec.launch "silu.forward" ins(%p : memref<8xf32>) outs(%first : memref<8xf32>) {ints = array<i64: 8>, floats = array<f64>}
  exec.result "first", %first : memref<8xf32>
  %halo = exec.buffer activations "halo" : memref<1x3x4xf32>
  exec.launch "halo_exchange.forward" ins(%x : memref<1x8x4xf32>) outs(%halo : memref<1x3x4xf32>) {ints = array<i64: 1, 1, 8, 4, 3>, floats = array<f64>}
  return
}

// -----

// Reading what the collective reads is no conflict: the launch that also reads the scan's input
// runs beside it, and the join waits for the scan's reader.
// CHECK-LABEL: func.func @readers_run_beside
// CHECK: exec.launch "state_scan.forward" {{.*}} {beside,
// CHECK-NOT: exec.join
// CHECK: exec.launch "softplus.forward"
// CHECK-NOT: exec.launch
// CHECK: exec.join
// CHECK-NEXT: exec.launch "silu.forward"
func.func @readers_run_beside() {
  %t = exec.buffer activations "t" : memref<2x4xf32>
  %g = exec.buffer activations "g" : memref<2xf32>
  %s_in = exec.buffer activations "s_in" : memref<2x4xf32>
  exec.launch "state_scan.forward" ins(%g, %t : memref<2xf32>, memref<2x4xf32>) outs(%s_in : memref<2x4xf32>) {ints = array<i64: 2, 1, 1, 2, 2, 0>, floats = array<f64>}
  %tv = exec.view %t : memref<2x4xf32> to memref<8xf32>
  %r = exec.buffer activations "r" : memref<8xf32>
  exec.launch "softplus.forward" ins(%tv : memref<8xf32>) outs(%r : memref<8xf32>) {ints = array<i64: 8>, floats = array<f64>}
  %out = exec.buffer activations "out" : memref<2x4xf32>
  exec.launch "silu.forward" ins(%s_in : memref<2x4xf32>) outs(%out : memref<2x4xf32>) {ints = array<i64: 8>, floats = array<f64>}
  exec.result "out", %out : memref<2x4xf32>
  return
}
