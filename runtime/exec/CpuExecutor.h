// Runs a plan on the CPU: the executor core (ExecutorCore.h) over the host's memory; owns the
// four arenas and runs the plan's steps in order on the reference kernels; the collectives of
// context and data parallelism go through a Communicator.
//
// One rank:
//   HCP_ASSIGN_OR_RETURN(plan::Plan plan, plan::LoadPlan(path));
//   HCP_ASSIGN_OR_RETURN(auto exec, CpuExecutor::Create(plan));  // its own LocalCommunicator
//   exec->InitializeParameters(seed);            // or LoadParameters(checkpoint)
//   HCP_RETURN_IF_ERROR(exec->SetInputs(ids, targets));
//   HCP_RETURN_IF_ERROR(exec->RunStep());        // forward and backward: loss and gradients
//   float loss = exec->Loss();
//   std::span<float> g = *exec->Gradient("model.norm.weight");
//
// Several ranks (mpirun -np cp*dp): the same, after the ranks have agreed on the plan
// (runtime/comm/Agreement.h), with the communicator passed to Create:
//   plan::RankPlan mine = plan::LoadPlanForRank(path);
//   HCP_RETURN_IF_ERROR(comm::CheckRanksAgree(world, mine.plan, mine.hash));
//   HCP_ASSIGN_OR_RETURN(auto exec, CpuExecutor::Create(*mine.plan, world));
//   ...
// With more than one rank, every method that returns a Status is collective over the world:
// every rank calls it at the same point and every rank gets the same status (an error names the
// ranks it happened on), so one rank's error never leaves the others waiting.
//
// Every buffer is (arena, offset, elements) from the plan; nothing is allocated per step
// except the kernel wrappers' small scratch.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/backends/cpu/CpuBackend.h"
#include "runtime/comm/Communicator.h"
#include "runtime/exec/ExecutorCore.h"
#include "runtime/exec/ParameterValues.h"
#include "runtime/plan/Plan.h"

namespace hcp {

class CheckpointReader;

class CpuExecutor final : public ExecutorCore {
 public:
  struct Options {
    // Fill the Activations arena with NaN at creation, so a step that reads an activation no
    // earlier step wrote produces NaN instead of a plausible number. On by default in debug
    // builds; tests turn it on explicitly.
#ifdef NDEBUG
    bool poison_activations = false;
#else
    bool poison_activations = true;
#endif
    // Threads the GEMMs, the MoE experts and the SSD scans may use (the same results with any
    // count).
    // ThreadsPerRank says how many fit beside the other ranks on the machine.
    int threads = 1;
  };
  // This machine's cores shared evenly by `ranks` processes (at least 1; no more than the cores
  // this process may run on): the ranks of a job on one machine, each running the CPU backend.
  static int ThreadsPerRank(int ranks);

  // Validates `plan` (again: a Plan may have been assembled in memory), checks that `comm` has
  // the plan's mesh (cp and dp: comm::CheckRanksAgree sets it) and that the arenas fit in this
  // machine's memory, and allocates them: parameters, gradients and inputs zeroed. `comm` must
  // outlive the executor. Collective over comm's world.
  static absl::StatusOr<std::unique_ptr<CpuExecutor>> Create(const plan::Plan& plan,
                                                             comm::Communicator& comm,
                                                             Options options);
  static absl::StatusOr<std::unique_ptr<CpuExecutor>> Create(const plan::Plan& plan,
                                                             comm::Communicator& comm) {
    return Create(plan, comm, Options());
  }
  // One rank: the executor owns a LocalCommunicator (the plan's mesh must be cp=1 x dp=1).
  static absl::StatusOr<std::unique_ptr<CpuExecutor>> Create(const plan::Plan& plan,
                                                             Options options);
  static absl::StatusOr<std::unique_ptr<CpuExecutor>> Create(const plan::Plan& plan) {
    return Create(plan, Options());
  }

  CpuExecutor(const CpuExecutor&) = delete;
  CpuExecutor& operator=(const CpuExecutor&) = delete;

  // This rank's part of an array laid out like p's whole checkpoint tensor (e.g. a restored
  // optimizer moment): full.subspan(begin, count). `full` must have ShardOf(p).full elements.
  std::span<const float> LocalPart(const plan::Parameter& p, std::span<const float> full) const;
  // The whole tensor of parameter `p` (its checkpoint shape) from every rank's `local` part:
  // `local` is this rank's value, gradient or any array laid out like p's buffer (an optimizer
  // moment, say; buffer elements). Replicated: a copy of `local`. Sharded: an all-gather over
  // the ep group, so every rank ends with the whole tensor. Collective over the world: every
  // rank calls it for the same parameters in the same order, replicated ones included (they
  // communicate nothing). Sizes that do not fit abort the job (a bug, as Communicator's misuse).
  std::vector<float> GatherFull(const plan::Parameter& p, std::span<const float> local);

  // Runs every step in order. With one rank the first failing step stops the run; its error
  // names it. With several, a rank whose step fails skips every later step except the
  // collectives (which it joins with whatever its buffers hold, so nobody waits for it); at the
  // end every rank returns the same error, naming the ranks and steps that failed.
  absl::Status RunStep() override;
  // From now on the MoE layer whose routing is step `step` (a moe_route.forward) takes these
  // experts, ids [tokens, k] of this rank's tokens, instead of the top k of its logits; its gates
  // become the softmax of its logits at those experts (cpu::selected_softmax_forward), and the
  // backward follows. For holding a run to another whose routing differs on near ties (a bf16
  // run: test_plan_step), so that both take the same experts. InvalidArgument names what does
  // not fit (not a routing step, the wrong size, an id outside the experts).
  absl::Status RouteWith(size_t step, std::vector<int32_t> experts);

  // Each rank computed its gradients from its own tokens only (a sharded parameter's: from every
  // token of its ep group that reached its experts): sums them over the ranks that hold a copy.
  // Replicated parameters are summed over the world, sharded (expert) parameters over the ep
  // replicas (Communicator's kEpReplica: the ranks with this rank's expert index). The plan puts
  // the sharded gradients after every replicated one (hcp-plan-memory; ValidatePlan checks it),
  // so that is two all-reduces of contiguous ranges of the gradients arena (one without sharded
  // parameters). Afterwards every rank holds, for each parameter, the gradient of the whole
  // global batch w.r.t. the part it holds. Collective over the world; call it once per
  // optimizer step, after gradient accumulation.
  absl::Status SumGradientsOverRanks() override;
  // RunStep, then SumGradientsOverRanks.
  absl::Status RunStepAndSumGradients() override;
  // The stash is one fp32 array as long as the gradients arena.
  absl::Status StashGradients(bool first) override;
  absl::Status AddStashedGradients() override;

  // A parameter's value or gradient by checkpoint name (this rank's part: a sharded parameter's
  // rows only, see GatherFull); NotFound names the parameter.
  absl::StatusOr<std::span<float>> Parameter(std::string_view name);
  absl::StatusOr<std::span<float>> Gradient(std::string_view name);

  // Any buffer by index (for tests and debugging). Empty if the index is out of range or the
  // buffer is not of that dtype.
  std::span<float> F32Buffer(uint32_t index) const;
  std::span<int32_t> I32Buffer(uint32_t index) const;

 private:
  // One arena: a 64-byte aligned allocation.
  struct FreeDeleter {
    void operator()(std::byte* p) const;
  };
  using ArenaMemory = std::unique_ptr<std::byte[], FreeDeleter>;

  CpuExecutor(plan::Plan plan, comm::Communicator* comm) : ExecutorCore(std::move(plan), comm) {}
  // `comm` null: one rank (a LocalCommunicator of the executor's own).
  static absl::StatusOr<std::unique_ptr<CpuExecutor>> CreateOnThisRank(const plan::Plan& plan,
                                                                       comm::Communicator* comm,
                                                                       Options options);
  absl::Status RunStepOnThisRank();
  // The whole gradients arena as floats (an f32 plan's gradients, alignment padding included).
  std::span<float> GradientsArena() const;
  absl::Status CheckFloatBuffer(uint32_t buffer, size_t count) const;

  // The device: host memory.
  absl::Status WriteFloats(uint32_t buffer, std::span<const float> values) override;
  absl::StatusOr<std::vector<float>> ReadFloats(uint32_t buffer) const override;
  absl::Status WriteInts(uint32_t buffer, std::span<const int32_t> values) override;
  absl::StatusOr<std::vector<double>> GradientSquares() override;

  std::array<ArenaMemory, plan::kNumArenas> arenas_;
  std::map<size_t, std::vector<int32_t>> routes_;  // RouteWith's, by step
  cpu::Threads threads_;
  std::vector<float> gradient_stash_;  // StashGradients' sums, laid out as the gradients arena
};

}  // namespace hcp
