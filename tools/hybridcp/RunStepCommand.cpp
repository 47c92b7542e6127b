// `hybridcp run-step`: one training step of a plan on the CPU backend; optionally compared with a
// reference (the transformers fixtures).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "runtime/comm/Agreement.h"
#include "runtime/comm/Communicator.h"
#include "runtime/comm/World.h"
#include "runtime/exec/CpuExecutor.h"
#include "runtime/plan/PlanFile.h"
#include "runtime/support/Status.h"
#include "runtime/weights/Checkpoint.h"
#include "runtime/weights/Safetensors.h"
#include "tools/hybridcp/Commands.h"
#include "tools/hybridcp/StepResult.h"

namespace hcp {
namespace {

// A token tensor of a safetensors file as int32, checked against the plan's global batch (its
// micro-batch times dp).
absl::StatusOr<std::vector<int32_t>> ReadTokens(const SafetensorsFile& file,
                                                const std::string& name, const plan::Plan& plan) {
  HCP_ASSIGN_OR_RETURN(std::vector<int64_t> values, file.ReadInt(name));
  const int64_t expected = plan.tokens() * plan.mesh.dp;
  if (static_cast<int64_t>(values.size()) != expected) {
    if (plan.mesh.dp == 1) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: '%s' has %d tokens but the plan's micro-batch takes %d", file.path(),
                          name, values.size(), expected));
    }
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: '%s' has %d tokens but the plan's global batch (micro-batch %d x dp %d sequences "
        "of %d) takes %d",
        file.path(), name, values.size(), plan.micro_batch, plan.mesh.dp, plan.seq, expected));
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

// The step's loss (summed over dp: each dp group's loss is its micro-batch's share of the
// global batch's mean) and every parameter's whole gradient (sharded ones gathered over the ep
// group). Collective over the world; every rank gets the same.
StepResult GatherStepResult(CpuExecutor& executor) {
  StepResult result;
  double loss = executor.Loss();
  executor.communicator().AllReduceSum(&loss, 1, comm::Group::kDp);
  result.loss = static_cast<float>(loss);
  for (const plan::Parameter& parameter : executor.parameters()) {
    std::span<float> gradient = *executor.Gradient(parameter.name);  // the plan's own names
    result.gradients.emplace_back(parameter.name, executor.GatherFull(parameter, gradient));
  }
  return result;
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
  // Every rank reads the whole global batch (micro_batch * dp sequences) and gives the executor
  // its dp index's micro-batch, sequences [dp_index * micro_batch, +micro_batch); the executor
  // keeps this rank's shard of them. The loss is normalised by the valid targets of the whole
  // global batch, so the dp groups' losses and gradients add up to the global batch's.
  absl::StatusOr<std::vector<int32_t>> ids, targets;
  absl::StatusOr<SafetensorsFile> inputs = SafetensorsFile::Open(*inputs_path);
  if (inputs.ok()) {
    ids = ReadTokens(*inputs, "input_ids", plan);
    targets = ReadTokens(*inputs, "targets", plan);
  }
  absl::Status read = !inputs.ok() ? inputs.status() : !ids.ok() ? ids.status() : targets.status();
  HCP_RETURN_IF_ERROR(comm::AgreeOnStatus(comm, read));
  const int64_t valid = std::count_if(targets->begin(), targets->end(),
                                      [](int32_t t) { return t != plan::kIgnoredTarget; });
  const float loss_scale = valid > 0 ? 1.0f / static_cast<float>(valid) : 0.0f;
  const auto micro_batch = static_cast<size_t>(plan.tokens());
  const size_t first = static_cast<size_t>(comm.dp_index()) * micro_batch;
  HCP_RETURN_IF_ERROR(executor->SetInputs(std::span(*ids).subspan(first, micro_batch),
                                          std::span(*targets).subspan(first, micro_batch),
                                          loss_scale));
  HCP_RETURN_IF_ERROR(executor->RunStep());
  executor->SumGradientsOverRanks();

  const StepResult step = GatherStepResult(*executor);
  absl::Status result;
  if (world.is_root()) {
    result = Report(step, args);
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
      {{"inputs", "FILE",
        "safetensors with input_ids and targets (targets already shifted): the global batch, "
        "micro-batch x dp sequences; dp group i runs sequences [i*micro-batch, +micro-batch) and "
        "the loss printed is summed over dp (the mean over the whole batch's valid targets)"},
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
