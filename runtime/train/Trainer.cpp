#include "runtime/train/Trainer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "runtime/comm/Agreement.h"
#include "runtime/data/TokenData.h"
#include "runtime/exec/RankExecutor.h"
#include "runtime/support/DType.h"
#include "runtime/support/Format.h"
#include "runtime/support/Status.h"
#include "runtime/train/Metrics.h"
#include "runtime/train/Optimizer.h"
#include "runtime/train/TokenizerFiles.h"
#include "runtime/train/TrainLoop.h"
#include "runtime/train/TrainState.h"
#include "runtime/weights/Checkpoint.h"

namespace hcp::train {
namespace {

// "12 tensors, 1,234,567 parameters (bf16) from DIR (2 files)": what --init loaded.
std::string DescribeCheckpoint(const CheckpointReader& weights) {
  int64_t parameters = 0;
  std::set<std::string> dtypes;
  const std::vector<std::string> names = weights.names();
  for (const std::string& name : names) {
    absl::StatusOr<TensorInfo> info = weights.Info(name);
    if (!info.ok()) continue;
    parameters += info->numel;
    dtypes.insert(std::string(DTypeName(info->dtype)));
  }
  return absl::StrFormat("%d tensors, %s parameters (%s) from %s (%d file%s)", names.size(),
                         FormatCount(parameters), absl::StrJoin(dtypes, ", "), weights.dir(),
                         weights.num_files(), weights.num_files() == 1 ? "" : "s");
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
  Executor& executor() const { return rank_.executor(); }

  absl::Status CreateOptimizer();
  absl::Status ResumeFrom(const std::string& checkpoint);
  absl::Status OpenTokenizer(const std::string& resumed_from);
  DType SaveDType() const;
  absl::Status Step(int64_t step, MetricsRecord& record);
  absl::Status Evaluate(MetricsRecord& record);
  absl::Status SaveCheckpoint(int64_t steps_done, const Retention& retention);

  comm::Communicator& comm_;
  const plan::Plan& plan_;
  TrainOptions options_;
  RankExecutor rank_;
  std::unique_ptr<Optimizer> optimizer_;
  TrainingData data_;
  EvalData eval_;  // --eval-data's, when given
  std::optional<MetricsWriter> metrics_;
  std::optional<TokenizerFiles> tokenizer_;  // on the root rank, when the checkpoints carry one
  int64_t first_step_ = 0;                   // 0, or the step a resumed run continues from
};

absl::Status Loop::Setup() {
  HCP_RETURN_IF_ERROR(PrepareOptions(options_));
  HCP_RETURN_IF_ERROR(PrepareCheckpointDir(comm_, options_));
  // The plan says where it runs: bf16 on this rank's GPU, f32 on the CPU.
  ExecutorOptions where;
  where.optimizer_state = true;
  where.shard_optimizer = options_.shard_optimizer;
  HCP_ASSIGN_OR_RETURN(rank_, RankExecutor::Create(plan_, comm_, where));
  HCP_RETURN_IF_ERROR(OpenTrainingData(comm_, plan_, options_, data_));
  if (root()) {
    for (const std::string& line : data_.Describe()) std::printf("%s\n", line.c_str());
    if (plan_.position_ids) std::printf("%s\n", DescribeDocuments(data_.config()).c_str());
  }
  HCP_RETURN_IF_ERROR(OpenEvalData(comm_, options_, data_.config(), eval_));
  if (root() && eval_.source) {
    std::printf("eval data: %s; %lld tokens every %lld steps\n", eval_.source->Describe().c_str(),
                static_cast<long long>(eval_.tokens), static_cast<long long>(*options_.eval_every));
  }

  std::string resumed_from;
  if (options_.resume) {
    HCP_ASSIGN_OR_RETURN(resumed_from, CheckpointToResume(comm_, options_));
    HCP_RETURN_IF_ERROR(ResumeFrom(resumed_from));
  } else {
    if (!options_.init_weights.empty()) {
      absl::StatusOr<CheckpointReader> weights =
          CheckpointReader::OpenVerified(options_.init_weights);
      HCP_RETURN_IF_ERROR(Agree(weights.status()));
      HCP_RETURN_IF_ERROR(executor().LoadParameters(*weights));
      if (root()) std::printf("init: %s\n", DescribeCheckpoint(*weights).c_str());
    } else {
      HCP_RETURN_IF_ERROR(executor().InitializeParameters(options_.seed));
    }
    HCP_RETURN_IF_ERROR(CreateOptimizer());
    HCP_RETURN_IF_ERROR(optimizer_->Start());
  }
  if (root()) std::printf("optimizer: %s\n", optimizer_->Describe().c_str());
  if (root() && plan_.router_aux_loss) {
    std::printf(
        "objective: the loss + %g x the MoE load-balancing loss (\"aux\" in the progress, "
        "router_aux_loss in the metrics)\n",
        plan_.router_aux_loss->coefficient);
  }
  HCP_RETURN_IF_ERROR(OpenTokenizer(resumed_from));
  if (root() && !options_.checkpoint_dir.empty()) {
    std::printf("checkpoints: %s weights%s, config.json%s\n",
                std::string(DTypeName(SaveDType())).c_str(),
                SaveDType() == DType::F32 ? "" : " (their fp32 masters with the optimizer state)",
                tokenizer_ ? ", the tokenizer" : "");
  }
  if (root() && data_.run.shuffle_seed) {
    std::printf("data order: %s\n", DescribeOrder(data_.run.shuffle_seed).c_str());
  }
  return OpenMetrics(comm_, options_, metrics_);
}

absl::Status Loop::OpenTokenizer(const std::string& resumed_from) {
  std::string path = options_.tokenizer;
  for (const std::string* dir : {&std::as_const(options_.init_weights), &resumed_from}) {
    if (path.empty() && !dir->empty() && HasTokenizer(*dir)) path = *dir;
  }
  if (path.empty()) return absl::OkStatus();
  absl::StatusOr<int64_t> vocab = VocabularyOf(plan_);
  absl::StatusOr<TokenizerFiles> files = TokenizerFiles{};
  if (!vocab.ok()) {
    files = vocab.status();
  } else if (root()) {
    files = ReadTokenizerFiles(path, *vocab);
  }
  HCP_RETURN_IF_ERROR(Agree(files.status()));
  if (!root()) return absl::OkStatus();
  tokenizer_ = *std::move(files);
  std::printf("tokenizer: %s, copied into every checkpoint\n",
              DescribeTokenizerFiles(*tokenizer_).c_str());
  return absl::OkStatus();
}

// --save-dtype's, else the plan's: a bf16 model is exported as bf16.
DType Loop::SaveDType() const {
  return options_.save_dtype.value_or(plan_.StoresBf16() ? DType::BF16 : DType::F32);
}

// With options_.adamw: a resumed run's, once OpenResume has adopted the saved run's settings.
absl::Status Loop::CreateOptimizer() {
  absl::StatusOr<std::unique_ptr<Optimizer>> optimizer =
      train::CreateOptimizer(rank_, options_.adamw, options_.shard_optimizer);
  HCP_RETURN_IF_ERROR(Agree(optimizer.status()));
  optimizer_ = *std::move(optimizer);
  return absl::OkStatus();
}

absl::Status Loop::ResumeFrom(const std::string& checkpoint) {
  HCP_ASSIGN_OR_RETURN(ResumeSources resume,
                       OpenResume(comm_, plan_, checkpoint, data_.run, options_));
  // The saved position points into the saved run's order, which OpenResume adopted.
  if (options_.shuffle_seed != data_.run.shuffle_seed) {
    const data::BatchConfig batch = data_.config();
    HCP_RETURN_IF_ERROR(OrderTrainingData(comm_, batch, options_.shuffle_seed, data_));
  }
  HCP_RETURN_IF_ERROR(CreateOptimizer());
  HCP_RETURN_IF_ERROR(optimizer_->Resume(resume.weights, resume.state));
  const TrainState& saved = resume.state.state();
  HCP_RETURN_IF_ERROR(Agree(data_.Restore(saved)));
  first_step_ = saved.step;
  // Without --save-dtype the run goes on saving as it did: bf16 weights if their fp32 masters
  // were kept beside them.
  if (!options_.save_dtype && resume.state.has_masters()) options_.save_dtype = DType::BF16;
  if (root()) PrintResumed(resume, checkpoint);
  return absl::OkStatus();
}

absl::Status Loop::Step(int64_t step, MetricsRecord& record) {
  absl::StatusOr<data::StepBatch> batch = data_.NextStep(comm_.has_mesh() ? comm_.dp_index() : 0);
  HCP_RETURN_IF_ERROR(Agree(batch.status()));
  const float loss_scale = StepLossScale(comm_, *batch);

  // A load-balancing loss is the mean of the step's micro-batches' (every dp rank's).
  const float aux_scale = 1.0f / static_cast<float>(options_.grad_accum * plan_.mesh.dp);
  double loss = 0, aux = 0;
  const int64_t micro_batches = options_.grad_accum;
  for (int64_t a = 0; a < micro_batches; ++a) {
    HCP_RETURN_IF_ERROR(executor().SetInputs(batch->micro_inputs(a), batch->micro_targets(a),
                                             loss_scale, aux_scale));
    if (plan_.position_ids) HCP_RETURN_IF_ERROR(executor().SetPositions(batch->micro_positions(a)));
    if (micro_batches == 1) {  // a backend may overlap the gradient sums with the backward
      HCP_RETURN_IF_ERROR(executor().RunStepAndSumGradients());
    } else {
      HCP_RETURN_IF_ERROR(executor().RunStep());
      // The stash is allocated at its first use: a rank without the memory stops them all.
      HCP_RETURN_IF_ERROR(Agree(a + 1 < micro_batches ? executor().StashGradients(/*first=*/a == 0)
                                                      : executor().AddStashedGradients()));
    }
    loss += executor().Loss();  // already summed over the cp group by the plan
    aux += executor().RouterAuxLoss().value_or(0.0f);
  }
  if (micro_batches > 1) HCP_RETURN_IF_ERROR(executor().SumGradientsOverRanks());
  double sums[2] = {loss, aux};
  comm_.AllReduceSum(sums, 2, comm::Group::kDp);
  loss = sums[0];
  if (plan_.router_aux_loss) record.router_aux_loss = sums[1];

  // The gradients are the same on every rank now: so are the norm and the decision.
  HCP_ASSIGN_OR_RETURN(const double squared_norm, executor().GradientSquaredNorm());
  const double norm = std::sqrt(squared_norm);
  const StepDecision decision = DecideStep(loss, norm, options_.adamw.max_grad_norm);
  const double lr = LearningRate(options_.schedule, step);
  if (decision.applied()) HCP_RETURN_IF_ERROR(optimizer_->Update(lr, decision.clip_coef));
  RecordStep(record, step, loss, lr, norm, decision, root());
  return absl::OkStatus();
}

// The held-out loss with the weights as they are, combined as Step combines the training loss.
// Training must go on exactly as without it: the eval data was read at the start, the optimizer is
// not called, and the executors have no forward-only entry, so RunStep writes gradients that
// nothing reads. That is safe because every RunStep writes every gradient whole (no
// accumulation into them), the next step's first micro-batch restarts the stash
// (StashGradients(first=true)), and the loss scale is set again by each SetInputs
// (eval.test checks the training losses bit for bit).
absl::Status Loop::Evaluate(MetricsRecord& record) {
  double loss = 0;  // eval_.loss_scale makes the sum the mean per-token loss
  for (const data::StepBatch& batch : eval_.batches) {
    for (int64_t a = 0; a < options_.grad_accum; ++a) {
      HCP_RETURN_IF_ERROR(
          executor().SetInputs(batch.micro_inputs(a), batch.micro_targets(a), eval_.loss_scale));
      if (plan_.position_ids) {
        HCP_RETURN_IF_ERROR(executor().SetPositions(batch.micro_positions(a)));
      }
      HCP_RETURN_IF_ERROR(executor().RunStep());
      loss += executor().Loss();  // already summed over the cp group by the plan
    }
  }
  comm_.AllReduceSum(&loss, 1, comm::Group::kDp);
  record.eval_loss = loss;
  record.eval_tokens = eval_.tokens;
  return absl::OkStatus();
}

absl::Status Loop::Run() {
  LoopHooks hooks;
  hooks.step = [this](int64_t step, MetricsRecord& record) { return Step(step, record); };
  if (!eval_.batches.empty()) {
    hooks.evaluate = [this](int64_t, MetricsRecord& record) { return Evaluate(record); };
  }
  hooks.save = [this](int64_t steps_done, const Retention& retention) {
    return SaveCheckpoint(steps_done, retention);
  };
  return RunTrainingSteps(options_, root(), first_step_, data_.config().global_batch() * plan_.seq,
                          metrics_ ? &*metrics_ : nullptr, hooks);
}

// Every rank takes part in the gathers; rank 0 writes.
absl::Status Loop::SaveCheckpoint(int64_t steps_done, const Retention& retention) {
  ModelTensors tensors;
  HCP_RETURN_IF_ERROR(optimizer_->Gather(tensors));
  absl::Status written = absl::OkStatus();
  if (root()) {
    const CheckpointContents contents{
        tensors.values, tensors.exp_avg, tensors.exp_avg_sq,
        StateAfter(steps_done, data_, options_, optimizer_->updates()),
        // --config's text, else the config the plan was compiled from.
        options_.model_config.empty() ? plan_.model_config : options_.model_config, SaveDType(),
        tokenizer_ ? &*tokenizer_ : nullptr};
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
