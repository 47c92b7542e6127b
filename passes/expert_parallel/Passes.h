#pragma once

#include "dialects/dist/DistDialect.h"
#include "dialects/model/ModelDialect.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"

namespace hcp {

#define GEN_PASS_DECL
#include "passes/expert_parallel/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "passes/expert_parallel/Passes.h.inc"

}  // namespace hcp
