// Every `model` op parses, verifies and prints back to the same text, also through the generic
// form and bytecode.
// RUN: hybridcp-opt %s | FileCheck %s
// RUN: hybridcp-opt %s | hybridcp-opt | FileCheck %s
// RUN: hybridcp-opt %s --mlir-print-op-generic | hybridcp-opt | FileCheck %s
// RUN: hybridcp-opt %s --emit-bytecode | hybridcp-opt | FileCheck %s

// Parameters carry checkpoint names and an initialiser.
// CHECK-LABEL: func.func @params
func.func @params() -> (tensor<8x4xf32>, tensor<4xf32>, tensor<4xbf16>, tensor<3xf32>) {
  // CHECK: model.param "model.embed_tokens.weight" normal(2.000000e-02) : tensor<8x4xf32>
  %0 = model.param "model.embed_tokens.weight" normal(0.02) : tensor<8x4xf32>
  // CHECK: model.param "model.norm.weight" ones : tensor<4xf32>
  %1 = model.param "model.norm.weight" ones : tensor<4xf32>
  // CHECK: model.param "model.layers.0.mamba.conv1d.bias" zeros : tensor<4xbf16>
  %2 = model.param "model.layers.0.mamba.conv1d.bias" zeros : tensor<4xbf16>
  // CHECK: model.param "model.layers.0.mamba.A_log" log_arange : tensor<3xf32>
  %3 = model.param "model.layers.0.mamba.A_log" log_arange : tensor<3xf32>
  return %0, %1, %2, %3 : tensor<8x4xf32>, tensor<4xf32>, tensor<4xbf16>, tensor<3xf32>
}

// An expert-parallel parameter: this rank's 2 of the checkpoint tensor's 8 experts (4 shards).
// CHECK-LABEL: func.func @sharded_param
func.func @sharded_param() -> tensor<2x10x4xf32> {
  // CHECK: model.param "model.layers.0.block_sparse_moe.input_linear.weight" normal(2.000000e-02) shards 4 : tensor<2x10x4xf32>
  %0 = model.param "model.layers.0.block_sparse_moe.input_linear.weight" normal(0.02) shards 4 : tensor<2x10x4xf32>
  return %0 : tensor<2x10x4xf32>
}

// Token-local ops: embedding, norms, linear, elementwise, split/reshape, SwiGLU.
// CHECK-LABEL: func.func @token_local
func.func @token_local(%ids: tensor<2x5xi32>, %table: tensor<8x4xf32>, %w: tensor<4xf32>,
                       %proj: tensor<6x4xf32>, %bias: tensor<6xf32>) -> tensor<2x5x3xf32> {
  // CHECK: %[[E:.+]] = model.embedding %{{.+}}, %{{.+}} {multiplier = 1.200000e+01 : f64, padding_idx = 3 : i64} : (tensor<8x4xf32>, tensor<2x5xi32>) -> tensor<2x5x4xf32>
  %e = model.embedding %table, %ids {multiplier = 12.0 : f64, padding_idx = 3 : i64} : (tensor<8x4xf32>, tensor<2x5xi32>) -> tensor<2x5x4xf32>
  // CHECK: %[[N:.+]] = model.rms_norm %[[E]], %{{.+}} {eps = 9.9999999999999995E-7 : f64} : tensor<2x5x4xf32>, tensor<4xf32>
  %n = model.rms_norm %e, %w {eps = 1.0e-6 : f64} : tensor<2x5x4xf32>, tensor<4xf32>
  // CHECK: %[[L:.+]] = model.linear %[[N]], %{{.+}} : (tensor<2x5x4xf32>, tensor<6x4xf32>) -> tensor<2x5x6xf32>
  %l = model.linear %n, %proj : (tensor<2x5x4xf32>, tensor<6x4xf32>) -> tensor<2x5x6xf32>
  // CHECK: %[[B:.+]] = model.add %[[L]], %{{.+}} : tensor<2x5x6xf32>, tensor<6xf32>
  %b = model.add %l, %bias : tensor<2x5x6xf32>, tensor<6xf32>
  // CHECK: %[[M:.+]] = model.mul %[[B]], %[[L]] : tensor<2x5x6xf32>, tensor<2x5x6xf32>
  %m = model.mul %b, %l : tensor<2x5x6xf32>, tensor<2x5x6xf32>
  // CHECK: %[[S:.+]] = model.scale %[[M]] {factor = 2.200000e-01 : f64} : tensor<2x5x6xf32>
  %s = model.scale %m {factor = 0.22 : f64} : tensor<2x5x6xf32>
  // CHECK: model.silu %[[S]] : tensor<2x5x6xf32>
  %a = model.silu %s : tensor<2x5x6xf32>
  // CHECK: model.softplus
  %sp = model.softplus %a : tensor<2x5x6xf32>
  // CHECK: model.neg_exp
  %ne = model.neg_exp %sp : tensor<2x5x6xf32>
  // CHECK: %[[P:.+]]:2 = model.split %{{.+}} [2, 4] : tensor<2x5x6xf32> -> tensor<2x5x2xf32>, tensor<2x5x4xf32>
  %p:2 = model.split %ne [2, 4] : tensor<2x5x6xf32> -> tensor<2x5x2xf32>, tensor<2x5x4xf32>
  // CHECK: model.reshape %[[P]]#1 : tensor<2x5x4xf32> -> tensor<2x5x2x2xf32>
  %r = model.reshape %p#1 : tensor<2x5x4xf32> -> tensor<2x5x2x2xf32>
  // CHECK: model.swiglu %{{.+}} : tensor<2x5x6xf32> -> tensor<2x5x3xf32>
  %g = model.swiglu %ne : tensor<2x5x6xf32> -> tensor<2x5x3xf32>
  return %g : tensor<2x5x3xf32>
}

// A cast changes the element type only (mixed precision: dt enters the f32 chain).
// CHECK-LABEL: func.func @cast
func.func @cast(%x: tensor<2x8x4xbf16>) -> tensor<2x8x4xf32> {
  // CHECK: model.cast %{{.+}} : tensor<2x8x4xbf16> to tensor<2x8x4xf32>
  %0 = model.cast %x : tensor<2x8x4xbf16> to tensor<2x8x4xf32>
  return %0 : tensor<2x8x4xf32>
}

// The Mamba2 mixer's sequence ops: conv1d, the SSD scan with and without an initial state, and
// the gated norm.
// CHECK-LABEL: func.func @mamba
func.func @mamba(%xbc: tensor<1x7x10xf32>, %cw: tensor<10x1x4xf32>, %cb: tensor<10xf32>,
                 %x: tensor<1x7x4x2xf32>, %dt: tensor<1x7x4xf32>, %A: tensor<4xf32>,
                 %B: tensor<1x7x2x3xf32>, %C: tensor<1x7x2x3xf32>, %D: tensor<4xf32>,
                 %s0: tensor<1x4x2x3xf32>, %z: tensor<1x7x8xf32>, %nw: tensor<8xf32>)
    -> (tensor<1x7x10xf32>, tensor<1x7x8xf32>, tensor<1x4x2x3xf32>) {
  // CHECK: model.causal_conv1d %{{.+}}, %{{.+}}, %{{.+}} : (tensor<1x7x10xf32>, tensor<10x1x4xf32>, tensor<10xf32>) -> tensor<1x7x10xf32>
  %c = model.causal_conv1d %xbc, %cw, %cb : (tensor<1x7x10xf32>, tensor<10x1x4xf32>, tensor<10xf32>) -> tensor<1x7x10xf32>
  // CHECK: %[[Y:.+]], %{{.+}} = model.ssd_scan %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}} {chunk_size = 4 : i64}
  %y, %f = model.ssd_scan %x, %dt, %A, %B, %C, %D {chunk_size = 4 : i64} : (tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x7x2x3xf32>, tensor<4xf32>) -> (tensor<1x7x4x2xf32>, tensor<1x4x2x3xf32>)
  // CHECK: model.ssd_scan {{.+}} init %{{.+}} {chunk_size = 4 : i64}
  %y2, %f2 = model.ssd_scan %x, %dt, %A, %B, %C, %D init %s0 {chunk_size = 4 : i64} : (tensor<1x7x4x2xf32>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xf32>, tensor<1x7x2x3xf32>, tensor<4xf32>, tensor<1x4x2x3xf32>) -> (tensor<1x7x4x2xf32>, tensor<1x4x2x3xf32>)
  %yf = model.reshape %y : tensor<1x7x4x2xf32> -> tensor<1x7x8xf32>
  // CHECK: model.gated_rms_norm %{{.+}}, %{{.+}}, %{{.+}} {eps = 1.000000e-05 : f64} : tensor<1x7x8xf32>, tensor<8xf32>
  %o = model.gated_rms_norm %yf, %z, %nw {eps = 1.0e-5 : f64} : tensor<1x7x8xf32>, tensor<8xf32>
  return %c, %o, %f2 : tensor<1x7x10xf32>, tensor<1x7x8xf32>, tensor<1x4x2x3xf32>
}

// The SSD scan's final state from a zero start, without y: context parallelism's segment summary.
// CHECK-LABEL: func.func @ssd_final_state
func.func @ssd_final_state(%x: tensor<1x7x4x2xbf16>, %dt: tensor<1x7x4xf32>, %A: tensor<4xf32>,
                           %B: tensor<1x7x2x3xbf16>) -> tensor<1x4x2x3xf32> {
  // CHECK: model.ssd_final_state %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}} {chunk_size = 4 : i64} : (tensor<1x7x4x2xbf16>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xbf16>) -> tensor<1x4x2x3xf32>
  %f = model.ssd_final_state %x, %dt, %A, %B {chunk_size = 4 : i64} : (tensor<1x7x4x2xbf16>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xbf16>) -> tensor<1x4x2x3xf32>
  return %f : tensor<1x4x2x3xf32>
}

// A segment's zero-start scan outputs plus what its incoming state adds (context parallelism).
// CHECK-LABEL: func.func @ssd_add_initial_state
func.func @ssd_add_initial_state(%y: tensor<1x7x4x2xbf16>, %dt: tensor<1x7x4xf32>, %A: tensor<4xf32>,
                                 %C: tensor<1x7x2x3xbf16>, %s: tensor<1x4x2x3xf32>) -> tensor<1x7x4x2xbf16> {
  // CHECK: model.ssd_add_initial_state %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}} init %{{.+}} : (tensor<1x7x4x2xbf16>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xbf16>, tensor<1x4x2x3xf32>) -> tensor<1x7x4x2xbf16>
  %o = model.ssd_add_initial_state %y, %dt, %A, %C init %s : (tensor<1x7x4x2xbf16>, tensor<1x7x4xf32>, tensor<4xf32>, tensor<1x7x2x3xbf16>, tensor<1x4x2x3xf32>) -> tensor<1x7x4x2xbf16>
  return %o : tensor<1x7x4x2xbf16>
}

// Causal grouped-query attention returns the output and the per-row log-sum-exp.
// CHECK-LABEL: func.func @attention
func.func @attention(%q: tensor<2x6x4x8xbf16>, %k: tensor<2x6x2x8xbf16>, %v: tensor<2x6x2x8xbf16>)
    -> (tensor<2x6x4x8xbf16>, tensor<2x4x6xf32>) {
  // CHECK: model.attention %{{.+}}, %{{.+}}, %{{.+}} {causal, scale = 1.250000e-01 : f64} : (tensor<2x6x4x8xbf16>, tensor<2x6x2x8xbf16>, tensor<2x6x2x8xbf16>) -> (tensor<2x6x4x8xbf16>, tensor<2x4x6xf32>)
  %o, %lse = model.attention %q, %k, %v {causal, scale = 0.125 : f64} : (tensor<2x6x4x8xbf16>, tensor<2x6x2x8xbf16>, tensor<2x6x2x8xbf16>) -> (tensor<2x6x4x8xbf16>, tensor<2x4x6xf32>)
  return %o, %lse : tensor<2x6x4x8xbf16>, tensor<2x4x6xf32>
}

// MoE: routing picks top-k experts, expert compute combines them with the gates.
// CHECK-LABEL: func.func @moe
func.func @moe(%x: tensor<1x5x4xf32>, %router: tensor<1x5x6xf32>, %win: tensor<6x10x4xf32>,
               %wout: tensor<6x4x5xf32>) -> tensor<1x5x4xf32> {
  // CHECK: %[[G:.+]], %[[I:.+]] = model.moe_route %{{.+}} {top_k = 2 : i64} : tensor<1x5x6xf32> -> tensor<1x5x2xf32>, tensor<1x5x2xi32>
  %g, %i = model.moe_route %router {top_k = 2 : i64} : tensor<1x5x6xf32> -> tensor<1x5x2xf32>, tensor<1x5x2xi32>
  // CHECK: model.moe_experts %{{.+}}, %[[G]], %[[I]], %{{.+}}, %{{.+}} : (tensor<1x5x4xf32>, tensor<1x5x2xf32>, tensor<1x5x2xi32>, tensor<6x10x4xf32>, tensor<6x4x5xf32>) -> tensor<1x5x4xf32>
  %o = model.moe_experts %x, %g, %i, %win, %wout : (tensor<1x5x4xf32>, tensor<1x5x2xf32>, tensor<1x5x2xi32>, tensor<6x10x4xf32>, tensor<6x4x5xf32>) -> tensor<1x5x4xf32>
  return %o : tensor<1x5x4xf32>
}

// The loss: summed cross-entropy and the valid-token count, then their ratio.
// CHECK-LABEL: func.func @loss
func.func @loss(%logits: tensor<2x5x8xf32>, %targets: tensor<2x5xi32>) -> tensor<f32> {
  // CHECK: %[[SUM:.+]], %[[COUNT:.+]] = model.cross_entropy %{{.+}}, %{{.+}} {ignore_index = -100 : i64} : (tensor<2x5x8xf32>, tensor<2x5xi32>) -> (tensor<f32>, tensor<f32>)
  %sum, %count = model.cross_entropy %logits, %targets {ignore_index = -100 : i64} : (tensor<2x5x8xf32>, tensor<2x5xi32>) -> (tensor<f32>, tensor<f32>)
  // CHECK: model.div %[[SUM]], %[[COUNT]] : tensor<f32>, tensor<f32>
  %loss = model.div %sum, %count : tensor<f32>, tensor<f32>
  return %loss : tensor<f32>
}

// The MoE load-balancing loss: a layer's statistics (summed softmax, picks), combined, reported.
// CHECK-LABEL: func.func @router_aux_loss
func.func @router_aux_loss(%router: tensor<1x5x6xf32>, %i: tensor<1x5x2xi32>) -> tensor<f32> {
  // CHECK: %[[P:.+]], %[[C:.+]] = model.router_load %{{.+}}, %{{.+}} : (tensor<1x5x6xf32>, tensor<1x5x2xi32>) -> (tensor<6xf32>, tensor<6xf32>)
  %p, %c = model.router_load %router, %i : (tensor<1x5x6xf32>, tensor<1x5x2xi32>) -> (tensor<6xf32>, tensor<6xf32>)
  // CHECK: %[[AUX:.+]] = model.router_aux_loss %[[P]], %[[C]] {scale = 2.400000e-01 : f64} : (tensor<6xf32>, tensor<6xf32>) -> tensor<f32>
  %aux = model.router_aux_loss %p, %c {scale = 0.24 : f64} : (tensor<6xf32>, tensor<6xf32>) -> tensor<f32>
  // CHECK: model.report "router_aux_loss", %[[AUX]] : tensor<f32>
  model.report "router_aux_loss", %aux : tensor<f32>
  return %aux : tensor<f32>
}

// Packed documents: the sequence ops take each token's position in its document.
// CHECK-LABEL: func.func @documents
func.func @documents(%x: tensor<1x6x4xf32>, %w: tensor<4x1x3xf32>, %b: tensor<4xf32>,
                     %pos: tensor<1x6xi32>, %q: tensor<1x6x2x4xf32>, %kv: tensor<1x6x1x4xf32>)
    -> tensor<1x6x4xf32> {
  // CHECK: model.causal_conv1d %{{.+}}, %{{.+}}, %{{.+}} positions %{{.+}} : (tensor<1x6x4xf32>, tensor<4x1x3xf32>, tensor<4xf32>, tensor<1x6xi32>) -> tensor<1x6x4xf32>
  %y = model.causal_conv1d %x, %w, %b positions %pos : (tensor<1x6x4xf32>, tensor<4x1x3xf32>, tensor<4xf32>, tensor<1x6xi32>) -> tensor<1x6x4xf32>
  // CHECK: model.attention %{{.+}}, %{{.+}}, %{{.+}} positions %{{.+}} {causal, scale = 5.000000e-01 : f64}
  %o, %lse = model.attention %q, %kv, %kv positions %pos {causal, scale = 0.5 : f64} : (tensor<1x6x2x4xf32>, tensor<1x6x1x4xf32>, tensor<1x6x1x4xf32>, tensor<1x6xi32>) -> (tensor<1x6x2x4xf32>, tensor<1x2x6xf32>)
  return %y : tensor<1x6x4xf32>
}
