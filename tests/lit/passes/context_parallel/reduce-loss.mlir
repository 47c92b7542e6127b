// hcp-reduce-loss: the loss is the global sum over valid tokens over the global count.
// RUN: hybridcp-opt %s --split-input-file --hcp-reduce-loss | FileCheck %s

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

// -----

// The load-balancing loss reads the routing statistics of the whole micro-batch: the rank's sums
// are summed over the cp group right before it, once.
// CHECK-LABEL: func.func @router_aux_loss
// CHECK: %[[P:.+]], %[[C:.+]] = model.router_load
// CHECK-DAG: %[[GP:.+]] = dist.all_reduce %[[P]] <cp> : tensor<4xf32>
// CHECK-DAG: %[[GC:.+]] = dist.all_reduce %[[C]] <cp> : tensor<4xf32>
// CHECK: model.router_aux_loss %[[GP]], %[[GC]]
// CHECK-NOT: dist.all_reduce
module attributes {dist.sequence = #dist.sequence<contiguous, cp = 2, seq = 8>} {
func.func @router_aux_loss(%logits: tensor<1x4x4xf32>, %i: tensor<1x4x2xi32>) -> tensor<f32> {
  %p, %c = model.router_load %logits, %i : (tensor<1x4x4xf32>, tensor<1x4x2xi32>) -> (tensor<4xf32>, tensor<4xf32>)
  %aux = model.router_aux_loss %p, %c {scale = 0.0625 : f64} : (tensor<4xf32>, tensor<4xf32>) -> tensor<f32>
  return %aux : tensor<f32>
}
}
