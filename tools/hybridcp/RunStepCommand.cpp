// `hybridcp run-step`: one training step of a plan on the CPU backend; optionally compared with a
// reference (the transformers fixtures).
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "runtime/exec/CpuExecutor.h"
#include "runtime/plan/PlanFile.h"
#include "runtime/support/Status.h"
#include "runtime/weights/Checkpoint.h"
#include "runtime/weights/Safetensors.h"
#include "tools/hybridcp/Commands.h"

namespace hcp {
namespace {

// A token tensor of a safetensors file as int32, checked against the plan's micro-batch.
absl::StatusOr<std::vector<int32_t>> ReadTokens(const SafetensorsFile& file,
                                                const std::string& name, int64_t expected) {
  HCP_ASSIGN_OR_RETURN(std::vector<int64_t> values, file.ReadInt(name));
  if (static_cast<int64_t>(values.size()) != expected) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: '%s' has %d tokens but the plan's micro-batch takes %d", file.path(),
                        name, values.size(), expected));
  }
  std::vector<int32_t> tokens(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    if (values[i] < INT32_MIN || values[i] > INT32_MAX) {
      return absl::InvalidArgumentError(absl::StrFormat("%s: '%s'[%d] = %d does not fit in int32",
                                                        file.path(), name, i, values[i]));
    }
    tokens[i] = static_cast<int32_t>(values[i]);
  }
  return tokens;
}

double RelativeRms(std::span<const float> value, const std::vector<float>& reference) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < reference.size(); ++i) {
    diff += (double(value[i]) - reference[i]) * (double(value[i]) - reference[i]);
    norm += double(reference[i]) * reference[i];
  }
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

// Compares loss and every gradient with DIR/reference.safetensors ("loss", "grad.<name>").
absl::Status Compare(CpuExecutor& executor, const std::string& dir, double loss_tolerance,
                     double grad_tolerance, bool verbose) {
  HCP_ASSIGN_OR_RETURN(SafetensorsFile reference,
                       SafetensorsFile::Open(dir + "/reference.safetensors"));
  HCP_ASSIGN_OR_RETURN(std::vector<float> loss, reference.ReadF32("loss"));
  double loss_error = std::abs(double(executor.Loss()) - loss.at(0)) / std::abs(double(loss.at(0)));
  std::printf("reference loss %.7f, relative error %.3e (tolerance %.0e)\n", loss.at(0), loss_error,
              loss_tolerance);
  double worst = 0;
  std::string worst_name;
  int failures = 0;
  for (const plan::Parameter& parameter : executor.parameters()) {
    std::string name = "grad." + parameter.name;
    if (reference.Find(name) == nullptr) {
      return absl::NotFoundError(
          absl::StrFormat("%s: no reference gradient '%s'", reference.path(), name));
    }
    HCP_ASSIGN_OR_RETURN(std::vector<float> expected, reference.ReadF32(name));
    HCP_ASSIGN_OR_RETURN(std::span<float> gradient, executor.Gradient(parameter.name));
    if (expected.size() != gradient.size()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("reference gradient '%s' has %d values, the plan's has %d", name,
                          expected.size(), gradient.size()));
    }
    double error = RelativeRms(gradient, expected);
    failures += !(error <= grad_tolerance);
    if (verbose || !(error <= grad_tolerance)) {
      std::printf("  %-60s relative RMS %.3e%s\n", parameter.name.c_str(), error,
                  error <= grad_tolerance ? "" : "  FAIL");
    }
    if (!(error <= worst)) {
      worst = error;
      worst_name = parameter.name;
    }
  }
  std::printf("gradients: %zu compared, worst relative RMS %.3e (%s), tolerance %.0e\n",
              executor.parameters().size(), worst, worst_name.c_str(), grad_tolerance);
  if (!(loss_error <= loss_tolerance) || failures > 0) {
    return absl::FailedPreconditionError(
        absl::StrFormat("the step does not match %s: loss error %.3e, %d gradients over tolerance",
                        dir, loss_error, failures));
  }
  std::printf("MATCH\n");
  return absl::OkStatus();
}

absl::Status RunStep(const Args& args) {
  if (args.positionals().size() != 1) return absl::InvalidArgumentError("give one plan file");
  HCP_ASSIGN_OR_RETURN(plan::Plan plan, plan::LoadPlan(args.positionals()[0]));
  HCP_ASSIGN_OR_RETURN(std::unique_ptr<CpuExecutor> executor, CpuExecutor::Create(plan));
  if (std::optional<std::string> weights = args.Get("weights")) {
    HCP_ASSIGN_OR_RETURN(CheckpointReader checkpoint, CheckpointReader::Open(*weights));
    HCP_RETURN_IF_ERROR(executor->LoadParameters(checkpoint));
  } else {
    HCP_ASSIGN_OR_RETURN(int64_t seed, args.GetInt("seed", 0));
    executor->InitializeParameters(static_cast<uint64_t>(seed));
  }
  std::optional<std::string> inputs_path = args.Get("inputs");
  if (!inputs_path) {
    return absl::InvalidArgumentError(
        "--inputs FILE.safetensors (with input_ids and targets) is required");
  }
  HCP_ASSIGN_OR_RETURN(SafetensorsFile inputs, SafetensorsFile::Open(*inputs_path));
  HCP_ASSIGN_OR_RETURN(std::vector<int32_t> ids, ReadTokens(inputs, "input_ids", plan.tokens()));
  HCP_ASSIGN_OR_RETURN(std::vector<int32_t> targets, ReadTokens(inputs, "targets", plan.tokens()));
  HCP_RETURN_IF_ERROR(executor->SetInputs(ids, targets));
  HCP_RETURN_IF_ERROR(executor->RunStep());
  std::printf("loss %.7f\n", executor->Loss());
  if (std::optional<std::string> reference = args.Get("compare")) {
    HCP_ASSIGN_OR_RETURN(double loss_tolerance, args.GetDouble("loss-tolerance", 1e-5));
    HCP_ASSIGN_OR_RETURN(double grad_tolerance, args.GetDouble("grad-tolerance", 1e-4));
    return Compare(*executor, *reference, loss_tolerance, grad_tolerance, args.Has("verbose"));
  }
  return absl::OkStatus();
}

}  // namespace

Command MakeRunStepCommand() {
  return Command{
      "run-step",
      "run one training step of a plan on the CPU: loss and gradients",
      "run-step FILE.plan --inputs FILE.safetensors [--weights DIR | --seed N] [--compare DIR]",
      {{"inputs", "FILE", "safetensors with input_ids and targets (targets already shifted)"},
       {"weights", "DIR", "checkpoint directory (model.safetensors or a sharded index)"},
       {"seed", "N", "initialise parameters from this seed instead (default 0)"},
       {"compare", "DIR", "compare loss and gradients with DIR/reference.safetensors"},
       {"loss-tolerance", "X", "relative loss error allowed by --compare (default 1e-5)"},
       {"grad-tolerance", "X", "relative RMS gradient error allowed by --compare (default 1e-4)"},
       {"verbose", "", "print every gradient's error"}},
      RunStep,
  };
}

}  // namespace hcp
