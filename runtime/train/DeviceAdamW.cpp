#include "runtime/train/DeviceAdamW.h"

#include <vector>

#include "absl/strings/str_format.h"
#include "runtime/comm/Agreement.h"
#include "runtime/exec/CudaExecutor.h"
#include "runtime/exec/ParameterValues.h"
#include "runtime/support/Status.h"
#include "runtime/support/Format.h"
#include "runtime/train/TrainState.h"
#include "runtime/weights/Checkpoint.h"

namespace hcp::train {

absl::Status DeviceAdamW::Start() {
  return comm::AgreeOnStatus(executor_.communicator(), executor_.InitOptimizer());
}

absl::Status DeviceAdamW::Resume(const CheckpointReader& weights, const TrainStateReader& state) {
  const plan::Plan& plan = executor_.plan();
  absl::Status loaded = CheckCheckpointHasParameters(plan, weights);
  if (loaded.ok()) loaded = executor_.InitOptimizer();
  for (const plan::Parameter& p : plan.parameters) {
    if (!loaded.ok()) break;
    const CudaExecutor::ShardRange range = executor_.ShardOf(p);  // whole, or this rank's rows
    std::vector<float> master(range.count), m(range.count), v(range.count);
    loaded = weights.ReadF32Range(p.name, range.begin, range.count, master.data());
    if (loaded.ok()) {
      loaded = state.ReadMomentsRange(p.name, range.begin, range.count, m.data(), v.data());
    }
    if (loaded.ok()) loaded = executor_.SetOptimizerState(p.name, master, m, v);
  }
  if (loaded.ok()) updates_ = state.state().optimizer_updates;
  return comm::AgreeOnStatus(executor_.communicator(), loaded);
}

absl::Status DeviceAdamW::Update(double lr, double clip_coef) {
  const cuda::AdamWStep step{.lr = lr,
                             .beta1 = config_.beta1,
                             .beta2 = config_.beta2,
                             .eps = config_.eps,
                             .weight_decay = config_.weight_decay,
                             .clip_coef = clip_coef,
                             .t = updates_ + 1};
  const plan::Plan& plan = executor_.plan();
  HCP_RETURN_IF_ERROR(comm::AgreeOnStatus(
      executor_.communicator(), executor_.OptimizerStep(step, [&plan](const plan::Parameter& p) {
        return DefaultDecay(p.name, plan.FullShape(p));
      })));
  ++updates_;
  return absl::OkStatus();
}

// The root holds every replicated parameter's state whole, unless the optimizer is sharded; an
// expert tensor split over ep ranks is gathered over the ep group, a sharded optimizer's slices
// over the world, so every rank fetches those (a rank whose download fails ends the job in the
// gather).
absl::Status DeviceAdamW::Gather(ModelTensors& tensors) {
  const bool root = executor_.communicator().world_rank() == 0;
  absl::Status read;
  tensors = ModelTensors{};
  for (const plan::Parameter& p : executor_.plan().parameters) {
    // After a failure, the root still takes part in the gathers the other ranks are in.
    if (!executor_.ReadsGather(p) && (!root || !read.ok())) continue;
    absl::StatusOr<std::vector<float>> master = executor_.Master(p.name);
    absl::StatusOr<std::vector<float>> m = executor_.ExpAvg(p.name);
    absl::StatusOr<std::vector<float>> v = executor_.ExpAvgSq(p.name);
    if (!root) continue;
    for (const absl::Status& s : {master.status(), m.status(), v.status()}) {
      if (read.ok()) read = s;
    }
    if (!read.ok()) continue;
    tensors.values.push_back(*std::move(master));
    tensors.exp_avg.push_back(*std::move(m));
    tensors.exp_avg_sq.push_back(*std::move(v));
  }
  return comm::AgreeOnStatus(executor_.communicator(), read);
}

std::string DeviceAdamW::Describe() const {
  const plan::Plan& plan = executor_.plan();
  std::string how = "fp32 masters of the bf16 parameters, m and v, on the GPU";
  if (shard_optimizer_) {
    how = absl::StrFormat(
        "--shard-optimizer: fp32 masters, m and v of the replicated parameters sliced over %d "
        "GPUs",
        executor_.communicator().world_size());
  }
  return absl::StrFormat("AdamW, state %s on rank 0 (%s)",
                         FormatBytes(OptimizerStateBytes(plan, shard_optimizer_)), how);
}

}  // namespace hcp::train
