// hcp-fuse-gemm-epilogue: gemm -> [scale ->] add chains become one gemm_add at the GEMM's place
// (or the add's, when the addend comes later), and only when nothing else can see the difference.
// RUN: hybridcp-opt %s --split-input-file --hcp-fuse-gemm-epilogue | FileCheck %s

// A residual: h = x + 0.5 * (y W). The scale goes into alpha, x becomes the addend, and the
// output buffer (declared after the GEMM) moves up with it; the product and its scaled copy
// are gone.
// CHECK-LABEL: func.func @residual
// CHECK-DAG: %[[X:.*]] = exec.buffer activations "x"
// CHECK-DAG: %[[Y:.*]] = exec.buffer activations "y"
// CHECK-DAG: %[[W:.*]] = exec.buffer parameters "w"
// CHECK-DAG: %[[H:.*]] = exec.buffer activations "h"
// CHECK: exec.launch "gemm_add" ins(%[[Y]], %[[W]], %[[X]] : {{.*}}) outs(%[[H]] : {{.*}}) {floats = array<f64: 1.000000e+00, 1.000000e+00>, ints = array<i64: 0, 1, 4, 8, 16>}
// CHECK-NOT: exec.launch "scale"
// CHECK-NOT: exec.launch "add"
// CHECK-NOT: "product"
// CHECK: exec.result "h"
func.func @residual() {
  %x = exec.buffer activations "x" : memref<4x8xf32>
  %y = exec.buffer activations "y" : memref<4x16xf32>
  %w = exec.buffer parameters "w" {init = #exec.init<ones>} : memref<8x16xf32>
  exec.launch "fill" outs(%x : memref<4x8xf32>) {ints = array<i64: 32>, floats = array<f64: 1.0>}
  exec.launch "fill" outs(%y : memref<4x16xf32>) {ints = array<i64: 64>, floats = array<f64: 1.0>}
  %p = exec.buffer activations "product" : memref<4x8xf32>
  exec.launch "gemm" ins(%y, %w : memref<4x16xf32>, memref<8x16xf32>) outs(%p : memref<4x8xf32>) {ints = array<i64: 0, 1, 4, 8, 16>, floats = array<f64: 2.0>}
  %s = exec.buffer activations "scaled" : memref<4x8xf32>
  exec.launch "scale" ins(%p : memref<4x8xf32>) outs(%s : memref<4x8xf32>) {ints = array<i64: 32>, floats = array<f64: 0.5>}
  %h = exec.buffer activations "h" : memref<4x8xf32>
  exec.launch "add" ins(%x, %s : memref<4x8xf32>, memref<4x8xf32>) outs(%h : memref<4x8xf32>) {ints = array<i64: 32, 32>, floats = array<f64>}
  exec.result "h", %h : memref<4x8xf32>
  return
}

// -----

// A gradient sum straight into a gradient buffer, the product first and through a view: dx =
// dy W + other.
// CHECK-LABEL: func.func @gradient_sum
// CHECK: exec.launch "gemm_add" ins({{.*}}) outs({{.*}}) {floats = array<f64: 1.000000e+00, 1.000000e+00>, ints = array<i64: 0, 0, 4, 8, 16>}
// CHECK-NOT: exec.launch "add"
func.func @gradient_sum() {
  %dy = exec.buffer activations "dy" : memref<4x16xf32>
  %w = exec.buffer parameters "w" {init = #exec.init<ones>} : memref<16x8xf32>
  %other = exec.buffer activations "other" : memref<32xf32>
  exec.launch "fill" outs(%other : memref<32xf32>) {ints = array<i64: 32>, floats = array<f64: 1.0>}
  exec.launch "fill" outs(%dy : memref<4x16xf32>) {ints = array<i64: 64>, floats = array<f64: 1.0>}
  %p = exec.buffer activations "product" : memref<4x8xf32>
  exec.launch "gemm" ins(%dy, %w : memref<4x16xf32>, memref<16x8xf32>) outs(%p : memref<4x8xf32>) {ints = array<i64: 0, 0, 4, 8, 16>, floats = array<f64: 1.0>}
  %pv = exec.view %p : memref<4x8xf32> to memref<32xf32>
  %g = exec.buffer gradients "w" : memref<32xf32>
  exec.launch "add" ins(%pv, %other : memref<32xf32>, memref<32xf32>) outs(%g : memref<32xf32>) {ints = array<i64: 32, 32>, floats = array<f64>}
  return
}

// -----

// A broadcasting add (a bias row) is not a sum of two [m, n] tensors: left alone.
// CHECK-LABEL: func.func @broadcast
// CHECK: exec.launch "gemm"
// CHECK: exec.launch "add"
// CHECK-NOT: gemm_add
func.func @broadcast() {
  %y = exec.buffer activations "y" : memref<4x16xf32>
  %w = exec.buffer parameters "w" {init = #exec.init<ones>} : memref<8x16xf32>
  %bias = exec.buffer parameters "bias" {init = #exec.init<zeros>} : memref<8xf32>
  exec.launch "fill" outs(%y : memref<4x16xf32>) {ints = array<i64: 64>, floats = array<f64: 1.0>}
  %p = exec.buffer activations "product" : memref<4x8xf32>
  exec.launch "gemm" ins(%y, %w : memref<4x16xf32>, memref<8x16xf32>) outs(%p : memref<4x8xf32>) {ints = array<i64: 0, 1, 4, 8, 16>, floats = array<f64: 1.0>}
  %h = exec.buffer activations "h" : memref<4x8xf32>
  exec.launch "add" ins(%p, %bias : memref<4x8xf32>, memref<8xf32>) outs(%h : memref<4x8xf32>) {ints = array<i64: 32, 8>, floats = array<f64>}
  exec.result "h", %h : memref<4x8xf32>
  return
}

// -----

// The addend is computed after the GEMM (the experts' output, to which the shared MLP's
// product is added): at the GEMM's place it does not hold its value yet, so the fused launch
// runs at the add's place, where the GEMM's operands still hold what it read. Its input lives
// on until there, where the product lived before: no more bytes.
// CHECK-LABEL: func.func @addend_written_later
// CHECK-NOT: exec.launch "gemm"
// CHECK: exec.launch "fill"
// CHECK: exec.launch "fill"
// CHECK: exec.launch "gemm_add" {{.*}} ints = array<i64: 0, 1, 4, 8, 4>
// CHECK-NOT: exec.launch "add"
func.func @addend_written_later() {
  %y = exec.buffer activations "y" : memref<4x4xf32>
  %w = exec.buffer parameters "w" {init = #exec.init<ones>} : memref<8x4xf32>
  exec.launch "fill" outs(%y : memref<4x4xf32>) {ints = array<i64: 16>, floats = array<f64: 1.0>}
  %p = exec.buffer activations "product" : memref<4x8xf32>
  exec.launch "gemm" ins(%y, %w : memref<4x4xf32>, memref<8x4xf32>) outs(%p : memref<4x8xf32>) {ints = array<i64: 0, 1, 4, 8, 4>, floats = array<f64: 1.0>}
  %x = exec.buffer activations "x" : memref<4x8xf32>
  exec.launch "fill" outs(%x : memref<4x8xf32>) {ints = array<i64: 32>, floats = array<f64: 1.0>}
  %h = exec.buffer activations "h" : memref<4x8xf32>
  exec.launch "add" ins(%p, %x : memref<4x8xf32>, memref<4x8xf32>) outs(%h : memref<4x8xf32>) {ints = array<i64: 32, 32>, floats = array<f64>}
  exec.result "h", %h : memref<4x8xf32>
  return
}

// -----

// The addend is computed after the GEMM, but the GEMM's input is larger than its product:
// keeping it live until the add would raise the activation peak. Left alone.
// CHECK-LABEL: func.func @addend_later_input_larger
// CHECK: exec.launch "gemm"
// CHECK: exec.launch "fill"
// CHECK: exec.launch "add"
// CHECK-NOT: gemm_add
func.func @addend_later_input_larger() {
  %y = exec.buffer activations "y" : memref<4x16xf32>
  %w = exec.buffer parameters "w" {init = #exec.init<ones>} : memref<8x16xf32>
  exec.launch "fill" outs(%y : memref<4x16xf32>) {ints = array<i64: 64>, floats = array<f64: 1.0>}
  %p = exec.buffer activations "product" : memref<4x8xf32>
  exec.launch "gemm" ins(%y, %w : memref<4x16xf32>, memref<8x16xf32>) outs(%p : memref<4x8xf32>) {ints = array<i64: 0, 1, 4, 8, 16>, floats = array<f64: 1.0>}
  %x = exec.buffer activations "x" : memref<4x8xf32>
  exec.launch "fill" outs(%x : memref<4x8xf32>) {ints = array<i64: 32>, floats = array<f64: 1.0>}
  %h = exec.buffer activations "h" : memref<4x8xf32>
  exec.launch "add" ins(%p, %x : memref<4x8xf32>, memref<4x8xf32>) outs(%h : memref<4x8xf32>) {ints = array<i64: 32, 32>, floats = array<f64>}
  exec.result "h", %h : memref<4x8xf32>
  return
}

// -----

// The addend is computed after the GEMM and the GEMM's input is overwritten before the add:
// neither place sees what the add and the GEMM saw. Left alone.
// CHECK-LABEL: func.func @addend_later_operand_rewritten
// CHECK: exec.launch "gemm"
// CHECK: exec.launch "add"
// CHECK-NOT: gemm_add
func.func @addend_later_operand_rewritten() {
  %y = exec.buffer activations "y" : memref<4x4xf32>
  %w = exec.buffer parameters "w" {init = #exec.init<ones>} : memref<8x4xf32>
  exec.launch "fill" outs(%y : memref<4x4xf32>) {ints = array<i64: 16>, floats = array<f64: 1.0>}
  %p = exec.buffer activations "product" : memref<4x8xf32>
  exec.launch "gemm" ins(%y, %w : memref<4x4xf32>, memref<8x4xf32>) outs(%p : memref<4x8xf32>) {ints = array<i64: 0, 1, 4, 8, 4>, floats = array<f64: 1.0>}
  exec.launch "fill" outs(%y : memref<4x4xf32>) {ints = array<i64: 16>, floats = array<f64: 2.0>}
  %x = exec.buffer activations "x" : memref<4x8xf32>
  exec.launch "fill" outs(%x : memref<4x8xf32>) {ints = array<i64: 32>, floats = array<f64: 1.0>}
  %h = exec.buffer activations "h" : memref<4x8xf32>
  exec.launch "add" ins(%p, %x : memref<4x8xf32>, memref<4x8xf32>) outs(%h : memref<4x8xf32>) {ints = array<i64: 32, 32>, floats = array<f64>}
  exec.result "h", %h : memref<4x8xf32>
  exec.result "y", %y : memref<4x4xf32>
  return
}

// -----

// The addend comes later and the add writes its sum over the GEMM's own input: a gemm_add there
// would read and write the same buffer. Left alone.
// CHECK-LABEL: func.func @addend_later_sum_over_input
// CHECK: exec.launch "gemm"
// CHECK: exec.launch "add"
// CHECK-NOT: gemm_add
func.func @addend_later_sum_over_input() {
  %y = exec.buffer activations "y" : memref<4x8xf32>
  %w = exec.buffer parameters "w" {init = #exec.init<ones>} : memref<8x8xf32>
  exec.launch "fill" outs(%y : memref<4x8xf32>) {ints = array<i64: 32>, floats = array<f64: 1.0>}
  %p = exec.buffer activations "product" : memref<4x8xf32>
  exec.launch "gemm" ins(%y, %w : memref<4x8xf32>, memref<8x8xf32>) outs(%p : memref<4x8xf32>) {ints = array<i64: 0, 1, 4, 8, 8>, floats = array<f64: 1.0>}
  %x = exec.buffer activations "x" : memref<4x8xf32>
  exec.launch "fill" outs(%x : memref<4x8xf32>) {ints = array<i64: 32>, floats = array<f64: 1.0>}
  exec.launch "add" ins(%p, %x : memref<4x8xf32>, memref<4x8xf32>) outs(%y : memref<4x8xf32>) {ints = array<i64: 32, 32>, floats = array<f64>}
  exec.result "y", %y : memref<4x8xf32>
  return
}

// -----

// The product is also read by another launch (kept for the backward): it must be stored.
// CHECK-LABEL: func.func @product_used_twice
// CHECK: exec.launch "gemm"
// CHECK: exec.launch "add"
// CHECK-NOT: gemm_add
func.func @product_used_twice() {
  %x = exec.buffer activations "x" : memref<4x8xf32>
  %y = exec.buffer activations "y" : memref<4x16xf32>
  %w = exec.buffer parameters "w" {init = #exec.init<ones>} : memref<8x16xf32>
  exec.launch "fill" outs(%x : memref<4x8xf32>) {ints = array<i64: 32>, floats = array<f64: 1.0>}
  exec.launch "fill" outs(%y : memref<4x16xf32>) {ints = array<i64: 64>, floats = array<f64: 1.0>}
  %p = exec.buffer activations "product" : memref<4x8xf32>
  exec.launch "gemm" ins(%y, %w : memref<4x16xf32>, memref<8x16xf32>) outs(%p : memref<4x8xf32>) {ints = array<i64: 0, 1, 4, 8, 16>, floats = array<f64: 1.0>}
  %h = exec.buffer activations "h" : memref<4x8xf32>
  exec.launch "add" ins(%x, %p : memref<4x8xf32>, memref<4x8xf32>) outs(%h : memref<4x8xf32>) {ints = array<i64: 32, 32>, floats = array<f64>}
  %k = exec.buffer activations "k" : memref<4x8xf32>
  exec.launch "silu.forward" ins(%p : memref<4x8xf32>) outs(%k : memref<4x8xf32>) {ints = array<i64: 32>, floats = array<f64>}
  exec.result "h", %h : memref<4x8xf32>
  return
}

// -----

// The add's output is a gradient read between the GEMM and the add (by the norm of the
// previous micro-step's value, say): writing it at the GEMM's place would change what that
// launch reads.
// CHECK-LABEL: func.func @output_read_in_between
// CHECK: exec.launch "gemm"
// CHECK: exec.launch "silu.forward"
// CHECK: exec.launch "add"
// CHECK-NOT: gemm_add
func.func @output_read_in_between() {
  %x = exec.buffer activations "x" : memref<4x8xf32>
  %y = exec.buffer activations "y" : memref<4x16xf32>
  %w = exec.buffer parameters "w" {init = #exec.init<ones>} : memref<8x16xf32>
  %g = exec.buffer gradients "w" : memref<4x8xf32>
  exec.launch "fill" outs(%x : memref<4x8xf32>) {ints = array<i64: 32>, floats = array<f64: 1.0>}
  exec.launch "fill" outs(%y : memref<4x16xf32>) {ints = array<i64: 64>, floats = array<f64: 1.0>}
  %p = exec.buffer activations "product" : memref<4x8xf32>
  exec.launch "gemm" ins(%y, %w : memref<4x16xf32>, memref<8x16xf32>) outs(%p : memref<4x8xf32>) {ints = array<i64: 0, 1, 4, 8, 16>, floats = array<f64: 1.0>}
  %k = exec.buffer activations "k" : memref<4x8xf32>
  exec.launch "silu.forward" ins(%g : memref<4x8xf32>) outs(%k : memref<4x8xf32>) {ints = array<i64: 32>, floats = array<f64>}
  exec.launch "add" ins(%x, %p : memref<4x8xf32>, memref<4x8xf32>) outs(%g : memref<4x8xf32>) {ints = array<i64: 32, 32>, floats = array<f64>}
  exec.result "k", %k : memref<4x8xf32>
  return
}

// -----

// A gradient scaled by the residual multiplier, then read by a projection's two backward
// products (one through a view): both read dy itself, alpha times 0.25; the scale is gone.
// CHECK-LABEL: func.func @scale_before_gemms
// CHECK: %[[DY:.*]] = exec.buffer activations "dy"
// CHECK-NOT: exec.launch "scale"
// CHECK: exec.launch "gemm" ins(%[[DY]], {{.*}}) {floats = array<f64: 2.500000e-01>, ints = array<i64: 0, 0, 4, 8, 16>}
// CHECK: %[[VIEW:.*]] = exec.view %[[DY]] : memref<4x16xf32> to memref<64xf32>
// CHECK: exec.launch "gemm" ins(%[[VIEW]], {{.*}}) {floats = array<f64: 5.000000e-01>, ints = array<i64: 1, 0, 16, 8, 4>}
func.func @scale_before_gemms() {
  %dy = exec.buffer activations "dy" : memref<4x16xf32>
  %w = exec.buffer parameters "w" {init = #exec.init<ones>} : memref<16x8xf32>
  %x = exec.buffer activations "x" : memref<4x8xf32>
  exec.launch "fill" outs(%dy : memref<4x16xf32>) {ints = array<i64: 64>, floats = array<f64: 1.0>}
  exec.launch "fill" outs(%x : memref<4x8xf32>) {ints = array<i64: 32>, floats = array<f64: 1.0>}
  %s = exec.buffer activations "scaled" : memref<4x16xf32>
  exec.launch "scale" ins(%dy : memref<4x16xf32>) outs(%s : memref<4x16xf32>) {ints = array<i64: 64>, floats = array<f64: 0.25>}
  %dx = exec.buffer activations "dx" : memref<4x8xf32>
  exec.launch "gemm" ins(%s, %w : memref<4x16xf32>, memref<16x8xf32>) outs(%dx : memref<4x8xf32>) {ints = array<i64: 0, 0, 4, 8, 16>, floats = array<f64: 1.0>}
  %sv = exec.view %s : memref<4x16xf32> to memref<64xf32>
  %dw = exec.buffer gradients "w" : memref<16x8xf32>
  exec.launch "gemm" ins(%sv, %x : memref<64xf32>, memref<4x8xf32>) outs(%dw : memref<16x8xf32>) {ints = array<i64: 1, 0, 16, 8, 4>, floats = array<f64: 2.0>}
  exec.result "dx", %dx : memref<4x8xf32>
  return
}

// -----

// The scaled gradient also goes to a kernel that takes no factor (a silu): it must exist, so
// the scale stays.
// CHECK-LABEL: func.func @scale_read_by_other
// CHECK: exec.launch "scale"
// CHECK: exec.launch "gemm" {{.*}} {floats = array<f64: 1.000000e+00>
func.func @scale_read_by_other() {
  %dy = exec.buffer activations "dy" : memref<4x16xf32>
  %w = exec.buffer parameters "w" {init = #exec.init<ones>} : memref<16x8xf32>
  exec.launch "fill" outs(%dy : memref<4x16xf32>) {ints = array<i64: 64>, floats = array<f64: 1.0>}
  %s = exec.buffer activations "scaled" : memref<4x16xf32>
  exec.launch "scale" ins(%dy : memref<4x16xf32>) outs(%s : memref<4x16xf32>) {ints = array<i64: 64>, floats = array<f64: 0.25>}
  %dx = exec.buffer activations "dx" : memref<4x8xf32>
  exec.launch "gemm" ins(%s, %w : memref<4x16xf32>, memref<16x8xf32>) outs(%dx : memref<4x8xf32>) {ints = array<i64: 0, 0, 4, 8, 16>, floats = array<f64: 1.0>}
  %k = exec.buffer activations "k" : memref<4x16xf32>
  exec.launch "silu.forward" ins(%s : memref<4x16xf32>) outs(%k : memref<4x16xf32>) {ints = array<i64: 64>, floats = array<f64>}
  exec.result "dx", %dx : memref<4x8xf32>
  exec.result "k", %k : memref<4x16xf32>
  return
}

// -----

// The scale's input is overwritten before the GEMM reads the scaled copy: the GEMM could not
// read the input in its place.
// CHECK-LABEL: func.func @scale_input_overwritten
// CHECK: exec.launch "scale"
// CHECK: exec.launch "fill"
// CHECK: exec.launch "gemm"
func.func @scale_input_overwritten() {
  %dy = exec.buffer activations "dy" : memref<4x16xf32>
  %w = exec.buffer parameters "w" {init = #exec.init<ones>} : memref<16x8xf32>
  exec.launch "fill" outs(%dy : memref<4x16xf32>) {ints = array<i64: 64>, floats = array<f64: 1.0>}
  %s = exec.buffer activations "scaled" : memref<4x16xf32>
  exec.launch "scale" ins(%dy : memref<4x16xf32>) outs(%s : memref<4x16xf32>) {ints = array<i64: 64>, floats = array<f64: 0.25>}
  exec.launch "fill" outs(%dy : memref<4x16xf32>) {ints = array<i64: 64>, floats = array<f64: 1.0>}
  %dx = exec.buffer activations "dx" : memref<4x8xf32>
  exec.launch "gemm" ins(%s, %w : memref<4x16xf32>, memref<16x8xf32>) outs(%dx : memref<4x8xf32>) {ints = array<i64: 0, 0, 4, 8, 16>, floats = array<f64: 1.0>}
  exec.result "dx", %dx : memref<4x8xf32>
  exec.result "dy", %dy : memref<4x16xf32>
  return
}

// -----

// The logits divided by logits_scaling: the product only feeds the scale, so the GEMM takes the
// factor into its alpha and writes the scaled logits (declared after it, moved up).
// CHECK-LABEL: func.func @scaled_product
// CHECK-DAG: %[[H:.*]] = exec.buffer activations "h"
// CHECK-DAG: %[[W:.*]] = exec.buffer parameters "w"
// CHECK-DAG: %[[S:.*]] = exec.buffer activations "scaled"
// CHECK: exec.launch "gemm" ins(%[[H]], %[[W]] : {{.*}}) outs(%[[S]] : {{.*}}) {floats = array<f64: 5.000000e-01>, ints = array<i64: 0, 1, 4, 8, 16>}
// CHECK-NOT: exec.launch "scale"
// CHECK-NOT: "logits"
// CHECK: exec.launch "silu.forward" ins(%[[S]]
func.func @scaled_product() {
  %h = exec.buffer activations "h" : memref<4x16xf32>
  %w = exec.buffer parameters "w" {init = #exec.init<ones>} : memref<8x16xf32>
  exec.launch "fill" outs(%h : memref<4x16xf32>) {ints = array<i64: 64>, floats = array<f64: 1.0>}
  %l = exec.buffer activations "logits" : memref<4x8xf32>
  exec.launch "gemm" ins(%h, %w : memref<4x16xf32>, memref<8x16xf32>) outs(%l : memref<4x8xf32>) {ints = array<i64: 0, 1, 4, 8, 16>, floats = array<f64: 2.0>}
  %s = exec.buffer activations "scaled" : memref<4x8xf32>
  exec.launch "scale" ins(%l : memref<4x8xf32>) outs(%s : memref<4x8xf32>) {ints = array<i64: 32>, floats = array<f64: 0.25>}
  %k = exec.buffer activations "k" : memref<4x8xf32>
  exec.launch "silu.forward" ins(%s : memref<4x8xf32>) outs(%k : memref<4x8xf32>) {ints = array<i64: 32>, floats = array<f64>}
  exec.result "k", %k : memref<4x8xf32>
  return
}

// -----

// The product is read by something besides the scale: it must be stored. Left alone.
// CHECK-LABEL: func.func @scaled_product_read_twice
// CHECK: exec.launch "gemm" {{.*}} {floats = array<f64: 2.000000e+00>
// CHECK: exec.launch "scale"
func.func @scaled_product_read_twice() {
  %h = exec.buffer activations "h" : memref<4x16xf32>
  %w = exec.buffer parameters "w" {init = #exec.init<ones>} : memref<8x16xf32>
  exec.launch "fill" outs(%h : memref<4x16xf32>) {ints = array<i64: 64>, floats = array<f64: 1.0>}
  %l = exec.buffer activations "logits" : memref<4x8xf32>
  exec.launch "gemm" ins(%h, %w : memref<4x16xf32>, memref<8x16xf32>) outs(%l : memref<4x8xf32>) {ints = array<i64: 0, 1, 4, 8, 16>, floats = array<f64: 2.0>}
  %s = exec.buffer activations "scaled" : memref<4x8xf32>
  exec.launch "scale" ins(%l : memref<4x8xf32>) outs(%s : memref<4x8xf32>) {ints = array<i64: 32>, floats = array<f64: 0.25>}
  exec.result "scaled", %s : memref<4x8xf32>
  exec.result "logits", %l : memref<4x8xf32>
  return
}

// -----

// The MoE block's output: the shared MLP's product plus the experts' output (written after the
// GEMM, so the gemm_add runs at the add's place; its input is smaller than its product), times
// the residual multiplier, then added to the residual. The scale of the sum goes into the
// gemm_add's alpha and beta, which writes the scaled sum; the residual add stays.
// CHECK-LABEL: func.func @scaled_sum
// CHECK-DAG: %[[X:.*]] = exec.buffer activations "x"
// CHECK-DAG: %[[Y:.*]] = exec.buffer activations "y"
// CHECK-DAG: %[[W:.*]] = exec.buffer parameters "w"
// CHECK-DAG: %[[M:.*]] = exec.buffer activations "experts"
// CHECK-DAG: %[[S:.*]] = exec.buffer activations "scaled"
// CHECK: exec.launch "gemm_add" ins(%[[Y]], %[[W]], %[[M]] : {{.*}}) outs(%[[S]] : {{.*}}) {floats = array<f64: 2.500000e-01, 2.500000e-01>, ints = array<i64: 0, 1, 4, 8, 4>}
// CHECK-NOT: exec.launch "scale"
// CHECK: exec.launch "add" ins(%[[X]], %[[S]] : {{.*}})
func.func @scaled_sum() {
  %x = exec.buffer activations "x" : memref<4x8xf32>
  %y = exec.buffer activations "y" : memref<4x4xf32>
  %w = exec.buffer parameters "w" {init = #exec.init<ones>} : memref<8x4xf32>
  exec.launch "fill" outs(%x : memref<4x8xf32>) {ints = array<i64: 32>, floats = array<f64: 1.0>}
  exec.launch "fill" outs(%y : memref<4x4xf32>) {ints = array<i64: 16>, floats = array<f64: 1.0>}
  %p = exec.buffer activations "product" : memref<4x8xf32>
  exec.launch "gemm" ins(%y, %w : memref<4x4xf32>, memref<8x4xf32>) outs(%p : memref<4x8xf32>) {ints = array<i64: 0, 1, 4, 8, 4>, floats = array<f64: 1.0>}
  %m = exec.buffer activations "experts" : memref<4x8xf32>
  exec.launch "fill" outs(%m : memref<4x8xf32>) {ints = array<i64: 32>, floats = array<f64: 2.0>}
  %sum = exec.buffer activations "sum" : memref<4x8xf32>
  exec.launch "add" ins(%m, %p : memref<4x8xf32>, memref<4x8xf32>) outs(%sum : memref<4x8xf32>) {ints = array<i64: 32, 32>, floats = array<f64>}
  %s = exec.buffer activations "scaled" : memref<4x8xf32>
  exec.launch "scale" ins(%sum : memref<4x8xf32>) outs(%s : memref<4x8xf32>) {ints = array<i64: 32>, floats = array<f64: 0.25>}
  %h = exec.buffer activations "h" : memref<4x8xf32>
  exec.launch "add" ins(%x, %s : memref<4x8xf32>, memref<4x8xf32>) outs(%h : memref<4x8xf32>) {ints = array<i64: 32, 32>, floats = array<f64>}
  exec.result "h", %h : memref<4x8xf32>
  return
}

// -----

// The MoE block's backward: the gradient times the residual multiplier goes to the shared MLP's
// backward product and to the experts' backward as its dout. Both read dy itself: the GEMM with
// alpha 0.25, the experts with dout_scale 0.25; the scale is gone.
// CHECK-LABEL: func.func @scale_before_experts_backward
// CHECK: %[[DY:.*]] = exec.buffer activations "dy"
// CHECK-NOT: exec.launch "scale"
// CHECK: exec.launch "gemm" ins(%[[DY]], {{.*}}) {floats = array<f64: 2.500000e-01>
// CHECK: exec.launch "moe_experts.backward" ins(%[[DY]], {{.*}}) {floats = array<f64: 2.500000e-01>, ints = array<i64: 4, 3, 2, 3, 2, 0>}
func.func @scale_before_experts_backward() {
  %dy = exec.buffer activations "dy" : memref<4x3xf32>
  %x = exec.buffer activations "x" : memref<4x3xf32>
  %gates = exec.buffer activations "gates" : memref<4x2xf32>
  %ids = exec.buffer activations "ids" : memref<4x2xi32>
  %w = exec.buffer parameters "w" {init = #exec.init<ones>} : memref<3x3xf32>
  %w_in = exec.buffer parameters "w_in" {init = #exec.init<ones>} : memref<3x4x3xf32>
  %w_out = exec.buffer parameters "w_out" {init = #exec.init<ones>} : memref<3x3x2xf32>
  exec.launch "fill" outs(%dy : memref<4x3xf32>) {ints = array<i64: 12>, floats = array<f64: 1.0>}
  exec.launch "fill" outs(%x : memref<4x3xf32>) {ints = array<i64: 12>, floats = array<f64: 1.0>}
  exec.launch "fill" outs(%gates : memref<4x2xf32>) {ints = array<i64: 8>, floats = array<f64: 0.5>}
  %s = exec.buffer activations "scaled" : memref<4x3xf32>
  exec.launch "scale" ins(%dy : memref<4x3xf32>) outs(%s : memref<4x3xf32>) {ints = array<i64: 12>, floats = array<f64: 0.25>}
  %dh = exec.buffer activations "dh" : memref<4x3xf32>
  exec.launch "gemm" ins(%s, %w : memref<4x3xf32>, memref<3x3xf32>) outs(%dh : memref<4x3xf32>) {ints = array<i64: 0, 0, 4, 3, 3>, floats = array<f64: 1.0>}
  %dx = exec.buffer activations "dx" : memref<4x3xf32>
  %dgates = exec.buffer activations "dgates" : memref<4x2xf32>
  %dw_in = exec.buffer gradients "w_in" : memref<3x4x3xf32>
  %dw_out = exec.buffer gradients "w_out" : memref<3x3x2xf32>
  exec.launch "moe_experts.backward" ins(%s, %x, %gates, %ids, %w_in, %w_out : memref<4x3xf32>, memref<4x3xf32>, memref<4x2xf32>, memref<4x2xi32>, memref<3x4x3xf32>, memref<3x3x2xf32>) outs(%dx, %dgates, %dw_in, %dw_out : memref<4x3xf32>, memref<4x2xf32>, memref<3x4x3xf32>, memref<3x3x2xf32>) {ints = array<i64: 4, 3, 2, 3, 2, 0>, floats = array<f64: 1.0>}
  exec.result "dh", %dh : memref<4x3xf32>
  exec.result "dx", %dx : memref<4x3xf32>
  exec.result "dgates", %dgates : memref<4x2xf32>
  return
}

// -----

// The experts' backward reads the scaled values as its x, which takes no factor: the scale stays.
// CHECK-LABEL: func.func @scale_read_as_experts_input
// CHECK: exec.launch "scale"
// CHECK: exec.launch "moe_experts.backward" {{.*}} {floats = array<f64: 1.000000e+00>
func.func @scale_read_as_experts_input() {
  %dy = exec.buffer activations "dy" : memref<4x3xf32>
  %gates = exec.buffer activations "gates" : memref<4x2xf32>
  %ids = exec.buffer activations "ids" : memref<4x2xi32>
  %w_in = exec.buffer parameters "w_in" {init = #exec.init<ones>} : memref<3x4x3xf32>
  %w_out = exec.buffer parameters "w_out" {init = #exec.init<ones>} : memref<3x3x2xf32>
  exec.launch "fill" outs(%dy : memref<4x3xf32>) {ints = array<i64: 12>, floats = array<f64: 1.0>}
  exec.launch "fill" outs(%gates : memref<4x2xf32>) {ints = array<i64: 8>, floats = array<f64: 0.5>}
  %s = exec.buffer activations "scaled" : memref<4x3xf32>
  exec.launch "scale" ins(%dy : memref<4x3xf32>) outs(%s : memref<4x3xf32>) {ints = array<i64: 12>, floats = array<f64: 0.25>}
  %dx = exec.buffer activations "dx" : memref<4x3xf32>
  %dgates = exec.buffer activations "dgates" : memref<4x2xf32>
  %dw_in = exec.buffer gradients "w_in" : memref<3x4x3xf32>
  %dw_out = exec.buffer gradients "w_out" : memref<3x3x2xf32>
  exec.launch "moe_experts.backward" ins(%dy, %s, %gates, %ids, %w_in, %w_out : memref<4x3xf32>, memref<4x3xf32>, memref<4x2xf32>, memref<4x2xi32>, memref<3x4x3xf32>, memref<3x3x2xf32>) outs(%dx, %dgates, %dw_in, %dw_out : memref<4x3xf32>, memref<4x2xf32>, memref<3x4x3xf32>, memref<3x3x2xf32>) {ints = array<i64: 4, 3, 2, 3, 2, 0>, floats = array<f64: 1.0>}
  exec.result "dx", %dx : memref<4x3xf32>
  exec.result "dgates", %dgates : memref<4x2xf32>
  return
}

// -----

// A GEMM reads rows 2 and 3 of the scaled gradient (a view at element 32): it reads the same
// rows of dy, through a view at the same place.
// CHECK-LABEL: func.func @scaled_rows_read
// CHECK: %[[DY:.*]] = exec.buffer activations "dy"
// CHECK-NOT: exec.launch "scale"
// CHECK: %[[ROWS:.*]] = exec.view %[[DY]] offset 32 : memref<4x16xf32> to memref<2x16xf32>
// CHECK: exec.launch "gemm" ins(%[[ROWS]], {{.*}}) {floats = array<f64: 2.500000e-01>
func.func @scaled_rows_read() {
  %dy = exec.buffer activations "dy" : memref<4x16xf32>
  %w = exec.buffer parameters "w" {init = #exec.init<ones>} : memref<16x8xf32>
  exec.launch "fill" outs(%dy : memref<4x16xf32>) {ints = array<i64: 64>, floats = array<f64: 1.0>}
  %s = exec.buffer activations "scaled" : memref<4x16xf32>
  exec.launch "scale" ins(%dy : memref<4x16xf32>) outs(%s : memref<4x16xf32>) {ints = array<i64: 64>, floats = array<f64: 0.25>}
  %rows = exec.view %s offset 32 : memref<4x16xf32> to memref<2x16xf32>
  %dx = exec.buffer activations "dx" : memref<2x8xf32>
  exec.launch "gemm" ins(%rows, %w : memref<2x16xf32>, memref<16x8xf32>) outs(%dx : memref<2x8xf32>) {ints = array<i64: 0, 0, 2, 8, 16>, floats = array<f64: 1.0>}
  exec.result "dx", %dx : memref<2x8xf32>
  return
}

// -----

// The scale writes the first half of a buffer and the GEMM reads its second half, which the
// scale did not write: the GEMM does not read a scaled value of dy there. Left alone.
// CHECK-LABEL: func.func @read_beside_the_scaled
// CHECK: exec.launch "scale"
// CHECK: exec.launch "gemm" {{.*}} {floats = array<f64: 1.000000e+00>
func.func @read_beside_the_scaled() {
  %dy = exec.buffer activations "dy" : memref<2x16xf32>
  %w = exec.buffer parameters "w" {init = #exec.init<ones>} : memref<16x8xf32>
  %both = exec.buffer activations "both" : memref<4x16xf32>
  exec.launch "fill" outs(%dy : memref<2x16xf32>) {ints = array<i64: 32>, floats = array<f64: 1.0>}
  exec.launch "fill" outs(%both : memref<4x16xf32>) {ints = array<i64: 64>, floats = array<f64: 1.0>}
  %first = exec.view %both offset 0 : memref<4x16xf32> to memref<2x16xf32>
  exec.launch "scale" ins(%dy : memref<2x16xf32>) outs(%first : memref<2x16xf32>) {ints = array<i64: 32>, floats = array<f64: 0.25>}
  %second = exec.view %both offset 32 : memref<4x16xf32> to memref<2x16xf32>
  %dx = exec.buffer activations "dx" : memref<2x8xf32>
  exec.launch "gemm" ins(%second, %w : memref<2x16xf32>, memref<16x8xf32>) outs(%dx : memref<2x8xf32>) {ints = array<i64: 0, 0, 2, 8, 16>, floats = array<f64: 1.0>}
  exec.result "dx", %dx : memref<2x8xf32>
  return
}

// -----

// The GEMM reads the first two rows of the scaled gradient: it reads dy's, through a view that
// names its offset 0 (fewer elements than dy).
// CHECK-LABEL: func.func @scaled_first_rows_read
// CHECK: %[[DY:.*]] = exec.buffer activations "dy"
// CHECK-NOT: exec.launch "scale"
// CHECK: %[[ROWS:.*]] = exec.view %[[DY]] offset 0 : memref<4x16xf32> to memref<2x16xf32>
// CHECK: exec.launch "gemm" ins(%[[ROWS]], {{.*}}) {floats = array<f64: 2.500000e-01>
func.func @scaled_first_rows_read() {
  %dy = exec.buffer activations "dy" : memref<4x16xf32>
  %w = exec.buffer parameters "w" {init = #exec.init<ones>} : memref<16x8xf32>
  exec.launch "fill" outs(%dy : memref<4x16xf32>) {ints = array<i64: 64>, floats = array<f64: 1.0>}
  %s = exec.buffer activations "scaled" : memref<4x16xf32>
  exec.launch "scale" ins(%dy : memref<4x16xf32>) outs(%s : memref<4x16xf32>) {ints = array<i64: 64>, floats = array<f64: 0.25>}
  %rows = exec.view %s offset 0 : memref<4x16xf32> to memref<2x16xf32>
  %dx = exec.buffer activations "dx" : memref<2x8xf32>
  exec.launch "gemm" ins(%rows, %w : memref<2x16xf32>, memref<16x8xf32>) outs(%dx : memref<2x8xf32>) {ints = array<i64: 0, 0, 2, 8, 16>, floats = array<f64: 1.0>}
  exec.result "dx", %dx : memref<2x8xf32>
  return
}
