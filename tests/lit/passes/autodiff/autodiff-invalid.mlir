// hcp-autodiff's errors: what it cannot differentiate, and why, in the model's terms.
// RUN: hybridcp-opt %s --split-input-file --hcp-autodiff --verify-diagnostics

// A parameter the loss does not depend on gets no gradient: the pass names it.
func.func @train_step(%x: tensor<2x5x4xf32>, %t: tensor<2x5xi32>) -> tensor<f32> {
  %w = model.param "w" normal(0.02) : tensor<8x4xf32>
  // expected-error @+1 {{parameter 'model.layers.0.unused.weight' gets no gradient: the loss does not depend on it}}
  %u = model.param "model.layers.0.unused.weight" normal(0.02) : tensor<8x4xf32>
  %l = model.linear %x, %w : (tensor<2x5x4xf32>, tensor<8x4xf32>) -> tensor<2x5x8xf32>
  %sum, %count = model.cross_entropy %l, %t {ignore_index = -100 : i64} : (tensor<2x5x8xf32>, tensor<2x5xi32>) -> (tensor<f32>, tensor<f32>)
  return %sum : tensor<f32>
}

// -----

// An op without a backward rule on the path to the loss stops the pass.
func.func @train_step(%x: tensor<2x5x4xf32>, %t: tensor<2x5xi32>) -> tensor<f32> {
  %w = model.param "w" normal(0.02) : tensor<8x4xf32>
  %l = model.linear %x, %w : (tensor<2x5x4xf32>, tensor<8x4xf32>) -> tensor<2x5x8xf32>
  %d = model.linear_grad_input %l, %w : (tensor<2x5x8xf32>, tensor<8x4xf32>) -> tensor<2x5x4xf32>
  // expected-error @+1 {{'model.sum_leading' op has no backward rule (DifferentiableOpInterface): hcp-autodiff cannot differentiate through it}}
  %s = model.sum_leading %d : tensor<2x5x4xf32> -> tensor<f32>
  return %s : tensor<f32>
}

// -----

// The training step returns one scalar loss.
// expected-error @+1 {{function 'train_step' must return exactly one scalar loss (a 0-d float tensor)}}
func.func @train_step(%x: tensor<2x5x4xf32>) -> tensor<2x5x8xf32> {
  %w = model.param "w" normal(0.02) : tensor<8x4xf32>
  %l = model.linear %x, %w : (tensor<2x5x4xf32>, tensor<8x4xf32>) -> tensor<2x5x8xf32>
  return %l : tensor<2x5x8xf32>
}

// -----

// A loss that no parameter influences has nothing to differentiate.
// expected-error @+1 {{the loss of 'train_step' does not depend on any parameter: nothing to differentiate}}
func.func @train_step(%logits: tensor<2x5x8xf32>, %t: tensor<2x5xi32>) -> tensor<f32> {
  %sum, %count = model.cross_entropy %logits, %t {ignore_index = -100 : i64} : (tensor<2x5x8xf32>, tensor<2x5xi32>) -> (tensor<f32>, tensor<f32>)
  return %sum : tensor<f32>
}

// -----

// A function that already has its backward is not differentiated twice.
func.func @train_step(%x: tensor<2x5x4xf32>, %t: tensor<2x5xi32>) -> tensor<f32> {
  %w = model.param "w" normal(0.02) : tensor<8x4xf32>
  %l = model.linear %x, %w : (tensor<2x5x4xf32>, tensor<8x4xf32>) -> tensor<2x5x8xf32>
  %sum, %count = model.cross_entropy %l, %t {ignore_index = -100 : i64} : (tensor<2x5x8xf32>, tensor<2x5xi32>) -> (tensor<f32>, tensor<f32>)
  // expected-error @+1 {{'model.param_grad' op 'train_step' already has parameter gradients: hcp-autodiff runs once}}
  model.param_grad "w", %w : tensor<8x4xf32>
  return %sum : tensor<f32>
}

// -----

// A declaration has no body to differentiate.
// expected-error @+1 {{function 'train_step' has no body to differentiate}}
func.func private @train_step(tensor<2x5xi32>) -> tensor<f32>
