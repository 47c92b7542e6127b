#include "runtime/exec/RankExecutor.h"

#include "absl/strings/str_format.h"
#include "runtime/comm/Agreement.h"
#include "runtime/exec/CpuExecutor.h"
#include "runtime/support/Status.h"
#ifdef HYBRIDCP_HAVE_CUDA
#include "runtime/comm/NcclCommunicator.h"
#include "runtime/exec/CudaExecutor.h"
#endif

namespace hcp {

RankExecutor::RankExecutor() = default;
RankExecutor::RankExecutor(RankExecutor&&) noexcept = default;
RankExecutor& RankExecutor::operator=(RankExecutor&&) noexcept = default;
// The executor goes before the communicator it uses.
RankExecutor::~RankExecutor() { executor_.reset(); }

absl::StatusOr<RankExecutor> RankExecutor::Create(const plan::Plan& plan, comm::Communicator& ranks,
                                                  const ExecutorOptions& options) {
  RankExecutor rank;
  if (!plan.StoresBf16()) {
    CpuExecutor::Options cpu;
    cpu.threads = CpuExecutor::ThreadsPerRank(ranks.world_size());
    HCP_ASSIGN_OR_RETURN(std::unique_ptr<CpuExecutor> executor,
                         CpuExecutor::Create(plan, ranks, cpu));
    rank.cpu_ = executor.get();
    rank.executor_ = std::move(executor);
    rank.where_ =
        absl::StrFormat("the CPU, %d thread%s per rank", cpu.threads, cpu.threads == 1 ? "" : "s");
    return rank;
  }
#ifdef HYBRIDCP_HAVE_CUDA
  // What the CUDA backend cannot run is refused before any GPU is involved.
  HCP_RETURN_IF_ERROR(comm::AgreeOnStatus(ranks, cuda_backend::CheckPlanRunsOnCuda(plan)));
  CudaExecutor::Options gpu;
  gpu.device = options.device;
  gpu.reserve_optimizer_state = options.optimizer_state;
  gpu.shard_optimizer = options.shard_optimizer;
  if (ranks.world_size() > 1) {
    gpu.device = comm::NcclCommunicator::LocalDevice(ranks);
    absl::StatusOr<std::unique_ptr<comm::NcclCommunicator>> nccl =
        comm::NcclCommunicator::Create(ranks, gpu.device, ranks.timeout());
    HCP_RETURN_IF_ERROR(comm::AgreeOnStatus(ranks, nccl.status()));
    rank.nccl_ = *std::move(nccl);
    gpu.nccl = rank.nccl_.get();
  }
  absl::StatusOr<std::unique_ptr<CudaExecutor>> created = CudaExecutor::Create(plan, gpu);
  HCP_RETURN_IF_ERROR(comm::AgreeOnStatus(ranks, created.status()));
  std::unique_ptr<CudaExecutor> executor = *std::move(created);
  rank.gpu_ = executor.get();
  rank.executor_ = std::move(executor);
  rank.where_ = absl::StrFormat("GPU %d", gpu.device);
  return rank;
#else
  (void)options;
  return comm::AgreeOnStatus(
      ranks, absl::FailedPreconditionError(
                 "the plan stores bf16 (compiled with --dtype bf16), which runs on GPUs: this "
                 "hybridcp was built without CUDA (the CPU runs f32 plans)"));
#endif
}

}  // namespace hcp
