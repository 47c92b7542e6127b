// hcp-plan-memory: activations share bytes only when their lifetimes do not overlap;
// persistent arenas are laid out one buffer after another.
// RUN: hybridcp-opt %s --split-input-file --hcp-plan-memory | FileCheck %s

// A chain a -> b -> c -> d of 1 KiB buffers: a dies when c is born, so c reuses a's bytes and
// d reuses b's; the arena holds two buffers at a time (2 KiB), not four.
// CHECK: module attributes {exec.arena_bytes = array<i64: 1024, 0, 2048, 0>}
// CHECK-LABEL: func.func @chain
// CHECK: exec.buffer parameters "w" offset 0 {init = #exec.init<ones>}
// CHECK: exec.buffer activations "a" offset [[A:[0-9]+]] :
// CHECK: exec.buffer activations "b" offset [[B:[0-9]+]] :
// CHECK: exec.buffer activations "c" offset [[A]] :
// CHECK: exec.buffer activations "d" offset [[B]] :
func.func @chain() {
  %w = exec.buffer parameters "w" {init = #exec.init<ones>} : memref<256xf32>
  %a = exec.buffer activations "a" : memref<256xf32>
  exec.launch "silu.forward" ins(%w : memref<256xf32>) outs(%a : memref<256xf32>) {ints = array<i64: 256>, floats = array<f64>}
  %b = exec.buffer activations "b" : memref<256xf32>
  exec.launch "silu.forward" ins(%a : memref<256xf32>) outs(%b : memref<256xf32>) {ints = array<i64: 256>, floats = array<f64>}
  %c = exec.buffer activations "c" : memref<256xf32>
  exec.launch "silu.forward" ins(%b : memref<256xf32>) outs(%c : memref<256xf32>) {ints = array<i64: 256>, floats = array<f64>}
  %d = exec.buffer activations "d" : memref<256xf32>
  exec.launch "silu.forward" ins(%c : memref<256xf32>) outs(%d : memref<256xf32>) {ints = array<i64: 256>, floats = array<f64>}
  exec.result "loss", %d : memref<256xf32>
  return
}

// -----

// A view keeps its source alive: a is read through its view by the last launch, so nothing
// may take a's bytes before then (three live buffers at the end: 3 KiB).
// CHECK: module attributes {exec.arena_bytes = array<i64: 1024, 0, 3072, 0>}
// CHECK-LABEL: func.func @view_extends_lifetime
func.func @view_extends_lifetime() {
  %w = exec.buffer parameters "w" {init = #exec.init<ones>} : memref<256xf32>
  %a = exec.buffer activations "a" : memref<256xf32>
  exec.launch "silu.forward" ins(%w : memref<256xf32>) outs(%a : memref<256xf32>) {ints = array<i64: 256>, floats = array<f64>}
  %v = exec.view %a : memref<256xf32> to memref<16x16xf32>
  %b = exec.buffer activations "b" : memref<256xf32>
  exec.launch "silu.forward" ins(%w : memref<256xf32>) outs(%b : memref<256xf32>) {ints = array<i64: 256>, floats = array<f64>}
  %c = exec.buffer activations "c" : memref<256xf32>
  exec.launch "add" ins(%v, %b : memref<16x16xf32>, memref<256xf32>) outs(%c : memref<256xf32>) {ints = array<i64: 256, 256>, floats = array<f64>}
  exec.result "loss", %c : memref<256xf32>
  return
}

// -----

// Inputs and gradients get their own arenas; offsets are aligned to 256 bytes.
// CHECK: module attributes {exec.arena_bytes = array<i64: 256, 512, 256, 512>}
// CHECK-LABEL: func.func @arenas
// CHECK: exec.buffer inputs "input_ids" offset 0
// CHECK: exec.buffer inputs "targets" offset 256
// CHECK: exec.buffer gradients "w" offset 0
// CHECK: exec.buffer gradients "v" offset 256
func.func @arenas() {
  %ids = exec.buffer inputs "input_ids" : memref<1x4xi32>
  %t = exec.buffer inputs "targets" : memref<1x4xi32>
  %w = exec.buffer parameters "w" {init = #exec.init<ones>} : memref<4xf32>
  %gw = exec.buffer gradients "w" : memref<4xf32>
  %gv = exec.buffer gradients "v" : memref<4xf32>
  %a = exec.buffer activations "a" : memref<4xf32>
  exec.launch "silu.forward" ins(%w : memref<4xf32>) outs(%a : memref<4xf32>) {ints = array<i64: 4>, floats = array<f64>}
  exec.result "loss", %a : memref<4xf32>
  return
}

// -----

// Expert-parallel (sharded) parameters and gradients come after all the others, whatever the
// program order, so each gradient sum of the runtime is one contiguous range: replicated
// gradients [0, 1024), sharded [1024, 1536).
// CHECK: module attributes {exec.arena_bytes = array<i64: 1536, 1536, 1024, 0>}
// CHECK-LABEL: func.func @sharded_last
// CHECK: exec.buffer parameters "experts" offset 1024 {init = #exec.init<normal>, shards = 4 : i64, std = 1.000000e+00 : f64} : memref<2x64xf32>
// CHECK: exec.buffer parameters "w" offset 0 {init = #exec.init<ones>} : memref<256xf32>
// CHECK: exec.buffer gradients "experts" offset 1024 {shards = 4 : i64} : memref<2x64xf32>
// CHECK: exec.buffer gradients "w" offset 0 : memref<256xf32>
func.func @sharded_last() {
  %e = exec.buffer parameters "experts" {init = #exec.init<normal>, std = 1.0 : f64, shards = 4 : i64} : memref<2x64xf32>
  %w = exec.buffer parameters "w" {init = #exec.init<ones>} : memref<256xf32>
  %ge = exec.buffer gradients "experts" {shards = 4 : i64} : memref<2x64xf32>
  %gw = exec.buffer gradients "w" : memref<256xf32>
  %a = exec.buffer activations "a" : memref<256xf32>
  exec.launch "silu.forward" ins(%w : memref<256xf32>) outs(%a : memref<256xf32>) {ints = array<i64: 256>, floats = array<f64>}
  exec.launch "silu.forward" ins(%e : memref<2x64xf32>) outs(%ge : memref<2x64xf32>) {ints = array<i64: 128>, floats = array<f64>}
  exec.launch "silu.forward" ins(%a : memref<256xf32>) outs(%gw : memref<256xf32>) {ints = array<i64: 256>, floats = array<f64>}
  exec.result "loss", %a : memref<256xf32>
  return
}

// -----

// A launch beside the compute stream keeps its buffers live until its exec.join: the launches in
// between run while it reads x, so b (born after x's last launch) may not take x's bytes before
// the join, and c (born after it) may (2 KiB of x, halo and b, then c over x: 3 KiB, not 4).
// CHECK: module attributes {exec.arena_bytes = array<i64: 1024, 0, 3072, 0>}
// CHECK-LABEL: func.func @beside_lives_until_its_join
// CHECK: exec.buffer activations "x" offset [[X:[0-9]+]] :
// CHECK-NOT: offset [[X]] :
// CHECK: exec.join
// CHECK: exec.buffer activations "c" offset [[X]] :
func.func @beside_lives_until_its_join() {
  %w = exec.buffer parameters "w" {init = #exec.init<ones>} : memref<256xf32>
  %x = exec.buffer activations "x" : memref<1x64x4xf32>
  %xv = exec.view %x : memref<1x64x4xf32> to memref<256xf32>
  exec.launch "silu.forward" ins(%w : memref<256xf32>) outs(%xv : memref<256xf32>) {ints = array<i64: 256>, floats = array<f64>}
  %halo = exec.buffer activations "halo" : memref<1x64x4xf32>
  exec.launch "halo_exchange.forward" ins(%x : memref<1x64x4xf32>) outs(%halo : memref<1x64x4xf32>) {beside, ints = array<i64: 1, 1, 64, 4, 64>, floats = array<f64>}
  %b = exec.buffer activations "b" : memref<256xf32>
  exec.launch "silu.forward" ins(%w : memref<256xf32>) outs(%b : memref<256xf32>) {ints = array<i64: 256>, floats = array<f64>}
  exec.join
  %hv = exec.view %halo : memref<1x64x4xf32> to memref<256xf32>
  %c = exec.buffer activations "c" : memref<256xf32>
  exec.launch "silu.forward" ins(%hv : memref<256xf32>) outs(%c : memref<256xf32>) {ints = array<i64: 256>, floats = array<f64>}
  exec.result "loss", %c : memref<256xf32>
  return
}
