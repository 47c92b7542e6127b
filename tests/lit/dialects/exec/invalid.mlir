// Verifier errors of the `exec` dialect.
// RUN: hybridcp-opt %s --split-input-file --verify-diagnostics

// A kernel must be in the kernel table.
func.func @unknown_kernel(%a: memref<4xf32>) {
  // expected-error @+1 {{unknown kernel 'frobnicate'}}
  exec.launch "frobnicate" outs(%a : memref<4xf32>) {ints = array<i64>, floats = array<f64>}
  return
}

// -----

// Argument counts follow the kernel table.
func.func @wrong_arity(%a: memref<4xf32>, %b: memref<4xf32>) {
  // expected-error @+1 {{kernel 'silu.forward': takes 1 inputs, got 2}}
  exec.launch "silu.forward" ins(%a, %b : memref<4xf32>, memref<4xf32>) outs(%a : memref<4xf32>) {ints = array<i64: 4>, floats = array<f64>}
  return
}

// -----

// Scalar argument counts too.
func.func @wrong_ints(%a: memref<4xf32>, %b: memref<4xf32>) {
  // expected-error @+1 {{kernel 'silu.forward': takes 1 ints, got 2}}
  exec.launch "silu.forward" ins(%a : memref<4xf32>) outs(%b : memref<4xf32>) {ints = array<i64: 4, 4>, floats = array<f64>}
  return
}

// -----

// Only parameters carry an initialiser.
func.func @init_on_activation() {
  // expected-error @+1 {{buffer 'act.0': parameters and only parameters carry an init}}
  %0 = exec.buffer activations "act.0" {init = #exec.init<ones>} : memref<4xf32>
  return
}

// -----

// A parameter needs one.
func.func @param_without_init() {
  // expected-error @+1 {{buffer 'w': parameters and only parameters carry an init}}
  %0 = exec.buffer parameters "w" : memref<4xf32>
  return
}

// -----

// Known initialisers only: the attribute's parser names them.
func.func @bad_init() {
  // expected-error @+2 {{expected ::hcp::model::ParamInit to be one of: normal, zeros, ones, log_arange}}
  // expected-error @+1 {{failed to parse Exec_ParamInitAttr parameter 'value'}}
  %0 = exec.buffer parameters "w" {init = #exec.init<xavier>} : memref<4xf32>
  return
}

// -----

// A view keeps the element count.
func.func @bad_view(%a: memref<4x2xf32>) {
  // expected-error @+1 {{a view keeps the element type and count}}
  %0 = exec.view %a : memref<4x2xf32> to memref<6xf32>
  return
}

// -----

// A view with an offset is a part of its source: it ends inside it.
func.func @view_past_the_end(%a: memref<4x2xf32>) {
  // expected-error @+1 {{a view of elements [6, 10) lies outside its source of 8}}
  %0 = exec.view %a offset 6 : memref<4x2xf32> to memref<2x2xf32>
  return
}

// -----

// Only parameters and their gradients are split into shards (expert parallelism).
func.func @shards_on_activation() {
  // expected-error @+1 {{buffer 'act.0': only parameters and their gradients are split into shards}}
  %0 = exec.buffer activations "act.0" {shards = 2 : i64} : memref<4xf32>
  return
}

// -----

// An activation's byte offset (from hcp-plan-memory) is never negative.
func.func @negative_offset() {
  // expected-error @+1 {{buffer 'act.0' has a negative offset}}
  %0 = exec.buffer activations "act.0" offset -64 : memref<4xf32>
  return
}

// -----

// Element counts follow the kernel's signature: a lowering that passes the wrong size fails
// where it is made.
func.func @wrong_elements(%a: memref<4xf32>, %b: memref<8xf32>) {
  // expected-error @+1 {{kernel 'silu.forward': output 0 '(a view)' has 8 elements, expected n = 4}}
  exec.launch "silu.forward" ins(%a : memref<4xf32>) outs(%b : memref<8xf32>) {ints = array<i64: 4>, floats = array<f64>}
  return
}

// -----

// So do dtypes: the SSD's A is f32 whatever the storage type.
func.func @wrong_dtype(%x: memref<1x4x1x2xbf16>, %dt: memref<1x4x1xf32>, %A: memref<1xbf16>, %B: memref<1x4x1x2xbf16>, %D: memref<1xf32>, %y: memref<1x4x1x2xbf16>, %s: memref<1x1x2x2xf32>) {
  // expected-error @+1 {{kernel 'ssd_scan.forward': input 2 '(a view)' is bf16, expected f32}}
  exec.launch "ssd_scan.forward" ins(%x, %dt, %A, %B, %B, %D : memref<1x4x1x2xbf16>, memref<1x4x1xf32>, memref<1xbf16>, memref<1x4x1x2xbf16>, memref<1x4x1x2xbf16>, memref<1xf32>) outs(%y, %s : memref<1x4x1x2xbf16>, memref<1x1x2x2xf32>) {ints = array<i64: 1, 4, 1, 2, 1, 2, 4, 0, 0, 0>, floats = array<f64>}
  return
}

// -----

// A size of 0 is refused by name.
func.func @zero_size(%a: memref<4xf32>) {
  // expected-error @+1 {{kernel 'fill': int 0 (n) is 0, expected a positive size}}
  exec.launch "fill" outs(%a : memref<4xf32>) {ints = array<i64: 0>, floats = array<f64: 1.0>}
  return
}

// -----

// Only the table's `beside` kernels run beside the compute stream.
func.func @beside_not_a_beside_kernel(%a: memref<4xf32>, %b: memref<4xf32>) {
  // expected-error @+1 {{kernel 'silu.forward' may not run beside the compute stream}}
  exec.launch "silu.forward" ins(%a : memref<4xf32>) outs(%b : memref<4xf32>) {beside, ints = array<i64: 4>, floats = array<f64>}
  exec.join
  return
}

// -----

// A launch beside the compute stream is joined before the next collective...
func.func @beside_across_a_collective(%x: memref<1x8x4xf32>, %halo: memref<1x3x4xf32>, %p: memref<8xf32>, %sum: memref<8xf32>) {
  // expected-error @+1 {{runs beside the compute stream but is not joined (exec.join) before the next collective, 'all_reduce'}}
  exec.launch "halo_exchange.forward" ins(%x : memref<1x8x4xf32>) outs(%halo : memref<1x3x4xf32>) {beside, ints = array<i64: 1, 1, 8, 4, 3>, floats = array<f64>}
  exec.launch "all_reduce" ins(%p : memref<8xf32>) outs(%sum : memref<8xf32>) {ints = array<i64: 8, 1>, floats = array<f64>}
  exec.join
  return
}

// -----

// ...and before the step ends.
func.func @beside_never_joined(%x: memref<1x8x4xf32>, %halo: memref<1x3x4xf32>) {
  // expected-error @+1 {{runs beside the compute stream but is not joined (exec.join) before the step ends}}
  exec.launch "halo_exchange.forward" ins(%x : memref<1x8x4xf32>) outs(%halo : memref<1x3x4xf32>) {beside, ints = array<i64: 1, 1, 8, 4, 3>, floats = array<f64>}
  return
}

// -----

// A join waits for a launch beside the compute stream, one join each.
func.func @join_without_beside(%x: memref<1x8x4xf32>, %halo: memref<1x3x4xf32>) {
  exec.launch "halo_exchange.forward" ins(%x : memref<1x8x4xf32>) outs(%halo : memref<1x3x4xf32>) {beside, ints = array<i64: 1, 1, 8, 4, 3>, floats = array<f64>}
  exec.join
  // expected-error @+1 {{waits for no launch: none runs beside the compute stream since the previous exec.join}}
  exec.join
  return
}
