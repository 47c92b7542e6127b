// hcp-insert-ring-attention: attention over the whole sequence from the rank's local queries.
// RUN: hybridcp-opt %s --hcp-insert-ring-attention | FileCheck %s

// The op keeps its operands, scale and causality; K/V blocks of [1, 8, 2, 4] travel the ring.
// CHECK-LABEL: func.func @attention
// CHECK-NOT: model.attention
// CHECK: %[[O:.+]], %{{.+}} = dist.ring_attention %{{.+}}, %{{.+}}, %{{.+}} {causal, layout = #dist.sequence<zigzag, cp = 2, seq = 16>, scale = 1.250000e-01 : f64} : (tensor<1x8x4x4xf32>, tensor<1x8x2x4xf32>, tensor<1x8x2x4xf32>) -> (tensor<1x8x4x4xf32>, tensor<1x4x8xf32>)
// CHECK: return %[[O]]
module attributes {dist.sequence = #dist.sequence<zigzag, cp = 2, seq = 16>} {
func.func @attention(%q: tensor<1x8x4x4xf32>, %k: tensor<1x8x2x4xf32>, %v: tensor<1x8x2x4xf32>) -> tensor<1x8x4x4xf32> {
  %o, %lse = model.attention %q, %k, %v {causal, scale = 0.125 : f64} : (tensor<1x8x4x4xf32>, tensor<1x8x2x4xf32>, tensor<1x8x2x4xf32>) -> (tensor<1x8x4x4xf32>, tensor<1x4x8xf32>)
  return %o : tensor<1x8x4x4xf32>
}
}
