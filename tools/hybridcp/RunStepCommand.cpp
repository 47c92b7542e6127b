// `hybridcp run-step`: one training step of a plan on the CPU backend; optionally compared with a
// reference (the transformers fixtures).
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "runtime/comm/Agreement.h"
#include "runtime/exec/CpuExecutor.h"
#include "runtime/plan/PlanFile.h"
#include "runtime/support/Status.h"
#include "runtime/weights/Checkpoint.h"
#include "runtime/weights/Safetensors.h"
#include "tools/hybridcp/Commands.h"
#include "tools/hybridcp/StepResult.h"
#include "tools/hybridcp/World.h"

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

absl::StatusOr<Tolerances> ReadTolerances(const Args& args) {
  Tolerances tolerances;
  HCP_ASSIGN_OR_RETURN(tolerances.loss, args.GetDouble("loss-tolerance", tolerances.loss));
  HCP_ASSIGN_OR_RETURN(tolerances.grad, args.GetDouble("grad-tolerance", tolerances.grad));
  return tolerances;
}

// Rank 0's report: the loss, then --save and --compare.
absl::Status Report(const StepResult& step, const Args& args) {
  std::printf("loss %.7f\n", step.loss);
  if (std::optional<std::string> save = args.Get("save")) {
    HCP_RETURN_IF_ERROR(WriteStepResult(step, *save));
  }
  std::optional<std::string> reference = args.Get("compare");
  if (!reference) return absl::OkStatus();
  HCP_ASSIGN_OR_RETURN(Tolerances tolerances, ReadTolerances(args));
  HCP_ASSIGN_OR_RETURN(StepResult expected, ReadStepResult(*reference));
  return CompareStepResults(step, expected, *reference, tolerances, args.Has("verbose"));
}

absl::Status RunStep(const Args& args) {
  if (args.positionals().size() != 1) return absl::InvalidArgumentError("give one plan file");
  HCP_ASSIGN_OR_RETURN(World world, World::Join());
  comm::Communicator& comm = world.comm();
  // Every rank loads; the first collective checks that all did, with the same plan, and that
  // the plan's cp x dp matches the ranks started, before anything else communicates.
  comm::RankPlan mine = comm::LoadPlanForRank(args.positionals()[0]);
  HCP_RETURN_IF_ERROR(comm::CheckRanksAgree(comm, mine.plan, mine.hash));
  const plan::Plan& plan = *mine.plan;
  HCP_ASSIGN_OR_RETURN(std::unique_ptr<CpuExecutor> executor, CpuExecutor::Create(plan, comm));
  if (std::optional<std::string> weights = args.Get("weights")) {
    absl::StatusOr<CheckpointReader> checkpoint = CheckpointReader::Open(*weights);
    HCP_RETURN_IF_ERROR(comm::AgreeOnStatus(comm, checkpoint.status()));
    HCP_RETURN_IF_ERROR(executor->LoadParameters(*checkpoint));
  } else {
    HCP_ASSIGN_OR_RETURN(int64_t seed, args.GetInt("seed", 0));
    executor->InitializeParameters(static_cast<uint64_t>(seed));
  }
  std::optional<std::string> inputs_path = args.Get("inputs");
  if (!inputs_path) {
    return absl::InvalidArgumentError(
        "--inputs FILE.safetensors (with input_ids and targets) is required");
  }
  // Every rank reads the whole micro-batch; the executor keeps this rank's shard.
  absl::StatusOr<std::vector<int32_t>> ids, targets;
  absl::StatusOr<SafetensorsFile> inputs = SafetensorsFile::Open(*inputs_path);
  if (inputs.ok()) {
    ids = ReadTokens(*inputs, "input_ids", plan.tokens());
    targets = ReadTokens(*inputs, "targets", plan.tokens());
  }
  absl::Status read = !inputs.ok() ? inputs.status() : !ids.ok() ? ids.status() : targets.status();
  HCP_RETURN_IF_ERROR(comm::AgreeOnStatus(comm, read));
  HCP_RETURN_IF_ERROR(executor->SetInputs(*ids, *targets));
  HCP_RETURN_IF_ERROR(executor->RunStep());
  executor->SumGradientsOverRanks();

  absl::Status result;
  if (world.is_root()) {
    result = Report(StepResultOf(*executor), args);
    std::fflush(stdout);
  }
  // Rank 0 judged; every rank exits the same way.
  return comm::AgreeOnStatus(comm, result);
}

}  // namespace

absl::Status CompareStep(const Args& args) {
  if (args.positionals().size() != 2) {
    return absl::InvalidArgumentError("give two step results: ACTUAL REFERENCE");
  }
  HCP_ASSIGN_OR_RETURN(Tolerances tolerances, ReadTolerances(args));
  HCP_ASSIGN_OR_RETURN(StepResult actual, ReadStepResult(args.positionals()[0]));
  HCP_ASSIGN_OR_RETURN(StepResult reference, ReadStepResult(args.positionals()[1]));
  std::printf("loss %.7f\n", actual.loss);
  return CompareStepResults(actual, reference, args.positionals()[1], tolerances,
                            args.Has("verbose"));
}

const OptionSpec kLossTolerance{"loss-tolerance", "X",
                                "relative loss error allowed (default 1e-5)"};
const OptionSpec kGradTolerance{"grad-tolerance", "X",
                                "relative RMS error allowed for each gradient (default 1e-4)"};
const OptionSpec kVerbose{"verbose", "", "print every gradient's error"};

Command MakeRunStepCommand() {
  return Command{
      "run-step",
      "run one training step of a plan on the CPU: loss and gradients",
      "run-step FILE.plan --inputs FILE.safetensors [--weights DIR | --seed N] [--compare "
      "DIR|FILE] "
      "[--save FILE]   (under mpirun: one process per rank)",
      {{"inputs", "FILE", "safetensors with input_ids and targets (targets already shifted)"},
       {"weights", "DIR", "checkpoint directory (model.safetensors or a sharded index)"},
       {"seed", "N", "initialise parameters from this seed instead (default 0)"},
       {"compare", "PATH",
        "compare loss and gradients with PATH/reference.safetensors or a --save file"},
       {"save", "FILE", "write the loss and every gradient to FILE (safetensors)"},
       kLossTolerance,
       kGradTolerance,
       kVerbose},
      RunStep,
  };
}

Command MakeCompareStepCommand() {
  return Command{
      "compare-step",
      "compare two saved step results (run-step --save files or fixture directories)",
      "compare-step ACTUAL REFERENCE [--loss-tolerance X] [--grad-tolerance X] [--verbose]",
      {kLossTolerance, kGradTolerance, kVerbose},
      CompareStep,
  };
}

}  // namespace hcp
