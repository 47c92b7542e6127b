// hcp-slice-gemms: a product cut into column slices is computed slice by slice, and a gradient
// put together from column blocks is read block by block, only when nothing can see the
// difference.
// RUN: hybridcp-opt %s --split-input-file --hcp-slice-gemms | FileCheck %s

// in_proj's forward: y = x w^T (w [8, 6]) cut into z, xBC and dt (3, 4 and 1 columns). Each
// slice is a GEMM of w's rows (offsets 0, 3*6 and 7*6), written where the product was; the
// product and its slices are gone.
// CHECK-LABEL: func.func @forward
// CHECK-DAG: %[[X:.*]] = exec.buffer activations "x"
// CHECK-DAG: %[[W:.*]] = exec.buffer parameters "w"
// CHECK: %[[Z:.*]] = exec.buffer activations "z"
// CHECK: %[[WZ:.*]] = exec.view %[[W]] offset 0 : memref<8x6xf32> to memref<3x6xf32>
// CHECK: exec.launch "gemm" ins(%[[X]], %[[WZ]] : {{.*}}) outs(%[[Z]] : {{.*}}) {floats = array<f64: 1.000000e+00>, ints = array<i64: 0, 1, 4, 3, 6>}
// CHECK: %[[XBC:.*]] = exec.buffer activations "xbc"
// CHECK: %[[WXBC:.*]] = exec.view %[[W]] offset 18 : memref<8x6xf32> to memref<4x6xf32>
// CHECK: exec.launch "gemm" ins(%[[X]], %[[WXBC]] : {{.*}}) outs(%[[XBC]] : {{.*}}) {floats = array<f64: 1.000000e+00>, ints = array<i64: 0, 1, 4, 4, 6>}
// CHECK: %[[DT:.*]] = exec.buffer activations "dt"
// CHECK: %[[WDT:.*]] = exec.view %[[W]] offset 42 : memref<8x6xf32> to memref<1x6xf32>
// CHECK: exec.launch "gemm" ins(%[[X]], %[[WDT]] : {{.*}}) outs(%[[DT]] : {{.*}}) {floats = array<f64: 1.000000e+00>, ints = array<i64: 0, 1, 4, 1, 6>}
// CHECK-NOT: slice_columns
// CHECK-NOT: "y"
// CHECK: exec.launch "silu.forward" ins(%[[XBC]]
func.func @forward() {
  %x = exec.buffer activations "x" : memref<1x4x6xf32>
  %w = exec.buffer parameters "w" {init = #exec.init<ones>} : memref<8x6xf32>
  exec.launch "fill" outs(%x : memref<1x4x6xf32>) {ints = array<i64: 24>, floats = array<f64: 1.0>}
  %y = exec.buffer activations "y" : memref<1x4x8xf32>
  exec.launch "gemm" ins(%x, %w : memref<1x4x6xf32>, memref<8x6xf32>) outs(%y : memref<1x4x8xf32>) {ints = array<i64: 0, 1, 4, 8, 6>, floats = array<f64: 1.0>}
  %z = exec.buffer activations "z" : memref<1x4x3xf32>
  exec.launch "slice_columns" ins(%y : memref<1x4x8xf32>) outs(%z : memref<1x4x3xf32>) {ints = array<i64: 4, 8, 0, 3>, floats = array<f64>}
  %xbc = exec.buffer activations "xbc" : memref<1x4x4xf32>
  exec.launch "slice_columns" ins(%y : memref<1x4x8xf32>) outs(%xbc : memref<1x4x4xf32>) {ints = array<i64: 4, 8, 3, 4>, floats = array<f64>}
  %dt = exec.buffer activations "dt" : memref<1x4x1xf32>
  exec.launch "slice_columns" ins(%y : memref<1x4x8xf32>) outs(%dt : memref<1x4x1xf32>) {ints = array<i64: 4, 8, 7, 1>, floats = array<f64>}
  %s = exec.buffer activations "s" : memref<1x4x4xf32>
  exec.launch "silu.forward" ins(%xbc : memref<1x4x4xf32>) outs(%s : memref<1x4x4xf32>) {ints = array<i64: 16>, floats = array<f64>}
  exec.result "s", %s : memref<1x4x4xf32>
  exec.result "z", %z : memref<1x4x3xf32>
  exec.result "dt", %dt : memref<1x4x1xf32>
  return
}

// -----

// in_proj's backward: dy assembled from dz, dxbc and ddt, then dx = dy w (w [8, 6]) plus the
// residual's gradient (a gemm_add) and dw = dy^T x. dx becomes the blocks' products summed
// through two partial sums, the first added to the residual's gradient; dw is written block
// by block into its rows. The alphas stay; the residual's gradient keeps its beta (0.5), the
// partial sums are added with beta 1.
// CHECK-LABEL: func.func @backward
// CHECK-DAG: %[[X:.*]] = exec.buffer activations "x"
// CHECK-DAG: %[[W:.*]] = exec.buffer parameters "w"
// CHECK-DAG: %[[DZ:.*]] = exec.buffer activations "dz"
// CHECK-DAG: %[[DXBC:.*]] = exec.buffer activations "dxbc"
// CHECK-DAG: %[[DDT:.*]] = exec.buffer activations "ddt"
// CHECK-DAG: %[[RES:.*]] = exec.buffer activations "res"
// CHECK-NOT: insert_columns
// CHECK: %[[DX:.*]] = exec.buffer activations "dx"
// CHECK: %[[WZ:.*]] = exec.view %[[W]] offset 0 : memref<8x6xf32> to memref<3x6xf32>
// CHECK: %[[P0:.*]] = exec.buffer activations "dx.partial0"
// CHECK: exec.launch "gemm_add" ins(%[[DZ]], %[[WZ]], %[[RES]] : {{.*}}) outs(%[[P0]] : {{.*}}) {floats = array<f64: 2.000000e+00, 5.000000e-01>, ints = array<i64: 0, 0, 4, 6, 3>}
// CHECK: %[[WXBC:.*]] = exec.view %[[W]] offset 18 : memref<8x6xf32> to memref<4x6xf32>
// CHECK: %[[P1:.*]] = exec.buffer activations "dx.partial1"
// CHECK: exec.launch "gemm_add" ins(%[[DXBC]], %[[WXBC]], %[[P0]] : {{.*}}) outs(%[[P1]] : {{.*}}) {floats = array<f64: 2.000000e+00, 1.000000e+00>, ints = array<i64: 0, 0, 4, 6, 4>}
// CHECK: %[[WDT:.*]] = exec.view %[[W]] offset 42 : memref<8x6xf32> to memref<1x6xf32>
// CHECK: exec.launch "gemm_add" ins(%[[DDT]], %[[WDT]], %[[P1]] : {{.*}}) outs(%[[DX]] : {{.*}}) {floats = array<f64: 2.000000e+00, 1.000000e+00>, ints = array<i64: 0, 0, 4, 6, 1>}
// CHECK: %[[GW:.*]] = exec.buffer gradients "w"
// CHECK: %[[GZ:.*]] = exec.view %[[GW]] offset 0 : memref<8x6xf32> to memref<3x6xf32>
// CHECK: exec.launch "gemm" ins(%[[DZ]], %[[X]] : {{.*}}) outs(%[[GZ]] : {{.*}}) {floats = array<f64: 1.000000e+00>, ints = array<i64: 1, 0, 3, 6, 4>}
// CHECK: %[[GXBC:.*]] = exec.view %[[GW]] offset 18 : memref<8x6xf32> to memref<4x6xf32>
// CHECK: exec.launch "gemm" ins(%[[DXBC]], %[[X]] : {{.*}}) outs(%[[GXBC]] : {{.*}}) {floats = array<f64: 1.000000e+00>, ints = array<i64: 1, 0, 4, 6, 4>}
// CHECK: %[[GDT:.*]] = exec.view %[[GW]] offset 42 : memref<8x6xf32> to memref<1x6xf32>
// CHECK: exec.launch "gemm" ins(%[[DDT]], %[[X]] : {{.*}}) outs(%[[GDT]] : {{.*}}) {floats = array<f64: 1.000000e+00>, ints = array<i64: 1, 0, 1, 6, 4>}
// CHECK-NOT: "dy"
// CHECK: exec.result "dx"
func.func @backward() {
  %x = exec.buffer activations "x" : memref<1x4x6xf32>
  %w = exec.buffer parameters "w" {init = #exec.init<ones>} : memref<8x6xf32>
  %dz = exec.buffer activations "dz" : memref<1x4x3xf32>
  %dxbc = exec.buffer activations "dxbc" : memref<1x4x4xf32>
  %ddt = exec.buffer activations "ddt" : memref<1x4x1xf32>
  %res = exec.buffer activations "res" : memref<1x4x6xf32>
  exec.launch "fill" outs(%x : memref<1x4x6xf32>) {ints = array<i64: 24>, floats = array<f64: 1.0>}
  exec.launch "fill" outs(%dz : memref<1x4x3xf32>) {ints = array<i64: 12>, floats = array<f64: 1.0>}
  exec.launch "fill" outs(%dxbc : memref<1x4x4xf32>) {ints = array<i64: 16>, floats = array<f64: 1.0>}
  exec.launch "fill" outs(%ddt : memref<1x4x1xf32>) {ints = array<i64: 4>, floats = array<f64: 1.0>}
  exec.launch "fill" outs(%res : memref<1x4x6xf32>) {ints = array<i64: 24>, floats = array<f64: 1.0>}
  %dy = exec.buffer activations "dy" : memref<1x4x8xf32>
  exec.launch "insert_columns" ins(%dz : memref<1x4x3xf32>) outs(%dy : memref<1x4x8xf32>) {ints = array<i64: 4, 8, 0, 3>, floats = array<f64>}
  exec.launch "insert_columns" ins(%ddt : memref<1x4x1xf32>) outs(%dy : memref<1x4x8xf32>) {ints = array<i64: 4, 8, 7, 1>, floats = array<f64>}
  exec.launch "insert_columns" ins(%dxbc : memref<1x4x4xf32>) outs(%dy : memref<1x4x8xf32>) {ints = array<i64: 4, 8, 3, 4>, floats = array<f64>}
  %dx = exec.buffer activations "dx" : memref<1x4x6xf32>
  exec.launch "gemm_add" ins(%dy, %w, %res : memref<1x4x8xf32>, memref<8x6xf32>, memref<1x4x6xf32>) outs(%dx : memref<1x4x6xf32>) {ints = array<i64: 0, 0, 4, 6, 8>, floats = array<f64: 2.0, 0.5>}
  %gw = exec.buffer gradients "w" : memref<8x6xf32>
  exec.launch "gemm" ins(%dy, %x : memref<1x4x8xf32>, memref<1x4x6xf32>) outs(%gw : memref<8x6xf32>) {ints = array<i64: 1, 0, 8, 6, 4>, floats = array<f64: 1.0>}
  exec.result "dx", %dx : memref<1x4x6xf32>
  return
}

// -----

// A product something else reads whole as well (here an add) stays, and so do its slices.
// CHECK-LABEL: func.func @read_whole
// CHECK: exec.launch "gemm"
// CHECK: exec.launch "slice_columns"
// CHECK: exec.launch "add"
func.func @read_whole() {
  %x = exec.buffer activations "x" : memref<4x6xf32>
  %w = exec.buffer parameters "w" {init = #exec.init<ones>} : memref<8x6xf32>
  exec.launch "fill" outs(%x : memref<4x6xf32>) {ints = array<i64: 24>, floats = array<f64: 1.0>}
  %y = exec.buffer activations "y" : memref<4x8xf32>
  exec.launch "gemm" ins(%x, %w : memref<4x6xf32>, memref<8x6xf32>) outs(%y : memref<4x8xf32>) {ints = array<i64: 0, 1, 4, 8, 6>, floats = array<f64: 1.0>}
  %z = exec.buffer activations "z" : memref<4x3xf32>
  exec.launch "slice_columns" ins(%y : memref<4x8xf32>) outs(%z : memref<4x3xf32>) {ints = array<i64: 4, 8, 0, 3>, floats = array<f64>}
  %s = exec.buffer activations "s" : memref<4x8xf32>
  exec.launch "add" ins(%y, %y : memref<4x8xf32>, memref<4x8xf32>) outs(%s : memref<4x8xf32>) {ints = array<i64: 32, 32>, floats = array<f64>}
  exec.result "s", %s : memref<4x8xf32>
  exec.result "z", %z : memref<4x3xf32>
  return
}

// -----

// y = x w with w [6, 8] (trans_b 0): a slice of y's columns is a column block of w, not a
// contiguous part of it. Left alone.
// CHECK-LABEL: func.func @weight_not_transposed
// CHECK: exec.launch "gemm"
// CHECK: exec.launch "slice_columns"
func.func @weight_not_transposed() {
  %x = exec.buffer activations "x" : memref<4x6xf32>
  %w = exec.buffer parameters "w" {init = #exec.init<ones>} : memref<6x8xf32>
  exec.launch "fill" outs(%x : memref<4x6xf32>) {ints = array<i64: 24>, floats = array<f64: 1.0>}
  %y = exec.buffer activations "y" : memref<4x8xf32>
  exec.launch "gemm" ins(%x, %w : memref<4x6xf32>, memref<6x8xf32>) outs(%y : memref<4x8xf32>) {ints = array<i64: 0, 0, 4, 8, 6>, floats = array<f64: 1.0>}
  %z = exec.buffer activations "z" : memref<4x3xf32>
  exec.launch "slice_columns" ins(%y : memref<4x8xf32>) outs(%z : memref<4x3xf32>) {ints = array<i64: 4, 8, 0, 3>, floats = array<f64>}
  exec.result "z", %z : memref<4x3xf32>
  return
}

// -----

// A slice's output is written between the product and the slice: computing the slice at the
// product's place would be overwritten. Left alone.
// CHECK-LABEL: func.func @slice_output_busy
// CHECK: exec.launch "gemm"
// CHECK: exec.launch "fill"
// CHECK: exec.launch "slice_columns"
func.func @slice_output_busy() {
  %x = exec.buffer activations "x" : memref<4x6xf32>
  %w = exec.buffer parameters "w" {init = #exec.init<ones>} : memref<8x6xf32>
  exec.launch "fill" outs(%x : memref<4x6xf32>) {ints = array<i64: 24>, floats = array<f64: 1.0>}
  %y = exec.buffer activations "y" : memref<4x8xf32>
  exec.launch "gemm" ins(%x, %w : memref<4x6xf32>, memref<8x6xf32>) outs(%y : memref<4x8xf32>) {ints = array<i64: 0, 1, 4, 8, 6>, floats = array<f64: 1.0>}
  %z = exec.buffer activations "z" : memref<4x3xf32>
  exec.launch "fill" outs(%z : memref<4x3xf32>) {ints = array<i64: 12>, floats = array<f64: 2.0>}
  exec.launch "slice_columns" ins(%y : memref<4x8xf32>) outs(%z : memref<4x3xf32>) {ints = array<i64: 4, 8, 0, 3>, floats = array<f64>}
  exec.result "z", %z : memref<4x3xf32>
  return
}

// -----

// Blocks that leave columns 3-5 unwritten: the GEMMs read whatever is there. Left alone.
// CHECK-LABEL: func.func @gap
// CHECK-COUNT-2: exec.launch "insert_columns"
// CHECK: exec.launch "gemm"
func.func @gap() {
  %w = exec.buffer parameters "w" {init = #exec.init<ones>} : memref<8x6xf32>
  %da = exec.buffer activations "da" : memref<4x3xf32>
  %db = exec.buffer activations "db" : memref<4x2xf32>
  exec.launch "fill" outs(%da : memref<4x3xf32>) {ints = array<i64: 12>, floats = array<f64: 1.0>}
  exec.launch "fill" outs(%db : memref<4x2xf32>) {ints = array<i64: 8>, floats = array<f64: 1.0>}
  %dy = exec.buffer activations "dy" : memref<4x8xf32>
  exec.launch "insert_columns" ins(%da : memref<4x3xf32>) outs(%dy : memref<4x8xf32>) {ints = array<i64: 4, 8, 0, 3>, floats = array<f64>}
  exec.launch "insert_columns" ins(%db : memref<4x2xf32>) outs(%dy : memref<4x8xf32>) {ints = array<i64: 4, 8, 6, 2>, floats = array<f64>}
  %dx = exec.buffer activations "dx" : memref<4x6xf32>
  exec.launch "gemm" ins(%dy, %w : memref<4x8xf32>, memref<8x6xf32>) outs(%dx : memref<4x6xf32>) {ints = array<i64: 0, 0, 4, 6, 8>, floats = array<f64: 1.0>}
  exec.result "dx", %dx : memref<4x6xf32>
  return
}

// -----

// A block is overwritten after its insert and before the GEMM: the GEMM must read what was
// inserted. Left alone.
// CHECK-LABEL: func.func @block_overwritten
// CHECK-COUNT-2: exec.launch "insert_columns"
// CHECK: exec.launch "fill"
// CHECK: exec.launch "gemm"
func.func @block_overwritten() {
  %w = exec.buffer parameters "w" {init = #exec.init<ones>} : memref<8x6xf32>
  %da = exec.buffer activations "da" : memref<4x3xf32>
  %db = exec.buffer activations "db" : memref<4x5xf32>
  exec.launch "fill" outs(%da : memref<4x3xf32>) {ints = array<i64: 12>, floats = array<f64: 1.0>}
  exec.launch "fill" outs(%db : memref<4x5xf32>) {ints = array<i64: 20>, floats = array<f64: 1.0>}
  %dy = exec.buffer activations "dy" : memref<4x8xf32>
  exec.launch "insert_columns" ins(%da : memref<4x3xf32>) outs(%dy : memref<4x8xf32>) {ints = array<i64: 4, 8, 0, 3>, floats = array<f64>}
  exec.launch "insert_columns" ins(%db : memref<4x5xf32>) outs(%dy : memref<4x8xf32>) {ints = array<i64: 4, 8, 3, 5>, floats = array<f64>}
  exec.launch "fill" outs(%da : memref<4x3xf32>) {ints = array<i64: 12>, floats = array<f64: 3.0>}
  %dx = exec.buffer activations "dx" : memref<4x6xf32>
  exec.launch "gemm" ins(%dy, %w : memref<4x8xf32>, memref<8x6xf32>) outs(%dx : memref<4x6xf32>) {ints = array<i64: 0, 0, 4, 6, 8>, floats = array<f64: 1.0>}
  exec.result "dx", %dx : memref<4x6xf32>
  exec.result "da", %da : memref<4x3xf32>
  return
}

// -----

// dy read as a GEMM's right operand (x^T dy): its blocks would be column blocks of the output.
// Left alone.
// CHECK-LABEL: func.func @right_operand
// CHECK-COUNT-2: exec.launch "insert_columns"
// CHECK: exec.launch "gemm"
func.func @right_operand() {
  %x = exec.buffer activations "x" : memref<4x6xf32>
  %da = exec.buffer activations "da" : memref<4x3xf32>
  %db = exec.buffer activations "db" : memref<4x5xf32>
  exec.launch "fill" outs(%x : memref<4x6xf32>) {ints = array<i64: 24>, floats = array<f64: 1.0>}
  exec.launch "fill" outs(%da : memref<4x3xf32>) {ints = array<i64: 12>, floats = array<f64: 1.0>}
  exec.launch "fill" outs(%db : memref<4x5xf32>) {ints = array<i64: 20>, floats = array<f64: 1.0>}
  %dy = exec.buffer activations "dy" : memref<4x8xf32>
  exec.launch "insert_columns" ins(%da : memref<4x3xf32>) outs(%dy : memref<4x8xf32>) {ints = array<i64: 4, 8, 0, 3>, floats = array<f64>}
  exec.launch "insert_columns" ins(%db : memref<4x5xf32>) outs(%dy : memref<4x8xf32>) {ints = array<i64: 4, 8, 3, 5>, floats = array<f64>}
  %g = exec.buffer activations "g" : memref<6x8xf32>
  exec.launch "gemm" ins(%x, %dy : memref<4x6xf32>, memref<4x8xf32>) outs(%g : memref<6x8xf32>) {ints = array<i64: 1, 0, 6, 8, 4>, floats = array<f64: 1.0>}
  exec.result "g", %g : memref<6x8xf32>
  return
}
