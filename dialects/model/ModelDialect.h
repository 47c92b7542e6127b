// The `model` dialect: GraniteMoeHybrid ops on tensors, global shapes.
#pragma once

#include "dialects/model/ModelDialect.h.inc"
#include "mlir/IR/Dialect.h"
