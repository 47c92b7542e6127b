// Turns a GraniteConfig into a `model` dialect module: one function computing the loss of one
// micro-batch from token ids and (already shifted) targets, every parameter named and shaped as
// in the Hugging Face checkpoint.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "compiler/import/GraniteConfig.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/OwningOpRef.h"

namespace hcp {

enum class ActivationType { kF32, kBF16 };

struct ImportOptions {
  int64_t seq = 0;
  int64_t micro_batch = 1;
  ActivationType dtype = ActivationType::kF32;
};

// The name of the function the importer builds.
inline constexpr char kTrainStepFunction[] = "train_step";
// Targets equal to this are ignored by the loss (Hugging Face's convention).
inline constexpr int64_t kIgnoreIndex = -100;

absl::StatusOr<mlir::OwningOpRef<mlir::ModuleOp>> ImportModel(mlir::MLIRContext& context,
                                                              const GraniteConfig& config,
                                                              const ImportOptions& options);

}  // namespace hcp
