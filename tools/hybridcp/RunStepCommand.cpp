// `hybridcp run-step`: one training step of a plan, an f32 plan on the CPU backend or a bf16 one
// on the GPUs; optionally compared with a reference (the transformers fixtures).
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
#include "runtime/exec/Executor.h"
#include "runtime/exec/RankExecutor.h"
#include "runtime/plan/PlanFile.h"
#include "runtime/support/Paths.h"
#include "runtime/support/Status.h"
#include "runtime/weights/Checkpoint.h"
#include "runtime/weights/Safetensors.h"
#include "tools/hybridcp/Commands.h"
#include "tools/hybridcp/Ranks.h"
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
absl::StatusOr<StepResult> GatherStepResult(Executor& executor, comm::Communicator& comm) {
  StepResult result;
  const std::optional<float> aux = executor.RouterAuxLoss();
  double sums[2] = {executor.Loss(), aux.value_or(0.0f)};
  comm.AllReduceSum(sums, 2, comm::Group::kDp);
  result.loss = static_cast<float>(sums[0]);
  if (aux) result.router_aux_loss = static_cast<float>(sums[1]);
  for (const plan::Parameter& parameter : executor.plan().parameters) {
    HCP_ASSIGN_OR_RETURN(std::vector<float> gradient, executor.FullGradient(parameter.name));
    result.gradients.emplace_back(parameter.name, std::move(gradient));
  }
  return result;
}

// --traffic: every rank's bytes sent during the step (Communicator::bytes_sent), gathered to all
// ranks as one table in the kinds the plan predicts (`predicted`, every rank's), plus the control
// messages and any unlabelled traffic when there are some. Collective over the world.
plan::CommVolume GatherTraffic(const plan::CommVolume& predicted, comm::Communicator& comm) {
  std::vector<std::string> kinds;
  for (const auto& rank : predicted) {
    for (const auto& [kind, bytes] : rank) {
      if (std::find(kinds.begin(), kinds.end(), kind) == kinds.end()) kinds.push_back(kind);
    }
  }
  const size_t predicted_kinds = kinds.size();
  kinds.push_back(std::string(plan::kControlTraffic));
  kinds.push_back("unlabelled");
  std::vector<uint64_t> mine(kinds.size(), 0);
  for (const auto& [label, bytes] : comm.bytes_sent()) {
    auto it = std::find(kinds.begin(), kinds.end(), label);
    mine[it == kinds.end() ? kinds.size() - 1 : it - kinds.begin()] += bytes;
  }
  std::vector<uint64_t> all(mine.size() * static_cast<size_t>(comm.world_size()));
  comm.AllGather(std::as_bytes(std::span(mine)), std::as_writable_bytes(std::span(all)),
                 comm::Group::kWorld);
  plan::CommVolume volume(comm.world_size());
  for (size_t rank = 0; rank < volume.size(); ++rank) {
    for (size_t k = 0; k < kinds.size(); ++k) {
      const uint64_t bytes = all[rank * kinds.size() + k];
      if (bytes > 0 || k < predicted_kinds) volume[rank][kinds[k]] = bytes;
    }
  }
  return volume;
}

// Rank 0: the measured table, and how it compares with the plan's prediction (inspect's).
// Expert parallelism's all-to-alls depend on the routing: inspect counts uniform routing.
absl::Status ReportTraffic(const plan::CommVolume& predicted, const plan::CommVolume& measured) {
  std::printf("bytes sent in this step (measured):\n");
  PrintBytesSent(measured);
  int differences = 0, routed_differences = 0;
  for (size_t rank = 0; rank < measured.size(); ++rank) {
    for (const auto& [kind, bytes] : measured[rank]) {
      if (kind == plan::kControlTraffic) continue;  // the ranks' status agreements
      auto it = predicted[rank].find(kind);
      const uint64_t expected = it == predicted[rank].end() ? 0 : it->second;
      if (bytes == expected) continue;
      const bool routed = kind == plan::TrafficKind(plan::KernelId::MoeExpertsEpForward);
      std::printf("rank %zu, %s: %llu bytes, the plan predicts %llu%s\n", rank, kind.c_str(),
                  static_cast<unsigned long long>(bytes), static_cast<unsigned long long>(expected),
                  routed ? " (uniform routing; this step's router decides)" : "");
      (routed ? routed_differences : differences) += 1;
    }
  }
  if (differences > 0) {
    return absl::InternalError(absl::StrFormat(
        "%d figure(s) of the plan's traffic prediction (hybridcp inspect) differ from the bytes "
        "the collectives sent",
        differences));
  }
  std::printf(
      "the bytes sent match the plan's prediction (hybridcp inspect)%s\n",
      routed_differences > 0 ? ", but for the experts' all-to-alls (routing-dependent)" : "");
  return absl::OkStatus();
}

// Rank 0's report: the loss, then --save and --compare.
absl::Status Report(const StepResult& step, const Args& args) {
  std::printf("loss %.7f\n", step.loss);
  if (step.router_aux_loss) std::printf("load-balancing loss %.7f\n", *step.router_aux_loss);
  if (std::optional<std::string> save = args.Get("save")) {
    HCP_RETURN_IF_ERROR(WriteStepResult(step, *save));
  }
  std::optional<std::string> reference = args.Get("compare");
  if (!reference) return absl::OkStatus();
  HCP_ASSIGN_OR_RETURN(Tolerances tolerances, ReadTolerances(args));
  HCP_ASSIGN_OR_RETURN(StepResult expected, ReadStepResult(*reference));
  return CompareStepResults(step, expected, *reference, tolerances, args.Has("verbose"));
}

// --save must not name a file this command reads: the plan, --inputs, --compare's reference or a
// file of the --weights checkpoint.
absl::Status CheckSaveIsNoInput(const Args& args) {
  std::optional<std::string> save = args.Get("save");
  if (!save) return absl::OkStatus();
  std::vector<std::string> inputs = {args.positionals()[0]};
  for (const char* option : {"inputs", "compare"}) {
    if (std::optional<std::string> path = args.Get(option)) {
      inputs.push_back(*path);
      inputs.push_back(*path + "/reference.safetensors");
    }
  }
  if (std::optional<std::string> weights = args.Get("weights")) {
    std::error_code error;
    for (const auto& entry : std::filesystem::directory_iterator(*weights, error)) {
      inputs.push_back(entry.path().string());
    }
  }
  return RefuseOutputOntoInput("--save", *save, inputs);
}

absl::Status RunStep(const Args& args) {
  if (args.positionals().size() != 1) return absl::InvalidArgumentError("give one plan file");
  // Every rank sees the same command line and files, so each refuses alike before joining.
  HCP_RETURN_IF_ERROR(CheckSaveIsNoInput(args));
  HCP_ASSIGN_OR_RETURN(World world, JoinRanks("run-step", args));
  comm::Communicator& comm = world.comm();
  // Every rank loads; the first collectives check that every rank runs this command with the
  // same options, and the same plan, and that the plan's cp x dp matches the ranks started,
  // before anything else communicates.
  plan::RankPlan mine = plan::LoadPlanForRank(args.positionals()[0]);
  HCP_RETURN_IF_ERROR(comm::CheckRanksAgree(comm, mine.plan, mine.hash));
  const plan::Plan& plan = *mine.plan;
  HCP_ASSIGN_OR_RETURN(RankExecutor rank, RankExecutor::Create(plan, comm, ExecutorOptions{}));
  if (args.Has("traffic") && rank.on_gpu()) {
    // NCCL's bytes are not counted by the host communicator.
    return absl::InvalidArgumentError(
        "--traffic measures the collectives of CPU ranks (an f32 plan); this plan runs on GPUs");
  }
  Executor* executor = &rank.executor();
  if (std::optional<std::string> weights = args.Get("weights")) {
    absl::StatusOr<CheckpointReader> checkpoint = CheckpointReader::OpenVerified(*weights);
    HCP_RETURN_IF_ERROR(comm::AgreeOnStatus(comm, checkpoint.status()));
    HCP_RETURN_IF_ERROR(executor->LoadParameters(*checkpoint));
  } else {
    HCP_ASSIGN_OR_RETURN(int64_t seed, args.GetInt("seed", 0));
    HCP_RETURN_IF_ERROR(executor->InitializeParameters(static_cast<uint64_t>(seed)));
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
  // Packed documents: a plan compiled with --documents reads position_ids, and only such a plan.
  const bool given = inputs->Find("position_ids") != nullptr;
  absl::StatusOr<std::vector<int32_t>> positions = std::vector<int32_t>();
  if (given != plan.position_ids.has_value()) {
    positions = absl::InvalidArgumentError(
        given ? absl::StrFormat("%s has position_ids (packed documents), but the plan treats "
                                "every sequence as one document: compile it with --documents",
                                *inputs_path)
              : absl::StrFormat("the plan was compiled with --documents: --inputs %s needs "
                                "position_ids [batch, seq] (each token's position in its "
                                "document)",
                                *inputs_path));
  } else if (given) {
    positions = ReadTokens(*inputs, "position_ids", plan);
  }
  HCP_RETURN_IF_ERROR(comm::AgreeOnStatus(comm, positions.status()));
  if (given) {
    HCP_RETURN_IF_ERROR(executor->SetPositions(std::span(*positions).subspan(first, micro_batch)));
  }
  comm.ResetTraffic();
  HCP_RETURN_IF_ERROR(executor->RunStep());
  HCP_RETURN_IF_ERROR(executor->SumGradientsOverRanks());
  std::optional<plan::CommVolume> predicted, traffic;
  if (args.Has("traffic")) {
    predicted = plan::BytesSentPerRank(plan);
    traffic = GatherTraffic(*predicted, comm);
  }

  HCP_ASSIGN_OR_RETURN(const StepResult step, GatherStepResult(*executor, comm));
  absl::Status result;
  if (world.is_root()) {
    result = Report(step, args);
    if (result.ok() && traffic) result = ReportTraffic(*predicted, *traffic);
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
      "run one training step of a plan, on the CPU (f32 plans) or the GPUs (bf16 plans): loss "
      "and gradients",
      "run-step FILE.plan --inputs FILE.safetensors [--weights DIR | --seed N] [--compare "
      "DIR|FILE] "
      "[--save FILE] [--traffic]   (under mpirun: one process per rank)",
      {{"inputs", "FILE",
        "safetensors with input_ids and targets (targets already shifted): the global batch, "
        "micro-batch x dp sequences; dp group i runs sequences [i*micro-batch, +micro-batch) and "
        "the loss printed is summed over dp (the mean over the whole batch's valid targets); "
        "for a plan compiled with --documents also position_ids (each token's position in its "
        "document)"},
       {"weights", "DIR", "checkpoint directory (model.safetensors or a sharded index)"},
       {"seed", "N", "initialise parameters from this seed instead (default 0)"},
       {"compare", "PATH",
        "compare loss and gradients with PATH/reference.safetensors or a --save file"},
       {"save", "FILE", "write the loss and every gradient to FILE (safetensors)"},
       {"traffic", "",
        "print the bytes each rank's collectives sent in the step, by kind, and check them "
        "against the plan's prediction (hybridcp inspect)"},
       kLossTolerance,
       kGradTolerance,
       kVerbose,
       kTimeoutOption},
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
