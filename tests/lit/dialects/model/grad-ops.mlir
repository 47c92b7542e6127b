// Every `model` gradient op parses, verifies and prints back to the same text, also through the
// generic form and bytecode.
// RUN: hybridcp-opt %s --split-input-file | FileCheck %s
// RUN: hybridcp-opt %s --split-input-file | hybridcp-opt --split-input-file | FileCheck %s
// RUN: hybridcp-opt %s --split-input-file --mlir-print-op-generic | hybridcp-opt --split-input-file | FileCheck %s
// RUN: hybridcp-opt %s --emit-bytecode | hybridcp-opt | FileCheck %s

// model.fill: the loss seed and zeros of any shape and float type.
// CHECK-LABEL: func.func @fill
func.func @fill() -> (tensor<f32>, tensor<2x5x3xbf16>) {
  // CHECK: model.fill 1.000000e+00 : tensor<f32>
  %seed = model.fill 1.0 : tensor<f32>
  // CHECK: model.fill 0.000000e+00 : tensor<2x5x3xbf16>
  %zeros = model.fill 0.0 : tensor<2x5x3xbf16>
  return %seed, %zeros : tensor<f32>, tensor<2x5x3xbf16>
}

// -----

// sum_leading reduces to the trailing dims (a bias, a scalar); concat joins along the last dim.
// CHECK-LABEL: func.func @broadcast_and_split
func.func @broadcast_and_split(%d: tensor<2x5x6xf32>, %a: tensor<2x5x2xf32>)
    -> (tensor<6xf32>, tensor<f32>, tensor<2x5x8xf32>) {
  // CHECK: model.sum_leading %{{.+}} : tensor<2x5x6xf32> -> tensor<6xf32>
  %bias = model.sum_leading %d : tensor<2x5x6xf32> -> tensor<6xf32>
  // CHECK: model.sum_leading %{{.+}} : tensor<2x5x6xf32> -> tensor<f32>
  %scalar = model.sum_leading %d : tensor<2x5x6xf32> -> tensor<f32>
  // CHECK: model.concat %[[A:.+]], %{{.+}} : tensor<2x5x2xf32>, tensor<2x5x6xf32> -> tensor<2x5x8xf32>
  %c = model.concat %a, %d : tensor<2x5x2xf32>, tensor<2x5x6xf32> -> tensor<2x5x8xf32>
  return %bias, %scalar, %c : tensor<6xf32>, tensor<f32>, tensor<2x5x8xf32>
}

// -----

// The two gradients of y = x W^T: dx = dy W and dW = dy^T x over all leading dims.
// CHECK-LABEL: func.func @linear_grads
func.func @linear_grads(%dy: tensor<2x5x6xf32>, %w: tensor<6x4xf32>, %x: tensor<2x5x4xf32>)
    -> (tensor<2x5x4xf32>, tensor<6x4xf32>) {
  // CHECK: model.linear_grad_input %{{.+}}, %{{.+}} : (tensor<2x5x6xf32>, tensor<6x4xf32>) -> tensor<2x5x4xf32>
  %dx = model.linear_grad_input %dy, %w : (tensor<2x5x6xf32>, tensor<6x4xf32>) -> tensor<2x5x4xf32>
  // CHECK: model.linear_grad_weight %{{.+}}, %{{.+}} : (tensor<2x5x6xf32>, tensor<2x5x4xf32>) -> tensor<6x4xf32>
  %dw = model.linear_grad_weight %dy, %x : (tensor<2x5x6xf32>, tensor<2x5x4xf32>) -> tensor<6x4xf32>
  return %dx, %dw : tensor<2x5x4xf32>, tensor<6x4xf32>
}

// -----

// The embedding's table gradient, with and without a padding row; the vocabulary comes from the
// result type.
// CHECK-LABEL: func.func @embedding_grad
func.func @embedding_grad(%dy: tensor<2x5x4xf32>, %ids: tensor<2x5xi32>)
    -> (tensor<8x4xf32>, tensor<8x4xf32>) {
  // CHECK: model.embedding_grad %{{.+}}, %{{.+}} {multiplier = 1.200000e+01 : f64, padding_idx = 3 : i64} : (tensor<2x5x4xf32>, tensor<2x5xi32>) -> tensor<8x4xf32>
  %a = model.embedding_grad %dy, %ids {multiplier = 12.0 : f64, padding_idx = 3 : i64} : (tensor<2x5x4xf32>, tensor<2x5xi32>) -> tensor<8x4xf32>
  // CHECK: model.embedding_grad %{{.+}}, %{{.+}} {multiplier = 1.000000e+00 : f64} : (tensor<2x5x4xf32>, tensor<2x5xi32>) -> tensor<8x4xf32>
  %b = model.embedding_grad %dy, %ids {multiplier = 1.0 : f64} : (tensor<2x5x4xf32>, tensor<2x5xi32>) -> tensor<8x4xf32>
  return %a, %b : tensor<8x4xf32>, tensor<8x4xf32>
}

// -----

// Norm gradients: (dx, dw) for RMSNorm, (dy, dgate, dw) for the Mamba2 gated norm.
// CHECK-LABEL: func.func @norm_grads
func.func @norm_grads(%d: tensor<2x5x4xbf16>, %x: tensor<2x5x4xbf16>, %w: tensor<4xbf16>,
                      %g: tensor<2x5x4xbf16>)
    -> (tensor<2x5x4xbf16>, tensor<4xbf16>, tensor<2x5x4xbf16>, tensor<2x5x4xbf16>, tensor<4xbf16>) {
  // CHECK: %[[DX:.+]], %[[DW:.+]] = model.rms_norm_grad %{{.+}}, %{{.+}}, %{{.+}} {eps = 1.000000e-05 : f64} : (tensor<2x5x4xbf16>, tensor<2x5x4xbf16>, tensor<4xbf16>) -> (tensor<2x5x4xbf16>, tensor<4xbf16>)
  %dx, %dw = model.rms_norm_grad %d, %x, %w {eps = 1.0e-5 : f64} : (tensor<2x5x4xbf16>, tensor<2x5x4xbf16>, tensor<4xbf16>) -> (tensor<2x5x4xbf16>, tensor<4xbf16>)
  // CHECK: %[[DY:.+]], %[[DG:.+]], %[[DW2:.+]] = model.gated_rms_norm_grad %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}} {eps = 1.000000e-05 : f64} : (tensor<2x5x4xbf16>, tensor<2x5x4xbf16>, tensor<2x5x4xbf16>, tensor<4xbf16>) -> (tensor<2x5x4xbf16>, tensor<2x5x4xbf16>, tensor<4xbf16>)
  %dy, %dg, %dw2 = model.gated_rms_norm_grad %d, %x, %g, %w {eps = 1.0e-5 : f64} : (tensor<2x5x4xbf16>, tensor<2x5x4xbf16>, tensor<2x5x4xbf16>, tensor<4xbf16>) -> (tensor<2x5x4xbf16>, tensor<2x5x4xbf16>, tensor<4xbf16>)
  // CHECK: return %[[DX]], %[[DW]], %[[DY]], %[[DG]], %[[DW2]]
  return %dx, %dw, %dy, %dg, %dw2 : tensor<2x5x4xbf16>, tensor<4xbf16>, tensor<2x5x4xbf16>, tensor<2x5x4xbf16>, tensor<4xbf16>
}

// -----

// Elementwise gradients; neg_exp_grad reads the forward result, swiglu_grad the packed input.
// CHECK-LABEL: func.func @elementwise_grads
func.func @elementwise_grads(%d: tensor<2x6xf32>, %x: tensor<2x6xf32>, %h: tensor<2x3xf32>)
    -> (tensor<2x6xf32>, tensor<2x6xf32>, tensor<2x6xf32>, tensor<2x6xf32>) {
  // CHECK: model.silu_grad %{{.+}}, %{{.+}} : tensor<2x6xf32>
  %a = model.silu_grad %d, %x : tensor<2x6xf32>
  // CHECK: model.softplus_grad %{{.+}}, %{{.+}} : tensor<2x6xf32>
  %b = model.softplus_grad %d, %x : tensor<2x6xf32>
  // CHECK: model.neg_exp_grad %{{.+}}, %{{.+}} : tensor<2x6xf32>
  %c = model.neg_exp_grad %d, %x : tensor<2x6xf32>
  // CHECK: model.swiglu_grad %{{.+}}, %{{.+}} : (tensor<2x3xf32>, tensor<2x6xf32>) -> tensor<2x6xf32>
  %e = model.swiglu_grad %h, %x : (tensor<2x3xf32>, tensor<2x6xf32>) -> tensor<2x6xf32>
  return %a, %b, %c, %e : tensor<2x6xf32>, tensor<2x6xf32>, tensor<2x6xf32>, tensor<2x6xf32>
}

// -----

// The conv's gradients: input, weight in the checkpoint's [C, 1, K] shape, bias [C].
// CHECK-LABEL: func.func @conv_grad
func.func @conv_grad(%dy: tensor<1x7x10xf32>, %x: tensor<1x7x10xf32>, %w: tensor<10x1x4xf32>)
    -> (tensor<1x7x10xf32>, tensor<10x1x4xf32>, tensor<10xf32>) {
  // CHECK: model.causal_conv1d_grad %{{.+}}, %{{.+}}, %{{.+}} : (tensor<1x7x10xf32>, tensor<1x7x10xf32>, tensor<10x1x4xf32>) -> (tensor<1x7x10xf32>, tensor<10x1x4xf32>, tensor<10xf32>)
  %dx, %dw, %db = model.causal_conv1d_grad %dy, %x, %w : (tensor<1x7x10xf32>, tensor<1x7x10xf32>, tensor<10x1x4xf32>) -> (tensor<1x7x10xf32>, tensor<10x1x4xf32>, tensor<10xf32>)
  return %dx, %dw, %db : tensor<1x7x10xf32>, tensor<10x1x4xf32>, tensor<10xf32>
}

// -----

// The SSD scan's gradient in all four forms: plain, with a final-state gradient, with an initial
// state (and its gradient as a seventh result), with both.
// CHECK-LABEL: func.func @ssd_scan_grad
func.func @ssd_scan_grad(%dy: tensor<1x7x4x2xf32>, %x: tensor<1x7x4x2xf32>, %dt: tensor<1x7x4xf32>,
                         %A: tensor<4xf32>, %B: tensor<1x7x2x3xf32>, %C: tensor<1x7x2x3xf32>,
                         %D: tensor<4xf32>, %s0: tensor<1x4x2x3xf32>, %df: tensor<1x4x2x3xf32>)
    -> (tensor<1x4x2x3xf32>, tensor<1x4x2x3xf32>) {
  // CHECK: model.ssd_scan_grad %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}} {chunk_size = 4 : i64} : (tensor<1x7x4x2xf32>, tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x7x2x3xf32>, tensor<4xf32>) -> (tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x7x2x3xf32>, tensor<4xf32>)
  %a:6 = model.ssd_scan_grad %dy, %x, %dt, %A, %B, %C, %D {chunk_size = 4 : i64} : (tensor<1x7x4x2xf32>, tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x7x2x3xf32>, tensor<4xf32>) -> (tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x7x2x3xf32>, tensor<4xf32>)
  // CHECK: model.ssd_scan_grad {{.+}} dfinal %{{.+}} {chunk_size = 4 : i64} : {{.+}} -> (tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x7x2x3xf32>, tensor<4xf32>)
  %b:6 = model.ssd_scan_grad %dy, %x, %dt, %A, %B, %C, %D dfinal %df {chunk_size = 4 : i64} : (tensor<1x7x4x2xf32>, tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x7x2x3xf32>, tensor<4xf32>, tensor<1x4x2x3xf32>) -> (tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x7x2x3xf32>, tensor<4xf32>)
  // CHECK: , %[[DINIT:[^ ,]+]] = model.ssd_scan_grad {{.+}} init %{{.+}} {chunk_size = 4 : i64} : {{.+}} -> (tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x7x2x3xf32>, tensor<4xf32>, tensor<1x4x2x3xf32>)
  %c:7 = model.ssd_scan_grad %dy, %x, %dt, %A, %B, %C, %D init %s0 {chunk_size = 4 : i64} : (tensor<1x7x4x2xf32>, tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x7x2x3xf32>, tensor<4xf32>, tensor<1x4x2x3xf32>) -> (tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x7x2x3xf32>, tensor<4xf32>, tensor<1x4x2x3xf32>)
  // CHECK: , %[[DINIT2:[^ ,]+]] = model.ssd_scan_grad {{.+}} init %{{.+}} dfinal %{{.+}} {chunk_size = 4 : i64}
  %e:7 = model.ssd_scan_grad %dy, %x, %dt, %A, %B, %C, %D init %s0 dfinal %df {chunk_size = 4 : i64} : (tensor<1x7x4x2xf32>, tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x7x2x3xf32>, tensor<4xf32>, tensor<1x4x2x3xf32>, tensor<1x4x2x3xf32>) -> (tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x7x2x3xf32>, tensor<4xf32>, tensor<1x4x2x3xf32>)
  // CHECK: return %[[DINIT]], %[[DINIT2]]
  return %c#6, %e#6 : tensor<1x4x2x3xf32>, tensor<1x4x2x3xf32>
}

// -----

// The correction's gradient takes the output gradient first and returns ddt, dA, dC, dinit.
// CHECK-LABEL: func.func @ssd_add_initial_state_grad
func.func @ssd_add_initial_state_grad(%d: tensor<1x7x4x2xbf16>, %dt: tensor<1x7x4xf32>, %A: tensor<4xf32>,
                                      %C: tensor<1x7x2x3xbf16>, %s: tensor<1x4x2x3xf32>) -> tensor<1x4x2x3xf32> {
  // CHECK: , %[[DINIT:[^ ,]+]] = model.ssd_add_initial_state_grad %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}} init %{{.+}} : (tensor<1x7x4x2xbf16>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xbf16>, tensor<1x4x2x3xf32>) -> (tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xbf16>, tensor<1x4x2x3xf32>)
  %g:4 = model.ssd_add_initial_state_grad %d, %dt, %A, %C init %s : (tensor<1x7x4x2xbf16>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xbf16>, tensor<1x4x2x3xf32>) -> (tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xbf16>, tensor<1x4x2x3xf32>)
  // CHECK: return %[[DINIT]]
  return %g#3 : tensor<1x4x2x3xf32>
}

// -----

// The summary's gradient takes the final state's gradient first and returns dx, ddt, dA, dB.
// CHECK-LABEL: func.func @ssd_final_state_grad
func.func @ssd_final_state_grad(%df: tensor<1x4x2x3xf32>, %x: tensor<1x7x4x2xbf16>,
                                %dt: tensor<1x7x4xf32>, %A: tensor<4xf32>,
                                %B: tensor<1x7x2x3xbf16>) -> tensor<1x7x2x3xbf16> {
  // CHECK: , %[[DB:[^ ,]+]] = model.ssd_final_state_grad %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}} {chunk_size = 4 : i64} : (tensor<1x4x2x3xf32>, tensor<1x7x4x2xbf16>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xbf16>) -> (tensor<1x7x4x2xbf16>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xbf16>)
  %g:4 = model.ssd_final_state_grad %df, %x, %dt, %A, %B {chunk_size = 4 : i64} : (tensor<1x4x2x3xf32>, tensor<1x7x4x2xbf16>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xbf16>) -> (tensor<1x7x4x2xbf16>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xbf16>)
  // CHECK: return %[[DB]]
  return %g#3 : tensor<1x7x2x3xbf16>
}

// -----

// Attention's gradient reads the output and the log-sum-exp; dk and dv have the kv heads' shape.
// CHECK-LABEL: func.func @attention_grad
func.func @attention_grad(%do: tensor<2x6x4x8xbf16>, %q: tensor<2x6x4x8xbf16>,
                          %k: tensor<2x6x2x8xbf16>, %v: tensor<2x6x2x8xbf16>,
                          %o: tensor<2x6x4x8xbf16>, %lse: tensor<2x4x6xf32>)
    -> (tensor<2x6x4x8xbf16>, tensor<2x6x2x8xbf16>, tensor<2x6x2x8xbf16>) {
  // CHECK: model.attention_grad %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}} {causal, scale = 1.250000e-01 : f64} : (tensor<2x6x4x8xbf16>, tensor<2x6x4x8xbf16>, tensor<2x6x2x8xbf16>, tensor<2x6x2x8xbf16>, tensor<2x6x4x8xbf16>, tensor<2x4x6xf32>) -> (tensor<2x6x4x8xbf16>, tensor<2x6x2x8xbf16>, tensor<2x6x2x8xbf16>)
  %dq, %dk, %dv = model.attention_grad %do, %q, %k, %v, %o, %lse {causal, scale = 0.125 : f64} : (tensor<2x6x4x8xbf16>, tensor<2x6x4x8xbf16>, tensor<2x6x2x8xbf16>, tensor<2x6x2x8xbf16>, tensor<2x6x4x8xbf16>, tensor<2x4x6xf32>) -> (tensor<2x6x4x8xbf16>, tensor<2x6x2x8xbf16>, tensor<2x6x2x8xbf16>)
  return %dq, %dk, %dv : tensor<2x6x4x8xbf16>, tensor<2x6x2x8xbf16>, tensor<2x6x2x8xbf16>
}

// -----

// MoE gradients: the router logits' gradient (experts dim from the result type) and the experts'.
// CHECK-LABEL: func.func @moe_grads
func.func @moe_grads(%dg: tensor<1x5x2xf32>, %g: tensor<1x5x2xf32>, %i: tensor<1x5x2xi32>,
                     %do: tensor<1x5x4xf32>, %x: tensor<1x5x4xf32>, %win: tensor<6x10x4xf32>,
                     %wout: tensor<6x4x5xf32>)
    -> (tensor<1x5x6xf32>, tensor<1x5x4xf32>, tensor<1x5x2xf32>, tensor<6x10x4xf32>, tensor<6x4x5xf32>) {
  // CHECK: model.moe_route_grad %{{.+}}, %{{.+}}, %{{.+}} : (tensor<1x5x2xf32>, tensor<1x5x2xf32>, tensor<1x5x2xi32>) -> tensor<1x5x6xf32>
  %dl = model.moe_route_grad %dg, %g, %i : (tensor<1x5x2xf32>, tensor<1x5x2xf32>, tensor<1x5x2xi32>) -> tensor<1x5x6xf32>
  // CHECK: model.moe_experts_grad %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}} : (tensor<1x5x4xf32>, tensor<1x5x4xf32>, tensor<1x5x2xf32>, tensor<1x5x2xi32>, tensor<6x10x4xf32>, tensor<6x4x5xf32>) -> (tensor<1x5x4xf32>, tensor<1x5x2xf32>, tensor<6x10x4xf32>, tensor<6x4x5xf32>)
  %dx, %dgates, %dwin, %dwout = model.moe_experts_grad %do, %x, %g, %i, %win, %wout : (tensor<1x5x4xf32>, tensor<1x5x4xf32>, tensor<1x5x2xf32>, tensor<1x5x2xi32>, tensor<6x10x4xf32>, tensor<6x4x5xf32>) -> (tensor<1x5x4xf32>, tensor<1x5x2xf32>, tensor<6x10x4xf32>, tensor<6x4x5xf32>)
  return %dl, %dx, %dgates, %dwin, %dwout : tensor<1x5x6xf32>, tensor<1x5x4xf32>, tensor<1x5x2xf32>, tensor<6x10x4xf32>, tensor<6x4x5xf32>
}

// -----

// The loss gradient: from the gradient of the summed loss to the logits'.
// CHECK-LABEL: func.func @cross_entropy_grad
func.func @cross_entropy_grad(%d: tensor<f32>, %logits: tensor<2x5x8xf32>, %t: tensor<2x5xi32>)
    -> tensor<2x5x8xf32> {
  // CHECK: model.cross_entropy_grad %{{.+}}, %{{.+}}, %{{.+}} {ignore_index = -100 : i64} : (tensor<f32>, tensor<2x5x8xf32>, tensor<2x5xi32>) -> tensor<2x5x8xf32>
  %dl = model.cross_entropy_grad %d, %logits, %t {ignore_index = -100 : i64} : (tensor<f32>, tensor<2x5x8xf32>, tensor<2x5xi32>) -> tensor<2x5x8xf32>
  return %dl : tensor<2x5x8xf32>
}

// -----

// param_grad is a sink: a checkpoint name and the gradient, no result.
// CHECK-LABEL: func.func @param_grad
func.func @param_grad(%g: tensor<6x4xf32>) {
  // CHECK: model.param_grad "model.layers.0.mamba.in_proj.weight", %{{.+}} : tensor<6x4xf32>
  model.param_grad "model.layers.0.mamba.in_proj.weight", %g : tensor<6x4xf32>
  return
}

// -----

// The load-balancing loss's gradients: to the summed probabilities, then to the router logits.
// CHECK-LABEL: func.func @router_aux_loss_grad
func.func @router_aux_loss_grad(%d: tensor<f32>, %c: tensor<6xf32>, %logits: tensor<1x5x6xf32>)
    -> tensor<1x5x6xf32> {
  // CHECK: %[[DP:.+]] = model.router_aux_loss_grad %{{.+}}, %{{.+}} {scale = 5.000000e-01 : f64} : (tensor<f32>, tensor<6xf32>) -> tensor<6xf32>
  %dp = model.router_aux_loss_grad %d, %c {scale = 0.5 : f64} : (tensor<f32>, tensor<6xf32>) -> tensor<6xf32>
  // CHECK: model.router_load_grad %[[DP]], %{{.+}} : (tensor<6xf32>, tensor<1x5x6xf32>) -> tensor<1x5x6xf32>
  %dl = model.router_load_grad %dp, %logits : (tensor<6xf32>, tensor<1x5x6xf32>) -> tensor<1x5x6xf32>
  return %dl : tensor<1x5x6xf32>
}
