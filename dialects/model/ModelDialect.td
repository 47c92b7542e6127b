// The `model` dialect: one training step of a GraniteMoeHybrid model on global shapes, in tensor
// semantics. Parameters carry their Hugging Face checkpoint names.
#ifndef HYBRIDCP_MODEL_DIALECT_TD
#define HYBRIDCP_MODEL_DIALECT_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/EnumAttr.td"

def Model_Dialect : Dialect {
  let name = "model";
  let cppNamespace = "::hcp::model";
  let summary = "GraniteMoeHybrid model ops on tensors";
  let description = [{
    Ops for every part of a Granite 4.0-H training step: embedding, norms, linear layers, the
    Mamba2 mixer (causal conv1d, SSD scan, gated RMSNorm), attention, mixture-of-experts routing
    and expert compute, the shared MLP and the cross-entropy loss. Shapes are global: the
    sequence is not split yet.
  }];
}

// How the runtime initialises a parameter when no checkpoint is given.
def Model_ParamInit : I32EnumAttr<"ParamInit", "parameter initialisation", [
  I32EnumAttrCase<"Normal", 0, "normal">,
  I32EnumAttrCase<"Zeros", 1, "zeros">,
  I32EnumAttrCase<"Ones", 2, "ones">,
  // log(1), log(2), ..., log(heads): Mamba2's A_log.
  I32EnumAttrCase<"LogArange", 3, "log_arange">
]> {
  let cppNamespace = "::hcp::model";
}

class Model_Op<string mnemonic, list<Trait> traits = []>
    : Op<Model_Dialect, mnemonic, traits>;

// Activations and parameters: fp32 on the CPU backend, bf16 on GPUs.
def Model_FloatTensor : RankedTensorOf<[F32, BF16]>;
def Model_TokenTensor : RankedTensorOf<[I32]>;
def Model_Scalar : 0DTensorOf<[F32]>;

#endif  // HYBRIDCP_MODEL_DIALECT_TD
