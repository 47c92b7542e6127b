#ifndef HYBRIDCP_EXEC_OPS_TD
#define HYBRIDCP_EXEC_OPS_TD

include "dialects/exec/ExecDialect.td"
include "dialects/model/ModelDialect.td"
include "mlir/Interfaces/SideEffectInterfaces.td"

// A parameter's initialiser, the model dialect's ParamInit: `#exec.init<ones>`.
def Exec_ParamInitAttr : EnumAttr<Exec_Dialect, Model_ParamInit, "init"> {
  let cppNamespace = "::hcp::exec";
  let assemblyFormat = "`<` $value `>`";
}

def Exec_BufferOp : Exec_Op<"buffer", [MemoryEffects<[MemAlloc]>]> {
  let summary = "a buffer in an arena";
  let description = [{
    `%w = exec.buffer parameters "model.norm.weight" {init = #exec.init<ones>} : memref<1536xf32>`
    Parameters carry their checkpoint name and initialiser (`init`: normal, zeros, ones,
    log_arange; `std` for normal); gradients carry the parameter's name; inputs are named
    "input_ids" and "targets"; activations get an `offset` in bytes from hcp-plan-memory.
    The value and gradient of an expert-parallel parameter carry `shards` (the mesh's ep): the
    buffer is the rank's rows [i*R/shards, (i+1)*R/shards) along dim 0 of the checkpoint tensor,
    whose shape is the buffer's with dim 0 times shards.
  }];
  let arguments = (ins Exec_Arena:$arena, StrAttr:$name, OptionalAttr<I64Attr>:$offset,
                       OptionalAttr<Exec_ParamInitAttr>:$init, OptionalAttr<F64Attr>:$std,
                       OptionalAttr<I64Attr>:$shards);
  let results = (outs Exec_Buffer:$result);
  let assemblyFormat = "$arena $name (`offset` $offset^)? attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def Exec_ViewOp : Exec_Op<"view", [Pure]> {
  let summary = "the same bytes with another shape, or a contiguous part of them";
  let description = [{
    `%v = exec.view %w : memref<4x8xf32> to memref<32xf32>`: a reshape, which costs nothing.
    `%rows = exec.view %w offset 8 : memref<4x8xf32> to memref<2x8xf32>`: the source's elements
    [offset, offset + the view's count), here rows 1 and 2 of %w (hcp-slice-gemms reads and
    writes a weight's row blocks so).
  }];
  let arguments = (ins Exec_Buffer:$source, OptionalAttr<I64Attr>:$offset);
  let results = (outs Exec_Buffer:$result);
  let assemblyFormat = [{
    $source (`offset` $offset^)? attr-dict `:` type($source) `to` type($result)
  }];
  let hasVerifier = 1;
}

def Exec_LaunchOp : Exec_Op<"launch", [DeclareOpInterfaceMethods<MemoryEffectsOpInterface>,
                                        AttrSizedOperandSegments]> {
  let summary = "run one kernel of the kernel table";
  let description = [{
    `exec.launch "gemm" ins(%x, %w : ...) outs(%y : ...) {ints = array<i64: 0, 1, 64, 96, 48>, floats = array<f64: 1.0>}`
    Reads `ins`, overwrites `outs`; `ints` and `floats` are the kernel's scalar arguments in the
    order of the kernel's signature in runtime/plan/KernelTable.txt, whose sizes and dtypes
    the verifier checks.

    `beside` (hcp-overlap-collectives sets it): the launch runs on a stream beside the compute
    stream, from here until the next `exec.join`, while the launches in between run on the
    compute stream. Only a `beside` kernel of the table may, and it must be joined before the
    next launch that communicates and before the step ends.
  }];
  let arguments = (ins StrAttr:$kernel, Variadic<Exec_Buffer>:$ins, Variadic<Exec_Buffer>:$outs,
                       DenseI64ArrayAttr:$ints, DenseF64ArrayAttr:$floats, UnitAttr:$beside);
  let assemblyFormat = [{
    $kernel (`ins` `(` $ins^ `:` type($ins) `)`)? `outs` `(` $outs `:` type($outs) `)` attr-dict
  }];
  let hasVerifier = 1;
}

def Exec_JoinOp : Exec_Op<"join", [MemoryEffects<[MemRead, MemWrite]>]> {
  let summary = "the compute stream waits for the launch running beside it";
  let description = [{
    `exec.join`: the launches after it start once the `beside` launch before it is done
    (hcp-overlap-collectives places it before the first launch that touches that launch's
    buffers, or communicates, or at the end of the step). Its memory effects keep it in place.
  }];
  let assemblyFormat = "attr-dict";
  let hasVerifier = 1;
}

def Exec_ResultOp : Exec_Op<"result", [MemoryEffects<[MemRead]>]> {
  let summary = "a buffer the runtime reads after the step (the loss)";
  let arguments = (ins StrAttr:$name, Exec_Buffer:$value);
  let assemblyFormat = "$name `,` $value attr-dict `:` type($value)";
}

#endif  // HYBRIDCP_EXEC_OPS_TD
