// The `exec` dialect: what the runtime does, in order. Buffers are (arena, offset, size) memrefs,
// kernel launches name an entry of runtime/plan/KernelTable.txt. It maps one-to-one to the plan.
#ifndef HYBRIDCP_EXEC_DIALECT_TD
#define HYBRIDCP_EXEC_DIALECT_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/EnumAttr.td"

def Exec_Dialect : Dialect {
  let name = "exec";
  let cppNamespace = "::hcp::exec";
  let summary = "kernel launches over statically placed buffers";
  let useDefaultAttributePrinterParser = 1;
}

def Exec_Arena : I32EnumAttr<"Arena", "where a buffer lives", [
  // Persist across steps.
  I32EnumAttrCase<"Parameters", 0, "parameters">,
  I32EnumAttrCase<"Gradients", 1, "gradients">,
  // Reused within a step by liveness.
  I32EnumAttrCase<"Activations", 2, "activations">,
  // Token ids and targets, written by the data loader before each step.
  I32EnumAttrCase<"Inputs", 3, "inputs">
]> {
  let cppNamespace = "::hcp::exec";
}

class Exec_Op<string mnemonic, list<Trait> traits = []> : Op<Exec_Dialect, mnemonic, traits>;

def Exec_Buffer : MemRefOf<[F32, BF16, I32]>;

#endif  // HYBRIDCP_EXEC_DIALECT_TD
