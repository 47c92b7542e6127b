#include "runtime/train/Trainer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>

#include "absl/strings/str_format.h"
#include "runtime/comm/Agreement.h"
#include "runtime/exec/CpuExecutor.h"
#include "runtime/support/Status.h"
#include "runtime/train/Metrics.h"
#include "runtime/train/TokenData.h"
#include "runtime/train/TrainLoop.h"
#include "runtime/train/TrainState.h"
#include "runtime/weights/Checkpoint.h"

namespace hcp::train {
namespace {

absl::StatusOr<FlatLayout> LayoutOf(const plan::Plan& plan) {
  std::vector<ParamSpec> specs;
  for (const plan::Parameter& p : plan.parameters)
    specs.push_back(ParamSpec::WithDefaultDecay(p.name, plan.buffers[p.buffer].shape));
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

class Loop {
 public:
  Loop(comm::Communicator& comm, const plan::Plan& plan, const TrainOptions& options)
      : comm_(comm), plan_(plan), options_(options) {}

  absl::Status Setup();
  absl::Status Run();

 private:
  bool root() const { return comm_.world_rank() == 0; }
  // `local` on this rank; every rank returns the same status.
  absl::Status Agree(const absl::Status& local) { return comm::AgreeOnStatus(comm_, local); }

  absl::Status ResumeFrom(const std::string& checkpoint);
  absl::Status LoadMoments(const TrainStateReader& state);
  absl::Status Step(int64_t step, MetricsRecord& record);
  void CopyGradients(bool accumulate);
  void WriteBackGradients();
  absl::Status Update(const AdamWUpdate& update);
  absl::Status SaveCheckpoint(int64_t steps_done);

  comm::Communicator& comm_;
  const plan::Plan& plan_;
  TrainOptions options_;
  std::unique_ptr<CpuExecutor> executor_;
  TrainingData data_;
  std::optional<FlatLayout> layout_;
  std::optional<AdamW> optimizer_;
  std::optional<MetricsWriter> metrics_;
  std::vector<float> gradients_;  // flat, layout order: accumulation and the update's input
  // A checkpoint's whole tensors, per parameter (expert shards gathered), while it is written.
  std::vector<std::vector<float>> full_values_, full_exp_avg_, full_exp_avg_sq_;
  int64_t first_step_ = 0;  // 0, or the step a resumed run continues from
};

absl::Status Loop::Setup() {
  HCP_RETURN_IF_ERROR(PrepareOptions(options_));
  HCP_ASSIGN_OR_RETURN(executor_, CpuExecutor::Create(plan_, comm_));
  HCP_ASSIGN_OR_RETURN(FlatLayout layout, LayoutOf(plan_));
  layout_ = std::move(layout);
  HCP_RETURN_IF_ERROR(OpenTrainingData(comm_, plan_, options_, data_));

  std::optional<FlatRange> owned;
  if (options_.shard_optimizer) {
    // The optimizer's slices cut the flat parameters, which must be the same on every rank:
    // expert shards are not.
    if (plan_.mesh.ep > 1) {
      return absl::UnimplementedError(
          "--shard-optimizer with expert parallelism (ep > 1) is not supported yet");
    }
    owned = ShardRange(layout_->total(), comm_.world_rank(), comm_.world_size());
  }
  HCP_ASSIGN_OR_RETURN(AdamW optimizer, AdamW::Create(*layout_, options_.adamw, owned));
  optimizer_ = std::move(optimizer);
  gradients_.assign(layout_->total(), 0.0f);

  if (options_.resume) {
    HCP_ASSIGN_OR_RETURN(std::string checkpoint, CheckpointToResume(comm_, options_));
    HCP_RETURN_IF_ERROR(ResumeFrom(checkpoint));
  } else if (!options_.init_weights.empty()) {
    absl::StatusOr<CheckpointReader> weights = CheckpointReader::Open(options_.init_weights);
    HCP_RETURN_IF_ERROR(Agree(weights.status()));
    HCP_RETURN_IF_ERROR(executor_->LoadParameters(*weights));
  } else {
    executor_->InitializeParameters(options_.seed);
  }
  return OpenMetrics(comm_, options_, metrics_);
}

absl::Status Loop::ResumeFrom(const std::string& checkpoint) {
  absl::StatusOr<CheckpointReader> weights = CheckpointReader::Open(checkpoint);
  HCP_RETURN_IF_ERROR(Agree(weights.status()));
  HCP_RETURN_IF_ERROR(executor_->LoadParameters(*weights));
  // The checkpoint holds every parameter's whole tensor (an expert parameter's all shards).
  std::vector<ParamSpec> full;
  for (const plan::Parameter& p : plan_.parameters) {
    full.push_back(ParamSpec::WithDefaultDecay(p.name, plan_.FullShape(p)));
  }
  absl::StatusOr<TrainStateReader> state = TrainStateReader::Open(checkpoint, full);
  HCP_RETURN_IF_ERROR(Agree(state.status()));
  // The saved run's optimizer and schedule, so that it continues exactly.
  const TrainState& saved = state->state();
  absl::Status loaded = LoadMoments(*state);
  if (loaded.ok()) loaded = data_.batcher->Restore(saved.data);
  if (loaded.ok() && saved.step >= options_.steps) {
    loaded = absl::InvalidArgumentError(
        absl::StrFormat("%s is after step %d: nothing left of a %d-step run", checkpoint,
                        saved.step, options_.steps));
  }
  HCP_RETURN_IF_ERROR(Agree(loaded));
  options_.adamw = saved.optimizer;
  options_.schedule = saved.schedule;
  first_step_ = saved.step;
  if (root())
    std::printf("resumed from %s (after step %lld)\n", checkpoint.c_str(),
                static_cast<long long>(saved.step));
  return absl::OkStatus();
}

// The optimizer's moments from a checkpoint: a sharded optimizer takes its flat slice; otherwise
// each parameter reads the rows this rank holds (all of them unless it is an expert shard).
absl::Status Loop::LoadMoments(const TrainStateReader& state) {
  if (!optimizer_->owns_all()) return state.LoadInto(*optimizer_);
  for (size_t i = 0; i < layout_->size(); ++i) {
    const plan::Parameter& p = plan_.parameters[i];
    CpuExecutor::ShardRange shard = executor_->ShardOf(p);
    HCP_RETURN_IF_ERROR(state.ReadMomentsRange(
        p.name, shard.begin, shard.count, optimizer_->exp_avg().data() + layout_->offset(i),
        optimizer_->exp_avg_sq().data() + layout_->offset(i)));
  }
  optimizer_->set_updates(state.state().optimizer_updates);
  return absl::OkStatus();
}

// Copies (or adds) the executor's gradients into the flat accumulator.
void Loop::CopyGradients(bool accumulate) {
  for (size_t i = 0; i < layout_->size(); ++i) {
    std::span<float> g = *executor_->Gradient(layout_->param(i).name);
    float* flat = gradients_.data() + layout_->offset(i);
    for (size_t k = 0; k < g.size(); ++k) flat[k] = accumulate ? flat[k] + g[k] : g[k];
  }
}

void Loop::WriteBackGradients() {
  for (size_t i = 0; i < layout_->size(); ++i) {
    std::span<float> g = *executor_->Gradient(layout_->param(i).name);
    std::copy_n(gradients_.data() + layout_->offset(i), g.size(), g.begin());
  }
}

absl::Status Loop::Update(const AdamWUpdate& update) {
  if (optimizer_->owns_all()) {
    for (size_t i = 0; i < layout_->size(); ++i) {
      const std::string& name = layout_->param(i).name;
      std::span<float> param = *executor_->Parameter(name);
      HCP_RETURN_IF_ERROR(optimizer_->UpdateTensor(update, name, param.data(),
                                                   gradients_.data() + layout_->offset(i)));
    }
    return optimizer_->Commit(update);
  }
  // Sharded: each rank updates its slice of the flat parameters, then all gather the slices.
  std::vector<float> params(layout_->total());
  for (size_t i = 0; i < layout_->size(); ++i) {
    std::span<float> p = *executor_->Parameter(layout_->param(i).name);
    std::copy(p.begin(), p.end(), params.begin() + layout_->offset(i));
  }
  FlatRange own = optimizer_->owned();
  HCP_RETURN_IF_ERROR(optimizer_->UpdateRange(update, own, params.data() + own.begin,
                                              gradients_.data() + own.begin));
  AllGatherSlices(comm_, params);
  for (size_t i = 0; i < layout_->size(); ++i) {
    std::span<float> p = *executor_->Parameter(layout_->param(i).name);
    std::copy_n(params.begin() + layout_->offset(i), p.size(), p.begin());
  }
  return optimizer_->Commit(update);
}

absl::Status Loop::Step(int64_t step, MetricsRecord& record) {
  absl::StatusOr<StepBatch> batch =
      data_.batcher->NextStep(comm_.has_mesh() ? comm_.dp_index() : 0);
  HCP_RETURN_IF_ERROR(Agree(batch.status()));
  const float loss_scale = StepLossScale(comm_, *batch);

  double loss = 0;
  for (int64_t a = 0; a < options_.grad_accum; ++a) {
    HCP_RETURN_IF_ERROR(
        executor_->SetInputs(batch->micro_inputs(a), batch->micro_targets(a), loss_scale));
    HCP_RETURN_IF_ERROR(executor_->RunStep());
    loss += executor_->Loss();  // already summed over the cp group by the plan
    CopyGradients(/*accumulate=*/a > 0);
  }
  comm_.AllReduceSum(&loss, 1, comm::Group::kDp);
  if (options_.grad_accum > 1) WriteBackGradients();
  executor_->SumGradientsOverRanks();
  CopyGradients(/*accumulate=*/false);

  // The whole model's gradient norm: expert shards are summed over their ep group.
  double norm = std::sqrt(executor_->GradientSquaredNorm());
  StepDecision decision = DecideStep(loss, norm, options_.adamw.max_grad_norm);
  double lr = LearningRate(options_.schedule, step);
  if (decision.applied()) {
    HCP_RETURN_IF_ERROR(Agree(Update(optimizer_->NextUpdate(lr, decision.clip_coef))));
  }
  RecordStep(record, step, loss, lr, norm, decision, root());
  return absl::OkStatus();
}

absl::Status Loop::Run() {
  LoopHooks hooks;
  hooks.step = [this](int64_t step, MetricsRecord& record) { return Step(step, record); };
  hooks.save = [this](int64_t steps_done) { return SaveCheckpoint(steps_done); };
  return RunTrainingSteps(options_, root(), first_step_,
                          data_.batcher->config().global_batch() * plan_.seq,
                          metrics_ ? &*metrics_ : nullptr, hooks);
}

// --- checkpoints ----------------------------------------------------------------------------

absl::Status Loop::SaveCheckpoint(int64_t steps_done) {
  // Every rank: the moments as full arrays (gathered when sharded).
  std::vector<float> exp_avg(layout_->total()), exp_avg_sq(layout_->total());
  FlatRange own = optimizer_->owned();
  std::copy(optimizer_->exp_avg().begin(), optimizer_->exp_avg().end(),
            exp_avg.begin() + own.begin);
  std::copy(optimizer_->exp_avg_sq().begin(), optimizer_->exp_avg_sq().end(),
            exp_avg_sq.begin() + own.begin);
  if (!optimizer_->owns_all()) {
    AllGatherSlices(comm_, exp_avg);
    AllGatherSlices(comm_, exp_avg_sq);
  }
  // Every rank: the whole tensors of every parameter and moment (expert shards gathered over
  // their ep group: collective, so all ranks take part although rank 0 alone writes).
  full_values_.clear();
  full_exp_avg_.clear();
  full_exp_avg_sq_.clear();
  for (size_t i = 0; i < layout_->size(); ++i) {
    const plan::Parameter& p = plan_.parameters[i];
    std::span<const float> m(exp_avg.data() + layout_->offset(i), layout_->numel(i));
    std::span<const float> v(exp_avg_sq.data() + layout_->offset(i), layout_->numel(i));
    full_values_.push_back(executor_->GatherFull(p, *executor_->Parameter(p.name)));
    full_exp_avg_.push_back(executor_->GatherFull(p, m));
    full_exp_avg_sq_.push_back(executor_->GatherFull(p, v));
  }
  absl::Status written = absl::OkStatus();
  if (root()) {
    const CheckpointContents contents{
        full_values_, full_exp_avg_, full_exp_avg_sq_,
        StateAfter(steps_done, *data_.batcher, options_, optimizer_->updates()),
        options_.model_config};
    written = PublishCheckpoint(options_.checkpoint_dir, steps_done, [&](const std::string& dir) {
      return WriteCheckpointFiles(dir, plan_, contents);
    });
    if (written.ok() && metrics_) written = metrics_->Sync();
  }
  return Agree(written);
}

}  // namespace

std::string CheckpointName(int64_t step) { return absl::StrFormat("step-%06d", step); }

absl::Status Train(comm::Communicator& comm, const plan::Plan& plan, const TrainOptions& options) {
  Loop loop(comm, plan, options);
  HCP_RETURN_IF_ERROR(loop.Setup());
  return loop.Run();
}

}  // namespace hcp::train
