#pragma once

#include "dialects/exec/ExecDialect.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"

namespace hcp {

#define GEN_PASS_DECL
#include "passes/lowering/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "passes/lowering/Passes.h.inc"

// The attribute hcp-plan-memory puts on the module: bytes per arena.
inline constexpr char kArenaBytesAttr[] = "exec.arena_bytes";

}  // namespace hcp
