// The executor a rank runs a plan on, chosen by the plan: a bf16 plan on this rank's GPU
// (CudaExecutor, NCCL between the ranks), an f32 plan on the CPU (CpuExecutor, the host
// communicator between them). run-step, bench and the trainer drive either through the Executor
// interface; the trainer's optimizer (runtime/train/Optimizer.h) takes the backend's own.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "runtime/comm/Communicator.h"
#include "runtime/exec/Executor.h"
#include "runtime/plan/Plan.h"

namespace hcp {

class CpuExecutor;
class CudaExecutor;
namespace comm {
class NcclCommunicator;
}

struct ExecutorOptions {
  int device = 0;  // the CUDA device of a one-rank run (several ranks: each its local rank's)
  bool optimizer_state = false;  // CUDA: reserve the AdamW state in the memory check
  bool shard_optimizer = false;  // CUDA: ZeRO-1 over the ranks
};

class RankExecutor {
 public:
  RankExecutor();
  RankExecutor(RankExecutor&&) noexcept;
  RankExecutor& operator=(RankExecutor&&) noexcept;
  ~RankExecutor();

  Executor& executor() const { return *executor_; }
  bool on_gpu() const { return gpu_ != nullptr; }
  // The CUDA executor when on_gpu() (its optimizer, profile and memory figures), else null.
  CudaExecutor* gpu() const { return gpu_; }
  // The CPU executor when not on_gpu() (its parameters in host memory), else null.
  CpuExecutor* cpu() const { return cpu_; }
  // "the CPU, 8 threads per rank" or "GPU 0": where the plan runs, for a report.
  const std::string& where() const { return where_; }

  // Checks that this build and the plan's dtype agree (a bf16 plan needs a CUDA build), then
  // creates the executor over `ranks` (whose mesh CheckRanksAgree has set to the plan's).
  // Collective over the world.
  static absl::StatusOr<RankExecutor> Create(const plan::Plan& plan, comm::Communicator& ranks,
                                             const ExecutorOptions& options);

 private:
  // Several GPU ranks. Shared: its deleter is bound where the type is complete (a build without
  // CUDA never has one).
  std::shared_ptr<comm::NcclCommunicator> nccl_;
  std::unique_ptr<Executor> executor_;
  CudaExecutor* gpu_ = nullptr;
  CpuExecutor* cpu_ = nullptr;
  std::string where_;
};

}  // namespace hcp
