// The outcome of one training step (loss and every parameter gradient, by checkpoint name), as
// `run-step` computes, saves and compares it. The fixtures' reference.safetensors has the same
// layout: "loss" [1] and "grad.<name>".
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/exec/CpuExecutor.h"

namespace hcp {

struct StepResult {
  float loss = 0;
  // The MoE load-balancing loss (transformers' aux_loss) of a plan with it; the gradients are
  // those of loss + coefficient * it.
  std::optional<float> router_aux_loss;
  std::vector<std::pair<std::string, std::vector<float>>> gradients;  // in the plan's order
};

StepResult StepResultOf(CpuExecutor& executor);
// A file written by WriteStepResult, or a fixture directory (its reference.safetensors).
absl::StatusOr<StepResult> ReadStepResult(const std::string& path);
absl::Status WriteStepResult(const StepResult& result, const std::string& path);

struct Tolerances {
  double loss = 1e-5;  // relative error of the loss
  double grad = 1e-4;  // relative RMS error of each gradient
};

// Prints the loss error and the worst gradient error (every gradient with `verbose`, every one
// over tolerance always), then "MATCH"; an error names how many gradients are over tolerance.
// Both must hold gradients of the same parameters (an error lists the differences), each with
// the same size; the count compared is printed.
absl::Status CompareStepResults(const StepResult& actual, const StepResult& reference,
                                const std::string& reference_name, const Tolerances& tolerances,
                                bool verbose);

}  // namespace hcp
