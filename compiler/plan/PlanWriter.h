// Writes the plan file from an `exec` module (after hcp-lower-to-exec and hcp-plan-memory).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "mlir/IR/BuiltinOps.h"

namespace hcp {

struct PlanInfo {
  std::string model;         // config source, for `inspect`
  std::string model_config;  // the config.json text, written into every checkpoint
  int64_t seq = 0;
  int64_t micro_batch = 0;
  double flops_per_step = 0.0;
  double router_aux_loss = 0.0;  // the load-balancing loss's coefficient; 0: none
};

// The plan file's bytes (header + FlatBuffer), validated by loading them back exactly as the
// runtime will: a plan the runtime would refuse is an error here, naming what is wrong.
absl::StatusOr<std::string> WritePlan(mlir::ModuleOp module, const PlanInfo& info);

}  // namespace hcp
