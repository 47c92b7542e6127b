// The optimizer the training loop drives, whichever executor holds the parameters: AdamW with
// fp32 state (AdamW.h's rule, element for element), on the host over a CpuExecutor's parameters
// (HostAdamW.h) or on the GPU over a CudaExecutor's (DeviceAdamW.h). With --shard-optimizer each
// rank keeps and updates a slice of the replicated parameters' state, and the updated slices are
// gathered (ZeRO-1); an expert shard's state stays whole on its rank.
//
// Every method that returns a Status is collective over the world: every rank calls it at the
// same point and gets the same status.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/train/AdamW.h"

namespace hcp {
class CheckpointReader;
class RankExecutor;
}  // namespace hcp

namespace hcp::train {

class TrainStateReader;

// What a checkpoint holds of the model: per plan parameter, in plan order, its whole tensor
// (checkpoint shape) as fp32 (the master weights), and AdamW's two moments laid out alike.
struct ModelTensors {
  std::vector<std::vector<float>> values, exp_avg, exp_avg_sq;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;

  // A fresh run, once the executor's parameters are set: the moments zero, the fp32 masters
  // (where the parameters are stored in bf16) their values.
  virtual absl::Status Start() = 0;
  // A resumed run: every parameter (its master) from `weights`, the moments and the count of
  // updates from `state`, this rank's part of each; the checkpoint's tensors must all be there
  // with the plan's shapes.
  virtual absl::Status Resume(const CheckpointReader& weights, const TrainStateReader& state) = 0;
  // One update of every parameter from the executor's gradients (summed over the ranks): the
  // gradients multiplied by clip_coef, then AdamW with learning rate `lr` (weight decay by
  // DefaultDecay of the parameter's name and shape).
  virtual absl::Status Update(double lr, double clip_coef) = 0;
  // The updates applied so far (the next one is AdamW's t = updates() + 1).
  virtual int64_t updates() const = 0;
  // Every parameter's whole value and moments, for a checkpoint: expert shards and split slices
  // are gathered, so every rank takes part; `tensors` is filled on the root rank (world rank 0)
  // only.
  virtual absl::Status Gather(ModelTensors& tensors) = 0;
  // "AdamW, state 1.2 MiB on rank 0 (m and v of every parameter it holds)": what it keeps.
  virtual std::string Describe() const = 0;
};

// The optimizer for the executor `rank` runs on: HostAdamW on the CPU, DeviceAdamW on a GPU.
absl::StatusOr<std::unique_ptr<Optimizer>> CreateOptimizer(RankExecutor& rank,
                                                           const AdamWConfig& config,
                                                           bool shard_optimizer);

}  // namespace hcp::train
