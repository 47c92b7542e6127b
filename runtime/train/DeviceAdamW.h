// AdamW on the GPU over a CudaExecutor's parameters: the executor keeps the state on the device
// (fp32 masters of the bf16 parameters, m and v; with --shard-optimizer each rank its slice of
// them, CudaExecutor::Options::shard_optimizer) and runs the update kernel (adamw_update: AdamW.h's
// operations element for element). Checkpoints hold the fp32 masters, which a CPU run loads too.
#pragma once

#include <memory>
#include <string>

#include "runtime/train/AdamW.h"
#include "runtime/train/Optimizer.h"

namespace hcp {
class CudaExecutor;
}

namespace hcp::train {

class DeviceAdamW final : public Optimizer {
 public:
  DeviceAdamW(CudaExecutor& executor, const AdamWConfig& config, bool shard_optimizer)
      : executor_(executor), config_(config), shard_optimizer_(shard_optimizer) {}

  absl::Status Start() override;
  // Each parameter's master and moments are set from the checkpoint (the bf16 compute copy
  // rounded from the master), so the run continues as if it had not stopped. Each tensor is read
  // once.
  absl::Status Resume(const CheckpointReader& weights, const TrainStateReader& state) override;
  absl::Status Update(double lr, double clip_coef) override;
  int64_t updates() const override { return updates_; }
  absl::Status Gather(ModelTensors& tensors) override;
  std::string Describe() const override;

 private:
  CudaExecutor& executor_;
  AdamWConfig config_;
  bool shard_optimizer_;
  int64_t updates_ = 0;
};

}  // namespace hcp::train
