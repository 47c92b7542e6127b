// hcp-recompute: each layer keeps its checkpoints (values other layers' forward ops read) and
// the backward recomputes the rest of what it reads, right before its first use.
// RUN: hybridcp-opt %s --split-input-file --hcp-autodiff --hcp-recompute --verify-diagnostics | FileCheck %s
// RUN: hybridcp-opt %s --split-input-file --hcp-autodiff --hcp-recompute="recompute-attention=true" | FileCheck %s --check-prefix=AGAIN

// Two layers of linear + SiLU. Each SiLU gradient needs its linear's output, which is computed
// again (a clone of the linear, on the same inputs) just before the layer's backward; the layer
// outputs a0 (read by layer 1) and a1 (read by the loss) are checkpoints and are not cloned.
// CHECK-LABEL: func.func @train_step
// CHECK: %[[W0:.+]] = model.param "model.layers.0.mlp.w"
// CHECK: %[[A0:.+]] = model.silu
// CHECK: %[[W1:.+]] = model.param "model.layers.1.mlp.w"
// CHECK: model.cross_entropy %
// CHECK: %[[DA1:.+]] = model.cross_entropy_grad
// CHECK: %[[H1:.+]] = model.linear %[[A0]], %[[W1]]
// CHECK: %[[DH1:.+]] = model.silu_grad %[[DA1]], %[[H1]]
// CHECK: model.linear_grad_weight %[[DH1]], %[[A0]]
// CHECK: %[[H0:.+]] = model.linear %arg0, %[[W0]]
// CHECK: model.silu_grad %{{.+}}, %[[H0]]
// CHECK-NOT: model.silu %
// CHECK: return
func.func @train_step(%x: tensor<2x5x4xf32>, %t: tensor<2x5xi32>) -> tensor<f32> {
  %w0 = model.param "model.layers.0.mlp.w" normal(0.02) : tensor<4x4xf32> loc("model.layers.0.mlp.w")
  %h0 = model.linear %x, %w0 : (tensor<2x5x4xf32>, tensor<4x4xf32>) -> tensor<2x5x4xf32> loc("model.layers.0.mlp")
  %a0 = model.silu %h0 : tensor<2x5x4xf32> loc("model.layers.0.mlp")
  %w1 = model.param "model.layers.1.mlp.w" normal(0.02) : tensor<4x4xf32> loc("model.layers.1.mlp.w")
  %h1 = model.linear %a0, %w1 : (tensor<2x5x4xf32>, tensor<4x4xf32>) -> tensor<2x5x4xf32> loc("model.layers.1.mlp")
  %a1 = model.silu %h1 : tensor<2x5x4xf32> loc("model.layers.1.mlp")
  %sum, %count = model.cross_entropy %a1, %t {ignore_index = -100 : i64} : (tensor<2x5x4xf32>, tensor<2x5xi32>) -> (tensor<f32>, tensor<f32>) loc("loss")
  return %sum : tensor<f32>
}

// -----

// Ops outside any decoder layer (no "model.layers.N." location) are never recomputed: here
// the linear's output stays alive for the SiLU gradient, as without the pass.
// CHECK-LABEL: func.func @train_step
// CHECK: %[[H:.+]] = model.linear
// CHECK: model.cross_entropy_grad
// CHECK-NOT: model.linear %
// CHECK: model.silu_grad %{{.+}}, %[[H]]
func.func @train_step(%x: tensor<2x5x4xf32>, %t: tensor<2x5xi32>) -> tensor<f32> {
  %w = model.param "lm_head.weight" normal(0.02) : tensor<4x4xf32>
  %h = model.linear %x, %w : (tensor<2x5x4xf32>, tensor<4x4xf32>) -> tensor<2x5x4xf32> loc("lm_head")
  %a = model.silu %h : tensor<2x5x4xf32> loc("lm_head")
  %sum, %count = model.cross_entropy %a, %t {ignore_index = -100 : i64} : (tensor<2x5x4xf32>, tensor<2x5xi32>) -> (tensor<f32>, tensor<f32>) loc("loss")
  return %sum : tensor<f32>
}

// -----

// An attention layer: its output and log-sum-exp are kept (a whole attention forward is the
// layer's largest op at long context, the two results a few bytes a token), so the backward
// recomputes only the q, k and v projections that attention_grad reads, and the attention runs
// once. With recompute-attention it runs again too.
// CHECK-LABEL: func.func @train_step
// CHECK: %[[OUT:[^ ,]+]], %[[LSE:[^ ,]+]] = model.attention
// CHECK: model.cross_entropy_grad
// CHECK-NOT: model.attention %
// CHECK: %[[Q:.+]] = model.reshape {{.+}} -> tensor<1x6x2x4xf32>
// CHECK-NOT: model.attention %
// CHECK: model.attention_grad %{{.+}}, %[[Q]], %{{.+}}, %{{.+}}, %[[OUT]], %[[LSE]]
// AGAIN-LABEL: func.func @train_step
// AGAIN: model.attention %
// AGAIN: model.cross_entropy_grad
// AGAIN: %[[OUT:[^ ,]+]], %[[LSE:[^ ,]+]] = model.attention %
// AGAIN: model.attention_grad %{{.+}}, %[[OUT]], %[[LSE]]
func.func @train_step(%x: tensor<1x6x8xf32>, %t: tensor<1x6xi32>) -> tensor<f32> {
  %wq = model.param "model.layers.0.self_attn.q_proj.weight" normal(0.02) : tensor<8x8xf32> loc("model.layers.0.self_attn.q_proj.weight")
  %q0 = model.linear %x, %wq : (tensor<1x6x8xf32>, tensor<8x8xf32>) -> tensor<1x6x8xf32> loc("model.layers.0.self_attn")
  %q = model.reshape %q0 : tensor<1x6x8xf32> -> tensor<1x6x2x4xf32> loc("model.layers.0.self_attn")
  %wk = model.param "model.layers.0.self_attn.k_proj.weight" normal(0.02) : tensor<4x8xf32> loc("model.layers.0.self_attn.k_proj.weight")
  %k0 = model.linear %x, %wk : (tensor<1x6x8xf32>, tensor<4x8xf32>) -> tensor<1x6x4xf32> loc("model.layers.0.self_attn")
  %k = model.reshape %k0 : tensor<1x6x4xf32> -> tensor<1x6x1x4xf32> loc("model.layers.0.self_attn")
  %wv = model.param "model.layers.0.self_attn.v_proj.weight" normal(0.02) : tensor<4x8xf32> loc("model.layers.0.self_attn.v_proj.weight")
  %v0 = model.linear %x, %wv : (tensor<1x6x8xf32>, tensor<4x8xf32>) -> tensor<1x6x4xf32> loc("model.layers.0.self_attn")
  %v = model.reshape %v0 : tensor<1x6x4xf32> -> tensor<1x6x1x4xf32> loc("model.layers.0.self_attn")
  %out, %lse = model.attention %q, %k, %v {causal, scale = 0.25 : f64} : (tensor<1x6x2x4xf32>, tensor<1x6x1x4xf32>, tensor<1x6x1x4xf32>) -> (tensor<1x6x2x4xf32>, tensor<1x2x6xf32>) loc("model.layers.0.self_attn")
  %o0 = model.reshape %out : tensor<1x6x2x4xf32> -> tensor<1x6x8xf32> loc("model.layers.0.self_attn")
  %wo = model.param "model.layers.0.self_attn.o_proj.weight" normal(0.02) : tensor<8x8xf32> loc("model.layers.0.self_attn.o_proj.weight")
  %h = model.linear %o0, %wo : (tensor<1x6x8xf32>, tensor<8x8xf32>) -> tensor<1x6x8xf32> loc("model.layers.0.self_attn")
  %sum, %count = model.cross_entropy %h, %t {ignore_index = -100 : i64} : (tensor<1x6x8xf32>, tensor<1x6xi32>) -> (tensor<f32>, tensor<f32>) loc("loss")
  return %sum : tensor<f32>
}
