// The training loop: data -> micro-batches -> steps of the plan -> gradients summed over the
// ranks -> AdamW -> metrics -> checkpoints, on every rank of the plan's mesh. One loop for both
// backends: the plan's dtype picks the executor (runtime/exec/RankExecutor.h: an f32 plan on
// CPU ranks, a bf16 plan on one GPU per rank with NCCL between them) and its optimizer
// (Optimizer.h: AdamW on the host or on the GPU); the same data order, loss normalisation,
// schedule, NaN/Inf policy, clipping, metrics and checkpoints (a GPU run's checkpoints hold the
// fp32 masters, which a CPU run loads too).
//
// One optimizer step, on every rank:
//   1. the step's global batch is read deterministically; this rank takes its dp index's
//      micro-batches (whole sequences; the executor keeps its cp shard);
//   2. loss_scale = 1 / (valid targets of the WHOLE step: every micro-batch of every dp rank),
//      so each micro-batch's scaled loss and gradients simply add up to the step's mean;
//   3. each micro-batch runs the plan; gradients accumulate in fp32 (Executor::StashGradients);
//   4. gradients are summed over the ranks that hold a copy of each parameter (once per step);
//   5. the global gradient norm, the NaN/Inf policy (skip the update, report it), clipping,
//      the learning rate of the warmup + cosine schedule, and AdamW with fp32 master weights,
//      its state optionally sharded over the ranks (each updates its slice of the replicated
//      parameters, which are then all-gathered; an expert shard's state stays on its rank);
//      a resumed run takes the saved run's AdamW settings, schedule and seed, and says which
//      options of its command line differ (AdoptSavedRun);
//   6. with --eval-data, every --eval-every steps (and after the last), the held-out loss: the
//      first --eval-tokens of the eval data, the same windows every time, run forward and
//      backward with the gradients left unused (each step's RunStep overwrites them), so that
//      training goes on exactly as without it (see Loop::Evaluate);
//   7. rank 0 prints a progress line, appends a metrics line, and every N steps writes a
//      checkpoint (Hugging Face safetensors + optimizer state + data position + step),
//      atomically: `latest` names the last complete checkpoint, so a crash mid-write leaves the
//      previous one in charge.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "runtime/comm/Communicator.h"
#include "runtime/data/TokenData.h"
#include "runtime/plan/Plan.h"
#include "runtime/support/DType.h"
#include "runtime/train/AdamW.h"

namespace hcp::train {

// One source of a blend on the command line (--data W1 PATH1 W2 PATH2 ...): its weight as given
// (positive; OpenTrainingData normalises them) and its path (any form --data PATH takes).
struct WeightedData {
  double weight = 0;
  std::string path;
};

struct TrainOptions {
  std::string data;  // --data: indexed dataset, token file or raw (DataSource.h)
  // --data W1 PATH1 W2 PATH2 ...: the sources of a blend (runtime/data/Blend.h), in order; when
  // set, `data` is empty (--data with one pair is --data PATH).
  std::vector<WeightedData> blend;
  int64_t steps = 0;             // steps of the whole run (the schedule's length)
  int64_t grad_accum = 1;        // micro-batches per rank per step
  uint64_t seed = 0;             // parameter initialisation, when not loading weights
  std::string init_weights;      // Hugging Face checkpoint directory to start from (optional)
  std::string checkpoint_dir;    // where checkpoints go (optional); --resume reads from here
  int64_t checkpoint_every = 0;  // steps between checkpoints; 0: only after the last step
  bool resume = false;           // continue from checkpoint_dir's latest checkpoint
  int64_t stop_after = 0;        // stop after this step as if interrupted (0: run all steps)
  std::string metrics;           // JSON-lines file to append to (optional)
  std::string model_config;      // --config: config.json for checkpoints (default: the plan's)
  // --save-dtype: the checkpoints' weights (default: the plan's dtype, or resumed, the saved
  // run's); below F32 the fp32 masters are kept with the optimizer state, so that a resume is
  // exact.
  std::optional<DType> save_dtype;
  // --tokenizer: a tokenizer.json or its directory, copied into every checkpoint (default: the
  // tokenizer of --init's directory, or of the checkpoint resumed from; TokenizerFiles.h).
  std::string tokenizer;
  bool shard_optimizer = false;  // AdamW moments of replicated parameters sliced over the ranks
  int64_t log_every = 1;         // progress line every N steps (and the first and last)
  LrSchedule schedule;           // total_steps is set from `steps`
  AdamWConfig adamw;

  // --data-dtype: the tokens of a raw --data file (token files and indexed datasets say theirs).
  // It applies to --eval-data too.
  std::optional<data::TokenDType> data_dtype;
  // --shuffle-seed: the documents of an indexed dataset in this seed's order, a new order each
  // epoch (DocumentOrder.h); none reads them as stored.
  std::optional<uint64_t> shuffle_seed;

  // The held-out loss (optional): eval_data is opened like `data`; after every eval_every steps
  // (steps that are multiples of it, also in a resumed run) and after the last step, the mean
  // loss of its first eval_tokens tokens (the model's inputs, rounded up to whole global batches;
  // default one global batch), read from its start every time.
  std::string eval_data;
  std::optional<int64_t> eval_every;
  std::optional<int64_t> eval_tokens;

  // The checkpoint directory's rotation, and a new run's claim on it.
  int64_t keep_checkpoints = 2;        // the newest N checkpoints stay (0: all)
  bool overwrite_checkpoints = false;  // a new run replaces checkpoint_dir's checkpoints

  // The options the command line gave (without the dashes): those a resumed run keeps from the
  // saved run are reported when they differ from it (TrainLoop.h's AdoptSavedRun).
  std::set<std::string> given;
};

// Trains on `comm`, whose mesh must already be the plan's (comm::CheckRanksAgree). Collective:
// every rank returns the same status. Progress goes to stdout on rank 0.
absl::Status Train(comm::Communicator& comm, const plan::Plan& plan, const TrainOptions& options);

// "step-000012": the checkpoint directory of a step, inside checkpoint_dir.
std::string CheckpointName(int64_t step);
// The file in checkpoint_dir naming the last complete checkpoint.
inline constexpr char kLatestFileName[] = "latest";
// The file in checkpoint_dir naming the newest checkpoint written after an applied update (see
// Retention in TrainLoop.h): rotation never removes it.
inline constexpr char kLatestFiniteFileName[] = "latest-finite";

}  // namespace hcp::train
