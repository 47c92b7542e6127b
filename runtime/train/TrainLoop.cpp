#include "runtime/train/TrainLoop.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "runtime/comm/Agreement.h"
#include "runtime/support/Status.h"
#include "runtime/weights/AtomicFile.h"
#include "runtime/weights/Checkpoint.h"
#include "runtime/weights/Crc32c.h"

namespace hcp::train {

namespace fs = std::filesystem;

absl::StatusOr<int64_t> VocabularyOf(const plan::Plan& plan) {
  for (const plan::Parameter& p : plan.parameters) {
    if (p.name == "model.embed_tokens.weight") return plan.FullShape(p).at(0);
  }
  return absl::InvalidArgumentError("the plan has no model.embed_tokens.weight");
}

int64_t CountValid(std::span<const int32_t> targets) {
  return std::count_if(targets.begin(), targets.end(),
                       [](int32_t t) { return t != plan::kIgnoredTarget; });
}

absl::Status PrepareOptions(TrainOptions& options) {
  if (options.steps <= 0) return absl::InvalidArgumentError("--steps must be positive");
  options.schedule.total_steps = options.steps;
  HCP_RETURN_IF_ERROR(ValidateSchedule(options.schedule));
  return ValidateAdamWConfig(options.adamw);
}

absl::Status OpenTrainingData(comm::Communicator& comm, const plan::Plan& plan,
                              const TrainOptions& options, TrainingData& data) {
  absl::StatusOr<int64_t> vocab = VocabularyOf(plan);
  HCP_RETURN_IF_ERROR(comm::AgreeOnStatus(comm, vocab.status()));
  absl::StatusOr<TokenFile> file = TokenFile::Open(options.data);
  HCP_RETURN_IF_ERROR(comm::AgreeOnStatus(comm, file.status()));
  data.file = std::make_unique<TokenFile>(std::move(*file));
  absl::StatusOr<DataIdentity> identity = IdentifyData(options.data);
  HCP_RETURN_IF_ERROR(comm::AgreeOnStatus(comm, identity.status()));
  data.run = IdentifyRun(plan, options.grad_accum, *std::move(identity));
  const BatchConfig batch{plan.seq, plan.micro_batch, plan.mesh.dp, options.grad_accum, *vocab};
  absl::StatusOr<TokenBatcher> batcher = TokenBatcher::Create(*data.file, batch);
  HCP_RETURN_IF_ERROR(comm::AgreeOnStatus(comm, batcher.status()));
  data.batcher = std::move(*batcher);
  return absl::OkStatus();
}

RunIdentity IdentifyRun(const plan::Plan& plan, int64_t grad_accum, DataIdentity data) {
  std::vector<const plan::Parameter*> params;
  for (const plan::Parameter& p : plan.parameters) params.push_back(&p);
  std::sort(params.begin(), params.end(),
            [](const plan::Parameter* a, const plan::Parameter* b) { return a->name < b->name; });
  // Each parameter as its name, a NUL, its rank and dims as int64: no two models spell the same.
  uint32_t crc = 0;
  for (const plan::Parameter* p : params) {
    crc = Crc32c(crc, p->name.c_str(), p->name.size() + 1);
    const std::vector<int64_t>& shape = plan.FullShape(*p);
    const auto rank = static_cast<int64_t>(shape.size());
    crc = Crc32c(crc, &rank, sizeof(rank));
    crc = Crc32c(crc, shape.data(), shape.size() * sizeof(int64_t));
  }
  RunIdentity run;
  run.model = Crc32cHex(crc);
  run.parameters = static_cast<int64_t>(plan.parameters.size());
  run.seq = plan.seq;
  run.micro_batch = plan.micro_batch;
  run.global_batch = plan.micro_batch * plan.mesh.dp * grad_accum;
  run.dtype = plan.StoresBf16() ? "bf16" : "f32";
  run.data = std::move(data);
  return run;
}

absl::StatusOr<std::string> CheckpointToResume(comm::Communicator& comm,
                                               const TrainOptions& options) {
  if (options.checkpoint_dir.empty()) {
    return absl::InvalidArgumentError("--resume needs --checkpoint-dir");
  }
  absl::StatusOr<std::string> latest = LatestCheckpoint(options.checkpoint_dir);
  HCP_RETURN_IF_ERROR(comm::AgreeOnStatus(comm, latest.status()));
  return latest;
}

absl::Status OpenMetrics(comm::Communicator& comm, const TrainOptions& options,
                         std::optional<MetricsWriter>& metrics) {
  if (options.metrics.empty()) return absl::OkStatus();
  absl::Status opened = absl::OkStatus();
  if (comm.world_rank() == 0) {
    absl::StatusOr<MetricsWriter> writer = MetricsWriter::Open(options.metrics);
    opened = writer.status();
    if (writer.ok()) metrics = std::move(*writer);
  }
  return comm::AgreeOnStatus(comm, opened);
}

float StepLossScale(comm::Communicator& comm, const StepBatch& batch) {
  double valid = static_cast<double>(CountValid(batch.targets));
  comm.AllReduceSum(&valid, 1, comm::Group::kDp);
  return valid > 0 ? static_cast<float>(1.0 / valid) : 0.0f;
}

void RecordStep(MetricsRecord& record, int64_t step, double loss, double lr, double grad_norm,
                const StepDecision& decision, bool root) {
  record.step = step + 1;
  record.loss = loss;
  record.lr = lr;
  record.grad_norm = grad_norm;
  record.skipped = !decision.applied();
  if (!decision.applied() && root) {
    std::printf("step %lld: %s; the update was skipped\n", static_cast<long long>(step + 1),
                std::string(StepOutcomeName(decision.outcome)).c_str());
  }
}

TrainState StateAfter(int64_t steps_done, const TrainingData& data, const TrainOptions& options,
                      int64_t optimizer_updates) {
  TrainState state;
  state.step = steps_done;
  state.data = data.batcher->state();
  state.rng = {options.seed, 0};
  state.optimizer_updates = optimizer_updates;
  state.optimizer = options.adamw;
  state.schedule = options.schedule;
  state.run = data.run;
  return state;
}

absl::StatusOr<std::vector<std::string>> AdoptSavedRun(const std::string& checkpoint,
                                                       const TrainState& saved,
                                                       const RunIdentity& now,
                                                       TrainOptions& options) {
  const RunIdentity& was = saved.run;
  std::vector<std::string> differ;
  if (was.model != now.model) {
    differ.push_back(absl::StrFormat(
        "another model (saved: %d parameters, identity %s; this plan: %d parameters, identity %s)",
        was.parameters, was.model, now.parameters, now.model));
  }
  auto compare = [&](const char* what, const auto& saved_value, const auto& now_value) {
    if (saved_value != now_value) {
      differ.push_back(absl::StrCat(what, " ", saved_value, " saved, ", now_value, " now"));
    }
  };
  compare("seq", was.seq, now.seq);
  compare("micro-batch", was.micro_batch, now.micro_batch);
  compare("global batch (micro-batch x dp x grad-accum)", was.global_batch, now.global_batch);
  compare("dtype", was.dtype, now.dtype);
  if (!differ.empty()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cannot resume from %s: it was written by another run: %s; resume with the plan and "
        "--grad-accum it was trained with (any cp/dp/ep split of the same global batch), or "
        "start a new run in another --checkpoint-dir",
        checkpoint, absl::StrJoin(differ, "; ")));
  }
  if (was.data.bytes != now.data.bytes || was.data.head_crc32c != now.data.head_crc32c) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cannot resume from %s: --data %s (%d bytes, crc32c of its first MiB %s) is not the data "
        "the run trained on (%s: %d bytes, %s); give --data that file (moved or renamed is "
        "fine), or start a new run in another --checkpoint-dir",
        checkpoint, now.data.path, now.data.bytes, now.data.head_crc32c, was.data.path,
        was.data.bytes, was.data.head_crc32c));
  }

  std::vector<std::string> notes;
  auto note = [&](const char* option, const auto& given, const auto& kept) {
    if (options.given.count(option) && given != kept) {
      notes.push_back(absl::StrCat("--", option, " ", given, " differs from the saved run's ", kept,
                                   ": the saved run's value is kept"));
    }
  };
  note("lr", options.schedule.max_lr, saved.schedule.max_lr);
  note("min-lr", options.schedule.min_lr, saved.schedule.min_lr);
  note("warmup", options.schedule.warmup_steps, saved.schedule.warmup_steps);
  note("weight-decay", options.adamw.weight_decay, saved.optimizer.weight_decay);
  note("clip", options.adamw.max_grad_norm, saved.optimizer.max_grad_norm);
  note("seed", options.seed, saved.rng.seed);
  const int64_t total = saved.schedule.total_steps;
  if (options.steps != total) {
    notes.push_back(absl::StrFormat(
        "--steps %d differs from the saved run's %d: this run ends after step %d, and the "
        "learning-rate schedule stays the saved run's %d-step one%s",
        options.steps, total, options.steps, total,
        options.steps > total ? absl::StrCat(" (steps ", total + 1, "-", options.steps,
                                             " at its min-lr ", saved.schedule.min_lr, ")")
                              : std::string(" (it ends unfinished)")));
  }
  options.adamw = saved.optimizer;
  options.schedule = saved.schedule;
  options.seed = saved.rng.seed;
  return notes;
}

absl::StatusOr<std::string> LatestCheckpoint(const std::string& checkpoint_dir) {
  std::ifstream latest(fs::path(checkpoint_dir) / kLatestFileName);
  std::string name;
  if (!(latest >> name)) {
    return absl::NotFoundError(
        absl::StrFormat("%s has no complete checkpoint to resume from (no '%s' file)",
                        checkpoint_dir, kLatestFileName));
  }
  return (fs::path(checkpoint_dir) / name).string();
}

absl::Status PublishCheckpoint(const std::string& checkpoint_dir, int64_t steps_done,
                               const std::function<absl::Status(const std::string&)>& write) {
  const std::string name = CheckpointName(steps_done);
  const fs::path dir(checkpoint_dir);
  // The previous checkpoint stays the valid one until the new one is whole.
  const fs::path staging = dir / absl::StrFormat(".%s.tmp.%d", name, getpid());
  std::error_code error;
  fs::remove_all(staging, error);
  absl::Status written = write(staging.string());
  if (written.ok()) {
    fs::remove_all(dir / name, error);
    fs::rename(staging, dir / name, error);
    if (error) {
      written = absl::InternalError(
          absl::StrFormat("cannot move %s into place: %s", (dir / name).string(), error.message()));
    }
  }
  if (written.ok()) written = WriteFileAtomically((dir / kLatestFileName).string(), name + "\n");
  if (!written.ok()) {
    fs::remove_all(staging, error);
    return written;
  }
  std::printf("checkpoint %s\n", (dir / name).string().c_str());
  // Keep the newest two complete checkpoints.
  std::vector<std::string> old;
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    const std::string n = entry.path().filename().string();
    if (n.rfind("step-", 0) == 0 && n < name) old.push_back(n);
  }
  std::sort(old.begin(), old.end());
  for (size_t i = 0; i + 1 < old.size(); ++i) fs::remove_all(dir / old[i], error);
  return absl::OkStatus();
}

absl::Status WriteCheckpointFiles(const std::string& dir, const plan::Plan& plan,
                                  const CheckpointContents& c) {
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) {
    return absl::InternalError(absl::StrFormat("cannot create %s: %s", dir, error.message()));
  }
  std::vector<TensorToWrite> weights;
  std::vector<MomentsToWrite> moments;
  for (size_t i = 0; i < plan.parameters.size(); ++i) {
    const std::string& name = plan.parameters[i].name;
    const std::vector<int64_t> shape = plan.FullShape(plan.parameters[i]);
    weights.push_back({name, DType::F32, shape, c.values[i], {}});
    moments.push_back({name, shape, c.exp_avg[i], c.exp_avg_sq[i]});
  }
  HCP_RETURN_IF_ERROR(WriteCheckpoint(dir, weights));
  if (!c.model_config.empty()) {
    HCP_RETURN_IF_ERROR(
        WriteFileAtomically((fs::path(dir) / "config.json").string(), c.model_config));
  }
  return SaveTrainState(dir, c.state, moments);
}

absl::Status RunTrainingSteps(const TrainOptions& options, bool root, int64_t first_step,
                              int64_t tokens_per_step, MetricsWriter* metrics,
                              const LoopHooks& hooks) {
  using Clock = std::chrono::steady_clock;
  MetricsRecord record;
  record.tokens = first_step * tokens_per_step;
  const int64_t last =
      options.stop_after > 0 ? std::min(options.stop_after, options.steps) : options.steps;
  const auto start = Clock::now();
  const int64_t tokens_at_start = record.tokens;
  for (int64_t step = first_step; step < last; ++step) {
    HCP_RETURN_IF_ERROR(hooks.step(step, record));
    record.tokens += tokens_per_step;
    record.elapsed_s = std::chrono::duration<double>(Clock::now() - start).count();
    record.tokens_per_s = (record.tokens - tokens_at_start) / std::max(record.elapsed_s, 1e-9);
    if (root) {
      if (metrics != nullptr) HCP_RETURN_IF_ERROR(metrics->Append(record));
      const bool log = (step + 1) % std::max<int64_t>(options.log_every, 1) == 0 ||
                       step == first_step || step + 1 == last;
      if (log) {
        const double eta =
            EstimateEta(record.elapsed_s, step + 1 - first_step, options.steps - step - 1);
        std::printf("%s\n", FormatProgress(record, options.steps, eta).c_str());
        std::fflush(stdout);
      }
    }
    const bool checkpoint =
        !options.checkpoint_dir.empty() &&
        ((options.checkpoint_every > 0 && (step + 1) % options.checkpoint_every == 0) ||
         step + 1 == last);
    if (checkpoint) HCP_RETURN_IF_ERROR(hooks.save(step + 1));
  }
  return absl::OkStatus();
}

}  // namespace hcp::train
