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
#include "runtime/train/Format.h"
#include "runtime/train/Metrics.h"
#include "runtime/train/TokenData.h"
#include "runtime/train/TrainLoop.h"
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

  absl::Status CreateOptimizer();
  void DescribeOptimizer() const;
  absl::Status ResumeFrom(const std::string& checkpoint);
  absl::Status LoadMoments(const TrainStateReader& state);
  absl::Status Step(int64_t step, MetricsRecord& record);
  void CopyGradients(bool accumulate);
  void WriteBackGradients();
  absl::Status Update(const AdamWUpdate& update);
  absl::Status SaveCheckpoint(int64_t steps_done, const Retention& retention);

  comm::Communicator& comm_;
  const plan::Plan& plan_;
  TrainOptions options_;
  std::unique_ptr<CpuExecutor> executor_;
  TrainingData data_;
  std::optional<FlatLayout> layout_;  // every parameter, in plan order
  // The AdamW state, in one or two parts. Without --shard-optimizer, one part: every parameter,
  // whole on every rank. With it, the replicated parameters' state is cut over the ranks (each
  // updates its slice of their flat layout, then the slices are all-gathered); an expert shard
  // (ep > 1) holds other experts on every rank, so its state stays whole on its rank, in a
  // second part (as the GPU trainer does).
  struct OptimizerPart {
    std::vector<size_t> params;  // indices into the plan's parameters, in plan order
    AdamW adamw;                 // over the flat layout of those parameters
  };
  std::vector<OptimizerPart> optimizer_;
  std::optional<MetricsWriter> metrics_;
  std::vector<float> gradients_;  // flat, layout order: accumulation and the update's input
  // A checkpoint's whole tensors, per parameter (expert shards gathered), while it is written.
  std::vector<std::vector<float>> full_values_, full_exp_avg_, full_exp_avg_sq_;
  int64_t first_step_ = 0;  // 0, or the step a resumed run continues from
};

absl::Status Loop::Setup() {
  HCP_RETURN_IF_ERROR(PrepareOptions(options_));
  HCP_RETURN_IF_ERROR(PrepareCheckpointDir(comm_, options_));
  CpuExecutor::Options executor_options;
  executor_options.threads = CpuExecutor::ThreadsPerRank(comm_.world_size());
  HCP_ASSIGN_OR_RETURN(executor_, CpuExecutor::Create(plan_, comm_, executor_options));
  std::vector<size_t> all(plan_.parameters.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  HCP_ASSIGN_OR_RETURN(FlatLayout layout, LayoutOf(plan_, all));
  layout_ = std::move(layout);
  HCP_RETURN_IF_ERROR(OpenTrainingData(comm_, plan_, options_, data_));

  gradients_.assign(layout_->total(), 0.0f);
  HCP_RETURN_IF_ERROR(CreateOptimizer());

  if (options_.resume) {
    HCP_ASSIGN_OR_RETURN(std::string checkpoint, CheckpointToResume(comm_, options_));
    HCP_RETURN_IF_ERROR(ResumeFrom(checkpoint));
  } else if (!options_.init_weights.empty()) {
    absl::StatusOr<CheckpointReader> weights =
        CheckpointReader::OpenVerified(options_.init_weights);
    HCP_RETURN_IF_ERROR(Agree(weights.status()));
    HCP_RETURN_IF_ERROR(executor_->LoadParameters(*weights));
  } else {
    HCP_RETURN_IF_ERROR(executor_->InitializeParameters(options_.seed));
  }
  if (root()) DescribeOptimizer();
  return OpenMetrics(comm_, options_, metrics_);
}

// One line on what the optimizer keeps on this rank (rank 0's figure; the others' differ by
// at most one element per sliced part).
void Loop::DescribeOptimizer() const {
  uint64_t bytes = 0;
  for (const OptimizerPart& part : optimizer_) {
    bytes += 2 * sizeof(float) * static_cast<uint64_t>(part.adamw.owned().size());
  }
  std::string how = "m and v of every parameter it holds";
  if (options_.shard_optimizer) {
    const char* experts = optimizer_.size() > 1 ? ", its experts' whole" : "";
    how = absl::StrFormat(
        "--shard-optimizer: the replicated parameters' m and v sliced over %d ranks%s",
        comm_.world_size(), experts);
  }
  std::printf("optimizer: AdamW, state %s on rank 0 (%s)\n", FormatBytes(bytes).c_str(),
              how.c_str());
}

// Zero moments with options_.adamw, in the parts described at optimizer_.
absl::Status Loop::CreateOptimizer() {
  std::vector<size_t> replicated, experts;
  for (size_t i = 0; i < plan_.parameters.size(); ++i) {
    const bool apart = options_.shard_optimizer && plan_.parameters[i].sharded();
    (apart ? experts : replicated).push_back(i);
  }
  optimizer_.clear();
  for (const std::vector<size_t>* params : {&replicated, &experts}) {
    if (params->empty()) continue;
    HCP_ASSIGN_OR_RETURN(FlatLayout layout, LayoutOf(plan_, *params));
    std::optional<FlatRange> owned;
    if (options_.shard_optimizer && params == &replicated) {
      owned = ShardRange(layout.total(), comm_.world_rank(), comm_.world_size());
    }
    HCP_ASSIGN_OR_RETURN(AdamW adamw, AdamW::Create(std::move(layout), options_.adamw, owned));
    optimizer_.push_back({*params, std::move(adamw)});
  }
  if (optimizer_.empty()) return absl::InvalidArgumentError("the plan has no parameters to train");
  return absl::OkStatus();
}

absl::Status Loop::ResumeFrom(const std::string& checkpoint) {
  HCP_ASSIGN_OR_RETURN(ResumeSources resume,
                       OpenResume(comm_, plan_, checkpoint, data_.run, options_));
  HCP_RETURN_IF_ERROR(executor_->LoadParameters(resume.weights));
  const TrainState& saved = resume.state.state();
  // With the saved run's AdamW settings (OpenResume adopted them).
  absl::Status loaded = CreateOptimizer();
  if (loaded.ok()) loaded = LoadMoments(resume.state);
  if (loaded.ok()) loaded = data_.batcher->Restore(saved.data);
  HCP_RETURN_IF_ERROR(Agree(loaded));
  first_step_ = saved.step;
  if (root()) PrintResumed(resume, checkpoint);
  return absl::OkStatus();
}

// The optimizer's moments from a checkpoint: a sliced part takes its flat slice; a whole part,
// each parameter's rows this rank holds (all of them unless it is an expert shard).
absl::Status Loop::LoadMoments(const TrainStateReader& state) {
  for (OptimizerPart& part : optimizer_) {
    AdamW& adamw = part.adamw;
    adamw.set_updates(state.state().optimizer_updates);
    if (!adamw.owns_all()) {
      HCP_RETURN_IF_ERROR(state.LoadInto(adamw));
      continue;
    }
    for (size_t k = 0; k < part.params.size(); ++k) {
      const plan::Parameter& p = plan_.parameters[part.params[k]];
      CpuExecutor::ShardRange shard = executor_->ShardOf(p);
      const int64_t at = adamw.layout().offset(k);
      HCP_RETURN_IF_ERROR(state.ReadMomentsRange(p.name, shard.begin, shard.count,
                                                 adamw.exp_avg().data() + at,
                                                 adamw.exp_avg_sq().data() + at));
    }
  }
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
  for (OptimizerPart& part : optimizer_) {
    AdamW& adamw = part.adamw;
    if (adamw.owns_all()) {
      for (size_t i : part.params) {
        const std::string& name = layout_->param(i).name;
        std::span<float> param = *executor_->Parameter(name);
        HCP_RETURN_IF_ERROR(
            adamw.UpdateTensor(update, name, param.data(), gradients_.data() + layout_->offset(i)));
      }
    } else {
      // Sliced: each rank updates its slice of the part's flat parameters, then all gather the
      // slices.
      const FlatLayout& flat = adamw.layout();
      std::vector<float> params(flat.total()), grads(flat.total());
      for (size_t k = 0; k < part.params.size(); ++k) {
        const size_t i = part.params[k];
        std::span<float> p = *executor_->Parameter(layout_->param(i).name);
        std::copy(p.begin(), p.end(), params.begin() + flat.offset(k));
        std::copy_n(gradients_.begin() + layout_->offset(i), p.size(),
                    grads.begin() + flat.offset(k));
      }
      const FlatRange own = adamw.owned();
      HCP_RETURN_IF_ERROR(
          adamw.UpdateRange(update, own, params.data() + own.begin, grads.data() + own.begin));
      AllGatherSlices(comm_, params);
      for (size_t k = 0; k < part.params.size(); ++k) {
        std::span<float> p = *executor_->Parameter(layout_->param(part.params[k]).name);
        std::copy_n(params.begin() + flat.offset(k), p.size(), p.begin());
      }
    }
    HCP_RETURN_IF_ERROR(adamw.Commit(update));
  }
  return absl::OkStatus();
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
  HCP_RETURN_IF_ERROR(executor_->SumGradientsOverRanks());
  CopyGradients(/*accumulate=*/false);

  // The whole model's gradient norm: expert shards are summed over their ep group.
  HCP_ASSIGN_OR_RETURN(const double squared_norm, executor_->GradientSquaredNorm());
  double norm = std::sqrt(squared_norm);
  StepDecision decision = DecideStep(loss, norm, options_.adamw.max_grad_norm);
  double lr = LearningRate(options_.schedule, step);
  if (decision.applied()) {
    // Every part has applied as many updates: any one gives the next update's number.
    HCP_RETURN_IF_ERROR(Agree(Update(optimizer_.front().adamw.NextUpdate(lr, decision.clip_coef))));
  }
  RecordStep(record, step, loss, lr, norm, decision, root());
  return absl::OkStatus();
}

absl::Status Loop::Run() {
  LoopHooks hooks;
  hooks.step = [this](int64_t step, MetricsRecord& record) { return Step(step, record); };
  hooks.save = [this](int64_t steps_done, const Retention& retention) {
    return SaveCheckpoint(steps_done, retention);
  };
  return RunTrainingSteps(options_, root(), first_step_,
                          data_.batcher->config().global_batch() * plan_.seq,
                          metrics_ ? &*metrics_ : nullptr, hooks);
}

// --- checkpoints ----------------------------------------------------------------------------

absl::Status Loop::SaveCheckpoint(int64_t steps_done, const Retention& retention) {
  // Every rank: the moments of this rank's parameters in the whole layout (sliced parts
  // gathered).
  std::vector<float> exp_avg(layout_->total()), exp_avg_sq(layout_->total());
  for (const OptimizerPart& part : optimizer_) {
    const AdamW& adamw = part.adamw;
    const FlatLayout& flat = adamw.layout();
    std::vector<float> m(flat.total()), v(flat.total());
    const FlatRange own = adamw.owned();
    std::copy(adamw.exp_avg().begin(), adamw.exp_avg().end(), m.begin() + own.begin);
    std::copy(adamw.exp_avg_sq().begin(), adamw.exp_avg_sq().end(), v.begin() + own.begin);
    if (!adamw.owns_all()) {
      AllGatherSlices(comm_, m);
      AllGatherSlices(comm_, v);
    }
    for (size_t k = 0; k < part.params.size(); ++k) {
      const int64_t to = layout_->offset(part.params[k]);
      std::copy_n(m.begin() + flat.offset(k), flat.numel(k), exp_avg.begin() + to);
      std::copy_n(v.begin() + flat.offset(k), flat.numel(k), exp_avg_sq.begin() + to);
    }
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
        StateAfter(steps_done, data_, options_, optimizer_.front().adamw.updates()),
        options_.model_config};
    written = PublishCheckpoint(
        options_.checkpoint_dir, steps_done, retention,
        [&](const std::string& dir) { return WriteCheckpointFiles(dir, plan_, contents); });
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
