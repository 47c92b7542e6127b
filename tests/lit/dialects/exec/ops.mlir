// Every `exec` op parses, verifies and prints back, also through the generic form and bytecode.
// RUN: hybridcp-opt %s | FileCheck %s
// RUN: hybridcp-opt %s --mlir-print-op-generic | hybridcp-opt | FileCheck %s
// RUN: hybridcp-opt %s --emit-bytecode | hybridcp-opt | FileCheck %s

// Buffers in each arena, a view, kernel launches and the loss result.
// CHECK-LABEL: func.func @step
func.func @step() {
  // CHECK: %[[IDS:.+]] = exec.buffer inputs "input_ids" : memref<1x4xi32>
  %ids = exec.buffer inputs "input_ids" : memref<1x4xi32>
  // CHECK: %[[T:.+]] = exec.buffer parameters "model.embed_tokens.weight" {init = #exec.init<normal>, std = 2.000000e-02 : f64} : memref<8x2xf32>
  %table = exec.buffer parameters "model.embed_tokens.weight" {init = #exec.init<normal>, std = 0.02 : f64} : memref<8x2xf32>
  // CHECK: %[[G:.+]] = exec.buffer gradients "model.embed_tokens.weight" : memref<8x2xf32>
  %grad = exec.buffer gradients "model.embed_tokens.weight" : memref<8x2xf32>
  // An expert-parallel parameter and its gradient: this rank's rows of 4 shards.
  // CHECK: exec.buffer parameters "experts.w" {init = #exec.init<normal>, shards = 4 : i64, std = 2.000000e-02 : f64} : memref<2x3xf32>
  %ew = exec.buffer parameters "experts.w" {init = #exec.init<normal>, std = 0.02 : f64, shards = 4 : i64} : memref<2x3xf32>
  // CHECK: exec.buffer gradients "experts.w" {shards = 4 : i64} : memref<2x3xf32>
  %eg = exec.buffer gradients "experts.w" {shards = 4 : i64} : memref<2x3xf32>
  // CHECK: %[[E:.+]] = exec.buffer activations "act.0" offset 0 : memref<1x4x2xf32>
  %e = exec.buffer activations "act.0" offset 0 : memref<1x4x2xf32>
  // CHECK: exec.launch "embedding.forward" ins(%[[T]], %[[IDS]] : memref<8x2xf32>, memref<1x4xi32>) outs(%[[E]] : memref<1x4x2xf32>) {floats = array<f64: 1.200000e+01>, ints = array<i64: 4, 8, 2>}
  exec.launch "embedding.forward" ins(%table, %ids : memref<8x2xf32>, memref<1x4xi32>) outs(%e : memref<1x4x2xf32>) {ints = array<i64: 4, 8, 2>, floats = array<f64: 12.0>}
  // CHECK: %[[V:.+]] = exec.view %[[E]] : memref<1x4x2xf32> to memref<4x2xf32>
  %v = exec.view %e : memref<1x4x2xf32> to memref<4x2xf32>
  // CHECK: exec.view %[[T]] offset 4 : memref<8x2xf32> to memref<3x2xf32>
  %rows = exec.view %table offset 4 : memref<8x2xf32> to memref<3x2xf32>
  // CHECK: exec.launch "fill" outs(%[[G]] : memref<8x2xf32>)
  exec.launch "fill" outs(%grad : memref<8x2xf32>) {ints = array<i64: 16>, floats = array<f64: 0.0>}
  %loss = exec.buffer activations "act.1" offset 64 : memref<f32>
  exec.launch "sum_leading" ins(%v : memref<4x2xf32>) outs(%loss : memref<f32>) {ints = array<i64: 8, 1>, floats = array<f64>}
  // CHECK: exec.result "loss", %{{.+}} : memref<f32>
  exec.result "loss", %loss : memref<f32>
  return
}
