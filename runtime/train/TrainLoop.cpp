#include "runtime/train/TrainLoop.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_format.h"
#include "runtime/support/Status.h"
#include "runtime/weights/AtomicFile.h"
#include "runtime/weights/Checkpoint.h"

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
      written = absl::InternalError(absl::StrFormat("cannot move %s into place: %s",
                                                    (dir / name).string(), error.message()));
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
