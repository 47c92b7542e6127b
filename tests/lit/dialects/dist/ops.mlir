// Every `dist` op and attribute parses, verifies and prints back, also through the generic form
// and bytecode.
// RUN: hybridcp-opt %s | FileCheck %s
// RUN: hybridcp-opt %s --mlir-print-op-generic | hybridcp-opt | FileCheck %s
// RUN: hybridcp-opt %s --emit-bytecode | hybridcp-opt | FileCheck %s

// The mesh and the sequence layout live on the module.
// CHECK: module attributes {dist.mesh = #dist.mesh<cp = 2, dp = 1>, dist.sequence = #dist.sequence<zigzag, cp = 2, seq = 24>}
module attributes {dist.mesh = #dist.mesh<cp = 2, dp = 1>, dist.sequence = #dist.sequence<zigzag, cp = 2, seq = 24>} {

// The Mamba collectives over segment rows (batch 1, 2 segments per rank of 6 tokens) and their
// transposes.
// CHECK-LABEL: func.func @mamba
func.func @mamba(%x: tensor<2x6x10xf32>, %g: tensor<2x4xf32>, %s: tensor<2x4x3x5xf32>) -> (tensor<2x6x10xf32>, tensor<2x4xf32>, tensor<2x4x3x5xf32>) {
  // CHECK: %[[H:.+]] = dist.halo_exchange %{{.+}} {layout = #dist.sequence<zigzag, cp = 2, seq = 24>, width = 3 : i64} : tensor<2x6x10xf32> -> tensor<2x3x10xf32>
  %h = dist.halo_exchange %x {layout = #dist.sequence<zigzag, cp = 2, seq = 24>, width = 3 : i64} : tensor<2x6x10xf32> -> tensor<2x3x10xf32>
  // CHECK: dist.halo_exchange_grad %[[H]] {layout = #dist.sequence<zigzag, cp = 2, seq = 24>} : tensor<2x3x10xf32> -> tensor<2x6x10xf32>
  %dx = dist.halo_exchange_grad %h {layout = #dist.sequence<zigzag, cp = 2, seq = 24>} : tensor<2x3x10xf32> -> tensor<2x6x10xf32>
  // CHECK: %[[SIN:.+]] = dist.state_scan %{{.+}}, %{{.+}} {layout = #dist.sequence<zigzag, cp = 2, seq = 24>, strategy = #dist.strategy<chain>}
  %sin = dist.state_scan %g, %s {layout = #dist.sequence<zigzag, cp = 2, seq = 24>, strategy = #dist.strategy<chain>} : (tensor<2x4xf32>, tensor<2x4x3x5xf32>) -> tensor<2x4x3x5xf32>
  // CHECK: dist.state_scan_grad %[[SIN]], %{{.+}}, %[[SIN]] {layout = #dist.sequence<zigzag, cp = 2, seq = 24>, strategy = #dist.strategy<allgather>}
  %dg, %ds = dist.state_scan_grad %sin, %g, %sin {layout = #dist.sequence<zigzag, cp = 2, seq = 24>, strategy = #dist.strategy<allgather>} : (tensor<2x4x3x5xf32>, tensor<2x4xf32>, tensor<2x4x3x5xf32>) -> (tensor<2x4xf32>, tensor<2x4x3x5xf32>)
  return %dx, %dg, %ds : tensor<2x6x10xf32>, tensor<2x4xf32>, tensor<2x4x3x5xf32>
}

// Ring attention over the rank's 12 local tokens, its transpose, and an all-reduce per group.
// CHECK-LABEL: func.func @attention
func.func @attention(%q: tensor<1x12x4x8xf32>, %k: tensor<1x12x2x8xf32>, %loss: tensor<f32>) -> (tensor<1x12x4x8xf32>, tensor<f32>) {
  // CHECK: %[[O:.+]], %[[L:.+]] = dist.ring_attention %{{.+}}, %{{.+}}, %{{.+}} {causal, layout = #dist.sequence<zigzag, cp = 2, seq = 24>, scale = 1.000000e-01 : f64}
  %o, %l = dist.ring_attention %q, %k, %k {causal, layout = #dist.sequence<zigzag, cp = 2, seq = 24>, scale = 0.1 : f64} : (tensor<1x12x4x8xf32>, tensor<1x12x2x8xf32>, tensor<1x12x2x8xf32>) -> (tensor<1x12x4x8xf32>, tensor<1x4x12xf32>)
  // CHECK: dist.ring_attention_grad %[[O]], %{{.+}}, %{{.+}}, %{{.+}}, %[[O]], %[[L]]
  %dq, %dk, %dv = dist.ring_attention_grad %o, %q, %k, %k, %o, %l {causal, layout = #dist.sequence<zigzag, cp = 2, seq = 24>, scale = 0.1 : f64} : (tensor<1x12x4x8xf32>, tensor<1x12x4x8xf32>, tensor<1x12x2x8xf32>, tensor<1x12x2x8xf32>, tensor<1x12x4x8xf32>, tensor<1x4x12xf32>) -> (tensor<1x12x4x8xf32>, tensor<1x12x2x8xf32>, tensor<1x12x2x8xf32>)
  // CHECK: dist.all_reduce %{{.+}} <cp> : tensor<f32>
  %a = dist.all_reduce %loss <cp> : tensor<f32>
  // CHECK: dist.all_reduce %{{.+}} <world> : tensor<f32>
  %b = dist.all_reduce %a <world> : tensor<f32>
  // CHECK: dist.all_reduce %{{.+}} <dp> : tensor<f32>
  %c = dist.all_reduce %b <dp> : tensor<f32>
  return %dq, %c : tensor<1x12x4x8xf32>, tensor<f32>
}

// The experts split over ep = 4 ranks: this rank's 2 of 8 experts (hidden 4, width 5), tokens
// routed among all 8; and the transpose.
// CHECK-LABEL: func.func @experts
func.func @experts(%x: tensor<1x6x4xf32>, %g: tensor<1x6x2xf32>, %i: tensor<1x6x2xi32>, %win: tensor<2x10x4xf32>, %wout: tensor<2x4x5xf32>) -> (tensor<1x6x4xf32>, tensor<2x10x4xf32>) {
  // CHECK: %[[Y:.+]] = dist.moe_experts %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}} {ep = 4 : i64, num_experts = 8 : i64} : (tensor<1x6x4xf32>, tensor<1x6x2xf32>, tensor<1x6x2xi32>, tensor<2x10x4xf32>, tensor<2x4x5xf32>) -> tensor<1x6x4xf32>
  %y = dist.moe_experts %x, %g, %i, %win, %wout {num_experts = 8 : i64, ep = 4 : i64} : (tensor<1x6x4xf32>, tensor<1x6x2xf32>, tensor<1x6x2xi32>, tensor<2x10x4xf32>, tensor<2x4x5xf32>) -> tensor<1x6x4xf32>
  // CHECK: dist.moe_experts_grad %[[Y]], %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}} {ep = 4 : i64, num_experts = 8 : i64} : (tensor<1x6x4xf32>, tensor<1x6x4xf32>, tensor<1x6x2xf32>, tensor<1x6x2xi32>, tensor<2x10x4xf32>, tensor<2x4x5xf32>) -> (tensor<1x6x4xf32>, tensor<1x6x2xf32>, tensor<2x10x4xf32>, tensor<2x4x5xf32>)
  %dx, %dg, %dwin, %dwout = dist.moe_experts_grad %y, %x, %g, %i, %win, %wout {num_experts = 8 : i64, ep = 4 : i64} : (tensor<1x6x4xf32>, tensor<1x6x4xf32>, tensor<1x6x2xf32>, tensor<1x6x2xi32>, tensor<2x10x4xf32>, tensor<2x4x5xf32>) -> (tensor<1x6x4xf32>, tensor<1x6x2xf32>, tensor<2x10x4xf32>, tensor<2x4x5xf32>)
  return %dx, %dwin : tensor<1x6x4xf32>, tensor<2x10x4xf32>
}

// Meshes with data and expert parallelism (on nested modules); ep = 1 is not printed.
// CHECK: module attributes {dist.mesh = #dist.mesh<cp = 2, dp = 4, ep = 8>}
module attributes {dist.mesh = #dist.mesh<cp = 2, dp = 4, ep = 8>} {}
// CHECK: module attributes {dist.mesh = #dist.mesh<cp = 1, dp = 4>}
module attributes {dist.mesh = #dist.mesh<cp = 1, dp = 4, ep = 1>} {}
}
