#include "runtime/train/Optimizer.h"

#include "runtime/exec/RankExecutor.h"
#include "runtime/support/Status.h"
#include "runtime/train/HostAdamW.h"
#ifdef HYBRIDCP_HAVE_CUDA
#include "runtime/train/DeviceAdamW.h"
#endif

namespace hcp::train {

absl::StatusOr<std::unique_ptr<Optimizer>> CreateOptimizer(RankExecutor& rank,
                                                           const AdamWConfig& config,
                                                           bool shard_optimizer) {
  if (rank.cpu() != nullptr) {
    HCP_ASSIGN_OR_RETURN(std::unique_ptr<HostAdamW> host,
                         HostAdamW::Create(*rank.cpu(), config, shard_optimizer));
    return host;
  }
#ifdef HYBRIDCP_HAVE_CUDA
  if (rank.gpu() != nullptr) {
    return std::make_unique<DeviceAdamW>(*rank.gpu(), config, shard_optimizer);
  }
#endif
  return absl::InternalError("CreateOptimizer: the rank has no executor (a bug)");
}

}  // namespace hcp::train
