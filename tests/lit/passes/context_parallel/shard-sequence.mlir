// hcp-shard-sequence: the training step's activations get the per-rank sequence length;
// parameters and per-sequence states keep their shapes.
// RUN: hybridcp-opt %s --split-input-file --hcp-shard-sequence="cp=4 layout=zigzag" --verify-diagnostics | FileCheck %s
// RUN: not hybridcp-opt %s --split-input-file --hcp-shard-sequence="cp=4 layout=zig" 2>&1 | FileCheck %s --check-prefix=BADLAYOUT
// An unknown layout is refused by the option's parser, which names the valid ones.
// BADLAYOUT: for the --layout option: unknown value 'zig'; expected contiguous or zigzag

// Token ids, embeddings, projections, reshapes and the attention log-sum-exp shrink from 32 to
// 8 tokens; the embedding table, the SSD state and the loss scalars do not.
// CHECK: module attributes {dist.mesh = #dist.mesh<cp = 4, dp = 1>, dist.sequence = #dist.sequence<zigzag, cp = 4, seq = 32>}
// CHECK-LABEL: func.func @train_step
// CHECK-SAME: (%{{.+}}: tensor<2x8xi32> {model.input = "input_ids"}, %{{.+}}: tensor<2x8xi32> {model.input = "targets"})
// CHECK: model.param "w" normal(2.000000e-02) : tensor<16x4xf32>
// CHECK: model.embedding {{.+}} -> tensor<2x8x4xf32>
// CHECK: model.linear {{.+}} -> tensor<2x8x16xf32>
// CHECK: model.reshape {{.+}} : tensor<2x8x16xf32> -> tensor<2x8x4x4xf32>
// CHECK: model.attention {{.+}} -> (tensor<2x8x4x4xf32>, tensor<2x4x8xf32>)
// CHECK: model.cross_entropy {{.+}} : (tensor<2x8x16xf32>, tensor<2x8xi32>) -> (tensor<f32>, tensor<f32>)
func.func @train_step(%ids: tensor<2x32xi32> {model.input = "input_ids"}, %targets: tensor<2x32xi32> {model.input = "targets"}) -> tensor<f32> {
  %w = model.param "w" normal(0.02) : tensor<16x4xf32>
  %e = model.embedding %w, %ids {multiplier = 1.0 : f64} : (tensor<16x4xf32>, tensor<2x32xi32>) -> tensor<2x32x4xf32>
  %l = model.linear %e, %w : (tensor<2x32x4xf32>, tensor<16x4xf32>) -> tensor<2x32x16xf32>
  %q = model.reshape %l : tensor<2x32x16xf32> -> tensor<2x32x4x4xf32>
  %o, %lse = model.attention %q, %q, %q {causal, scale = 0.5 : f64} : (tensor<2x32x4x4xf32>, tensor<2x32x4x4xf32>, tensor<2x32x4x4xf32>) -> (tensor<2x32x4x4xf32>, tensor<2x4x32xf32>)
  %s, %c = model.cross_entropy %l, %targets {ignore_index = -100 : i64} : (tensor<2x32x16xf32>, tensor<2x32xi32>) -> (tensor<f32>, tensor<f32>)
  %loss = model.div %s, %c : tensor<f32>, tensor<f32>
  return %loss : tensor<f32>
}

// -----

// A sequence that does not split into 2*cp equal pieces is refused before anything changes.
// expected-error @+1 {{sequence length 30 cannot be split into 8 equal pieces for cp=4 (zigzag)}}
module {
func.func @train_step(%ids: tensor<1x30xi32> {model.input = "input_ids"}, %targets: tensor<1x30xi32> {model.input = "targets"}) -> tensor<f32> {
  %z = model.fill 0.0 : tensor<f32>
  return %z : tensor<f32>
}
}
