// hcp-insert-expert-parallel: every MoE layer keeps this rank's experts and exchanges tokens with
// its ep group; the routing stays local.
// RUN: hybridcp-opt %s --split-input-file --hcp-insert-expert-parallel="ep=4" --verify-diagnostics | FileCheck %s --enable-var-scope

// Two layers of 8 experts (hidden 4, width 5) over ep = 4: each weight becomes this rank's 2
// experts under the same checkpoint name (shards 4); the router still picks among all 8.
// CHECK-LABEL: func.func @train_step
// CHECK: %[[G:.+]], %[[I:.+]] = model.moe_route %{{.+}} {top_k = 2 : i64} : tensor<1x6x8xf32> -> tensor<1x6x2xf32>, tensor<1x6x2xi32>
// CHECK-DAG: %[[WIN:.+]] = model.param "layers.0.input_linear.weight" normal(2.000000e-02) shards 4 : tensor<2x10x4xf32>
// CHECK-DAG: %[[WOUT:.+]] = model.param "layers.0.output_linear.weight" normal(2.000000e-02) shards 4 : tensor<2x4x5xf32>
// CHECK: %[[Y:.+]] = dist.moe_experts %{{.+}}, %[[G]], %[[I]], %[[WIN]], %[[WOUT]] {ep = 4 : i64, num_experts = 8 : i64} : (tensor<1x6x4xf32>, tensor<1x6x2xf32>, tensor<1x6x2xi32>, tensor<2x10x4xf32>, tensor<2x4x5xf32>) -> tensor<1x6x4xf32>
// CHECK: model.param "layers.1.input_linear.weight" normal(2.000000e-02) shards 4 : tensor<2x10x4xf32>
// CHECK: dist.moe_experts %[[Y]], {{.+}} {ep = 4 : i64, num_experts = 8 : i64}
// CHECK-NOT: model.moe_experts
module attributes {dist.mesh = #dist.mesh<cp = 2, dp = 2, ep = 4>} {
func.func @train_step(%x: tensor<1x6x4xf32>) -> tensor<1x6x4xf32> {
  %router = model.param "layers.0.router.weight" normal(0.02) : tensor<8x4xf32>
  %logits = model.linear %x, %router : (tensor<1x6x4xf32>, tensor<8x4xf32>) -> tensor<1x6x8xf32>
  %g, %i = model.moe_route %logits {top_k = 2 : i64} : tensor<1x6x8xf32> -> tensor<1x6x2xf32>, tensor<1x6x2xi32>
  %win = model.param "layers.0.input_linear.weight" normal(0.02) : tensor<8x10x4xf32>
  %wout = model.param "layers.0.output_linear.weight" normal(0.02) : tensor<8x4x5xf32>
  %y = model.moe_experts %x, %g, %i, %win, %wout : (tensor<1x6x4xf32>, tensor<1x6x2xf32>, tensor<1x6x2xi32>, tensor<8x10x4xf32>, tensor<8x4x5xf32>) -> tensor<1x6x4xf32>
  %win1 = model.param "layers.1.input_linear.weight" normal(0.02) : tensor<8x10x4xf32>
  %wout1 = model.param "layers.1.output_linear.weight" normal(0.02) : tensor<8x4x5xf32>
  %z = model.moe_experts %y, %g, %i, %win1, %wout1 : (tensor<1x6x4xf32>, tensor<1x6x2xf32>, tensor<1x6x2xi32>, tensor<8x10x4xf32>, tensor<8x4x5xf32>) -> tensor<1x6x4xf32>
  return %z : tensor<1x6x4xf32>
}
}

// -----

// The experts must split evenly; nothing changes when they do not.
module attributes {dist.mesh = #dist.mesh<cp = 4, dp = 1, ep = 4>} {
func.func @train_step(%x: tensor<6x4xf32>, %g: tensor<6x2xf32>, %i: tensor<6x2xi32>) -> tensor<6x4xf32> {
  %win = model.param "w_in" normal(0.02) : tensor<6x10x4xf32>
  %wout = model.param "w_out" normal(0.02) : tensor<6x4x5xf32>
  // expected-error @+1 {{6 experts cannot be split over ep=4 ranks}}
  %y = model.moe_experts %x, %g, %i, %win, %wout : (tensor<6x4xf32>, tensor<6x2xf32>, tensor<6x2xi32>, tensor<6x10x4xf32>, tensor<6x4x5xf32>) -> tensor<6x4xf32>
  return %y : tensor<6x4xf32>
}
}

// -----

// A dense model has no experts to split.
// expected-error @+1 {{ep=4 splits the experts of a mixture-of-experts model, but this model has no experts (it is dense): leave ep at 1}}
module attributes {dist.mesh = #dist.mesh<cp = 4, dp = 1, ep = 4>} {
func.func @train_step(%x: tensor<6x4xf32>) -> tensor<6x4xf32> {
  return %x : tensor<6x4xf32>
}
}

// -----

// The ranks come from the module's mesh (hcp-set-mesh).
// expected-error @+1 {{expert parallelism needs the module's mesh: run hcp-set-mesh with ep=4 first}}
module {
func.func @train_step(%x: tensor<6x4xf32>, %g: tensor<6x2xf32>, %i: tensor<6x2xi32>, %win: tensor<8x10x4xf32>, %wout: tensor<8x4x5xf32>) -> tensor<6x4xf32> {
  %y = model.moe_experts %x, %g, %i, %win, %wout : (tensor<6x4xf32>, tensor<6x2xf32>, tensor<6x2xi32>, tensor<8x10x4xf32>, tensor<8x4x5xf32>) -> tensor<6x4xf32>
  return %y : tensor<6x4xf32>
}
}

// -----

// The mesh and the pass agree on ep.
// expected-error @+1 {{the module's mesh has ep=2, but the experts are to be split over ep=4}}
module attributes {dist.mesh = #dist.mesh<cp = 4, dp = 1, ep = 2>} {
func.func @train_step(%x: tensor<6x4xf32>, %g: tensor<6x2xf32>, %i: tensor<6x2xi32>, %win: tensor<8x10x4xf32>, %wout: tensor<8x4x5xf32>) -> tensor<6x4xf32> {
  %y = model.moe_experts %x, %g, %i, %win, %wout : (tensor<6x4xf32>, tensor<6x2xf32>, tensor<6x2xi32>, tensor<8x10x4xf32>, tensor<8x4x5xf32>) -> tensor<6x4xf32>
  return %y : tensor<6x4xf32>
}
}

// -----

// Expert weights must be parameters, read by MoE layers only.
module attributes {dist.mesh = #dist.mesh<cp = 4, dp = 1, ep = 4>} {
func.func @train_step(%x: tensor<6x4xf32>, %g: tensor<6x2xf32>, %i: tensor<6x2xi32>, %wout: tensor<8x4x5xf32>) -> tensor<6x4xf32> {
  // expected-error @+1 {{parameter 'w_in' is read by something other than an MoE layer's weights: it cannot be split over the experts}}
  %win = model.param "w_in" normal(0.02) : tensor<8x10x4xf32>
  %s = model.scale %win {factor = 2.0 : f64} : tensor<8x10x4xf32>
  %y = model.moe_experts %x, %g, %i, %win, %wout : (tensor<6x4xf32>, tensor<6x2xf32>, tensor<6x2xi32>, tensor<8x10x4xf32>, tensor<8x4x5xf32>) -> tensor<6x4xf32>
  return %y : tensor<6x4xf32>
}
}
