// hcp-reduce-loss: the loss is the global sum over valid tokens over the global count.
// RUN: hybridcp-opt %s --hcp-reduce-loss | FileCheck %s

// Both the summed loss and the valid-token count are summed over the cp group before dividing.
// CHECK-LABEL: func.func @loss
// CHECK: %[[SUM:.+]], %[[COUNT:.+]] = model.cross_entropy
// CHECK-DAG: %[[GSUM:.+]] = dist.all_reduce %[[SUM]] <cp> : tensor<f32>
// CHECK-DAG: %[[GCOUNT:.+]] = dist.all_reduce %[[COUNT]] <cp> : tensor<f32>
// CHECK: model.div %[[GSUM]], %[[GCOUNT]]
module attributes {dist.sequence = #dist.sequence<contiguous, cp = 2, seq = 8>} {
func.func @loss(%logits: tensor<1x4x8xf32>, %targets: tensor<1x4xi32>) -> tensor<f32> {
  %s, %c = model.cross_entropy %logits, %targets {ignore_index = -100 : i64} : (tensor<1x4x8xf32>, tensor<1x4xi32>) -> (tensor<f32>, tensor<f32>)
  %loss = model.div %s, %c : tensor<f32>, tensor<f32>
  return %loss : tensor<f32>
}
}
