// The training loop's parts that do not depend on the executor (Trainer.cpp drives either
// backend through them): the vocabulary and valid-target count of a batch, the step loop with
// its progress lines, metrics and checkpoint cadence, and the checkpoint directory's protocol
// (checked before step 1; files written under a temporary name, renamed when whole, `latest`
// switched over, the newest --keep-checkpoints kept; a damaged `latest` falls back to the previous
// intact checkpoint).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include <memory>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/comm/Communicator.h"
#include "runtime/data/Blend.h"
#include "runtime/data/DataSource.h"
#include "runtime/data/DocumentOrder.h"
#include "runtime/data/TokenData.h"
#include "runtime/plan/Plan.h"
#include "runtime/support/DType.h"
#include "runtime/train/AdamW.h"
#include "runtime/train/Metrics.h"
#include "runtime/train/TokenizerFiles.h"
#include "runtime/train/TrainState.h"
#include "runtime/train/Trainer.h"

namespace hcp::train {

// The vocabulary: the rows of the embedding table.
absl::StatusOr<int64_t> VocabularyOf(const plan::Plan& plan);
// Targets that count in the loss (not plan::kIgnoredTarget).
int64_t CountValid(std::span<const int32_t> targets);

// Setting up a run, on every rank, each step agreed so that a failing rank stops them all with
// the same error:
//   - the options: steps > 0, a valid schedule (its total_steps set to steps) and AdamW config;
//   - the data (data::DataSource: an indexed dataset, a token file or a raw one), every token
//     checked against the plan's vocabulary on rank 0, and its batcher (the plan's micro-batch
//     and dp, options.grad_accum);
//   - the checkpoint directory (PrepareCheckpointDir), before anything else is written;
//   - with --resume, the checkpoint to resume from (checkpoint_dir's latest, or the previous
//     intact one);
//   - rank 0's metrics file.
// PrepareOptions refuses contradictory or senseless options, naming the option.
absl::Status PrepareOptions(TrainOptions& options);
// One source (--data PATH) is read by a TokenBatcher (TokenData.h's rule), a blend (--data W1
// PATH1 W2 PATH2 ...) by a BlendBatcher (Blend.h's rule); the loop reads either through
// config(), NextStep, Restore and Describe.
struct TrainingData {
  std::unique_ptr<data::DataSource> source;    // where the batcher reads: its address must not move
  std::unique_ptr<data::DocumentOrder> order;  // --shuffle-seed's, read by the batcher; or none
  std::optional<data::TokenBatcher> batcher;
  // A blend's sources (in --data's order), their orders (one each with --shuffle-seed), and the
  // batcher over them; empty for one source.
  std::vector<std::unique_ptr<data::DataSource>> blend_sources;
  std::vector<std::unique_ptr<data::DocumentOrder>> blend_orders;
  std::optional<data::BlendBatcher> blend;
  RunIdentity run;  // this run, as its checkpoints record it

  const data::BatchConfig& config() const { return blend ? blend->config() : batcher->config(); }
  absl::StatusOr<data::StepBatch> NextStep(int64_t dp_index) {
    return blend ? blend->NextStep(dp_index) : batcher->NextStep(dp_index);
  }
  // Continues from `saved`'s data state (its blend state for a blend).
  absl::Status Restore(const TrainState& saved);
  // The progress output's lines: "data: DESCRIPTION", or for a blend "data: a blend of 2
  // sources, by weight:" and "  30% DESCRIPTION" for each.
  std::vector<std::string> Describe() const;
};
// The data shape of one step of `plan` with grad_accum micro-batches per rank: a plan compiled
// with --documents reads packed documents (their boundaries from an indexed dataset's .idx, or
// after the config's eos_token_id in other data).
data::BatchConfig BatchConfigOf(const plan::Plan& plan, int64_t grad_accum, int64_t vocab);
// "documents: packed, none reading another (...)": the progress output's line for it.
std::string DescribeDocuments(const data::BatchConfig& batch);
// The eos_token_id of the config the plan carries (one, or a list), or none.
std::vector<int64_t> EosTokensOf(const plan::Plan& plan);
// The run a plan trains with grad_accum micro-batches per rank on `data`: the model is the
// CRC32C of the plan's parameters (names and full shapes, in name order), which is the same for
// every cp, dp and ep split of one model.
RunIdentity IdentifyRun(const plan::Plan& plan, int64_t grad_accum, DataIdentity data);
// options.data, or each source of options.blend (every one opened and checked alike; the same
// file twice is refused), identified in data.run (a blend's weights normalised), then ordered.
absl::Status OpenTrainingData(comm::Communicator& comm, const plan::Plan& plan,
                              const TrainOptions& options, TrainingData& data);
// (Re)makes data's batcher with `batch`, reading data.source (or each of a blend's sources, with
// data.run.blend's weights) in the order of `shuffle_seed` (DocumentOrder.h; a blend's source d
// in BlendSourceSeed(seed, d)'s, Blend.h) or, without one, as stored, and records the seed in
// data.run. OpenTrainingData calls it with the command line's seed; a resume whose saved run had
// another calls it again with the saved one (AdoptSavedRun). A seed for data without documents (a
// token file, a raw file; any of a blend's sources) is refused.
absl::Status OrderTrainingData(comm::Communicator& comm, const data::BatchConfig& batch,
                               std::optional<uint64_t> shuffle_seed, TrainingData& data);
// "the documents in --shuffle-seed 7's order, a new order each epoch", or "the documents as
// stored".
std::string DescribeOrder(std::optional<uint64_t> shuffle_seed);

// The held-out data of --eval-data: opened and checked like the training data (the same
// --data-dtype rule, every token against the vocabulary on rank 0), batched with the training
// data's BatchConfig from its start, once: every evaluation scores the same windows, so that the
// numbers compare. OpenEvalData does nothing without options.eval_data; collective (the loss
// scale sums the valid targets over dp).
struct EvalData {
  std::unique_ptr<data::DataSource> source;
  std::vector<data::StepBatch> batches;  // this dp rank's share of each global batch
  float loss_scale = 0;  // 1 / (valid targets of all the batches, over dp): their mean loss
  int64_t tokens = 0;    // the inputs one evaluation scores: batches * global_batch * seq
};
absl::Status OpenEvalData(comm::Communicator& comm, const TrainOptions& options,
                          const data::BatchConfig& batch, EvalData& eval);
// The global batches one evaluation reads: eval_tokens (default: one global batch's inputs,
// global_batch * seq) rounded up to whole global batches. A file too short for them is an error
// naming it, its tokens and what the evaluation needs.
absl::StatusOr<int64_t> EvalGlobalBatches(const data::BatchConfig& batch,
                                          std::optional<int64_t> eval_tokens,
                                          const std::string& path, int64_t file_tokens);
// Whether an evaluation follows the step that makes steps_done, in a run that stops after `last`:
// at the multiples of eval_every, and after the last step.
bool EvalDue(const TrainOptions& options, int64_t steps_done, int64_t last);

// Rank 0 checks checkpoint_dir (every rank gets its status); nothing to do without one. It must be
// a directory this process can write into: created for a new run, then probed by creating and
// removing a file (permission bits do not stop root, a real write does). Staging directories of
// interrupted writes whose process has ended are removed. A new run (no --resume) refuses a
// directory that holds checkpoints, naming its latest, unless options.overwrite_checkpoints: then
// they stay until the run's first checkpoint replaces them (Retention::replace_others).
absl::Status PrepareCheckpointDir(comm::Communicator& comm, const TrainOptions& options);
// Removes checkpoint_dir's leftovers of interrupted writes (".step-N.tmp.PID" staging directories,
// "latest.tmp.PID") whose process PID no longer runs on this machine; never a live process's.
void RemoveStaleStaging(const std::string& checkpoint_dir);

// The checkpoint a resume starts from: `latest`'s, or when that is damaged (missing, incomplete,
// garbage, or open() fails on it) the newest older step-N that opens; `note` then says so, and
// `damaged` lists the checkpoints that failed to open on the way (CheckpointToResume renames them
// to step-N.damaged, so that rotation counts only intact ones).
// `latest` naming anything outside checkpoint_dir (a path, "..", a link out) is refused, as is a
// directory with no intact checkpoint (naming what failed).
struct ResumeChoice {
  std::string path;
  int64_t step = 0;
  std::string note;  // empty when latest's checkpoint was taken
  std::vector<std::string> damaged;
};
absl::StatusOr<ResumeChoice> ChooseCheckpoint(
    const std::string& checkpoint_dir, const std::function<absl::Status(const std::string&)>& open);
// ChooseCheckpoint on rank 0, a checkpoint intact when its tensors and train state match their
// checksums and are finite (CheckpointReader::OpenVerified, CheckTrainStateIntact), whichever run
// wrote it; every rank gets the same path or the same error.
absl::StatusOr<std::string> CheckpointToResume(comm::Communicator& comm,
                                               const TrainOptions& options);
absl::Status OpenMetrics(comm::Communicator& comm, const TrainOptions& options,
                         std::optional<MetricsWriter>& metrics);

// 1 / (valid targets of the whole step: every micro-batch of every dp rank), so each
// micro-batch's scaled loss and gradients add up to the step's mean. Collective over dp.
float StepLossScale(comm::Communicator& comm, const data::StepBatch& batch);
// The same over several steps' batches (an evaluation's): their micro-batches' scaled losses add
// up to the mean over all their valid targets.
float LossScale(comm::Communicator& comm, std::span<const data::StepBatch> batches);
// Fills `record` after step `step` (0-based) and, on the root rank, says when the update was
// skipped.
void RecordStep(MetricsRecord& record, int64_t step, double loss, double lr, double grad_norm,
                const StepDecision& decision, bool root);
// What a checkpoint after steps_done records besides the tensors.
TrainState StateAfter(int64_t steps_done, const TrainingData& data, const TrainOptions& options,
                      int64_t optimizer_updates);

// Which checkpoints stay when a new one is published. A checkpoint is known finite when the step
// before it applied its update (its weights come from a finite loss and gradient), or when the
// run resumed from it (it loaded); kLatestFiniteFileName names the newest such one written.
struct Retention {
  int64_t keep = 2;             // the newest `keep` checkpoints stay, the new one included; 0: all
  bool finite = true;           // the new one is known finite: latest-finite names it
  int64_t also_keep = -1;       // the step of a checkpoint that stays anyway (-1: none)
  bool replace_others = false;  // every other checkpoint goes (--overwrite-checkpoints' first)
};

// Resuming from `checkpoint`, whose train state is `saved`, before any of its tensors is read:
// refuses (FailedPrecondition, naming each difference as saved vs now and what to do) a
// checkpoint of another model, seq, micro-batch, global batch, dtype or data than `now` (a blend:
// the same files with the same weights in the same order); then
// sets options' AdamW settings, schedule, seed and shuffle seed to the saved run's, so that it
// continues exactly, and returns one line for each option the command line gave (options.given)
// with another value ("--lr 0.01 differs from the saved run's 0.003: the saved run's value is
// kept"). --steps is the exception: it says where this run ends (it may extend the run or end
// it early), while the learning-rate schedule stays the saved one (after its last step the rate
// stays at its min-lr).
absl::StatusOr<std::vector<std::string>> AdoptSavedRun(const std::string& checkpoint,
                                                       const TrainState& saved,
                                                       const RunIdentity& now,
                                                       TrainOptions& options);

// What both loops open when resuming from `checkpoint`, on every rank, each step agreed: the saved
// run, adopted (AdoptSavedRun), then the weights and the train state, verified (checksums, finite
// values) and checked against the plan's parameters, whole; a checkpoint after the run's last
// step is refused. `notes` are AdoptSavedRun's lines, for PrintResumed.
struct ResumeSources {
  std::vector<std::string> notes;
  CheckpointReader weights;
  TrainStateReader state;
};
absl::StatusOr<ResumeSources> OpenResume(comm::Communicator& comm, const plan::Plan& plan,
                                         const std::string& checkpoint, const RunIdentity& now,
                                         TrainOptions& options);
// On the root rank: the notes, then "resumed from CHECKPOINT (after step N)".
void PrintResumed(const ResumeSources& resume, const std::string& checkpoint);

// Writes checkpoint CheckpointName(steps_done) into checkpoint_dir: write(staging) fills a
// temporary directory, which is then renamed into place and named in `latest` (and in
// latest-finite when retention.finite); then the older checkpoints beyond retention.keep are
// removed, except the one latest-finite names and retention.also_keep. One rank calls it (the
// others hold the same).
absl::Status PublishCheckpoint(const std::string& checkpoint_dir, int64_t steps_done,
                               const Retention& retention,
                               const std::function<absl::Status(const std::string&)>& write);

// A checkpoint's files in `dir`: model.safetensors (every parameter's whole tensor in
// weights_dtype, Hugging Face names; shards and an index above 5 GB), config.json when
// model_config is not empty, the tokenizer's files, and the train state with the AdamW moments
// (and, when weights_dtype is not F32, the fp32 masters: TrainState.h). values, exp_avg and
// exp_avg_sq hold one whole tensor per plan parameter, in order.
struct CheckpointContents {
  const std::vector<std::vector<float>>& values;
  const std::vector<std::vector<float>>& exp_avg;
  const std::vector<std::vector<float>>& exp_avg_sq;
  TrainState state;
  std::string model_config;
  DType weights_dtype = DType::F32;
  const TokenizerFiles* tokenizer = nullptr;  // none: no tokenizer files
};
absl::Status WriteCheckpointFiles(const std::string& dir, const plan::Plan& plan,
                                  const CheckpointContents& contents);

// The loop: steps [first_step, last) with last = options.stop_after or options.steps; after each,
// on the root rank the metrics line and (every log_every steps, the first and the last) the
// progress line, then, when due, save(steps_done, retention) on every rank. step(step, record)
// runs one optimizer step and fills record's step, loss, lr, grad_norm and skipped; the loop adds
// tokens (tokens_per_step each), elapsed time and throughput. A skipped step is no progress: a
// checkpoint due when every step since the last one (or the start) was skipped is not written
// (the root says so), and the retention keeps the newest checkpoint known finite.
// When EvalDue, evaluate(steps_done, record) follows the step on every rank and fills record's
// eval_loss and eval_tokens: the progress line is printed then whatever log_every says, and the
// evaluation's time is left out of tokens_per_s (it is in elapsed_s).
struct LoopHooks {
  std::function<absl::Status(int64_t step, MetricsRecord& record)> step;
  std::function<absl::Status(int64_t steps_done, MetricsRecord& record)> evaluate;  // optional
  std::function<absl::Status(int64_t steps_done, const Retention& retention)> save;
};
absl::Status RunTrainingSteps(const TrainOptions& options, bool root, int64_t first_step,
                              int64_t tokens_per_step, MetricsWriter* metrics,
                              const LoopHooks& hooks);

}  // namespace hcp::train
