// The `model` dialect: GraniteMoeHybrid ops on tensors, global shapes.
#pragma once

#include "mlir/IR/Dialect.h"

#include "dialects/model/ModelDialect.h.inc"
