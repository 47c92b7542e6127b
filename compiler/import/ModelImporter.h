// Turns a GraniteConfig into a `model` dialect module: one function computing the loss of one
// micro-batch from token ids and (already shifted) targets, every parameter named and shaped as
// in the Hugging Face checkpoint. With the MoE load-balancing loss (ImportOptions::
// router_aux_loss > 0) the function takes a fourth input, aux_loss_scale, and returns the
// objective, loss + coefficient * aux_loss_scale * aux, reporting the two parts by name
// (model.report "loss" and "router_aux_loss").
#pragma once

#include <cstdint>
#include <optional>

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
  // The MoE load-balancing loss's coefficient (0: none). RouterAuxLossCoefficient gives the
  // config's, or the one compile --router-aux-loss names.
  double router_aux_loss = 0;
  // Packed documents (compile --documents): the step takes position_ids [micro_batch, seq] (each
  // token's position in its document, Hugging Face's padding-free convention), and no layer
  // reads across a document start.
  bool documents = false;
};

// The coefficient of the MoE load-balancing loss for `config`: `given` (compile
// --router-aux-loss; 0 turns it off), else the config's router_aux_loss_coef when its
// output_router_logits is true, else 0. A dense model has none: a positive `given` is refused.
absl::StatusOr<double> RouterAuxLossCoefficient(const GraniteConfig& config,
                                                std::optional<double> given);

// The name of the function the importer builds.
inline constexpr char kTrainStepFunction[] = "train_step";
// Targets equal to this are ignored by the loss (Hugging Face's convention).
inline constexpr int64_t kIgnoreIndex = -100;

absl::StatusOr<mlir::OwningOpRef<mlir::ModuleOp>> ImportModel(mlir::MLIRContext& context,
                                                              const GraniteConfig& config,
                                                              const ImportOptions& options);

}  // namespace hcp
