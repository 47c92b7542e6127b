// hcp-insert-halo-exchange: conv1d over segment rows, fed the previous segment's tail.
// RUN: hybridcp-opt %s --split-input-file --hcp-insert-halo-exchange | FileCheck %s

// Contiguous: one segment per rank, so the rows are the batch rows; the halo is d_conv - 1 = 3
// rows of the 10 conv channels per row.
// CHECK-LABEL: func.func @contiguous
// CHECK: %[[H:.+]] = dist.halo_exchange %[[X:.+]] {layout = #dist.sequence<contiguous, cp = 2, seq = 16>, width = 3 : i64} : tensor<2x8x10xf32> -> tensor<2x3x10xf32>
// CHECK: model.causal_conv1d %[[X]], %{{.+}}, %{{.+}} halo %[[H]] : (tensor<2x8x10xf32>, tensor<10x1x4xf32>, tensor<10xf32>, tensor<2x3x10xf32>) -> tensor<2x8x10xf32>
// CHECK-NOT: model.reshape
module attributes {dist.sequence = #dist.sequence<contiguous, cp = 2, seq = 16>} {
func.func @contiguous(%x: tensor<2x8x10xf32>, %w: tensor<10x1x4xf32>, %b: tensor<10xf32>) -> tensor<2x8x10xf32> {
  %y = model.causal_conv1d %x, %w, %b : (tensor<2x8x10xf32>, tensor<10x1x4xf32>, tensor<10xf32>) -> tensor<2x8x10xf32>
  return %y : tensor<2x8x10xf32>
}
}

// -----

// Zigzag: the rank's 8 tokens are two segments of 4; viewed as 2 * 2 rows of 4, each row gets
// its own halo, and the result is viewed back.
// CHECK-LABEL: func.func @zigzag
// CHECK: %[[R:.+]] = model.reshape %{{.+}} : tensor<2x8x10xf32> -> tensor<4x4x10xf32>
// CHECK: %[[H:.+]] = dist.halo_exchange %[[R]] {{.+}} : tensor<4x4x10xf32> -> tensor<4x3x10xf32>
// CHECK: %[[Y:.+]] = model.causal_conv1d %[[R]], %{{.+}}, %{{.+}} halo %[[H]]
// CHECK: %[[B:.+]] = model.reshape %[[Y]] : tensor<4x4x10xf32> -> tensor<2x8x10xf32>
// CHECK: return %[[B]]
module attributes {dist.sequence = #dist.sequence<zigzag, cp = 2, seq = 16>} {
func.func @zigzag(%x: tensor<2x8x10xf32>, %w: tensor<10x1x4xf32>, %b: tensor<10xf32>) -> tensor<2x8x10xf32> {
  %y = model.causal_conv1d %x, %w, %b : (tensor<2x8x10xf32>, tensor<10x1x4xf32>, tensor<10xf32>) -> tensor<2x8x10xf32>
  return %y : tensor<2x8x10xf32>
}
}

// -----

// An unsharded module is left alone.
// CHECK-LABEL: func.func @unsharded
// CHECK-NOT: dist.
func.func @unsharded(%x: tensor<2x8x10xf32>, %w: tensor<10x1x4xf32>, %b: tensor<10xf32>) -> tensor<2x8x10xf32> {
  %y = model.causal_conv1d %x, %w, %b : (tensor<2x8x10xf32>, tensor<10x1x4xf32>, tensor<10xf32>) -> tensor<2x8x10xf32>
  return %y : tensor<2x8x10xf32>
}
