#include "runtime/train/HostAdamW.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "runtime/comm/Agreement.h"
#include "runtime/exec/CpuExecutor.h"
#include "runtime/support/Status.h"
#include "runtime/support/Format.h"
#include "runtime/train/TrainState.h"
#include "runtime/weights/Checkpoint.h"

namespace hcp::train {
namespace {

// The flat layout of parameters `indices` of the plan (this rank's buffers: an expert shard has
// its local shape), in that order.
absl::StatusOr<FlatLayout> LayoutOf(const plan::Plan& plan, const std::vector<size_t>& indices) {
  std::vector<ParamSpec> specs;
  for (size_t i : indices) {
    const plan::Parameter& p = plan.parameters[i];
    specs.push_back(ParamSpec::WithDefaultDecay(p.name, plan.buffers[p.buffer].shape));
  }
  return FlatLayout::Create(std::move(specs));
}

// Every rank contributes [begin, end) of `flat` (its slice of a partition of [0, size)); all end
// with the whole array. Slices are padded to the longest for the all-gather.
void AllGatherSlices(comm::Communicator& comm, std::vector<float>& flat) {
  const int world = comm.world_size();
  if (world == 1) return;
  const int64_t total = static_cast<int64_t>(flat.size());
  const int64_t longest = ShardRange(total, 0, world).size();
  std::vector<float> mine(longest, 0.0f), all(longest * world);
  FlatRange own = ShardRange(total, comm.world_rank(), world);
  std::copy(flat.begin() + own.begin, flat.begin() + own.end, mine.begin());
  comm.AllGather(std::as_bytes(std::span(mine)), std::as_writable_bytes(std::span(all)),
                 comm::Group::kWorld);
  for (int r = 0; r < world; ++r) {
    FlatRange range = ShardRange(total, r, world);
    std::copy_n(all.begin() + r * longest, range.size(), flat.begin() + range.begin);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<HostAdamW>> HostAdamW::Create(CpuExecutor& executor,
                                                             const AdamWConfig& config,
                                                             bool shard_optimizer) {
  const plan::Plan& plan = executor.plan();
  comm::Communicator& comm = executor.communicator();
  std::vector<size_t> replicated, experts;
  for (size_t i = 0; i < plan.parameters.size(); ++i) {
    const bool apart = shard_optimizer && plan.parameters[i].sharded();
    (apart ? experts : replicated).push_back(i);
  }
  std::unique_ptr<HostAdamW> optimizer(new HostAdamW(executor, shard_optimizer));
  for (const std::vector<size_t>* params : {&replicated, &experts}) {
    if (params->empty()) continue;
    HCP_ASSIGN_OR_RETURN(FlatLayout layout, LayoutOf(plan, *params));
    std::optional<FlatRange> owned;
    if (shard_optimizer && params == &replicated) {
      owned = ShardRange(layout.total(), comm.world_rank(), comm.world_size());
    }
    HCP_ASSIGN_OR_RETURN(AdamW adamw, AdamW::Create(std::move(layout), config, owned));
    optimizer->parts_.push_back({*params, std::move(adamw)});
  }
  if (optimizer->parts_.empty()) {
    return absl::InvalidArgumentError("the plan has no parameters to train");
  }
  return optimizer;
}

// The moments start at zero (Create); an f32 parameter is its own master.
absl::Status HostAdamW::Start() { return absl::OkStatus(); }

// The parameters from the checkpoint's weights; the moments: a sliced part takes its flat
// slice, a whole part each parameter's rows this rank holds (all of them unless it is an expert
// shard).
absl::Status HostAdamW::Resume(const CheckpointReader& weights, const TrainStateReader& state) {
  HCP_RETURN_IF_ERROR(executor_.LoadParameters(weights));
  absl::Status loaded;
  for (Part& part : parts_) {
    AdamW& adamw = part.adamw;
    adamw.set_updates(state.state().optimizer_updates);
    if (!adamw.owns_all()) {
      loaded = state.LoadInto(adamw);
      if (!loaded.ok()) break;
      continue;
    }
    for (size_t k = 0; k < part.params.size() && loaded.ok(); ++k) {
      const plan::Parameter& p = executor_.plan().parameters[part.params[k]];
      const CpuExecutor::ShardRange shard = executor_.ShardOf(p);
      const int64_t at = adamw.layout().offset(k);
      loaded = state.ReadMomentsRange(p.name, shard.begin, shard.count, adamw.exp_avg().data() + at,
                                      adamw.exp_avg_sq().data() + at);
    }
    if (!loaded.ok()) break;
  }
  return comm::AgreeOnStatus(executor_.communicator(), loaded);
}

absl::Status HostAdamW::Update(double lr, double clip_coef) {
  // Every part has applied as many updates: any one gives the next update's number.
  const AdamWUpdate update = parts_.front().adamw.NextUpdate(lr, clip_coef);
  absl::Status status;
  for (Part& part : parts_) {
    status = UpdatePart(part, update);
    if (status.ok()) status = part.adamw.Commit(update);
    if (!status.ok()) break;
  }
  return comm::AgreeOnStatus(executor_.communicator(), status);
}

absl::Status HostAdamW::UpdatePart(Part& part, const AdamWUpdate& update) {
  AdamW& adamw = part.adamw;
  const plan::Plan& plan = executor_.plan();
  if (adamw.owns_all()) {
    for (size_t i : part.params) {
      const std::string& name = plan.parameters[i].name;
      std::span<float> param = *executor_.Parameter(name);
      std::span<float> grad = *executor_.Gradient(name);
      HCP_RETURN_IF_ERROR(adamw.UpdateTensor(update, name, param.data(), grad.data()));
    }
    return absl::OkStatus();
  }
  // Sliced: each rank updates its slice of the part's flat parameters, then all gather the
  // slices.
  const FlatLayout& flat = adamw.layout();
  std::vector<float> params(flat.total()), grads(flat.total());
  for (size_t k = 0; k < part.params.size(); ++k) {
    const std::string& name = plan.parameters[part.params[k]].name;
    std::span<float> p = *executor_.Parameter(name);
    std::span<float> g = *executor_.Gradient(name);
    std::copy(p.begin(), p.end(), params.begin() + flat.offset(k));
    std::copy(g.begin(), g.end(), grads.begin() + flat.offset(k));
  }
  const FlatRange own = adamw.owned();
  HCP_RETURN_IF_ERROR(
      adamw.UpdateRange(update, own, params.data() + own.begin, grads.data() + own.begin));
  AllGatherSlices(executor_.communicator(), params);
  for (size_t k = 0; k < part.params.size(); ++k) {
    std::span<float> p = *executor_.Parameter(plan.parameters[part.params[k]].name);
    std::copy_n(params.begin() + flat.offset(k), p.size(), p.begin());
  }
  return absl::OkStatus();
}

absl::Status HostAdamW::Gather(ModelTensors& tensors) {
  const plan::Plan& plan = executor_.plan();
  comm::Communicator& comm = executor_.communicator();
  // Every rank: the moments of this rank's parameters, per parameter (sliced parts gathered).
  std::vector<std::vector<float>> exp_avg(plan.parameters.size()),
      exp_avg_sq(plan.parameters.size());
  for (const Part& part : parts_) {
    const AdamW& adamw = part.adamw;
    const FlatLayout& flat = adamw.layout();
    std::vector<float> m(flat.total()), v(flat.total());
    const FlatRange own = adamw.owned();
    std::copy(adamw.exp_avg().begin(), adamw.exp_avg().end(), m.begin() + own.begin);
    std::copy(adamw.exp_avg_sq().begin(), adamw.exp_avg_sq().end(), v.begin() + own.begin);
    if (!adamw.owns_all()) {
      AllGatherSlices(comm, m);
      AllGatherSlices(comm, v);
    }
    for (size_t k = 0; k < part.params.size(); ++k) {
      const auto from = m.begin() + flat.offset(k);
      exp_avg[part.params[k]].assign(from, from + flat.numel(k));
      const auto from_v = v.begin() + flat.offset(k);
      exp_avg_sq[part.params[k]].assign(from_v, from_v + flat.numel(k));
    }
  }
  // Every rank: the whole tensors of every parameter and moment (expert shards gathered over
  // their ep group: collective, so all ranks take part although the root alone keeps them).
  const bool root = comm.world_rank() == 0;
  tensors = ModelTensors{};
  for (size_t i = 0; i < plan.parameters.size(); ++i) {
    const plan::Parameter& p = plan.parameters[i];
    std::vector<float> value = executor_.GatherFull(p, *executor_.Parameter(p.name));
    std::vector<float> m = executor_.GatherFull(p, exp_avg[i]);
    std::vector<float> v = executor_.GatherFull(p, exp_avg_sq[i]);
    if (!root) continue;
    tensors.values.push_back(std::move(value));
    tensors.exp_avg.push_back(std::move(m));
    tensors.exp_avg_sq.push_back(std::move(v));
  }
  return absl::OkStatus();
}

// Rank 0's figure; the others' differ by at most one element per sliced part.
std::string HostAdamW::Describe() const {
  uint64_t bytes = 0;
  for (const Part& part : parts_) {
    bytes += 2 * sizeof(float) * static_cast<uint64_t>(part.adamw.owned().size());
  }
  std::string how = "m and v of every parameter it holds";
  if (shard_optimizer_) {
    const char* experts = parts_.size() > 1 ? ", its experts' whole" : "";
    how = absl::StrFormat(
        "--shard-optimizer: the replicated parameters' m and v sliced over %d ranks%s",
        executor_.communicator().world_size(), experts);
  }
  return absl::StrFormat("AdamW, state %s on rank 0 (%s)", FormatBytes(bytes), how);
}

}  // namespace hcp::train
