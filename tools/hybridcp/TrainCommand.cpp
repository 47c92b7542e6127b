// `hybridcp train`: the training loop on every rank (mpirun -np N hybridcp train ...), and
// `plot` (metrics -> SVG). `tokenize` is in TokenizeCommand.cpp.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "compiler/import/GraniteConfig.h"
#include "runtime/comm/Agreement.h"
#include "runtime/comm/World.h"
#include "runtime/data/TokenData.h"
#include "runtime/support/Paths.h"
#include "runtime/support/Status.h"
#include "runtime/train/Plot.h"
#include "runtime/train/Trainer.h"
#include "tools/hybridcp/Commands.h"
#include "tools/hybridcp/Ranks.h"

namespace hcp {
namespace {

constexpr double kPretrainingLr = 3e-3;
constexpr double kFineTuningLr = 2e-5;

// `path` as the file system names it (another spelling of one file is the same), or as given.
std::filesystem::path Canonical(const std::string& path) {
  std::error_code error;
  std::filesystem::path canonical = std::filesystem::weakly_canonical(path, error);
  return error ? std::filesystem::path(path).lexically_normal() : canonical;
}

// --data W1 PATH1 W2 PATH2 ...: weight/path pairs, each weight a positive number, no path twice.
absl::StatusOr<std::vector<train::WeightedData>> ReadBlend(const std::vector<std::string>& values) {
  constexpr char kForms[] =
      "--data PATH, or weight/path pairs --data W1 PATH1 W2 PATH2 ...: the words after --data up "
      "to the next option, so the plan goes before --data";
  if (values.size() % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--data: %d values are not weight/path pairs (%s)", values.size(), kForms));
  }
  std::vector<train::WeightedData> blend;
  for (size_t i = 0; i < values.size(); i += 2) {
    const std::string& text = values[i];
    const std::string& path = values[i + 1];
    char* end = nullptr;
    const double weight = std::strtod(text.c_str(), &end);
    if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(weight) ||
        !(weight > 0)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--data: weight '%s' before %s is not a positive number (%s)", text, path, kForms));
    }
    for (const train::WeightedData& earlier : blend) {
      if (Canonical(earlier.path) == Canonical(path)) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "--data: %s is given twice (as %s and %s); give each source once, with its whole "
            "weight",
            path, earlier.path, path));
      }
    }
    blend.push_back({weight, path});
  }
  return blend;
}

absl::StatusOr<train::TrainOptions> ReadTrainOptions(const Args& args) {
  train::TrainOptions o;
  const std::vector<std::string> data = args.GetAll("data");
  if (data.empty())
    return absl::InvalidArgumentError(
        "--data PATH (a Megatron indexed dataset, a token file: see `hybridcp tokenize`, or a raw "
        "token file with --data-dtype) is required");
  if (data.size() == 1) {
    o.data = data[0];
  } else {
    HCP_ASSIGN_OR_RETURN(o.blend, ReadBlend(data));
    // One pair is one source: today's rule.
    if (o.blend.size() == 1) o.data = o.blend[0].path, o.blend.clear();
  }
  if (std::optional<std::string> dtype = args.Get("data-dtype")) {
    absl::StatusOr<data::TokenDType> parsed = data::ParseTokenDType(*dtype);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--data-dtype: ", parsed.status().message()));
    }
    o.data_dtype = *parsed;
  }
  o.eval_data = args.Get("eval-data").value_or("");
  if (args.Has("shuffle-seed")) {
    HCP_ASSIGN_OR_RETURN(int64_t shuffle, args.GetInt("shuffle-seed", std::nullopt));
    if (shuffle < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("--shuffle-seed must not be negative, got %d", shuffle));
    }
    o.shuffle_seed = static_cast<uint64_t>(shuffle);
  }
  if (args.Has("eval-every")) {
    HCP_ASSIGN_OR_RETURN(o.eval_every, args.GetInt("eval-every", std::nullopt));
  }
  if (args.Has("eval-tokens")) {
    HCP_ASSIGN_OR_RETURN(o.eval_tokens, args.GetInt("eval-tokens", std::nullopt));
  }
  HCP_ASSIGN_OR_RETURN(o.steps, args.GetInt("steps", std::nullopt));
  HCP_ASSIGN_OR_RETURN(o.grad_accum, args.GetInt("grad-accum", 1));
  HCP_ASSIGN_OR_RETURN(int64_t seed, args.GetInt("seed", 0));
  o.seed = static_cast<uint64_t>(seed);
  o.init_weights = args.Get("init").value_or("");
  o.checkpoint_dir = args.Get("checkpoint-dir").value_or("");
  HCP_ASSIGN_OR_RETURN(o.checkpoint_every, args.GetInt("checkpoint-every", 0));
  if (args.Has("checkpoint-every") && o.checkpoint_every <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--checkpoint-every must be positive, got %d (leave it out to checkpoint only at the end)",
        o.checkpoint_every));
  }
  HCP_ASSIGN_OR_RETURN(o.keep_checkpoints, args.GetInt("keep-checkpoints", 2));
  if (args.Has("keep-checkpoints") && o.checkpoint_dir.empty()) {
    return absl::InvalidArgumentError("--keep-checkpoints needs --checkpoint-dir");
  }
  o.overwrite_checkpoints = args.Has("overwrite-checkpoints");
  o.resume = args.Has("resume");
  HCP_ASSIGN_OR_RETURN(o.stop_after, args.GetInt("stop-after", 0));
  o.metrics = args.Get("metrics").value_or("");
  o.shard_optimizer = args.Has("shard-optimizer");
  HCP_ASSIGN_OR_RETURN(o.log_every, args.GetInt("log-every", 1));
  // Fine-tuning a trained model (--init) wants a learning rate far below pre-training's.
  const double default_lr = o.init_weights.empty() ? kPretrainingLr : kFineTuningLr;
  HCP_ASSIGN_OR_RETURN(o.schedule.max_lr, args.GetDouble("lr", default_lr));
  HCP_ASSIGN_OR_RETURN(o.schedule.min_lr, args.GetDouble("min-lr", o.schedule.max_lr / 10));
  HCP_ASSIGN_OR_RETURN(o.schedule.warmup_steps, args.GetInt("warmup", 0));
  if (std::optional<std::string> decay = args.Get("schedule")) {
    absl::StatusOr<train::LrDecay> parsed = train::ParseLrDecay(*decay);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--", parsed.status().message()));
    }
    o.schedule.decay = *parsed;
  }
  HCP_ASSIGN_OR_RETURN(o.adamw.beta1, args.GetDouble("beta1", o.adamw.beta1));
  HCP_ASSIGN_OR_RETURN(o.adamw.beta2, args.GetDouble("beta2", o.adamw.beta2));
  HCP_ASSIGN_OR_RETURN(o.adamw.eps, args.GetDouble("eps", o.adamw.eps));
  HCP_ASSIGN_OR_RETURN(o.adamw.weight_decay, args.GetDouble("weight-decay", 0.1));
  HCP_ASSIGN_OR_RETURN(o.adamw.max_grad_norm, args.GetDouble("clip", 1.0));
  for (const char* name : {"lr", "min-lr", "warmup", "schedule", "beta1", "beta2", "eps",
                           "weight-decay", "clip", "seed", "shuffle-seed"}) {
    if (args.Has(name)) o.given.insert(name);
  }
  if (o.grad_accum < 1) return absl::InvalidArgumentError("--grad-accum must be at least 1");
  if (o.stop_after < 0) return absl::InvalidArgumentError("--stop-after must not be negative");
  if (std::optional<std::string> dtype = args.Get("save-dtype")) {
    if (*dtype == "f32" || *dtype == "fp32") {
      o.save_dtype = DType::F32;
    } else if (*dtype == "bf16") {
      o.save_dtype = DType::BF16;
    } else {
      return absl::InvalidArgumentError(
          absl::StrFormat("--save-dtype %s: the checkpoints' weights are f32 or bf16", *dtype));
    }
  }
  o.tokenizer = args.Get("tokenizer").value_or("");
  if (std::optional<std::string> config = args.Get("config")) {
    // What goes into every checkpoint must be a Granite config transformers can load: read
    // through the importer's checks (bounded, every field), then kept as written.
    absl::StatusOr<GraniteConfig> parsed = LoadGraniteConfig(*config);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--config: ", parsed.status().message()));
    }
    std::ifstream file(parsed->file.empty() ? *config : parsed->file);
    std::stringstream text;
    text << file.rdbuf();
    if (!file) return absl::NotFoundError(absl::StrFormat("%s: cannot read the config", *config));
    o.model_config = text.str();
  }
  if (!o.metrics.empty()) {
    std::vector<std::string> inputs = {args.positionals().at(0)};
    std::vector<std::string> data_paths = {o.data, o.eval_data};
    for (const train::WeightedData& source : o.blend) data_paths.push_back(source.path);
    // An indexed dataset's files too, when --data or --eval-data names their prefix.
    for (const std::string& path : data_paths) {
      if (path.empty()) continue;
      inputs.push_back(path);
      for (const char* extension : {".bin", ".idx"}) {
        std::error_code error;
        if (std::filesystem::exists(path + extension, error)) inputs.push_back(path + extension);
      }
    }
    if (std::optional<std::string> config = args.Get("config")) inputs.push_back(*config);
    HCP_RETURN_IF_ERROR(RefuseOutputOntoInput("--metrics", o.metrics, inputs));
  }
  return o;
}

absl::Status Train(const Args& args) {
  if (args.positionals().size() != 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "give one plan file%s",
        args.positionals().empty() && args.GetAll("data").size() > 1
            ? " (before --data: --data takes every word after it up to the next option)"
            : ""));
  }
  HCP_ASSIGN_OR_RETURN(World world, JoinRanks("train", args));
  plan::RankPlan mine = plan::LoadPlanForRank(args.positionals()[0]);
  HCP_RETURN_IF_ERROR(comm::CheckRanksAgree(world.comm(), mine.plan, mine.hash));
  absl::StatusOr<train::TrainOptions> options = ReadTrainOptions(args);
  HCP_RETURN_IF_ERROR(comm::AgreeOnStatus(world.comm(), options.status()));
  // A bf16 plan trains on the GPUs (the CUDA backend), an f32 plan on CPU ranks.
  return train::Train(world.comm(), *mine.plan, *options);
}

absl::Status Plot(const Args& args) {
  std::optional<std::string> output = args.Get("o");
  if (!output || args.positionals().empty()) {
    return absl::InvalidArgumentError("give metrics files (JSON lines) and -o FILE.svg");
  }
  HCP_RETURN_IF_ERROR(RefuseOutputOntoInput("-o", *output, args.positionals()));
  train::PlotOptions options;
  if (std::optional<std::string> title = args.Get("title")) options.title = *title;
  const std::string x_axis = args.Get("x").value_or("step");
  if (x_axis == "tokens") {
    options.x_axis = train::PlotXAxis::kTokens;
  } else if (x_axis != "step") {
    return absl::InvalidArgumentError(
        absl::StrFormat("--x %s: the x axis is step or tokens", x_axis));
  }
  HCP_RETURN_IF_ERROR(train::PlotMetricsFiles(args.positionals(), *output, options));
  std::printf("wrote %s (%zu runs)\n", output->c_str(), args.positionals().size());
  return absl::OkStatus();
}

}  // namespace

Command MakeTrainCommand() {
  return Command{
      "train",
      "train on token data: every rank of the plan's mesh (start them with mpirun -np N); an f32 "
      "plan on CPU ranks, a bf16 plan on GPUs (one per rank)",
      "train FILE.plan --data PATH|W1 PATH1 W2 PATH2 ... [--data-dtype TYPE] [--shuffle-seed N] "
      "--steps N "
      "[--grad-accum N] [--init DIR] [--tokenizer PATH] [--save-dtype f32|bf16] "
      "[--lr X --warmup N --min-lr X --schedule KIND] [--checkpoint-dir DIR [--checkpoint-every N] "
      "[--keep-checkpoints N] "
      "[--resume | --overwrite-checkpoints]] [--eval-data PATH --eval-every N [--eval-tokens M]] "
      "[--metrics FILE.jsonl]",
      {{"data", "PATH | W1 PATH1 W2 PATH2 ...",
        "training data: a Megatron indexed dataset (PREFIX, PREFIX.bin or PREFIX.idx), a token "
        "file (hybridcp tokenize makes one from text), or a raw token file with --data-dtype; or "
        "a blend of several, by weight (positive numbers, normalised to sum 1): each window of "
        "the run comes from the source furthest below its share, the same for every cp/dp split "
        "and across a resume",
        /*multi=*/true},
       {"data-dtype", "TYPE",
        "the tokens of a raw (headerless) --data file: uint16, uint32 or int32"},
       {"shuffle-seed", "N",
        "read the documents of an indexed --data in a pseudo-random order given by N, a new one "
        "each epoch (the same for every cp/dp split and across a resume; default: as stored)"},
       {"eval-data", "PATH",
        "held-out data (any format --data takes, the same --data-dtype): its loss is reported "
        "every --eval-every steps, without changing the training"},
       {"eval-every", "N",
        "evaluate after every N steps (steps that are multiples of N, also when resumed) and "
        "after the last"},
       {"eval-tokens", "M",
        "tokens scored by each evaluation, from the start of --eval-data (rounded up to whole "
        "global batches; default one global batch)"},
       {"steps", "N",
        "optimizer steps of the run (the learning-rate schedule's length; with --resume, where "
        "the run ends: the saved schedule stays)"},
       {"grad-accum", "N", "micro-batches per rank per step (default 1)"},
       {"lr", "X",
        "peak learning rate (default 3e-3; with --init, fine-tuning a trained model, 2e-5)"},
       {"min-lr", "X", "final learning rate of the decay (default lr / 10)"},
       {"warmup", "N", "linear warmup steps (default 0)"},
       {"schedule", "KIND",
        "after the warmup: cosine (default) or linear decay to min-lr, or constant at lr"},
       {"beta1", "X", "AdamW's first-moment decay (default 0.9)"},
       {"beta2", "X", "AdamW's second-moment decay (default 0.95)"},
       {"eps", "X", "AdamW's epsilon (default 1e-8)"},
       {"weight-decay", "X", "AdamW decoupled weight decay of matrices (default 0.1)"},
       {"clip", "X", "global gradient-norm clip (default 1.0; 0 disables)"},
       {"seed", "N", "parameter initialisation seed (default 0)"},
       {"init", "DIR",
        "start from a Hugging Face checkpoint directory (model.safetensors or shards; bf16, fp16 "
        "or fp32) instead of random weights"},
       {"config", "FILE",
        "config.json to write into each checkpoint instead of the one the plan was compiled from"},
       {"save-dtype", "TYPE",
        "the checkpoints' weights: f32 or bf16 (default: the plan's dtype, or on --resume the "
        "saved run's; bf16 weights keep their fp32 masters with the optimizer state, so a "
        "resume is exact)"},
       {"tokenizer", "PATH",
        "a tokenizer.json (or its directory) to copy into every checkpoint with the Hugging Face "
        "files beside it (default: --init's tokenizer, or the resumed checkpoint's)"},
       {"checkpoint-dir", "DIR",
        "write checkpoints here (checked before step 1; a new run refuses one that holds "
        "checkpoints)"},
       {"checkpoint-every", "N", "steps between checkpoints (default: only at the end)"},
       {"keep-checkpoints", "N",
        "keep the newest N checkpoints (default 2; 0 keeps all), and always the newest written "
        "after an applied update"},
       {"resume", "",
        "continue from the latest checkpoint in --checkpoint-dir (the previous intact one when "
        "that is damaged), with the saved run's AdamW settings, schedule and seed (options that "
        "differ are named)"},
       {"overwrite-checkpoints", "", "a new run replaces the checkpoints in --checkpoint-dir"},
       {"stop-after", "N",
        "stop after step N as if interrupted (writes a checkpoint, unless every step since the "
        "last one was skipped)"},
       {"metrics", "FILE", "append one JSON line per step"},
       {"shard-optimizer", "",
        "shard the AdamW moments (on GPUs also the fp32 masters) over the ranks"},
       {"log-every", "N", "progress line every N steps (default 1)"},
       kTimeoutOption},
      Train,
  };
}

Command MakePlotCommand() {
  return Command{
      "plot",
      "draw the loss curves of metrics files into one SVG",
      "plot METRICS.jsonl... -o FILE.svg [--title TEXT] [--x step|tokens]",
      {{"o", "FILE", "the SVG to write"},
       {"title", "TEXT", "the picture's title"},
       {"x", "AXIS", "step (default) or tokens"}},
      Plot,
  };
}

}  // namespace hcp
