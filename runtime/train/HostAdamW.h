// AdamW on the host over a CpuExecutor's parameters (f32 plans: each parameter's buffer is its
// own fp32 master). The state is in one or two parts. Without --shard-optimizer, one part:
// every parameter, whole on every rank. With it, the replicated parameters' state is cut over the
// ranks (each updates its slice of their flat layout, then the slices are all-gathered); an
// expert shard (ep > 1) holds other experts on every rank, so its state stays whole on its rank,
// in a second part (as DeviceAdamW keeps it).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/train/AdamW.h"
#include "runtime/train/Optimizer.h"

namespace hcp {
class CpuExecutor;
}

namespace hcp::train {

class HostAdamW final : public Optimizer {
 public:
  // Zero moments with `config`, in the parts described above.
  static absl::StatusOr<std::unique_ptr<HostAdamW>> Create(CpuExecutor& executor,
                                                           const AdamWConfig& config,
                                                           bool shard_optimizer);

  absl::Status Start() override;
  absl::Status Resume(const CheckpointReader& weights, const TrainStateReader& state) override;
  absl::Status Update(double lr, double clip_coef) override;
  int64_t updates() const override { return parts_.front().adamw.updates(); }
  absl::Status Gather(ModelTensors& tensors) override;
  std::string Describe() const override;

 private:
  struct Part {
    std::vector<size_t> params;  // indices into the plan's parameters, in plan order
    AdamW adamw;                 // over the flat layout of those parameters
  };
  HostAdamW(CpuExecutor& executor, bool shard_optimizer)
      : executor_(executor), shard_optimizer_(shard_optimizer) {}
  absl::Status UpdatePart(Part& part, const AdamWUpdate& update);

  CpuExecutor& executor_;
  bool shard_optimizer_;
  std::vector<Part> parts_;  // never empty
};

}  // namespace hcp::train
