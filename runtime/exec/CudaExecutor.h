// Runs a plan on one GPU: the executor core (ExecutorCore.h: parameters, inputs, gathers, the
// norm) over a GPU's memory; owns the four arenas in device memory, queues the plan's steps in
// order on its streams (runtime/backends/cuda) and keeps the AdamW state (fp32 master weights
// and moments) on the device (runtime/train/DeviceAdamW.h drives it). The plan is
// a bf16 plan (hybridcp compile --dtype bf16, see CudaBackend.h). A plan of several ranks
// (cp x dp, experts split over ep of them) runs one executor per rank, each on its own GPU,
// given the ranks' NCCL communicator (Options::nccl); its collectives then go through NCCL.
// With ep > 1 a rank holds its 1/ep of each expert tensor (Plan.h's sharded parameters); the
// methods that return or take whole tensors say so, and those that return one of an expert
// tensor gather it over the ep group: every rank of the group must call them alike.
//
//   HCP_ASSIGN_OR_RETURN(plan::Plan plan, plan::LoadPlan(path));
//   HCP_ASSIGN_OR_RETURN(auto exec, CudaExecutor::Create(plan));
//   HCP_RETURN_IF_ERROR(exec->InitializeParameters(seed));  // or LoadParameters(checkpoint)
//   HCP_RETURN_IF_ERROR(exec->InitOptimizer());
//   loop:
//     HCP_RETURN_IF_ERROR(exec->SetInputs(ids, targets));
//     HCP_RETURN_IF_ERROR(exec->RunStep());                 // forward and backward
//     HCP_ASSIGN_OR_RETURN(double norm2, exec->GradientSquaredNorm());
//     HCP_RETURN_IF_ERROR(exec->OptimizerStep(step, decay));
//
// Every buffer is (arena, offset, elements) from the plan: one device allocation per arena, one
// workspace shared by the steps (the largest any step needs), nothing allocated per step. Host
// values are fp32; a bf16 buffer is converted on the way in (round to nearest even) and out.
// Transfers are synchronous (they wait for the work queued before them). The executor is not
// thread-safe; each method makes its device current first.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/backends/cuda/CudaBackend.h"
#include "runtime/backends/cuda/HostCopies.h"
#include "runtime/comm/NcclCommunicator.h"
#include "runtime/exec/ExecutorCore.h"
#include "runtime/exec/ParameterValues.h"
#include "runtime/kernels/cuda/Kernels.h"
#include "runtime/plan/Plan.h"

namespace hcp {

class CheckpointReader;

// What one rank of `plan` allocates on its GPU, in bytes, computed on the host (no device
// needed): CudaExecutor::Create's memory check, and `hybridcp inspect`.
struct GpuMemory {
  uint64_t arenas = 0;     // the plan's arenas
  uint64_t workspace = 0;  // the kernels' shared workspace (the largest step's need), and with
                           // several ranks the collectives' beside it (BesideComputeWorkspaceBytes)
  uint64_t gemm = 0;       // cuBLASLt workspaces: the context's and its lanes'
  uint64_t optimizer = 0;  // AdamW: m, v and a bf16 parameter's fp32 master, this rank's slices
  uint64_t other = 0;      // flags and per-parameter scratch
  uint64_t total() const;  // the sum, saturating
};
// The optimizer state is left out unless `with_optimizer`; `rank` picks its slices with
// `shard_optimizer` (ranks' slices differ at most by a rounding).
GpuMemory GpuMemoryOf(const plan::Plan& plan, bool with_optimizer, bool shard_optimizer,
                      int64_t rank);

class CudaExecutor final : public ExecutorCore {
 public:
  struct Options {
    int device = 0;  // CUDA device index
    // Fill the Activations arena with NaN at creation (every byte 0xFF: NaN in f32 and bf16), so
    // a step that reads an activation no earlier step wrote produces NaN instead of a plausible
    // number. On by default in debug builds, as CpuExecutor's.
#ifdef NDEBUG
    bool poison_activations = false;
#else
    bool poison_activations = true;
#endif
    // Count the optimizer state InitOptimizer will allocate in Create's memory check (off for a
    // run that never calls InitOptimizer: forward and backward only).
    bool reserve_optimizer_state = true;
    // The ranks' communicator, for a plan of more than one rank (required then; unused with
    // one). Its host communicator's mesh must be the plan's; it outlives the executor. Waiting
    // for a step run goes through its Wait, so a peer that fails or hangs ends the job with a
    // message instead of a hang.
    comm::NcclCommunicator* nccl = nullptr;
    // ZeRO-1 over the plan's ranks: each rank keeps the fp32 master and moments of its slice of
    // every parameter (ParameterValues.h's OptimizerSliceOf: 1/ranks of each replicated
    // parameter whose size divides; an expert shard or a parameter that does not divide stays
    // whole), the gradient sums reduce-scatter those parameters instead of all-reducing them,
    // and OptimizerStep all-gathers the updated slices.
    bool shard_optimizer = false;
  };

  // Validates `plan` (plan::ValidatePlan, then cuda_backend::CheckPlanRunsOnCuda: one rank, every
  // kernel with a CUDA wrapper, the dtypes and shapes the kernels take), makes `device` current,
  // checks that the arenas, the workspace and the optimizer state to come fit in its free memory
  // (ResourceExhausted in GiB otherwise), and allocates the arenas (parameters, gradients and
  // inputs zeroed), the workspace, a cuBLASLt context and a non-blocking stream.
  static absl::StatusOr<std::unique_ptr<CudaExecutor>> Create(const plan::Plan& plan,
                                                              Options options);
  static absl::StatusOr<std::unique_ptr<CudaExecutor>> Create(const plan::Plan& plan) {
    return Create(plan, Options());
  }
  ~CudaExecutor() override;

  CudaExecutor(const CudaExecutor&) = delete;
  CudaExecutor& operator=(const CudaExecutor&) = delete;

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }

  // Queues every step, waits for them, and reports: a token id outside the vocabulary or a bad
  // target as InvalidArgument naming the step and position (as CpuExecutor's), a step the
  // backend refuses as its error, a CUDA failure as Internal with CUDA's message. With several
  // ranks every rank returns the same status (the first failing rank's error, agreed over the
  // host communicator).
  absl::Status RunStep() override;
  // RunStepAndSumGradients with CUDA events around every step: adds each step's milliseconds to
  // (*ms_per_kernel)[KernelId], which is first grown to plan::kNumKernels entries (zeros). The
  // kernels' times include what the gradient sums running beside them take from them, and a
  // halo exchange or state scan running beside the compute stream counts the time the compute
  // stream waited for it (not its own duration); how long the sums ran on after the last
  // kernel goes to *gradient_sums_after_ms (0 on one rank, or when they finished first).
  absl::Status RunStepProfiled(std::vector<double>* ms_per_kernel,
                               double* gradient_sums_after_ms = nullptr);

  // Any int32 buffer by index, as left by the last step (for tests: MoE routing decisions).
  absl::StatusOr<std::vector<int32_t>> I32Buffer(uint32_t index) const;

  // ---------------------------------------------------------------------------------------------
  // AdamW on the device (runtime/kernels/cuda's adamw_update: hcp::train::AdamWKernel's
  // operations element for element).

  // Allocates the optimizer state, per parameter: m and v (zeros) and, for a bf16 parameter, an
  // fp32 master copy initialised from the parameter's current value. An f32 parameter's buffer
  // IS its master. With Options::shard_optimizer, all of it for this rank's slice only. Call
  // after the parameters are set; calling it again resets the state.
  absl::Status InitOptimizer();
  // Each rank computed its gradients from its own tokens: sums them over the world (NCCL, in
  // each gradient's dtype; an expert gradient over the ranks holding the same experts), so every
  // rank holds the whole global batch's gradient (with Options::shard_optimizer, its optimizer
  // slice of it, for the parameters that are sliced: a reduce-scatter). Collective;
  // once per optimizer step, after gradient accumulation. Nothing to do with one rank.
  absl::Status SumGradientsOverRanks() override;
  // RunStep, then SumGradientsOverRanks, overlapped: each parameter's all-reduce starts on a
  // stream of its own as soon as the last step writing its gradient has run, while the rest of
  // the backward goes on. For a step without gradient accumulation (the same result).
  absl::Status RunStepAndSumGradients() override;
  // The stash takes twice the gradients arena's bytes (every running sum in fp32).
  absl::Status StashGradients(bool first) override;
  absl::Status AddStashedGradients() override;
  // One update of every parameter with `step` (lr, betas, eps, weight decay, clip_coef, t);
  // step.decay is replaced per parameter by decay(p) (the trainer's rule, e.g.
  // train::DefaultDecay of its name and checkpoint shape). A bf16 parameter is rewritten from its
  // updated master. Needs InitOptimizer. With sliced parameters, each rank updates its slices and
  // then all gather them (collective).
  absl::Status OptimizerStep(const cuda::AdamWStep& step,
                             const std::function<bool(const plan::Parameter&)>& decay);
  // The optimizer state of a parameter, as fp32, whole (gathered as Parameter is).
  absl::StatusOr<std::vector<float>> Master(std::string_view name) const;
  absl::StatusOr<std::vector<float>> ExpAvg(std::string_view name) const;
  absl::StatusOr<std::vector<float>> ExpAvgSq(std::string_view name) const;
  // Sets a parameter's optimizer state (resuming from a checkpoint): its fp32 master, from which
  // the bf16 compute copy is rounded again, and the moments, this rank's part (ShardOf(p).count
  // values from ShardOf(p).begin of the whole tensor). Needs InitOptimizer.
  absl::Status SetOptimizerState(std::string_view name, std::span<const float> master,
                                 std::span<const float> m, std::span<const float> v);

  // Device memory. allocated_bytes: what this executor holds (arenas, workspace, the cuBLASLt
  // context's workspace, small buffers and, once InitOptimizer has run, the optimizer state).
  // peak_bytes: the device's used memory (cudaMemGetInfo: the CUDA context and libraries
  // included, and any other process on the device), the most seen after Create, InitOptimizer,
  // RunStep and now; the executor allocates nothing in between, so this is its peak.
  // device_bytes: the device's total.
  struct Memory {
    uint64_t allocated_bytes = 0;
    uint64_t peak_bytes = 0;
    uint64_t device_bytes = 0;
  };
  Memory MemoryUse() const;
  uint64_t PeakMemoryBytes() const { return MemoryUse().peak_bytes; }
  // The plan's four arenas together.
  uint64_t ArenaBytes() const;

 private:
  // Per parameter: where its fp32 master, m and v live.
  struct OptimizerSlot {
    float* master = nullptr;  // the parameter buffer (its slice) for an f32 parameter
    float* m = nullptr;
    float* v = nullptr;
  };

  CudaExecutor(plan::Plan plan, int device, comm::NcclCommunicator* nccl,
               std::vector<OptimizerSlice> slices)
      : ExecutorCore(std::move(plan), nccl == nullptr ? nullptr : &nccl->host(), std::move(slices)),
        device_(device),
        nccl_(nccl) {}
  // Waits for the executor's stream: through the communicator with several ranks (a peer's
  // failure or a hang ends the job), else cudaStreamSynchronize.
  absl::Status Wait(const char* what) const;
  absl::Status Activate() const;
  // Updates the peak of the device's used memory (MemoryUse).
  void SampleMemory() const;
  absl::Status Allocate(void** ptr, uint64_t bytes, std::string_view what);
  absl::Status RunSteps(std::vector<double>* ms_per_kernel, bool sum_gradients = false,
                        double* gradient_sums_after_ms = nullptr);
  // Whether RunSteps may replay a CUDA graph of the steps: one rank (no collectives), no step
  // that reads ids on the host (MoE), not profiled, HCP_CUDA_GRAPHS not 0.
  bool StepsCanBeGraphed(bool profile, bool sum_gradients) const;
  // Captures what `queue` queues on stream_ into the step graph for packs_documents_. An error in
  // the capture leaves no graph and turns graphs off for this executor.
  absl::Status CaptureSteps(const std::function<absl::Status()>& queue);
  // Queues the all-reduce of parameters [first, last) of ready_order_ on grad_stream_, after the
  // work queued on stream_ so far.
  void StartGradientSums(size_t first, size_t last);
  // The all-reduces of parameters [first, last) of ready_order_, queued on `stream`.
  void QueueGradientSums(size_t first, size_t last, cudaStream_t stream);
  void OrderGradientsByReadiness();
  void PlanBesideCompute();
  // Allocates host_copies_'s pinned arrays and events.
  absl::Status PrepareHostCopies();
  // Queues the host copies that follow step `after_step` (kBeforeTheSteps: the start) on
  // copy_stream_, after the work queued on `producer` so far.
  absl::Status QueueHostCopies(size_t after_step, cudaStream_t producer);
  // Waits (through the communicator with several ranks) until step `step`'s host copy is done.
  absl::Status WaitForHostCopy(size_t step) const;
  enum class GradientSum { kStart, kIntoStash, kIntoGradients };
  absl::Status AddGradients(GradientSum what);
  absl::Status DescribeBadInput(int32_t position) const;
  // Host <-> device on the executor's stream, waiting for the copy (and what was queued before).
  absl::Status ToDevice(void* dst, const void* src, size_t bytes) const;
  absl::Status ToHost(void* dst, const void* src, size_t bytes) const;
  // The device (ExecutorCore.h): fp32 values into / out of a float buffer of either dtype,
  // int32 values into an i32 buffer, and the squares on the device (fp32 squares, double sums,
  // fixed order).
  absl::Status WriteFloats(uint32_t buffer, std::span<const float> values) override;
  absl::StatusOr<std::vector<float>> ReadFloats(uint32_t buffer) const override;
  absl::Status WriteInts(uint32_t buffer, std::span<const int32_t> values) override;
  absl::StatusOr<std::vector<double>> GradientSquares() override;
  absl::StatusOr<std::vector<float>> DownloadF32(const float* device, int64_t n) const;
  absl::StatusOr<const OptimizerSlot*> SlotOf(std::string_view name) const;
  // One of a parameter's optimizer arrays (master, m or v), whole.
  absl::StatusOr<std::vector<float>> OptimizerArray(std::string_view name,
                                                    float* OptimizerSlot::*array) const;

  int device_ = 0;
  void* workspace_ = nullptr;
  uint64_t workspace_bytes_ = 0;
  cuda::GemmContext* gemm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  comm::NcclCommunicator* nccl_ = nullptr;  // null: one rank
  cudaStream_t comm_stream_ = nullptr;      // the collectives' second stream and its events
  cudaEvent_t compute_done_ = nullptr;
  cudaEvent_t comm_done_ = nullptr;
  // The overlapped gradient sums (RunStepAndSumGradients): their stream and events, the
  // parameters in the order their gradients are complete, and after which step each is.
  cudaStream_t grad_stream_ = nullptr;
  cudaEvent_t grads_ready_ = nullptr;
  cudaEvent_t grads_summed_ = nullptr;
  std::vector<uint32_t> ready_order_;     // parameter indices
  std::vector<size_t> ready_after_step_;  // per entry of ready_order_
  int32_t* bad_position_ = nullptr;       // [2]: the flag, and kNoBadPosition to reset it from
  double* squares_ = nullptr;             // one per parameter, for GradientSquaredNorm
  cuda::Workspace squares_tables_{};      // sum_of_squares_many's tables of every slice
  void* optimizer_memory_ = nullptr;
  cuda::Workspace optimizer_tables_{};    // adamw_update_many's tables of every slice
  std::byte* gradient_stash_ = nullptr;   // StashGradients' fp32 sums: the gradient at byte
                                          // offset o of its arena is at 2 o here
  std::vector<OptimizerSlot> optimizer_;  // empty until InitOptimizer
  std::vector<cudaEvent_t> events_;  // RunStepProfiled's: one per step and one before, then the
                                     // gradient sums' end
  // The collectives the plan's schedule runs beside the compute stream (Step::stream, with
  // several ranks): their stream, the events that start them after the compute stream's work so
  // far and say when they are done, their scratch (the end of the workspace's allocation), and
  // per step the step before which the compute stream waits for it (the plan's join_before,
  // steps.size(): the end; kOnComputeStream: the step runs on stream_). RunStepProfiled records
  // join_events_[j] after the wait before step j, so the wait counts as the collective's time.
  cudaStream_t beside_stream_ = nullptr;
  cudaEvent_t beside_start_ = nullptr;
  cudaEvent_t beside_done_ = nullptr;
  cuda::Workspace beside_workspace_{};
  std::vector<size_t> join_before_;
  std::vector<cudaEvent_t> join_events_;
  // The MoE steps' expert ids, copied to the host while the steps run (HostCopies.h): which
  // copies and when, per copy a pinned host array and an event recorded when it is done, and the
  // stream they run on beside the compute stream.
  cuda_backend::HostCopyPlan host_copies_;
  std::vector<int32_t*> host_copy_data_;
  std::vector<cudaEvent_t> host_copy_done_;
  cudaStream_t copy_stream_ = nullptr;
  cudaEvent_t copy_start_ = nullptr;
  // The steps as a CUDA graph (StepsCanBeGraphed): launching a plan's thousands of kernels one
  // by one costs host time that a launch-bound model waits for. Captured at the second run (the
  // first sets up cuBLASLt's and the kernels' one-time state) and again when packs_documents_
  // changes, which changes what the steps read.
  std::array<cudaGraphExec_t, 2> step_graphs_{};  // by packs_documents_
  int runs_before_capture_ = 1;
  bool graphs_off_ = false;
  uint64_t allocated_bytes_ = 0;
  mutable uint64_t peak_used_bytes_ = 0;  // MemoryUse's peak_bytes
  mutable uint64_t device_bytes_ = 0;
};

}  // namespace hcp
