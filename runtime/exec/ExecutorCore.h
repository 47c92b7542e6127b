// What both executors do the same way, written once: the plan and the ranks' communicator,
// parameters by name, which part of each tensor this rank holds (its expert shard, its
// optimizer slice), filling the parameters from their initialisers or a checkpoint, cutting a
// rank's shard of a micro-batch and writing it, gathering a whole tensor over the ranks that
// split it, the loss, and the gradient norm's sums over the ranks.
//
// A backend derives from it and supplies the device (IREE's HAL device is the model): its memory
// (it allocates the plan's four arenas at creation and sets arena_bases_; where a buffer lies,
// Address, is the core's), the copies into and out of a buffer (fp32 on the host, converted to
// and from the buffer's dtype), and what runs there: the plan's steps, the gradient sums over the
// ranks, the accumulation stash, each gradient's sum of squares.
//   CpuExecutor   the host's memory and reference kernels (f32 plans), host collectives
//   CudaExecutor  one GPU's memory, the CUDA kernels on its streams (bf16 plans), NCCL
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/comm/Communicator.h"
#include "runtime/exec/Executor.h"
#include "runtime/exec/ParameterValues.h"
#include "runtime/plan/Plan.h"

namespace hcp {

class CheckpointReader;

class ExecutorCore : public Executor {
 public:
  const plan::Plan& plan() const override { return plan_; }
  const std::vector<plan::Parameter>& parameters() const { return plan_.parameters; }
  // The ranks' communicator (a LocalCommunicator of this executor's own with one rank).
  comm::Communicator& communicator() const { return *comm_; }

  // Which elements of p's whole (checkpoint) tensor this rank holds: all of a replicated
  // parameter, its ep_index's rows of a sharded one (ParameterValues.h's ShardOf).
  using ShardRange = ParameterShard;
  ShardRange ShardOf(const plan::Parameter& p) const;
  // The slice of p's buffer whose optimizer state this rank keeps: the whole buffer unless the
  // backend shards the optimizer (ZeRO-1, ParameterValues.h's OptimizerSliceOf).
  const OptimizerSlice& SliceOf(const plan::Parameter& p) const;
  // Whether reading p's gradient or optimizer state gathers it from other ranks (an expert
  // shard, or a split optimizer slice): every rank must make those calls alike.
  bool ReadsGather(const plan::Parameter& p) const;

  // The values FillInitialValues gives this rank's elements of each tensor, the same on every
  // backend, split and rank (a sharded parameter's rows start at ShardOf), converted to each
  // buffer's dtype.
  absl::Status InitializeParameters(uint64_t seed) override;
  // Every parameter from `checkpoint` as fp32 (bf16/f16 converted), this rank's part of it. Each
  // must be there with the plan's checkpoint shape and a float dtype; otherwise nothing is read
  // and the error names the tensor. A NaN or infinity is refused, naming the tensor and the
  // element (RefuseNonFinite).
  absl::Status LoadParameters(const CheckpointReader& checkpoint) override;
  // RankInputs.h's CutRankInputs of the global micro-batch (this rank's cp shard, the loss
  // scale), written into the plan's input buffers.
  absl::Status SetInputs(std::span<const int32_t> input_ids, std::span<const int32_t> targets,
                         std::optional<float> loss_scale = std::nullopt,
                         std::optional<float> aux_scale = std::nullopt) override;
  // The plan's loss buffer (NaN if it cannot be read).
  float Loss() const override;
  std::optional<float> RouterAuxLoss() const override;
  absl::Status SetPositions(std::span<const int32_t> position_ids) override;
  // Per parameter the backend's GradientSquares, summed in double in plan order: replicated
  // gradients are the same on every rank and count as they are, expert shards' squares add up
  // over the ep group, split optimizer slices' over the world.
  absl::StatusOr<double> GradientSquaredNorm() override;
  // A parameter's value or gradient, whole, as fp32: an expert tensor gathered over the ep
  // group, a reduce-scattered gradient over the world. NotFound names the parameter.
  absl::StatusOr<std::vector<float>> FullParameter(std::string_view name) override;
  absl::StatusOr<std::vector<float>> FullGradient(std::string_view name) override;

 protected:
  // `comm` null: one rank, on a LocalCommunicator of the executor's own. `slices`: per parameter
  // its optimizer slice (empty: every buffer whole).
  ExecutorCore(plan::Plan plan, comm::Communicator* comm, std::vector<OptimizerSlice> slices = {});

  // The device. Floats go in and out as fp32, converted to and from the buffer's dtype; every
  // call transfers a whole buffer (InternalError for the wrong count or dtype: a bug).
  virtual absl::Status WriteFloats(uint32_t buffer, std::span<const float> values) = 0;
  virtual absl::StatusOr<std::vector<float>> ReadFloats(uint32_t buffer) const = 0;
  virtual absl::Status WriteInts(uint32_t buffer, std::span<const int32_t> values) = 0;
  // Per parameter, in plan order, the sum of the squares of its gradient's elements in its
  // optimizer slice (SliceOf), in double.
  virtual absl::StatusOr<std::vector<double>> GradientSquares() = 0;

  // Where buffer `buffer` starts: its arena's base (arena_bases_, which the backend sets when it
  // allocates the arenas) plus its offset. Host or device memory, as the backend's.
  std::byte* Address(uint32_t buffer) const;
  const plan::Parameter* FindParameter(std::string_view name) const;
  absl::StatusOr<const plan::Parameter*> FindParameterOrError(std::string_view name) const;
  // `local` (this rank's part of p) made whole: as it is for a replicated parameter, gathered
  // over the ep group for a sharded one (collective then; a failed `local` ends the job rather
  // than leave the others waiting in the gather).
  absl::StatusOr<std::vector<float>> GatherFull(const plan::Parameter& p,
                                                absl::StatusOr<std::vector<float>> local) const;
  // `slice` (this rank's optimizer slice of p's buffer) made the whole buffer, gathered over the
  // world when the slice is split (collective then, as GatherFull); otherwise GatherFull.
  absl::StatusOr<std::vector<float>> GatherSlices(const plan::Parameter& p,
                                                  absl::StatusOr<std::vector<float>> slice) const;

  plan::Plan plan_;
  std::array<std::byte*, plan::kNumArenas> arena_bases_{};  // the backend's arenas
  std::vector<OptimizerSlice> slices_;                      // per parameter, set at construction
  // Set by a backend whose last gradient sums reduce-scattered the split slices: only this
  // rank's slice of those gradients holds the sum.
  bool gradients_scattered_ = false;
  // Packed documents: whether the micro-batch's position_ids (SetPositions) start a document
  // anywhere but at a row's first token. When not, a backend may run the step as a plan without
  // --documents (the same values); the CPU backend, the oracle, reads the positions always.
  bool packs_documents_ = false;

 private:
  std::unique_ptr<comm::Communicator> owned_comm_;  // one rank's LocalCommunicator
  comm::Communicator* comm_;                        // never null
};

}  // namespace hcp
