// hcp-autodiff on small hand-written training steps: the backward's structure for each kind of
// op, gradient accumulation, and one model.param_grad per parameter.
// RUN: hybridcp-opt %s --split-input-file --hcp-autodiff | FileCheck %s
// RUN: hybridcp-opt %s --split-input-file --hcp-autodiff=function=eval_step | FileCheck %s --check-prefix=OTHER

// A linear chain: dx = dy W and dW = dy^T x per linear; the input is an argument, so its dx is dropped.
// CHECK-LABEL: func.func @train_step
// CHECK: %[[W1:.+]] = model.param "w1"
// CHECK: %[[A:.+]] = model.linear %[[X:.+]], %[[W1]]
// CHECK: %[[S:.+]] = model.silu %[[A]]
// CHECK: %[[W2:.+]] = model.param "w2"
// CHECK: %[[LOGITS:.+]] = model.linear %[[S]], %[[W2]]
// CHECK: %[[SUM:.+]], %{{.+}} = model.cross_entropy %[[LOGITS]]
// CHECK: %[[SEED:.+]] = model.fill 1.000000e+00 : tensor<f32>
// CHECK: %[[DL:.+]] = model.cross_entropy_grad %[[SEED]], %[[LOGITS]]
// CHECK: %[[DS:.+]] = model.linear_grad_input %[[DL]], %[[W2]]
// CHECK: %[[DW2:.+]] = model.linear_grad_weight %[[DL]], %[[S]]
// CHECK: model.param_grad "w2", %[[DW2]] : tensor<8x6xf32>
// CHECK: %[[DA:.+]] = model.silu_grad %[[DS]], %[[A]]
// CHECK-NOT: model.linear_grad_input
// CHECK: %[[DW1:.+]] = model.linear_grad_weight %[[DA]], %[[X]]
// CHECK: model.param_grad "w1", %[[DW1]] : tensor<6x4xf32>
// CHECK: return %[[SUM]] : tensor<f32>
func.func @train_step(%x: tensor<2x5x4xf32>, %t: tensor<2x5xi32>) -> tensor<f32> {
  %w1 = model.param "w1" normal(0.02) : tensor<6x4xf32>
  %a = model.linear %x, %w1 : (tensor<2x5x4xf32>, tensor<6x4xf32>) -> tensor<2x5x6xf32>
  %s = model.silu %a : tensor<2x5x6xf32>
  %w2 = model.param "w2" normal(0.02) : tensor<8x6xf32>
  %logits = model.linear %s, %w2 : (tensor<2x5x6xf32>, tensor<8x6xf32>) -> tensor<2x5x8xf32>
  %sum, %count = model.cross_entropy %logits, %t {ignore_index = -100 : i64} : (tensor<2x5x8xf32>, tensor<2x5xi32>) -> (tensor<f32>, tensor<f32>)
  return %sum : tensor<f32>
}

// -----

// A bias broadcast over [batch, seq] gets dy summed over those dims; a value read twice (h) gets the sum of both gradients.
// CHECK-LABEL: func.func @train_step
// CHECK: %[[DL:.+]] = model.cross_entropy_grad
// CHECK: %[[DB:.+]] = model.sum_leading %[[DL]] : tensor<2x5x8xf32> -> tensor<8xf32>
// CHECK: %[[DH:.+]] = model.add %[[DL]], %[[DL]] : tensor<2x5x8xf32>, tensor<2x5x8xf32>
// CHECK: model.param_grad "bias", %[[DB]] : tensor<8xf32>
// CHECK: %[[DW:.+]] = model.linear_grad_weight %[[DH]]
// CHECK: model.param_grad "w", %[[DW]]
func.func @train_step(%x: tensor<2x5x4xf32>, %t: tensor<2x5xi32>) -> tensor<f32> {
  %w = model.param "w" normal(0.02) : tensor<8x4xf32>
  %h = model.linear %x, %w : (tensor<2x5x4xf32>, tensor<8x4xf32>) -> tensor<2x5x8xf32>
  %b = model.param "bias" zeros : tensor<8xf32>
  %y = model.add %h, %b : tensor<2x5x8xf32>, tensor<8xf32>
  %r = model.add %y, %h : tensor<2x5x8xf32>, tensor<2x5x8xf32>
  %sum, %count = model.cross_entropy %r, %t {ignore_index = -100 : i64} : (tensor<2x5x8xf32>, tensor<2x5xi32>) -> (tensor<f32>, tensor<f32>)
  return %sum : tensor<f32>
}

// -----

// mul and div by broadcast parameters: dy*rhs and dy/rhs for lhs, sum_leading(dy*lhs) and sum_leading(-(dy*lhs/rhs)/rhs) for rhs; scale by its factor.
// CHECK-LABEL: func.func @train_step
// CHECK: %[[H:.+]] = model.linear
// CHECK: %[[GAMMA:.+]] = model.param "gamma"
// CHECK: %[[M:.+]] = model.mul %[[H]], %[[GAMMA]]
// CHECK: %[[DELTA:.+]] = model.param "delta"
// CHECK: %[[DL:.+]] = model.cross_entropy_grad
// CHECK: %[[DQ:.+]] = model.scale %[[DL]] {factor = 5.000000e-01 : f64}
// CHECK: %[[DM:.+]] = model.div %[[DQ]], %[[DELTA]] : tensor<2x5x8xf32>, tensor<8xf32>
// CHECK: %[[T1:.+]] = model.mul %[[DQ]], %[[M]] : tensor<2x5x8xf32>, tensor<2x5x8xf32>
// CHECK: %[[T2:.+]] = model.div %[[T1]], %[[DELTA]]
// CHECK: %[[T3:.+]] = model.div %[[T2]], %[[DELTA]]
// CHECK: %[[T4:.+]] = model.scale %[[T3]] {factor = -1.000000e+00 : f64}
// CHECK: %[[DDELTA:.+]] = model.sum_leading %[[T4]] : tensor<2x5x8xf32> -> tensor<8xf32>
// CHECK: model.param_grad "delta", %[[DDELTA]]
// CHECK: %[[DH:.+]] = model.mul %[[DM]], %[[GAMMA]] : tensor<2x5x8xf32>, tensor<8xf32>
// CHECK: %[[T5:.+]] = model.mul %[[DM]], %[[H]] : tensor<2x5x8xf32>, tensor<2x5x8xf32>
// CHECK: %[[DGAMMA:.+]] = model.sum_leading %[[T5]]
// CHECK: model.param_grad "gamma", %[[DGAMMA]]
// CHECK: model.linear_grad_weight %[[DH]]
// CHECK: model.param_grad "w"
func.func @train_step(%x: tensor<2x5x4xf32>, %t: tensor<2x5xi32>) -> tensor<f32> {
  %w = model.param "w" normal(0.02) : tensor<8x4xf32>
  %h = model.linear %x, %w : (tensor<2x5x4xf32>, tensor<8x4xf32>) -> tensor<2x5x8xf32>
  %g = model.param "gamma" ones : tensor<8xf32>
  %m = model.mul %h, %g : tensor<2x5x8xf32>, tensor<8xf32>
  %d = model.param "delta" ones : tensor<8xf32>
  %q = model.div %m, %d : tensor<2x5x8xf32>, tensor<8xf32>
  %s = model.scale %q {factor = 0.5 : f64} : tensor<2x5x8xf32>
  %sum, %count = model.cross_entropy %s, %t {ignore_index = -100 : i64} : (tensor<2x5x8xf32>, tensor<2x5xi32>) -> (tensor<f32>, tensor<f32>)
  return %sum : tensor<f32>
}

// -----

// A split whose middle piece the loss never reads: the concat of the pieces' gradients has zeros in its place.
// CHECK-LABEL: func.func @train_step
// CHECK: %[[P:.+]]:3 = model.split
// CHECK: %[[DC:.+]] = model.linear_grad_input %{{.+}}, %{{.+}} : (tensor<2x5x8xf32>, tensor<8x1xf32>) -> tensor<2x5x1xf32>
// CHECK: model.param_grad "wc"
// CHECK: %[[DA:.+]] = model.linear_grad_input %{{.+}}, %{{.+}} : (tensor<2x5x8xf32>, tensor<8x2xf32>) -> tensor<2x5x2xf32>
// CHECK: model.param_grad "wa"
// CHECK: %[[ZERO:.+]] = model.fill 0.000000e+00 : tensor<2x5x3xf32>
// CHECK: %[[DP:.+]] = model.concat %[[DA]], %[[ZERO]], %[[DC]] : tensor<2x5x2xf32>, tensor<2x5x3xf32>, tensor<2x5x1xf32> -> tensor<2x5x6xf32>
// CHECK: %[[DW:.+]] = model.linear_grad_weight %[[DP]]
// CHECK: model.param_grad "w", %[[DW]]
func.func @train_step(%x: tensor<2x5x4xf32>, %t: tensor<2x5xi32>) -> tensor<f32> {
  %w = model.param "w" normal(0.02) : tensor<6x4xf32>
  %p = model.linear %x, %w : (tensor<2x5x4xf32>, tensor<6x4xf32>) -> tensor<2x5x6xf32>
  %a, %b, %c = model.split %p [2, 3, 1] : tensor<2x5x6xf32> -> tensor<2x5x2xf32>, tensor<2x5x3xf32>, tensor<2x5x1xf32>
  %wa = model.param "wa" normal(0.02) : tensor<8x2xf32>
  %ya = model.linear %a, %wa : (tensor<2x5x2xf32>, tensor<8x2xf32>) -> tensor<2x5x8xf32>
  %wc = model.param "wc" normal(0.02) : tensor<8x1xf32>
  %yc = model.linear %c, %wc : (tensor<2x5x1xf32>, tensor<8x1xf32>) -> tensor<2x5x8xf32>
  %logits = model.add %ya, %yc : tensor<2x5x8xf32>, tensor<2x5x8xf32>
  %sum, %count = model.cross_entropy %logits, %t {ignore_index = -100 : i64} : (tensor<2x5x8xf32>, tensor<2x5xi32>) -> (tensor<f32>, tensor<f32>)
  return %sum : tensor<f32>
}

// -----

// The tied embedding: the lookup and the vocabulary projection both read it; it gets one param_grad of their sum.
// CHECK-LABEL: func.func @train_step
// CHECK: %[[TABLE:.+]] = model.param "model.embed_tokens.weight"
// CHECK: %[[H:.+]] = model.embedding %[[TABLE]], %[[IDS:.+]] {multiplier
// CHECK: %[[NW:.+]] = model.param "model.norm.weight"
// CHECK: %[[N:.+]] = model.rms_norm %[[H]], %[[NW]]
// CHECK: %[[DL:.+]] = model.cross_entropy_grad
// CHECK: %[[DN:.+]] = model.linear_grad_input %[[DL]], %[[TABLE]]
// CHECK: %[[DHEAD:.+]] = model.linear_grad_weight %[[DL]], %[[N]]
// CHECK: %[[DH:.+]], %[[DNW:.+]] = model.rms_norm_grad %[[DN]], %[[H]], %[[NW]] {eps = 1.000000e-05 : f64}
// CHECK: model.param_grad "model.norm.weight", %[[DNW]]
// CHECK: %[[DLOOKUP:.+]] = model.embedding_grad %[[DH]], %[[IDS]] {multiplier = 1.200000e+01 : f64, padding_idx = 0 : i64} : (tensor<2x5x4xf32>, tensor<2x5xi32>) -> tensor<8x4xf32>
// CHECK: %[[DTABLE:.+]] = model.add %[[DHEAD]], %[[DLOOKUP]] : tensor<8x4xf32>, tensor<8x4xf32>
// CHECK: model.param_grad "model.embed_tokens.weight", %[[DTABLE]] : tensor<8x4xf32>
// CHECK-NOT: model.param_grad
// CHECK: return
func.func @train_step(%ids: tensor<2x5xi32>, %t: tensor<2x5xi32>) -> tensor<f32> {
  %table = model.param "model.embed_tokens.weight" normal(0.02) : tensor<8x4xf32>
  %h = model.embedding %table, %ids {multiplier = 12.0 : f64, padding_idx = 0 : i64} : (tensor<8x4xf32>, tensor<2x5xi32>) -> tensor<2x5x4xf32>
  %nw = model.param "model.norm.weight" ones : tensor<4xf32>
  %n = model.rms_norm %h, %nw {eps = 1.0e-5 : f64} : tensor<2x5x4xf32>, tensor<4xf32>
  %logits = model.linear %n, %table : (tensor<2x5x4xf32>, tensor<8x4xf32>) -> tensor<2x5x8xf32>
  %sum, %count = model.cross_entropy %logits, %t {ignore_index = -100 : i64} : (tensor<2x5x8xf32>, tensor<2x5xi32>) -> (tensor<f32>, tensor<f32>)
  return %sum : tensor<f32>
}

// -----

// A Mamba2 mixer as the importer builds it: out_proj, gated norm, SSD scan (no dfinal: the final state is unused), A and dt chains, conv, in_proj.
// CHECK-LABEL: func.func @train_step
// CHECK: %[[ZXBCDT:.+]]:3 = model.split
// CHECK: %[[CW:.+]] = model.param "mamba.conv1d.weight"
// CHECK: %[[CONV:.+]] = model.causal_conv1d %[[ZXBCDT]]#1, %[[CW]]
// CHECK: %[[XH:.+]] = model.reshape
// CHECK: %[[BG:.+]] = model.reshape
// CHECK: %[[CG:.+]] = model.reshape
// CHECK: %[[DT1:.+]] = model.add %[[ZXBCDT]]#2
// CHECK: %[[DT2:.+]] = model.softplus %[[DT1]]
// CHECK: %[[A:.+]] = model.neg_exp
// CHECK: %[[D:.+]] = model.param "mamba.D"
// CHECK: model.ssd_scan
// CHECK: %[[YF:.+]] = model.reshape
// CHECK: %[[NW:.+]] = model.param "mamba.norm.weight"
// CHECK: model.cross_entropy_grad
// CHECK: model.param_grad "lm_head.weight"
// CHECK: %[[DG:.+]] = model.linear_grad_input
// CHECK: model.param_grad "mamba.out_proj.weight"
// CHECK: %[[DY:[^ ,]+]], %[[DZ:[^ ,]+]], %[[DNW:[^ ,]+]] = model.gated_rms_norm_grad %[[DG]], %[[YF]], %[[ZXBCDT]]#0, %[[NW]]
// CHECK: model.param_grad "mamba.norm.weight", %[[DNW]]
// CHECK: %[[DYH:.+]] = model.reshape %[[DY]] : tensor<1x6x4xf32> -> tensor<1x6x2x2xf32>
// CHECK-NOT: dfinal
// CHECK: %[[DX:[^ ,]+]], %[[DDT:[^ ,]+]], %[[DA:[^ ,]+]], %[[DB:[^ ,]+]], %[[DC:[^ ,]+]], %[[DD:[^ ,]+]] = model.ssd_scan_grad %[[DYH]], %[[XH]], %[[DT2]], %[[A]], %[[BG]], %[[CG]], %[[D]] {chunk_size = 4 : i64}
// CHECK: model.param_grad "mamba.D", %[[DD]]
// CHECK: %[[DALOG:.+]] = model.neg_exp_grad %[[DA]], %[[A]] : tensor<2xf32>
// CHECK: model.param_grad "mamba.A_log", %[[DALOG]]
// CHECK: %[[DDT1:.+]] = model.softplus_grad %[[DDT]], %[[DT1]] : tensor<1x6x2xf32>
// CHECK: %[[DDTB:.+]] = model.sum_leading %[[DDT1]] : tensor<1x6x2xf32> -> tensor<2xf32>
// CHECK: model.param_grad "mamba.dt_bias", %[[DDTB]]
// CHECK: %[[DC2:.+]] = model.reshape %[[DC]]
// CHECK: %[[DB2:.+]] = model.reshape %[[DB]]
// CHECK: %[[DX2:.+]] = model.reshape %[[DX]]
// CHECK: %[[DACT:.+]] = model.concat %[[DX2]], %[[DB2]], %[[DC2]]
// CHECK: %[[DCONV:.+]] = model.silu_grad %[[DACT]], %[[CONV]]
// CHECK: %[[DXBC:[^ ,]+]], %[[DCW:[^ ,]+]], %[[DCB:[^ ,]+]] = model.causal_conv1d_grad %[[DCONV]], %[[ZXBCDT]]#1, %[[CW]] : (tensor<1x6x8xf32>, tensor<1x6x8xf32>, tensor<8x1x4xf32>) -> (tensor<1x6x8xf32>, tensor<8x1x4xf32>, tensor<8xf32>)
// CHECK: model.param_grad "mamba.conv1d.bias", %[[DCB]]
// CHECK: model.param_grad "mamba.conv1d.weight", %[[DCW]]
// CHECK: %[[DPROJ:.+]] = model.concat %[[DZ]], %[[DXBC]], %[[DDT1]] : tensor<1x6x4xf32>, tensor<1x6x8xf32>, tensor<1x6x2xf32> -> tensor<1x6x14xf32>
// CHECK: %[[DWIN:.+]] = model.linear_grad_weight %[[DPROJ]]
// CHECK: model.param_grad "mamba.in_proj.weight", %[[DWIN]]
func.func @train_step(%x: tensor<1x6x4xf32>, %t: tensor<1x6xi32>) -> tensor<f32> {
  %win = model.param "mamba.in_proj.weight" normal(0.02) : tensor<14x4xf32>
  %proj = model.linear %x, %win : (tensor<1x6x4xf32>, tensor<14x4xf32>) -> tensor<1x6x14xf32>
  %z, %xbc, %dt = model.split %proj [4, 8, 2] : tensor<1x6x14xf32> -> tensor<1x6x4xf32>, tensor<1x6x8xf32>, tensor<1x6x2xf32>
  %cw = model.param "mamba.conv1d.weight" normal(0.02) : tensor<8x1x4xf32>
  %cb = model.param "mamba.conv1d.bias" zeros : tensor<8xf32>
  %conv = model.causal_conv1d %xbc, %cw, %cb : (tensor<1x6x8xf32>, tensor<8x1x4xf32>, tensor<8xf32>) -> tensor<1x6x8xf32>
  %act = model.silu %conv : tensor<1x6x8xf32>
  %xs, %B, %C = model.split %act [4, 2, 2] : tensor<1x6x8xf32> -> tensor<1x6x4xf32>, tensor<1x6x2xf32>, tensor<1x6x2xf32>
  %xh = model.reshape %xs : tensor<1x6x4xf32> -> tensor<1x6x2x2xf32>
  %Bg = model.reshape %B : tensor<1x6x2xf32> -> tensor<1x6x1x2xf32>
  %Cg = model.reshape %C : tensor<1x6x2xf32> -> tensor<1x6x1x2xf32>
  %dtb = model.param "mamba.dt_bias" ones : tensor<2xf32>
  %dt1 = model.add %dt, %dtb : tensor<1x6x2xf32>, tensor<2xf32>
  %dt2 = model.softplus %dt1 : tensor<1x6x2xf32>
  %alog = model.param "mamba.A_log" log_arange : tensor<2xf32>
  %A = model.neg_exp %alog : tensor<2xf32>
  %D = model.param "mamba.D" ones : tensor<2xf32>
  %y, %final = model.ssd_scan %xh, %dt2, %A, %Bg, %Cg, %D {chunk_size = 4 : i64} : (tensor<1x6x2x2xf32>, tensor<1x6x2xf32>, tensor<2xf32>, tensor<1x6x1x2xf32>, tensor<1x6x1x2xf32>, tensor<2xf32>) -> (tensor<1x6x2x2xf32>, tensor<1x2x2x2xf32>)
  %yf = model.reshape %y : tensor<1x6x2x2xf32> -> tensor<1x6x4xf32>
  %nw = model.param "mamba.norm.weight" ones : tensor<4xf32>
  %g = model.gated_rms_norm %yf, %z, %nw {eps = 1.0e-5 : f64} : tensor<1x6x4xf32>, tensor<4xf32>
  %wout = model.param "mamba.out_proj.weight" normal(0.02) : tensor<4x4xf32>
  %o = model.linear %g, %wout : (tensor<1x6x4xf32>, tensor<4x4xf32>) -> tensor<1x6x4xf32>
  %head = model.param "lm_head.weight" normal(0.02) : tensor<8x4xf32>
  %logits = model.linear %o, %head : (tensor<1x6x4xf32>, tensor<8x4xf32>) -> tensor<1x6x8xf32>
  %sum, %count = model.cross_entropy %logits, %t {ignore_index = -100 : i64} : (tensor<1x6x8xf32>, tensor<1x6xi32>) -> (tensor<f32>, tensor<f32>)
  return %sum : tensor<f32>
}

// -----

// An SSD scan with an initial state, whose final state the loss reads and whose y it does not: dy is zeros, dfinal and dinit appear.
// CHECK-LABEL: func.func @train_step
// CHECK: %[[S0:.+]] = model.param "s0"
// CHECK: %{{.+}}, %[[FINAL:.+]] = model.ssd_scan {{.+}} init %[[S0]]
// CHECK: %[[DLOGITS:.+]] = model.cross_entropy_grad
// CHECK: %[[DFINAL:.+]] = model.reshape %[[DLOGITS]] : tensor<1x2x4xf32> -> tensor<1x2x2x2xf32>
// CHECK: %[[DY:.+]] = model.fill 0.000000e+00 : tensor<1x6x2x2xf32>
// CHECK: , %[[DINIT:[^ ,]+]] = model.ssd_scan_grad %[[DY]], {{.+}} init %[[S0]] dfinal %[[DFINAL]] {chunk_size = 4 : i64}
// CHECK: model.param_grad "s0", %[[DINIT]] : tensor<1x2x2x2xf32>
func.func @train_step(%t: tensor<1x2xi32>) -> tensor<f32> {
  %x = model.param "x" normal(0.02) : tensor<1x6x2x2xf32>
  %dt = model.param "dt" ones : tensor<1x6x2xf32>
  %A = model.param "A" ones : tensor<2xf32>
  %B = model.param "B" normal(0.02) : tensor<1x6x1x2xf32>
  %C = model.param "C" normal(0.02) : tensor<1x6x1x2xf32>
  %D = model.param "D" ones : tensor<2xf32>
  %s0 = model.param "s0" zeros : tensor<1x2x2x2xf32>
  %y, %final = model.ssd_scan %x, %dt, %A, %B, %C, %D init %s0 {chunk_size = 4 : i64} : (tensor<1x6x2x2xf32>, tensor<1x6x2xf32>, tensor<2xf32>, tensor<1x6x1x2xf32>, tensor<1x6x1x2xf32>, tensor<2xf32>, tensor<1x2x2x2xf32>) -> (tensor<1x6x2x2xf32>, tensor<1x2x2x2xf32>)
  %logits = model.reshape %final : tensor<1x2x2x2xf32> -> tensor<1x2x4xf32>
  %sum, %count = model.cross_entropy %logits, %t {ignore_index = -100 : i64} : (tensor<1x2x4xf32>, tensor<1x2xi32>) -> (tensor<f32>, tensor<f32>)
  return %sum : tensor<f32>
}

// -----

// An attention block (2 query heads, 1 kv head of 4): o_proj, attention_grad from out and lse, then the v, k, q projections.
// CHECK-LABEL: func.func @train_step
// CHECK: %[[Q:.+]] = model.reshape {{.+}} -> tensor<1x6x2x4xf32>
// CHECK: %[[K:.+]] = model.reshape {{.+}} -> tensor<1x6x1x4xf32>
// CHECK: %[[V:.+]] = model.reshape {{.+}} -> tensor<1x6x1x4xf32>
// CHECK: %[[OUT:[^ ,]+]], %[[LSE:[^ ,]+]] = model.attention %[[Q]], %[[K]], %[[V]]
// CHECK: model.cross_entropy_grad
// CHECK: model.param_grad "self_attn.o_proj.weight"
// CHECK: %[[DOUT:.+]] = model.reshape {{.+}} : tensor<1x6x8xf32> -> tensor<1x6x2x4xf32>
// CHECK: %[[DQ:[^ ,]+]], %[[DK:[^ ,]+]], %[[DV:[^ ,]+]] = model.attention_grad %[[DOUT]], %[[Q]], %[[K]], %[[V]], %[[OUT]], %[[LSE]] {causal, scale = 2.500000e-01 : f64}
// CHECK: model.reshape %[[DV]] : tensor<1x6x1x4xf32> -> tensor<1x6x4xf32>
// CHECK: model.param_grad "self_attn.v_proj.weight"
// CHECK: model.reshape %[[DK]] : tensor<1x6x1x4xf32> -> tensor<1x6x4xf32>
// CHECK: model.param_grad "self_attn.k_proj.weight"
// CHECK: model.reshape %[[DQ]] : tensor<1x6x2x4xf32> -> tensor<1x6x8xf32>
// CHECK: model.param_grad "self_attn.q_proj.weight"
func.func @train_step(%x: tensor<1x6x8xf32>, %t: tensor<1x6xi32>) -> tensor<f32> {
  %wq = model.param "self_attn.q_proj.weight" normal(0.02) : tensor<8x8xf32>
  %q0 = model.linear %x, %wq : (tensor<1x6x8xf32>, tensor<8x8xf32>) -> tensor<1x6x8xf32>
  %q = model.reshape %q0 : tensor<1x6x8xf32> -> tensor<1x6x2x4xf32>
  %wk = model.param "self_attn.k_proj.weight" normal(0.02) : tensor<4x8xf32>
  %k0 = model.linear %x, %wk : (tensor<1x6x8xf32>, tensor<4x8xf32>) -> tensor<1x6x4xf32>
  %k = model.reshape %k0 : tensor<1x6x4xf32> -> tensor<1x6x1x4xf32>
  %wv = model.param "self_attn.v_proj.weight" normal(0.02) : tensor<4x8xf32>
  %v0 = model.linear %x, %wv : (tensor<1x6x8xf32>, tensor<4x8xf32>) -> tensor<1x6x4xf32>
  %v = model.reshape %v0 : tensor<1x6x4xf32> -> tensor<1x6x1x4xf32>
  %out, %lse = model.attention %q, %k, %v {causal, scale = 0.25 : f64} : (tensor<1x6x2x4xf32>, tensor<1x6x1x4xf32>, tensor<1x6x1x4xf32>) -> (tensor<1x6x2x4xf32>, tensor<1x2x6xf32>)
  %o0 = model.reshape %out : tensor<1x6x2x4xf32> -> tensor<1x6x8xf32>
  %wo = model.param "self_attn.o_proj.weight" normal(0.02) : tensor<8x8xf32>
  %logits = model.linear %o0, %wo : (tensor<1x6x8xf32>, tensor<8x8xf32>) -> tensor<1x6x8xf32>
  %sum, %count = model.cross_entropy %logits, %t {ignore_index = -100 : i64} : (tensor<1x6x8xf32>, tensor<1x6xi32>) -> (tensor<f32>, tensor<f32>)
  return %sum : tensor<f32>
}

// -----

// An MoE block: the experts' gradients, the router's through moe_route_grad, and the normed input's two gradients summed.
// CHECK-LABEL: func.func @train_step
// CHECK: %[[X:.+]] = model.rms_norm
// CHECK: %[[GATES:[^ ,]+]], %[[EXPERTS:[^ ,]+]] = model.moe_route
// CHECK: %[[WIN:.+]] = model.param "block_sparse_moe.input_linear.weight"
// CHECK: %[[WOUT:.+]] = model.param "block_sparse_moe.output_linear.weight"
// CHECK: %[[DO:.+]] = model.linear_grad_input
// CHECK: %[[DX:[^ ,]+]], %[[DGATES:[^ ,]+]], %[[DWIN:[^ ,]+]], %[[DWOUT:[^ ,]+]] = model.moe_experts_grad %[[DO]], %[[X]], %[[GATES]], %[[EXPERTS]], %[[WIN]], %[[WOUT]]
// CHECK: model.param_grad "block_sparse_moe.output_linear.weight", %[[DWOUT]]
// CHECK: model.param_grad "block_sparse_moe.input_linear.weight", %[[DWIN]]
// CHECK: %[[DRL:.+]] = model.moe_route_grad %[[DGATES]], %[[GATES]], %[[EXPERTS]] : (tensor<1x5x2xf32>, tensor<1x5x2xf32>, tensor<1x5x2xi32>) -> tensor<1x5x6xf32>
// CHECK: %[[DXR:.+]] = model.linear_grad_input %[[DRL]]
// CHECK: %[[DWR:.+]] = model.linear_grad_weight %[[DRL]], %[[X]]
// CHECK: %[[DXSUM:.+]] = model.add %[[DX]], %[[DXR]]
// CHECK: model.param_grad "block_sparse_moe.router.layer.weight", %[[DWR]]
// CHECK: model.rms_norm_grad %[[DXSUM]]
// CHECK: model.param_grad "post_attention_layernorm.weight"
func.func @train_step(%h: tensor<1x5x4xf32>, %t: tensor<1x5xi32>) -> tensor<f32> {
  %nw = model.param "post_attention_layernorm.weight" ones : tensor<4xf32>
  %x = model.rms_norm %h, %nw {eps = 1.0e-5 : f64} : tensor<1x5x4xf32>, tensor<4xf32>
  %wr = model.param "block_sparse_moe.router.layer.weight" normal(0.02) : tensor<6x4xf32>
  %rl = model.linear %x, %wr : (tensor<1x5x4xf32>, tensor<6x4xf32>) -> tensor<1x5x6xf32>
  %gates, %experts = model.moe_route %rl {top_k = 2 : i64} : tensor<1x5x6xf32> -> tensor<1x5x2xf32>, tensor<1x5x2xi32>
  %win = model.param "block_sparse_moe.input_linear.weight" normal(0.02) : tensor<6x10x4xf32>
  %wout = model.param "block_sparse_moe.output_linear.weight" normal(0.02) : tensor<6x4x5xf32>
  %o = model.moe_experts %x, %gates, %experts, %win, %wout : (tensor<1x5x4xf32>, tensor<1x5x2xf32>, tensor<1x5x2xi32>, tensor<6x10x4xf32>, tensor<6x4x5xf32>) -> tensor<1x5x4xf32>
  %head = model.param "lm_head.weight" normal(0.02) : tensor<8x4xf32>
  %logits = model.linear %o, %head : (tensor<1x5x4xf32>, tensor<8x4xf32>) -> tensor<1x5x8xf32>
  %sum, %count = model.cross_entropy %logits, %t {ignore_index = -100 : i64} : (tensor<1x5x8xf32>, tensor<1x5xi32>) -> (tensor<f32>, tensor<f32>)
  return %sum : tensor<f32>
}

// -----

// The loss is the mean over valid tokens: the seed divided by the count reaches cross_entropy_grad; the count's own gradient is dropped.
// CHECK-LABEL: func.func @train_step
// CHECK: %[[LOGITS:.+]] = model.scale
// CHECK: %[[SUM:[^ ,]+]], %[[COUNT:[^ ,]+]] = model.cross_entropy %[[LOGITS]]
// CHECK: %[[LOSS:.+]] = model.div %[[SUM]], %[[COUNT]]
// CHECK: %[[SEED:.+]] = model.fill 1.000000e+00 : tensor<f32>
// CHECK: %[[DSUM:.+]] = model.div %[[SEED]], %[[COUNT]] : tensor<f32>, tensor<f32>
// CHECK-NOT: model.mul
// CHECK: %[[DLOGITS:.+]] = model.cross_entropy_grad %[[DSUM]], %[[LOGITS]], %{{.+}} {ignore_index = -100 : i64}
// CHECK: model.scale %[[DLOGITS]] {factor = 0.16666666666666666 : f64}
// CHECK: model.param_grad "lm_head.weight"
// CHECK: return %[[LOSS]] : tensor<f32>
func.func @train_step(%x: tensor<2x5x4xf32>, %t: tensor<2x5xi32>) -> tensor<f32> {
  %head = model.param "lm_head.weight" normal(0.02) : tensor<8x4xf32>
  %l0 = model.linear %x, %head : (tensor<2x5x4xf32>, tensor<8x4xf32>) -> tensor<2x5x8xf32>
  %logits = model.scale %l0 {factor = 0.16666666666666666 : f64} : tensor<2x5x8xf32>
  %sum, %count = model.cross_entropy %logits, %t {ignore_index = -100 : i64} : (tensor<2x5x8xf32>, tensor<2x5xi32>) -> (tensor<f32>, tensor<f32>)
  %loss = model.div %sum, %count : tensor<f32>, tensor<f32>
  return %loss : tensor<f32>
}

// -----

// A cast's gradient is cast back to the input's type: a bf16 activation entering an f32 chain
// gets a bf16 gradient.
// CHECK-LABEL: func.func @train_step
// CHECK: %[[DY:.+]] = model.linear_grad_input
// CHECK: %[[DX:.+]] = model.cast %[[DY]] : tensor<2x5x8xf32> to tensor<2x5x8xbf16>
// CHECK: model.linear_grad_weight %[[DX]]
func.func @train_step(%x: tensor<2x5x4xbf16>, %t: tensor<2x5xi32>) -> tensor<f32> {
  %w = model.param "w" normal(0.02) : tensor<8x4xbf16>
  %v = model.param "v" normal(0.02) : tensor<8x8xf32>
  %l = model.linear %x, %w : (tensor<2x5x4xbf16>, tensor<8x4xbf16>) -> tensor<2x5x8xbf16>
  %c = model.cast %l : tensor<2x5x8xbf16> to tensor<2x5x8xf32>
  %m = model.linear %c, %v : (tensor<2x5x8xf32>, tensor<8x8xf32>) -> tensor<2x5x8xf32>
  %sum, %count = model.cross_entropy %m, %t {ignore_index = -100 : i64} : (tensor<2x5x8xf32>, tensor<2x5xi32>) -> (tensor<f32>, tensor<f32>)
  return %sum : tensor<f32>
}

// -----

// The load-balancing loss: its gradient reaches the summed probabilities (not the picks, a
// count), then the router logits through their softmax, added to what the routing's gates give
// them; the reported values are not differentiated.
// CHECK-LABEL: func.func @train_step
// CHECK: %[[R:.+]] = model.linear %{{.+}}, %[[W:.+]] :
// CHECK: %[[G:.+]], %[[I:.+]] = model.moe_route %[[R]]
// CHECK: %[[P:.+]], %[[C:.+]] = model.router_load %[[R]], %[[I]]
// CHECK: model.report "router_aux_loss"
// CHECK: %[[SEED:.+]] = model.fill 1.000000e+00
// CHECK: %[[DP:.+]] = model.router_aux_loss_grad %{{.+}}, %[[C]] {scale = 2.500000e-01 : f64}
// CHECK: %[[DLA:.+]] = model.router_load_grad %[[DP]], %[[R]]
// CHECK: %[[DLB:.+]] = model.moe_route_grad
// CHECK: %[[DL:.+]] = model.add %[[DLA]], %[[DLB]]
// CHECK: model.linear_grad_weight %[[DL]]
// CHECK-NOT: model.router_load_grad
func.func @train_step(%x: tensor<1x4x3xf32>, %t: tensor<1x4xi32>) -> tensor<f32> {
  %w = model.param "router" normal(0.02) : tensor<4x3xf32>
  %r = model.linear %x, %w : (tensor<1x4x3xf32>, tensor<4x3xf32>) -> tensor<1x4x4xf32>
  %g, %i = model.moe_route %r {top_k = 2 : i64} : tensor<1x4x4xf32> -> tensor<1x4x2xf32>, tensor<1x4x2xi32>
  %p, %c = model.router_load %r, %i : (tensor<1x4x4xf32>, tensor<1x4x2xi32>) -> (tensor<4xf32>, tensor<4xf32>)
  %aux = model.router_aux_loss %p, %c {scale = 0.25 : f64} : (tensor<4xf32>, tensor<4xf32>) -> tensor<f32>
  model.report "router_aux_loss", %aux : tensor<f32>
  %s, %n = model.cross_entropy %g, %t {ignore_index = -100 : i64} : (tensor<1x4x2xf32>, tensor<1x4xi32>) -> (tensor<f32>, tensor<f32>)
  %loss = model.add %s, %aux : tensor<f32>, tensor<f32>
  return %loss : tensor<f32>
}

// -----

// Packed documents: the backward of each sequence op reads the same positions as its forward;
// the positions themselves (token indices) get no gradient.
// CHECK-LABEL: func.func @train_step
// CHECK-SAME: %{{[^:]+}}: tensor<1x6xi32>, %[[POS:[^:]+]]: tensor<1x6xi32>
// CHECK: model.attention_grad {{.+}} positions %[[POS]] {causal
// CHECK: model.causal_conv1d_grad {{.+}} positions %[[POS]] :
func.func @train_step(%x: tensor<1x6x4xf32>, %t: tensor<1x6xi32>, %pos: tensor<1x6xi32>) -> tensor<f32> {
  %w = model.param "conv" normal(0.02) : tensor<4x1x3xf32>
  %b = model.param "bias" zeros : tensor<4xf32>
  %y = model.causal_conv1d %x, %w, %b positions %pos : (tensor<1x6x4xf32>, tensor<4x1x3xf32>, tensor<4xf32>, tensor<1x6xi32>) -> tensor<1x6x4xf32>
  %q = model.reshape %y : tensor<1x6x4xf32> -> tensor<1x6x1x4xf32>
  %o, %lse = model.attention %q, %q, %q positions %pos {causal, scale = 0.5 : f64} : (tensor<1x6x1x4xf32>, tensor<1x6x1x4xf32>, tensor<1x6x1x4xf32>, tensor<1x6xi32>) -> (tensor<1x6x1x4xf32>, tensor<1x1x6xf32>)
  %l = model.reshape %o : tensor<1x6x1x4xf32> -> tensor<1x6x4xf32>
  %sum, %count = model.cross_entropy %l, %t {ignore_index = -100 : i64} : (tensor<1x6x4xf32>, tensor<1x6xi32>) -> (tensor<f32>, tensor<f32>)
  return %sum : tensor<f32>
}

// -----

// Only the function named by the `function` option (train_step by default) is differentiated.
// CHECK-LABEL: func.func @eval_step
// CHECK-NOT: model.param_grad
// OTHER-LABEL: func.func @eval_step
// OTHER: %[[SEED:.+]] = model.fill 1.000000e+00
// OTHER: model.param_grad "w"
func.func @eval_step(%x: tensor<2x5x4xf32>, %t: tensor<2x5xi32>) -> tensor<f32> {
  %w = model.param "w" normal(0.02) : tensor<8x4xf32>
  %l = model.linear %x, %w : (tensor<2x5x4xf32>, tensor<8x4xf32>) -> tensor<2x5x8xf32>
  %sum, %count = model.cross_entropy %l, %t {ignore_index = -100 : i64} : (tensor<2x5x8xf32>, tensor<2x5xi32>) -> (tensor<f32>, tensor<f32>)
  return %sum : tensor<f32>
}
