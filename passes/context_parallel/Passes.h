#pragma once

#include "dialects/dist/DistDialect.h"
#include "dialects/model/ModelDialect.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"

namespace hcp {

#define GEN_PASS_DECL
#include "passes/context_parallel/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "passes/context_parallel/Passes.h.inc"

// Module attributes written by hcp-shard-sequence.
inline constexpr char kMeshAttr[] = "dist.mesh";
inline constexpr char kSequenceAttr[] = "dist.sequence";

}  // namespace hcp
