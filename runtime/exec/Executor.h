// What every executor does, whatever it runs on: the interface the commands (run-step, bench)
// and the trainer drive. CpuExecutor runs f32 plans on the host's reference kernels,
// CudaExecutor bf16 plans on a GPU; what they do alike is written once in ExecutorCore.h (the
// parameters, the inputs, the gathers and the norm), what a device does in each.
//
// With more than one rank, every method that returns a Status is collective over the world:
// every rank calls it at the same point and every rank gets the same status.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/plan/Plan.h"

namespace hcp {

class CheckpointReader;

class Executor {
 public:
  virtual ~Executor() = default;

  virtual const plan::Plan& plan() const = 0;

  // Every parameter from its initialiser (ParameterValues.h's FillInitialValues: the same
  // values on every backend, split and rank), or from a checkpoint (every tensor there with the
  // plan's checkpoint shape; NaN and infinity refused).
  virtual absl::Status InitializeParameters(uint64_t seed) = 0;
  virtual absl::Status LoadParameters(const CheckpointReader& checkpoint) = 0;

  // One GLOBAL micro-batch: ids and targets [micro_batch, seq], the whole sequences (targets
  // already shifted; -100 = ignored); each rank keeps its cp shard. `loss_scale` multiplies the
  // summed token loss (1 / the valid targets of the whole optimizer step); without it, 1 / the
  // valid targets of this micro-batch. `aux_scale` multiplies a plan's load-balancing loss
  // (1 / the micro-batches of the whole optimizer step, over every dp rank); without it, 1 / dp
  // (one micro-batch per dp rank). A plan without that loss ignores it.
  virtual absl::Status SetInputs(std::span<const int32_t> input_ids,
                                 std::span<const int32_t> targets,
                                 std::optional<float> loss_scale = std::nullopt,
                                 std::optional<float> aux_scale = std::nullopt) = 0;
  // Packed documents (a plan with position_ids): the micro-batch's position_ids [micro_batch,
  // seq], whole sequences (RankInputs.h's CheckPositionIds); each rank keeps its cp shard. Call
  // after SetInputs, which sets one document per row.
  virtual absl::Status SetPositions(std::span<const int32_t> position_ids) = 0;
  // The plan's steps in order: the loss and every gradient of this rank's tokens.
  virtual absl::Status RunStep() = 0;
  // Sums the gradients over the ranks that hold a copy (replicated parameters over the world,
  // expert shards over their ep replicas): afterwards each is the global batch's.
  virtual absl::Status SumGradientsOverRanks() = 0;
  // RunStep then SumGradientsOverRanks; a backend may overlap the two (the same result).
  virtual absl::Status RunStepAndSumGradients() = 0;
  // Gradient accumulation over micro-batches (each RunStep overwrites the gradients): after
  // every micro-batch but the last, StashGradients(first) keeps its gradients (the first) or
  // adds them to what is kept; after the last, AddStashedGradients adds the kept sum into the
  // gradients, then SumGradientsOverRanks. The running sums are fp32, whatever the gradients'
  // dtype (a bf16 gradient's sum is rounded once, by AddStashedGradients); the stash is
  // allocated at the first use.
  virtual absl::Status StashGradients(bool first) = 0;
  virtual absl::Status AddStashedGradients() = 0;
  // The plan's loss buffer as the last step left it (this rank's micro-batch's share).
  virtual float Loss() const = 0;
  // The plan's load-balancing loss as the last step left it (times its aux_scale; summed over
  // the cp group), or nullopt for a plan without it.
  virtual std::optional<float> RouterAuxLoss() const = 0;
  // The squared L2 norm of the whole model's gradient, after SumGradientsOverRanks, in double;
  // the same on every rank.
  virtual absl::StatusOr<double> GradientSquaredNorm() = 0;

  // A parameter's whole value or gradient (its checkpoint shape) as fp32, by checkpoint name;
  // a tensor split over ranks is gathered, so every rank calls these alike. NotFound names the
  // parameter.
  virtual absl::StatusOr<std::vector<float>> FullParameter(std::string_view name) = 0;
  virtual absl::StatusOr<std::vector<float>> FullGradient(std::string_view name) = 0;
};

}  // namespace hcp
