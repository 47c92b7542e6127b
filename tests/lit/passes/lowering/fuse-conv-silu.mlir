// hcp-fuse-conv-silu: a causal conv1d and the SiLU after it (and their backwards) become the conv
// kernels with their silu flag, only when nothing else sees the conv's output or its gradient.
// RUN: hybridcp-opt %s --split-input-file --hcp-fuse-conv-silu | FileCheck %s

// A Mamba layer's conv, forward and backward: the forward writes the SiLU's output, the backward
// takes the SiLU output's gradient and the bias; the conv output and its gradient are gone.
// CHECK-LABEL: func.func @forward_and_backward
// CHECK-DAG: %[[X:.*]] = exec.buffer activations "x"
// CHECK-DAG: %[[W:.*]] = exec.buffer parameters "conv.weight"
// CHECK-DAG: %[[B:.*]] = exec.buffer parameters "conv.bias"
// CHECK-DAG: %[[ACT:.*]] = exec.buffer activations "act"
// CHECK: exec.launch "causal_conv1d.forward" ins(%[[X]], %[[W]], %[[B]] : {{.*}}) outs(%[[ACT]] : {{.*}}) {floats = array<f64>, ints = array<i64: 1, 8, 4, 4, 0, 1, 0>}
// CHECK-NOT: exec.launch "silu
// CHECK: %[[DACT:.*]] = exec.buffer activations "dact"
// CHECK-NOT: exec.launch "silu
// CHECK: exec.launch "causal_conv1d.backward" ins(%[[DACT]], %[[X]], %[[W]], %[[B]] : {{.*}}) {{.*}}ints = array<i64: 1, 8, 4, 4, 0, 1, 0>}
// CHECK-NOT: "conv"
// CHECK-NOT: "dconv"
func.func @forward_and_backward() {
  %x = exec.buffer activations "x" : memref<1x8x4xf32>
  %w = exec.buffer parameters "conv.weight" {init = #exec.init<ones>} : memref<4x1x4xf32>
  %b = exec.buffer parameters "conv.bias" {init = #exec.init<zeros>} : memref<4xf32>
  exec.launch "fill" outs(%x : memref<1x8x4xf32>) {ints = array<i64: 32>, floats = array<f64: 1.0>}
  %conv = exec.buffer activations "conv" : memref<1x8x4xf32>
  exec.launch "causal_conv1d.forward" ins(%x, %w, %b : memref<1x8x4xf32>, memref<4x1x4xf32>, memref<4xf32>) outs(%conv : memref<1x8x4xf32>) {ints = array<i64: 1, 8, 4, 4, 0, 0, 0>, floats = array<f64>}
  %act = exec.buffer activations "act" : memref<1x8x4xf32>
  exec.launch "silu.forward" ins(%conv : memref<1x8x4xf32>) outs(%act : memref<1x8x4xf32>) {ints = array<i64: 32>, floats = array<f64>}
  %dact = exec.buffer activations "dact" : memref<1x8x4xf32>
  exec.launch "scale" ins(%act : memref<1x8x4xf32>) outs(%dact : memref<1x8x4xf32>) {ints = array<i64: 32>, floats = array<f64: 2.0>}
  %dconv = exec.buffer activations "dconv" : memref<1x8x4xf32>
  exec.launch "silu.backward" ins(%dact, %conv : memref<1x8x4xf32>, memref<1x8x4xf32>) outs(%dconv : memref<1x8x4xf32>) {ints = array<i64: 32>, floats = array<f64>}
  %dx = exec.buffer activations "dx" : memref<1x8x4xf32>
  %dw = exec.buffer gradients "conv.weight" : memref<4x1x4xf32>
  %db = exec.buffer gradients "conv.bias" : memref<4xf32>
  exec.launch "causal_conv1d.backward" ins(%dconv, %x, %w : memref<1x8x4xf32>, memref<1x8x4xf32>, memref<4x1x4xf32>) outs(%dx, %dw, %db : memref<1x8x4xf32>, memref<4x1x4xf32>, memref<4xf32>) {ints = array<i64: 1, 8, 4, 4, 0, 0, 0>, floats = array<f64>}
  exec.result "dx", %dx : memref<1x8x4xf32>
  return
}

// -----

// With a halo (context parallelism): the backward's bias comes after it.
// CHECK-LABEL: func.func @with_halo
// CHECK-DAG: %[[B:.*]] = exec.buffer parameters "conv.bias"
// CHECK-DAG: %[[HALO:.*]] = exec.buffer activations "halo"
// CHECK: exec.launch "causal_conv1d.forward" {{.*}}ints = array<i64: 1, 8, 4, 4, 1, 1, 0>}
// CHECK: exec.launch "causal_conv1d.backward" ins({{.*}}, %[[HALO]], %[[B]] : {{.*}}) outs({{.*}}) {{.*}}ints = array<i64: 1, 8, 4, 4, 1, 1, 0>}
// CHECK-NOT: exec.launch "silu
func.func @with_halo() {
  %x = exec.buffer activations "x" : memref<1x8x4xf32>
  %w = exec.buffer parameters "conv.weight" {init = #exec.init<ones>} : memref<4x1x4xf32>
  %b = exec.buffer parameters "conv.bias" {init = #exec.init<zeros>} : memref<4xf32>
  %halo = exec.buffer activations "halo" : memref<1x3x4xf32>
  exec.launch "fill" outs(%x : memref<1x8x4xf32>) {ints = array<i64: 32>, floats = array<f64: 1.0>}
  exec.launch "halo_exchange.forward" ins(%x : memref<1x8x4xf32>) outs(%halo : memref<1x3x4xf32>) {ints = array<i64: 1, 1, 8, 4, 3>, floats = array<f64>}
  %conv = exec.buffer activations "conv" : memref<1x8x4xf32>
  exec.launch "causal_conv1d.forward" ins(%x, %w, %b, %halo : memref<1x8x4xf32>, memref<4x1x4xf32>, memref<4xf32>, memref<1x3x4xf32>) outs(%conv : memref<1x8x4xf32>) {ints = array<i64: 1, 8, 4, 4, 1, 0, 0>, floats = array<f64>}
  %act = exec.buffer activations "act" : memref<1x8x4xf32>
  exec.launch "silu.forward" ins(%conv : memref<1x8x4xf32>) outs(%act : memref<1x8x4xf32>) {ints = array<i64: 32>, floats = array<f64>}
  %dconv = exec.buffer activations "dconv" : memref<1x8x4xf32>
  exec.launch "silu.backward" ins(%act, %conv : memref<1x8x4xf32>, memref<1x8x4xf32>) outs(%dconv : memref<1x8x4xf32>) {ints = array<i64: 32>, floats = array<f64>}
  %dx = exec.buffer activations "dx" : memref<1x8x4xf32>
  %dw = exec.buffer gradients "conv.weight" : memref<4x1x4xf32>
  %db = exec.buffer gradients "conv.bias" : memref<4xf32>
  %dhalo = exec.buffer activations "dhalo" : memref<1x3x4xf32>
  exec.launch "causal_conv1d.backward" ins(%dconv, %x, %w, %halo : memref<1x8x4xf32>, memref<1x8x4xf32>, memref<4x1x4xf32>, memref<1x3x4xf32>) outs(%dx, %dw, %db, %dhalo : memref<1x8x4xf32>, memref<4x1x4xf32>, memref<4xf32>, memref<1x3x4xf32>) {ints = array<i64: 1, 8, 4, 4, 1, 0, 0>, floats = array<f64>}
  exec.result "dx", %dx : memref<1x8x4xf32>
  exec.result "dhalo", %dhalo : memref<1x3x4xf32>
  return
}

// -----

// A forward whose SiLU has no backward (the first forward of a recomputed layer) folds alone.
// CHECK-LABEL: func.func @forward_only
// CHECK: exec.launch "causal_conv1d.forward" {{.*}}ints = array<i64: 1, 8, 4, 4, 0, 1, 0>}
// CHECK-NOT: exec.launch "silu.forward"
func.func @forward_only() {
  %x = exec.buffer activations "x" : memref<1x8x4xf32>
  %w = exec.buffer parameters "conv.weight" {init = #exec.init<ones>} : memref<4x1x4xf32>
  %b = exec.buffer parameters "conv.bias" {init = #exec.init<zeros>} : memref<4xf32>
  exec.launch "fill" outs(%x : memref<1x8x4xf32>) {ints = array<i64: 32>, floats = array<f64: 1.0>}
  %conv = exec.buffer activations "conv" : memref<1x8x4xf32>
  exec.launch "causal_conv1d.forward" ins(%x, %w, %b : memref<1x8x4xf32>, memref<4x1x4xf32>, memref<4xf32>) outs(%conv : memref<1x8x4xf32>) {ints = array<i64: 1, 8, 4, 4, 0, 0, 0>, floats = array<f64>}
  %act = exec.buffer activations "act" : memref<1x8x4xf32>
  exec.launch "silu.forward" ins(%conv : memref<1x8x4xf32>) outs(%act : memref<1x8x4xf32>) {ints = array<i64: 32>, floats = array<f64>}
  exec.result "act", %act : memref<1x8x4xf32>
  return
}

// -----

// The conv's output is a result too: it must be stored, nothing folds.
// CHECK-LABEL: func.func @output_seen_elsewhere
// CHECK: exec.launch "causal_conv1d.forward" {{.*}}ints = array<i64: 1, 8, 4, 4, 0, 0, 0>}
// CHECK: exec.launch "silu.forward"
func.func @output_seen_elsewhere() {
  %x = exec.buffer activations "x" : memref<1x8x4xf32>
  %w = exec.buffer parameters "conv.weight" {init = #exec.init<ones>} : memref<4x1x4xf32>
  %b = exec.buffer parameters "conv.bias" {init = #exec.init<zeros>} : memref<4xf32>
  exec.launch "fill" outs(%x : memref<1x8x4xf32>) {ints = array<i64: 32>, floats = array<f64: 1.0>}
  %conv = exec.buffer activations "conv" : memref<1x8x4xf32>
  exec.launch "causal_conv1d.forward" ins(%x, %w, %b : memref<1x8x4xf32>, memref<4x1x4xf32>, memref<4xf32>) outs(%conv : memref<1x8x4xf32>) {ints = array<i64: 1, 8, 4, 4, 0, 0, 0>, floats = array<f64>}
  %act = exec.buffer activations "act" : memref<1x8x4xf32>
  exec.launch "silu.forward" ins(%conv : memref<1x8x4xf32>) outs(%act : memref<1x8x4xf32>) {ints = array<i64: 32>, floats = array<f64>}
  exec.result "conv", %conv : memref<1x8x4xf32>
  exec.result "act", %act : memref<1x8x4xf32>
  return
}

// -----

// The backward's x changes after the forward (its buffer reused): the recomputed conv would
// differ, so neither half folds (the SiLU backward needs the stored conv output).
// CHECK-LABEL: func.func @input_changes_before_backward
// CHECK: exec.launch "causal_conv1d.forward" {{.*}}ints = array<i64: 1, 8, 4, 4, 0, 0, 0>}
// CHECK: exec.launch "silu.forward"
// CHECK: exec.launch "silu.backward"
// CHECK: exec.launch "causal_conv1d.backward" {{.*}}ints = array<i64: 1, 8, 4, 4, 0, 0, 0>}
func.func @input_changes_before_backward() {
  %x = exec.buffer activations "x" : memref<1x8x4xf32>
  %w = exec.buffer parameters "conv.weight" {init = #exec.init<ones>} : memref<4x1x4xf32>
  %b = exec.buffer parameters "conv.bias" {init = #exec.init<zeros>} : memref<4xf32>
  exec.launch "fill" outs(%x : memref<1x8x4xf32>) {ints = array<i64: 32>, floats = array<f64: 1.0>}
  %conv = exec.buffer activations "conv" : memref<1x8x4xf32>
  exec.launch "causal_conv1d.forward" ins(%x, %w, %b : memref<1x8x4xf32>, memref<4x1x4xf32>, memref<4xf32>) outs(%conv : memref<1x8x4xf32>) {ints = array<i64: 1, 8, 4, 4, 0, 0, 0>, floats = array<f64>}
  %act = exec.buffer activations "act" : memref<1x8x4xf32>
  exec.launch "silu.forward" ins(%conv : memref<1x8x4xf32>) outs(%act : memref<1x8x4xf32>) {ints = array<i64: 32>, floats = array<f64>}
  exec.launch "scale" ins(%act : memref<1x8x4xf32>) outs(%x : memref<1x8x4xf32>) {ints = array<i64: 32>, floats = array<f64: 2.0>}
  %dconv = exec.buffer activations "dconv" : memref<1x8x4xf32>
  exec.launch "silu.backward" ins(%act, %conv : memref<1x8x4xf32>, memref<1x8x4xf32>) outs(%dconv : memref<1x8x4xf32>) {ints = array<i64: 32>, floats = array<f64>}
  %dx = exec.buffer activations "dx" : memref<1x8x4xf32>
  %dw = exec.buffer gradients "conv.weight" : memref<4x1x4xf32>
  %db = exec.buffer gradients "conv.bias" : memref<4xf32>
  exec.launch "causal_conv1d.backward" ins(%dconv, %x, %w : memref<1x8x4xf32>, memref<1x8x4xf32>, memref<4x1x4xf32>) outs(%dx, %dw, %db : memref<1x8x4xf32>, memref<4x1x4xf32>, memref<4xf32>) {ints = array<i64: 1, 8, 4, 4, 0, 0, 0>, floats = array<f64>}
  exec.result "dx", %dx : memref<1x8x4xf32>
  return
}
