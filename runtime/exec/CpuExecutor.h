// Runs a plan on the CPU: owns the four arenas, fills the parameters, takes a micro-batch and
// runs the plan's steps in order on the reference kernels.
//
//   HCP_ASSIGN_OR_RETURN(plan::Plan plan, plan::LoadPlan(path));
//   HCP_ASSIGN_OR_RETURN(auto exec, CpuExecutor::Create(plan));
//   exec->InitializeParameters(seed);            // or LoadParameters(checkpoint)
//   HCP_RETURN_IF_ERROR(exec->SetInputs(ids, targets));
//   HCP_RETURN_IF_ERROR(exec->RunStep());        // forward and backward: loss and gradients
//   float loss = exec->Loss();
//   std::span<float> g = *exec->Gradient("model.norm.weight");
//
// Every buffer is (arena, offset, elements) from the plan; nothing is allocated per step
// except the kernel wrappers' small scratch.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/backends/cpu/CpuBackend.h"
#include "runtime/plan/Plan.h"

namespace hcp {

class CheckpointReader;

class CpuExecutor {
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
  };

  // Validates `plan` (again: a Plan may have been assembled in memory), checks that its arenas
  // fit in this machine's memory and allocates them: parameters, gradients and inputs zeroed.
  static absl::StatusOr<std::unique_ptr<CpuExecutor>> Create(const plan::Plan& plan,
                                                             Options options);
  static absl::StatusOr<std::unique_ptr<CpuExecutor>> Create(const plan::Plan& plan) {
    return Create(plan, Options());
  }

  CpuExecutor(const CpuExecutor&) = delete;
  CpuExecutor& operator=(const CpuExecutor&) = delete;

  const plan::Plan& plan() const { return plan_; }
  const std::vector<plan::Parameter>& parameters() const { return plan_.parameters; }

  // Fills every parameter from its init: Normal keyed by the parameter's name (so a parameter
  // gets the same values whatever plan it is in, see runtime/weights/Init.h), Zeros, Ones, or
  // LogArange = log(1), log(2), ..., log(n) (Mamba2's A_log).
  void InitializeParameters(uint64_t seed);
  // Reads every parameter from `checkpoint`, converting bf16/f16 to f32. Each must be there with
  // the plan's shape and a float dtype; otherwise nothing is read and the error names the tensor.
  absl::Status LoadParameters(const CheckpointReader& checkpoint);

  // One micro-batch: ids and targets, micro_batch * seq each (targets may be -100 = ignored).
  absl::Status SetInputs(std::span<const int32_t> input_ids, std::span<const int32_t> targets);
  // Runs every step in order. The first failing step stops the run; its error names it.
  absl::Status RunStep();
  // The plan's loss buffer, as left by the last RunStep.
  float Loss() const;

  // A parameter's value or gradient by checkpoint name; NotFound names the parameter.
  absl::StatusOr<std::span<float>> Parameter(std::string_view name);
  absl::StatusOr<std::span<float>> Gradient(std::string_view name);

  // Any buffer by index (for tests and debugging). Empty if the index is out of range or the
  // buffer is not of that dtype.
  std::span<float> F32Buffer(uint32_t index);
  std::span<int32_t> I32Buffer(uint32_t index);

 private:
  // One arena: a 64-byte aligned allocation.
  struct FreeDeleter {
    void operator()(std::byte* p) const;
  };
  using ArenaMemory = std::unique_ptr<std::byte[], FreeDeleter>;

  explicit CpuExecutor(plan::Plan plan) : plan_(std::move(plan)) {}
  std::byte* Address(uint32_t buffer) const;
  const plan::Parameter* FindParameter(std::string_view name) const;

  plan::Plan plan_;
  std::array<ArenaMemory, plan::kNumArenas> arenas_;
  cpu::ArenaBases bases_{};
};

}  // namespace hcp
