#include "runtime/train/CudaTrainer.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>

#include "absl/strings/str_format.h"
#include "runtime/comm/Agreement.h"
#include "runtime/comm/NcclCommunicator.h"
#include "runtime/exec/CudaExecutor.h"
#include "runtime/exec/ParameterValues.h"
#include "runtime/support/Status.h"
#include "runtime/train/Metrics.h"
#include "runtime/train/TokenData.h"
#include "runtime/train/TrainLoop.h"
#include "runtime/train/TrainState.h"
#include "runtime/weights/Checkpoint.h"

namespace hcp::train {
namespace {

class GpuLoop {
 public:
  GpuLoop(comm::Communicator& comm, const plan::Plan& plan, const TrainOptions& options)
      : comm_(comm), plan_(plan), options_(options) {}

  absl::Status Setup();
  absl::Status Run();

 private:
  bool root() const { return comm_.world_rank() == 0; }
  absl::Status Agree(const absl::Status& local) { return comm::AgreeOnStatus(comm_, local); }
  absl::Status ResumeFrom(const std::string& checkpoint);
  absl::Status Step(int64_t step, MetricsRecord& record);
  absl::Status SaveCheckpoint(int64_t steps_done, const Retention& retention);

  comm::Communicator& comm_;
  const plan::Plan& plan_;
  TrainOptions options_;
  std::unique_ptr<comm::NcclCommunicator> nccl_;
  std::unique_ptr<CudaExecutor> executor_;
  TrainingData data_;
  std::optional<MetricsWriter> metrics_;
  int64_t first_step_ = 0;
  int64_t updates_ = 0;  // AdamW updates applied (its t)
};

absl::Status GpuLoop::Setup() {
  HCP_RETURN_IF_ERROR(PrepareOptions(options_));
  HCP_RETURN_IF_ERROR(PrepareCheckpointDir(comm_, options_));
  // One GPU per rank; NCCL between them when there are several.
  CudaExecutor::Options exec_options;
  exec_options.shard_optimizer = options_.shard_optimizer;
  if (comm_.world_size() > 1) {
    exec_options.device = comm::NcclCommunicator::LocalDevice(comm_);
    absl::StatusOr<std::unique_ptr<comm::NcclCommunicator>> nccl =
        comm::NcclCommunicator::Create(comm_, exec_options.device, comm_.timeout());
    HCP_RETURN_IF_ERROR(Agree(nccl.status()));
    nccl_ = std::move(*nccl);
    exec_options.nccl = nccl_.get();
  }
  absl::StatusOr<std::unique_ptr<CudaExecutor>> executor =
      CudaExecutor::Create(plan_, exec_options);
  HCP_RETURN_IF_ERROR(Agree(executor.status()));
  executor_ = std::move(*executor);
  HCP_RETURN_IF_ERROR(OpenTrainingData(comm_, plan_, options_, data_));

  if (options_.resume) {
    HCP_ASSIGN_OR_RETURN(std::string checkpoint, CheckpointToResume(comm_, options_));
    HCP_RETURN_IF_ERROR(ResumeFrom(checkpoint));
  } else {
    absl::Status set;
    if (!options_.init_weights.empty()) {
      absl::StatusOr<CheckpointReader> weights =
          CheckpointReader::OpenVerified(options_.init_weights);
      set = weights.ok() ? executor_->LoadParameters(*weights) : weights.status();
    } else {
      set = executor_->InitializeParameters(options_.seed);
    }
    if (set.ok()) set = executor_->InitOptimizer();
    HCP_RETURN_IF_ERROR(Agree(set));
  }
  return OpenMetrics(comm_, options_, metrics_);
}

// The checkpoint's values are the fp32 masters: each parameter's master and moments are set from
// it (the bf16 compute copy rounded from the master), so the run continues as if it had not
// stopped. Each tensor is read once.
absl::Status GpuLoop::ResumeFrom(const std::string& checkpoint) {
  HCP_ASSIGN_OR_RETURN(ResumeSources resume,
                       OpenResume(comm_, plan_, checkpoint, data_.run, options_));
  absl::Status loaded = CheckCheckpointHasParameters(plan_, resume.weights);
  if (loaded.ok()) loaded = executor_->InitOptimizer();
  for (const plan::Parameter& p : plan_.parameters) {
    if (!loaded.ok()) break;
    const CudaExecutor::ShardRange range = executor_->ShardOf(p);  // whole, or this rank's rows
    std::vector<float> master(range.count), m(range.count), v(range.count);
    loaded = resume.weights.ReadF32Range(p.name, range.begin, range.count, master.data());
    if (loaded.ok()) {
      loaded = resume.state.ReadMomentsRange(p.name, range.begin, range.count, m.data(), v.data());
    }
    if (loaded.ok()) loaded = executor_->SetOptimizerState(p.name, master, m, v);
  }
  const TrainState& saved = resume.state.state();
  if (loaded.ok()) loaded = data_.batcher->Restore(saved.data);
  HCP_RETURN_IF_ERROR(Agree(loaded));
  first_step_ = saved.step;
  updates_ = saved.optimizer_updates;
  if (root()) PrintResumed(resume, checkpoint);
  return absl::OkStatus();
}

absl::Status GpuLoop::Step(int64_t step, MetricsRecord& record) {
  absl::StatusOr<StepBatch> batch =
      data_.batcher->NextStep(comm_.has_mesh() ? comm_.dp_index() : 0);
  HCP_RETURN_IF_ERROR(Agree(batch.status()));
  const float loss_scale = StepLossScale(comm_, *batch);
  double loss = 0;
  const int64_t micro_batches = options_.grad_accum;
  for (int64_t a = 0; a < micro_batches; ++a) {
    HCP_RETURN_IF_ERROR(
        executor_->SetInputs(batch->micro_inputs(a), batch->micro_targets(a), loss_scale));
    if (micro_batches == 1) {  // the gradient sums overlap the backward
      HCP_RETURN_IF_ERROR(executor_->RunStepAndSumGradients());
    } else {
      HCP_RETURN_IF_ERROR(executor_->RunStep());
      // The stash is allocated at its first use: a rank without the memory stops them all.
      HCP_RETURN_IF_ERROR(Agree(a + 1 < micro_batches ? executor_->StashGradients(/*first=*/a == 0)
                                                      : executor_->AddStashedGradients()));
    }
    loss += executor_->Loss();  // summed over the cp group by the plan
  }
  if (micro_batches > 1) HCP_RETURN_IF_ERROR(executor_->SumGradientsOverRanks());
  comm_.AllReduceSum(&loss, 1, comm::Group::kDp);

  // The gradients are the same on every rank now: so are the norm and the decision.
  HCP_ASSIGN_OR_RETURN(double squared_norm, executor_->GradientSquaredNorm());
  const double norm = std::sqrt(squared_norm);
  const StepDecision decision = DecideStep(loss, norm, options_.adamw.max_grad_norm);
  const double lr = LearningRate(options_.schedule, step);
  if (decision.applied()) {
    const cuda::AdamWStep update{.lr = lr,
                                 .beta1 = options_.adamw.beta1,
                                 .beta2 = options_.adamw.beta2,
                                 .eps = options_.adamw.eps,
                                 .weight_decay = options_.adamw.weight_decay,
                                 .clip_coef = decision.clip_coef,
                                 .t = updates_ + 1};
    HCP_RETURN_IF_ERROR(Agree(executor_->OptimizerStep(update, [this](const plan::Parameter& p) {
      return DefaultDecay(p.name, plan_.FullShape(p));
    })));
    ++updates_;
  }
  RecordStep(record, step, loss, lr, norm, decision, root());
  return absl::OkStatus();
}

// Rank 0 writes. It holds every replicated parameter's state whole, unless the optimizer is
// sharded; an expert tensor split over ep ranks is gathered over the ep group, a sharded
// optimizer's slices over the world, so every rank fetches those (their values only matter on
// rank 0, and a rank whose download fails ends the job in the gather).
absl::Status GpuLoop::SaveCheckpoint(int64_t steps_done, const Retention& retention) {
  absl::Status written = absl::OkStatus();
  std::vector<std::vector<float>> values, exp_avg, exp_avg_sq;
  for (const plan::Parameter& p : plan_.parameters) {
    const bool gathered = executor_->ReadsGather(p);
    // After a failure, rank 0 still takes part in the gathers the other ranks are in.
    if (!gathered && (!root() || !written.ok())) continue;
    absl::StatusOr<std::vector<float>> master = executor_->Master(p.name);
    absl::StatusOr<std::vector<float>> m = executor_->ExpAvg(p.name);
    absl::StatusOr<std::vector<float>> v = executor_->ExpAvgSq(p.name);
    if (!root()) continue;
    for (const absl::Status& s : {master.status(), m.status(), v.status()}) {
      if (written.ok()) written = s;
    }
    if (!written.ok()) continue;
    values.push_back(*std::move(master));
    exp_avg.push_back(*std::move(m));
    exp_avg_sq.push_back(*std::move(v));
  }
  if (root()) {
    if (written.ok()) {
      const CheckpointContents contents{values, exp_avg, exp_avg_sq,
                                        StateAfter(steps_done, data_, options_, updates_),
                                        options_.model_config};
      written = PublishCheckpoint(
          options_.checkpoint_dir, steps_done, retention,
          [&](const std::string& dir) { return WriteCheckpointFiles(dir, plan_, contents); });
    }
    if (written.ok() && metrics_) written = metrics_->Sync();
  }
  return Agree(written);
}

absl::Status GpuLoop::Run() {
  LoopHooks hooks;
  hooks.step = [this](int64_t step, MetricsRecord& record) { return Step(step, record); };
  hooks.save = [this](int64_t steps_done, const Retention& retention) {
    return SaveCheckpoint(steps_done, retention);
  };
  return RunTrainingSteps(options_, root(), first_step_,
                          data_.batcher->config().global_batch() * plan_.seq,
                          metrics_ ? &*metrics_ : nullptr, hooks);
}

}  // namespace

absl::Status TrainOnGpus(comm::Communicator& comm, const plan::Plan& plan,
                         const TrainOptions& options) {
  GpuLoop loop(comm, plan, options);
  HCP_RETURN_IF_ERROR(loop.Setup());
  return loop.Run();
}

}  // namespace hcp::train
