#include "runtime/train/TrainLoop.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "runtime/comm/Agreement.h"
#include "runtime/support/AtomicFile.h"
#include "runtime/support/Crc32c.h"
#include "runtime/support/Format.h"
#include "runtime/support/Status.h"
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

absl::Status PrepareOptions(TrainOptions& options) {
  if (options.steps <= 0) return absl::InvalidArgumentError("--steps must be positive");
  if (options.log_every < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--log-every must be at least 1, got %d", options.log_every));
  }
  if (!(options.adamw.max_grad_norm >= 0)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--clip must be >= 0 (0 disables clipping), got %g", options.adamw.max_grad_norm));
  }
  if (!options.init_weights.empty() && options.resume) {
    return absl::InvalidArgumentError(
        "--init and --resume both say where the weights come from: a resumed run takes its "
        "checkpoint's; give one of them");
  }
  if (options.checkpoint_every < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--checkpoint-every must be positive, got %d", options.checkpoint_every));
  }
  if (options.keep_checkpoints < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--keep-checkpoints must be >= 0 (0 keeps all), got %d", options.keep_checkpoints));
  }
  if (options.checkpoint_dir.empty()) {
    if (options.checkpoint_every > 0) {
      return absl::InvalidArgumentError("--checkpoint-every needs --checkpoint-dir");
    }
    if (options.overwrite_checkpoints) {
      return absl::InvalidArgumentError("--overwrite-checkpoints needs --checkpoint-dir");
    }
  }
  const bool eval = !options.eval_data.empty();
  if (options.eval_every && *options.eval_every <= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--eval-every must be positive, got %d", *options.eval_every));
  }
  if (options.eval_tokens && *options.eval_tokens <= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--eval-tokens must be positive, got %d", *options.eval_tokens));
  }
  if (eval && !options.eval_every) {
    return absl::InvalidArgumentError(
        "--eval-data needs --eval-every N (steps between evaluations)");
  }
  if (!eval && options.eval_every) {
    return absl::InvalidArgumentError("--eval-every needs --eval-data (the held-out data)");
  }
  if (!eval && options.eval_tokens) {
    return absl::InvalidArgumentError("--eval-tokens needs --eval-data (the held-out data)");
  }
  if (options.overwrite_checkpoints && options.resume) {
    return absl::InvalidArgumentError(
        "--overwrite-checkpoints replaces the checkpoints that --resume continues from; give one "
        "of them");
  }
  options.schedule.total_steps = options.steps;
  HCP_RETURN_IF_ERROR(ValidateSchedule(options.schedule));
  return ValidateAdamWConfig(options.adamw);
}

namespace {

// `status` with `prefix` before its message ("--eval-data: "), or as it is when OK.
absl::Status Prefixed(const absl::Status& status, std::string_view prefix) {
  if (status.ok() || prefix.empty()) return status;
  return absl::Status(status.code(), absl::StrCat(std::string(prefix), status.message()));
}

// `path` opened as DataSource.h says and every token checked against the vocabulary, on every
// rank, each step agreed; errors start with `what`.
absl::StatusOr<std::unique_ptr<data::DataSource>> OpenCheckedSource(
    comm::Communicator& comm, const std::string& path, std::optional<data::TokenDType> dtype,
    int64_t vocab, std::string_view what) {
  absl::StatusOr<data::DataSource> source = data::DataSource::Open(path, dtype);
  HCP_RETURN_IF_ERROR(comm::AgreeOnStatus(comm, Prefixed(source.status(), what)));
  auto opened = std::make_unique<data::DataSource>(*std::move(source));
  // One scan of the whole data, on one rank (the others read the same file): a token the model
  // has no embedding for stops the run now, not at the step that reaches it.
  const absl::Status in_vocab =
      comm.world_rank() == 0 ? opened->CheckVocab(vocab) : absl::OkStatus();
  HCP_RETURN_IF_ERROR(comm::AgreeOnStatus(comm, Prefixed(in_vocab, what)));
  return opened;
}

// --shuffle-seed shuffles documents: refused for a source without them (--data's, or source
// `blend_index` of a blend), naming it.
absl::Status CanShuffle(const data::DataSource& source, std::optional<uint64_t> shuffle_seed,
                        std::optional<int64_t> blend_index) {
  if (!shuffle_seed || source.indexed() != nullptr) return absl::OkStatus();
  const char* kind =
      source.format() == data::DataFormat::kTokenFile ? "token file" : "raw token file";
  const std::string which = blend_index ? absl::StrFormat("--data's source %d, %s,",
                                                          *blend_index + 1, source.tokens().path())
                                        : absl::StrCat("--data ", source.tokens().path());
  return absl::InvalidArgumentError(absl::StrFormat(
      "--shuffle-seed %d shuffles the documents of %s, but %s is a %s: one stream of tokens "
      "without document boundaries; write %s as an indexed dataset (hybridcp tokenize "
      "--tokenizer tokenizer.json ... -o PREFIX), or leave --shuffle-seed out",
      *shuffle_seed, blend_index ? "Megatron indexed datasets" : "a Megatron indexed dataset",
      which, kind, blend_index ? "it" : "the data"));
}

// A blend's sources: each opened and checked like one source, identified by its tokens, and none
// the same file as another.
absl::Status OpenBlend(comm::Communicator& comm, const TrainOptions& options, int64_t vocab,
                       TrainingData& data) {
  std::vector<double> given;
  for (const WeightedData& source : options.blend) given.push_back(source.weight);
  absl::StatusOr<std::vector<double>> weights = data::NormalizeBlendWeights(given);
  HCP_RETURN_IF_ERROR(comm::AgreeOnStatus(comm, Prefixed(weights.status(), "--data: ")));
  std::vector<std::string> files;  // each source's tokens, as the file system names them
  for (size_t d = 0; d < options.blend.size(); ++d) {
    const std::string& path = options.blend[d].path;
    HCP_ASSIGN_OR_RETURN(std::unique_ptr<data::DataSource> source,
                         OpenCheckedSource(comm, path, options.data_dtype, vocab, ""));
    std::error_code error;
    files.push_back(fs::weakly_canonical(source->tokens().path(), error).string());
    absl::Status distinct = absl::OkStatus();
    for (size_t e = 0; e < d; ++e) {
      if (files[e] != files[d]) continue;
      distinct = absl::InvalidArgumentError(absl::StrFormat(
          "--data: %s and %s are the same data (%s); give each source once, with its whole weight",
          options.blend[e].path, path, files[d]));
    }
    HCP_RETURN_IF_ERROR(comm::AgreeOnStatus(comm, distinct));
    absl::StatusOr<DataIdentity> identity = IdentifyData(source->tokens().path());
    HCP_RETURN_IF_ERROR(comm::AgreeOnStatus(comm, identity.status()));
    data.run.blend.push_back({(*weights)[d], *std::move(identity)});
    data.blend_sources.push_back(std::move(source));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status OpenTrainingData(comm::Communicator& comm, const plan::Plan& plan,
                              const TrainOptions& options, TrainingData& data) {
  absl::StatusOr<int64_t> vocab = VocabularyOf(plan);
  HCP_RETURN_IF_ERROR(comm::AgreeOnStatus(comm, vocab.status()));
  if (options.blend.empty()) {
    HCP_ASSIGN_OR_RETURN(data.source,
                         OpenCheckedSource(comm, options.data, options.data_dtype, *vocab, ""));
    // The tokens identify the data (an indexed dataset's .bin): they are what the run trains on.
    absl::StatusOr<DataIdentity> identity = IdentifyData(data.source->tokens().path());
    HCP_RETURN_IF_ERROR(comm::AgreeOnStatus(comm, identity.status()));
    data.run = IdentifyRun(plan, options.grad_accum, *std::move(identity));
  } else {
    data.run = IdentifyRun(plan, options.grad_accum, {});
    HCP_RETURN_IF_ERROR(OpenBlend(comm, options, *vocab, data));
  }
  return OrderTrainingData(comm, BatchConfigOf(plan, options.grad_accum, *vocab),
                           options.shuffle_seed, data);
}

data::BatchConfig BatchConfigOf(const plan::Plan& plan, int64_t grad_accum, int64_t vocab) {
  data::BatchConfig batch{plan.seq, plan.micro_batch, plan.mesh.dp, grad_accum, vocab};
  batch.documents = plan.position_ids.has_value();
  if (batch.documents) batch.eos_tokens = EosTokensOf(plan);
  return batch;
}

std::string DescribeDocuments(const data::BatchConfig& batch) {
  std::string eos = absl::StrJoin(batch.eos_tokens, ", ");
  return absl::StrCat(
      "documents: packed, none reading another (an indexed dataset's documents as its .idx "
      "says",
      batch.eos_tokens.empty() ? "" : absl::StrCat("; other data's end after token ", eos),
      "); a document's last target is ignored");
}

std::vector<int64_t> EosTokensOf(const plan::Plan& plan) {
  const nlohmann::json config =
      nlohmann::json::parse(plan.model_config, nullptr, /*allow_exceptions=*/false);
  std::vector<int64_t> eos;
  if (!config.is_object() || !config.contains("eos_token_id")) return eos;
  const nlohmann::json& value = config["eos_token_id"];
  for (const nlohmann::json& id : value.is_array() ? value : nlohmann::json::array({value})) {
    if (id.is_number_integer()) eos.push_back(id.get<int64_t>());
  }
  return eos;
}

namespace {

// OrderTrainingData for a blend: source d's documents in BlendSourceSeed(seed, d)'s order.
absl::Status OrderBlend(comm::Communicator& comm, const data::BatchConfig& batch,
                        std::optional<uint64_t> shuffle_seed, TrainingData& data) {
  absl::Status can_shuffle = absl::OkStatus();
  for (size_t d = 0; d < data.blend_sources.size() && can_shuffle.ok(); ++d) {
    can_shuffle = CanShuffle(*data.blend_sources[d], shuffle_seed, static_cast<int64_t>(d));
  }
  HCP_RETURN_IF_ERROR(comm::AgreeOnStatus(comm, can_shuffle));
  // The batcher points at the orders: the old batcher goes before the orders it reads.
  data.blend.reset();
  data.blend_orders.clear();
  std::vector<data::TokenStream> streams;
  std::vector<double> weights;
  for (size_t d = 0; d < data.blend_sources.size(); ++d) {
    const data::DataSource& source = *data.blend_sources[d];
    const data::DocumentOrder* order = nullptr;
    if (shuffle_seed) {
      data.blend_orders.push_back(std::make_unique<data::DocumentOrder>(
          *source.indexed(), data::BlendSourceSeed(*shuffle_seed, static_cast<int64_t>(d))));
      order = data.blend_orders.back().get();
    }
    streams.push_back({&source.tokens(), source.loss_mask(), order, source.indexed()});
    weights.push_back(data.run.blend.at(d).weight);
  }
  absl::StatusOr<data::BlendBatcher> batcher =
      data::BlendBatcher::Create(std::move(streams), std::move(weights), batch);
  HCP_RETURN_IF_ERROR(comm::AgreeOnStatus(comm, batcher.status()));
  data.blend = std::move(*batcher);
  data.run.shuffle_seed = shuffle_seed;
  return absl::OkStatus();
}

}  // namespace

absl::Status OrderTrainingData(comm::Communicator& comm, const data::BatchConfig& batch,
                               std::optional<uint64_t> shuffle_seed, TrainingData& data) {
  if (!data.blend_sources.empty()) return OrderBlend(comm, batch, shuffle_seed, data);
  const data::DataSource& source = *data.source;
  HCP_RETURN_IF_ERROR(comm::AgreeOnStatus(comm, CanShuffle(source, shuffle_seed, std::nullopt)));
  // The batcher points at the order: the old batcher goes before the order it reads.
  data.batcher.reset();
  data.order = shuffle_seed
                   ? std::make_unique<data::DocumentOrder>(*source.indexed(), *shuffle_seed)
                   : nullptr;
  absl::StatusOr<data::TokenBatcher> batcher = data::TokenBatcher::Create(
      source.tokens(), batch, source.loss_mask(), data.order.get(), source.indexed());
  HCP_RETURN_IF_ERROR(comm::AgreeOnStatus(comm, batcher.status()));
  data.batcher = std::move(*batcher);
  data.run.shuffle_seed = shuffle_seed;
  return absl::OkStatus();
}

absl::Status TrainingData::Restore(const TrainState& saved) {
  if (blend) return blend->Restore(saved.blend_data);
  return batcher->Restore(saved.data);
}

std::vector<std::string> TrainingData::Describe() const {
  if (!blend) return {absl::StrCat("data: ", source->Describe())};
  std::vector<std::string> lines = {absl::StrFormat(
      "data: a blend of %d sources, by weight (each window from the source furthest below its "
      "share):",
      blend_sources.size())};
  for (size_t d = 0; d < blend_sources.size(); ++d) {
    lines.push_back(
        absl::StrFormat("  %g%% %s", 100 * run.blend.at(d).weight, blend_sources[d]->Describe()));
  }
  return lines;
}

std::string DescribeOrder(std::optional<uint64_t> shuffle_seed) {
  if (!shuffle_seed) return "the documents as stored";
  return absl::StrCat("the documents in --shuffle-seed ", *shuffle_seed,
                      "'s order, a new order each epoch");
}

absl::StatusOr<int64_t> EvalGlobalBatches(const data::BatchConfig& batch,
                                          std::optional<int64_t> eval_tokens,
                                          const std::string& path, int64_t file_tokens) {
  const int64_t batch_inputs = batch.global_batch() * batch.seq;
  const int64_t wanted = eval_tokens.value_or(batch_inputs);
  if (wanted <= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--eval-tokens must be positive, got %d", wanted));
  }
  const int64_t batches = wanted / batch_inputs + (wanted % batch_inputs != 0);
  // Windows of seq + 1 tokens, as the training data's (TokenData.h): the file must hold them all.
  if (batches > file_tokens / batch.step_tokens()) {
    const std::string needs =
        batches == 1
            ? absl::StrFormat(
                  "one evaluation needs one global batch: global_batch * (seq + 1) = "
                  "%d * (%d + 1) = %s",
                  batch.global_batch(), batch.seq, FormatCount(batch.step_tokens()))
            : absl::StrFormat(
                  "--eval-tokens %s needs %d global batches: %d * global_batch * "
                  "(seq + 1) = %d * %d * (%d + 1) = %s",
                  FormatCount(wanted), batches, batches, batches, batch.global_batch(), batch.seq,
                  batches > INT64_MAX / batch.step_tokens()
                      ? std::string("more tokens than any file holds")
                      : FormatCount(batches * batch.step_tokens()));
    return absl::InvalidArgumentError(absl::StrFormat(
        "--eval-data %s has %s tokens; %s (global_batch = micro_batch %d * dp %d * grad_accum %d)",
        path, FormatCount(file_tokens), needs, batch.micro_batch, batch.dp, batch.grad_accum));
  }
  return batches;
}

absl::Status OpenEvalData(comm::Communicator& comm, const TrainOptions& options,
                          const data::BatchConfig& batch, EvalData& eval) {
  if (options.eval_data.empty()) return absl::OkStatus();
  HCP_ASSIGN_OR_RETURN(eval.source, OpenCheckedSource(comm, options.eval_data, options.data_dtype,
                                                      batch.vocab, "--eval-data: "));
  const data::TokenFile& tokens = eval.source->tokens();
  absl::StatusOr<int64_t> batches =
      EvalGlobalBatches(batch, options.eval_tokens, tokens.path(), tokens.size());
  HCP_RETURN_IF_ERROR(comm::AgreeOnStatus(comm, batches.status()));
  // From the start; EvalGlobalBatches made sure they fit without wrapping around.
  absl::StatusOr<data::TokenBatcher> batcher = data::TokenBatcher::Create(
      tokens, batch, eval.source->loss_mask(), /*order=*/nullptr, eval.source->indexed());
  absl::Status read = batcher.status();
  const int64_t dp_index = comm.has_mesh() ? comm.dp_index() : 0;
  for (int64_t b = 0; read.ok() && b < *batches; ++b) {
    absl::StatusOr<data::StepBatch> step = batcher->NextStep(dp_index);
    read = step.status();
    if (read.ok()) eval.batches.push_back(*std::move(step));
  }
  HCP_RETURN_IF_ERROR(comm::AgreeOnStatus(comm, Prefixed(read, "--eval-data: ")));
  eval.loss_scale = LossScale(comm, eval.batches);
  eval.tokens = *batches * batch.global_batch() * batch.seq;
  return absl::OkStatus();
}

bool EvalDue(const TrainOptions& options, int64_t steps_done, int64_t last) {
  if (options.eval_data.empty() || !options.eval_every || *options.eval_every <= 0) return false;
  return steps_done % *options.eval_every == 0 || steps_done == last;
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

absl::Status OpenMetrics(comm::Communicator& comm, const TrainOptions& options,
                         std::optional<MetricsWriter>& metrics) {
  if (options.metrics.empty()) return absl::OkStatus();
  absl::Status opened = absl::OkStatus();
  if (comm.world_rank() == 0) {
    absl::StatusOr<MetricsWriter> writer = MetricsWriter::Open(
        options.metrics, options.resume ? MetricsMode::kContinue : MetricsMode::kNew);
    opened = writer.status();
    if (writer.ok()) metrics = std::move(*writer);
  }
  return comm::AgreeOnStatus(comm, opened);
}

float StepLossScale(comm::Communicator& comm, const data::StepBatch& batch) {
  return LossScale(comm, std::span<const data::StepBatch>(&batch, 1));
}

float LossScale(comm::Communicator& comm, std::span<const data::StepBatch> batches) {
  double valid = 0;
  for (const data::StepBatch& batch : batches)
    valid += static_cast<double>(CountValid(batch.targets));
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
  if (data.blend) {
    state.blend_data = data.blend->state();
  } else {
    state.data = data.batcher->state();
  }
  state.rng = {options.seed, 0};
  state.optimizer_updates = optimizer_updates;
  state.optimizer = options.adamw;
  state.schedule = options.schedule;
  state.run = data.run;
  return state;
}

namespace {

bool SameFile(const DataIdentity& a, const DataIdentity& b) {
  return a.bytes == b.bytes && a.head_crc32c == b.head_crc32c;
}

// Two weights of a blend, in percent, with the digits that tell them apart.
std::pair<std::string, std::string> Shares(double a, double b) {
  std::string x = absl::StrFormat("%g%%", 100 * a), y = absl::StrFormat("%g%%", 100 * b);
  if (x == y) x = absl::StrFormat("%.17g", a), y = absl::StrFormat("%.17g", b);
  return {x, y};
}

// The run's data is `now`'s: the same file, or a blend of the same files with the same weights in
// the same order (moved or renamed files are the same).
absl::Status CheckSameData(const std::string& checkpoint, const RunIdentity& was,
                           const RunIdentity& now) {
  if (was.blend.empty() && now.blend.empty()) {
    if (SameFile(was.data, now.data)) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrFormat(
        "cannot resume from %s: --data %s (%d bytes, crc32c of its first MiB %s) is not the data "
        "the run trained on (%s: %d bytes, %s); give --data that file (moved or renamed is "
        "fine), or start a new run in another --checkpoint-dir",
        checkpoint, now.data.path, now.data.bytes, now.data.head_crc32c, was.data.path,
        was.data.bytes, was.data.head_crc32c));
  }
  std::vector<std::string> differ;
  if (was.blend.empty()) {
    differ.push_back(absl::StrFormat("the run trained on one source, %s; --data now blends %d",
                                     was.data.path, now.blend.size()));
  } else if (now.blend.empty()) {
    differ.push_back(
        absl::StrFormat("the run trained on a blend of %d sources; --data now names "
                        "one, %s",
                        was.blend.size(), now.data.path));
  } else {
    if (was.blend.size() != now.blend.size()) {
      differ.push_back(
          absl::StrFormat("%d sources saved, %d now", was.blend.size(), now.blend.size()));
    }
    for (size_t d = 0; d < std::min(was.blend.size(), now.blend.size()); ++d) {
      const BlendPart& a = was.blend[d];
      const BlendPart& b = now.blend[d];
      if (!SameFile(a.data, b.data)) {
        differ.push_back(absl::StrFormat(
            "source %d is %s (%d bytes, crc32c of its first MiB %s), not the run's %s (%d bytes, "
            "%s)",
            d + 1, b.data.path, b.data.bytes, b.data.head_crc32c, a.data.path, a.data.bytes,
            a.data.head_crc32c));
      }
      if (a.weight != b.weight) {
        const auto [saved_share, now_share] = Shares(a.weight, b.weight);
        differ.push_back(absl::StrFormat("source %d (%s) has weight %s saved, %s now", d + 1,
                                         b.data.path, saved_share, now_share));
      }
    }
  }
  if (differ.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrFormat(
      "cannot resume from %s: --data is not the data the run trained on: %s; give --data the "
      "run's weights and files in its order (moved or renamed files are fine), or start a new run "
      "in another --checkpoint-dir",
      checkpoint, absl::StrJoin(differ, "; ")));
}

}  // namespace

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
  HCP_RETURN_IF_ERROR(CheckSameData(checkpoint, was, now));

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
  note("schedule", std::string(LrDecayName(options.schedule.decay)),
       std::string(LrDecayName(saved.schedule.decay)));
  note("beta1", options.adamw.beta1, saved.optimizer.beta1);
  note("beta2", options.adamw.beta2, saved.optimizer.beta2);
  note("eps", options.adamw.eps, saved.optimizer.eps);
  note("weight-decay", options.adamw.weight_decay, saved.optimizer.weight_decay);
  note("clip", options.adamw.max_grad_norm, saved.optimizer.max_grad_norm);
  note("seed", options.seed, saved.rng.seed);
  // The order is part of where the saved position points: the saved run's stays.
  if (options.given.count("shuffle-seed") && options.shuffle_seed != was.shuffle_seed) {
    notes.push_back(absl::StrCat("--shuffle-seed ", *options.shuffle_seed,
                                 " differs from the saved run's ",
                                 was.shuffle_seed ? absl::StrCat(*was.shuffle_seed)
                                                  : std::string("order (the documents as stored)"),
                                 ": the saved run's order is kept"));
  }
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
  options.shuffle_seed = was.shuffle_seed;
  return notes;
}

absl::StatusOr<ResumeSources> OpenResume(comm::Communicator& comm, const plan::Plan& plan,
                                         const std::string& checkpoint, const RunIdentity& now,
                                         TrainOptions& options) {
  // The saved run first: another model's or batch shape's checkpoint is refused as such.
  absl::StatusOr<TrainState> saved_run = ReadTrainState(checkpoint);
  absl::StatusOr<std::vector<std::string>> notes =
      saved_run.ok() ? AdoptSavedRun(checkpoint, *saved_run, now, options) : saved_run.status();
  HCP_RETURN_IF_ERROR(comm::AgreeOnStatus(comm, notes.status()));
  // The checkpoint holds every parameter's whole tensor (an expert parameter's all shards).
  std::vector<ParamSpec> full;
  for (const plan::Parameter& p : plan.parameters) {
    full.push_back(ParamSpec::WithDefaultDecay(p.name, plan.FullShape(p)));
  }
  absl::StatusOr<TrainStateReader> state = TrainStateReader::Open(checkpoint, full);
  // Weights saved in bf16 have their fp32 masters in the optimizer directory (verified by
  // TrainStateReader::Open): the run continues from those, exactly.
  absl::StatusOr<CheckpointReader> weights =
      !state.ok() ? state.status()
      : state->has_masters()
          ? CheckpointReader::Open((fs::path(checkpoint) / kOptimizerDirName).string())
          : CheckpointReader::OpenVerified(checkpoint);
  absl::Status opened = weights.status();
  if (opened.ok() && state->state().step >= options.steps) {
    opened = absl::InvalidArgumentError(
        absl::StrFormat("%s is after step %d: nothing left of a %d-step run", checkpoint,
                        state->state().step, options.steps));
  }
  HCP_RETURN_IF_ERROR(comm::AgreeOnStatus(comm, opened));
  return ResumeSources{*std::move(notes), *std::move(weights), *std::move(state)};
}

void PrintResumed(const ResumeSources& resume, const std::string& checkpoint) {
  for (const std::string& note : resume.notes) std::printf("%s\n", note.c_str());
  std::printf("resumed from %s (after step %lld)\n", checkpoint.c_str(),
              static_cast<long long>(resume.state.state().step));
}

namespace {

// N of a checkpoint's name "step-N" (CheckpointName); nullopt for any other name.
std::optional<int64_t> CheckpointStep(std::string_view name) {
  if (!name.starts_with("step-")) return std::nullopt;
  name.remove_prefix(5);
  if (name.empty() || name.size() > 18 || name[0] < '0' || name[0] > '9') return std::nullopt;
  int64_t step = 0;
  auto [end, error] = std::from_chars(name.data(), name.data() + name.size(), step);
  if (error != std::errc() || end != name.data() + name.size()) return std::nullopt;
  return step;
}

struct CheckpointEntry {
  int64_t step;
  std::string name;
};
// The entries of `dir` named like checkpoints, newest first.
std::vector<CheckpointEntry> ListCheckpoints(const fs::path& dir) {
  std::vector<CheckpointEntry> found;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    if (std::optional<int64_t> step = CheckpointStep(name)) found.push_back({*step, name});
  }
  std::sort(found.begin(), found.end(),
            [](const CheckpointEntry& a, const CheckpointEntry& b) { return a.step > b.step; });
  return found;
}

// Whether `entry` (a name in `dir`) resolves to something directly inside `dir`: not a link out.
bool InsideDir(const fs::path& dir, const fs::path& entry) {
  std::error_code error;
  const fs::path target = fs::weakly_canonical(entry, error);
  if (error) return false;
  const fs::path home = fs::canonical(dir, error);
  return !error && target.parent_path() == home;
}

// A file's first bytes (`latest` is one short line; anything longer is garbage anyway).
std::string ReadStart(const fs::path& path, size_t limit) {
  std::ifstream in(path, std::ios::binary);
  std::string text(limit, '\0');
  in.read(text.data(), static_cast<std::streamsize>(limit));
  text.resize(static_cast<size_t>(in.gcount()));
  return text;
}
// The name a `latest`-style file holds: its text without surrounding whitespace.
std::string ReadName(const fs::path& path) {
  return std::string(absl::StripAsciiWhitespace(ReadStart(path, 256)));
}

// Creates and removes a file in `dir`: the one test of writability that also holds for root.
absl::Status ProbeWritable(const fs::path& dir) {
  const fs::path probe = dir / absl::StrFormat(".write-probe.%d", getpid());
  const int fd = open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
  int error = fd < 0 ? errno : 0;
  if (fd >= 0) {
    close(fd);
    if (unlink(probe.c_str()) != 0) error = errno;
  }
  if (error == 0) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrFormat(
      "cannot write into --checkpoint-dir %s (%s): no checkpoint could be saved; give a directory "
      "this process can write into",
      dir.string(), std::strerror(error)));
}

// A new run's directory must hold no checkpoints, unless it replaces them on purpose.
// A new run's directory must hold no checkpoints, unless it replaces them on purpose: then they
// stay until the run's first checkpoint takes their place (a run that fails early loses nothing).
absl::Status ClaimForNewRun(const fs::path& dir, bool overwrite) {
  const std::vector<CheckpointEntry> checkpoints = ListCheckpoints(dir);
  std::error_code error;
  bool held = !checkpoints.empty();
  for (const char* file : {kLatestFileName, kLatestFiniteFileName}) {
    held = held || fs::exists(fs::symlink_status(dir / file, error));
  }
  if (!held) return absl::OkStatus();
  const std::string latest = ReadName(dir / kLatestFileName);
  const std::string newest = CheckpointStep(latest) ? latest
                             : !checkpoints.empty() ? checkpoints.front().name
                                                    : std::string("none complete");
  if (overwrite) {
    std::printf(
        "--overwrite-checkpoints: the checkpoints in %s (the latest: %s) go when this run writes "
        "its first\n",
        dir.string().c_str(), newest.c_str());
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrFormat(
      "--checkpoint-dir %s already holds checkpoints (the latest: %s), which a new run would "
      "overwrite: add --resume to continue that run, give another --checkpoint-dir, or add "
      "--overwrite-checkpoints to replace them",
      dir.string(), newest));
}

absl::Status PrepareCheckpointDirOnRoot(const TrainOptions& options) {
  const fs::path dir(options.checkpoint_dir);
  std::error_code error;
  const fs::file_status status = fs::status(dir, error);
  if (fs::exists(status) && !fs::is_directory(status)) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "--checkpoint-dir %s is not a directory (a file is in its place); give a directory for the "
        "checkpoints",
        dir.string()));
  }
  if (!fs::exists(status)) {
    if (options.resume) {
      return absl::NotFoundError(absl::StrFormat(
          "--resume: --checkpoint-dir %s does not exist, so there is no checkpoint to resume from",
          dir.string()));
    }
    fs::create_directories(dir, error);
    if (error) {
      return absl::FailedPreconditionError(
          absl::StrFormat("cannot create --checkpoint-dir %s: %s", dir.string(), error.message()));
    }
  }
  HCP_RETURN_IF_ERROR(ProbeWritable(dir));
  RemoveStaleStaging(dir.string());
  return options.resume ? absl::OkStatus() : ClaimForNewRun(dir, options.overwrite_checkpoints);
}

// Renames damaged checkpoints to "step-N.damaged": kept for a look, but no longer counted (or
// chosen) as checkpoints, so that rotation keeps intact ones.
void SetAside(const std::string& checkpoint_dir, const std::vector<std::string>& damaged) {
  for (const std::string& name : damaged) {
    const fs::path from = fs::path(checkpoint_dir) / name;
    const fs::path to = fs::path(checkpoint_dir) / (name + ".damaged");
    std::error_code error;
    if (fs::exists(to, error)) continue;
    fs::rename(from, to, error);
    if (!error) std::printf("set %s aside as %s\n", from.string().c_str(), to.string().c_str());
  }
}

}  // namespace

absl::Status PrepareCheckpointDir(comm::Communicator& comm, const TrainOptions& options) {
  if (options.checkpoint_dir.empty()) return absl::OkStatus();
  const absl::Status local =
      comm.world_rank() == 0 ? PrepareCheckpointDirOnRoot(options) : absl::OkStatus();
  return comm::AgreeOnStatus(comm, local);
}

void RemoveStaleStaging(const std::string& checkpoint_dir) {
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(checkpoint_dir, error)) {
    const std::string name = entry.path().filename().string();
    const size_t tmp = name.rfind(".tmp.");
    if (tmp == std::string::npos) continue;
    std::string_view base = std::string_view(name).substr(0, tmp);
    const bool ours = base == kLatestFileName || base == kLatestFiniteFileName ||
                      (base.starts_with(".") && CheckpointStep(base.substr(1)));
    std::string_view digits = std::string_view(name).substr(tmp + 5);
    int pid = 0;
    auto [end, parsed] = std::from_chars(digits.data(), digits.data() + digits.size(), pid);
    if (!ours || parsed != std::errc() || end != digits.data() + digits.size() || pid <= 0) {
      continue;
    }
    if (kill(pid, 0) == 0 || errno != ESRCH) continue;  // alive, or not ours to judge
    fs::remove_all(entry.path(), error);
    if (!error) {
      std::printf(
          "removed %s (left by an interrupted checkpoint write of process %d, which has "
          "ended)\n",
          entry.path().string().c_str(), pid);
    }
  }
}

absl::StatusOr<ResumeChoice> ChooseCheckpoint(
    const std::string& checkpoint_dir,
    const std::function<absl::Status(const std::string&)>& open) {
  const fs::path dir(checkpoint_dir);
  const fs::path latest_path = dir / kLatestFileName;
  const std::vector<CheckpointEntry> all = ListCheckpoints(dir);
  std::error_code error;
  // What is wrong with `latest`, in words, when it does not name an intact checkpoint.
  std::string problem;
  std::optional<int64_t> named;
  std::vector<std::string> damaged;
  if (!fs::exists(fs::symlink_status(latest_path, error))) {
    if (all.empty()) {
      return absl::NotFoundError(
          absl::StrFormat("%s has no complete checkpoint to resume from (no '%s' file)",
                          checkpoint_dir, kLatestFileName));
    }
    problem = absl::StrFormat("%s has no '%s' file", checkpoint_dir, kLatestFileName);
  } else {
    const std::string text = ReadStart(latest_path, 256);
    const std::string name(absl::StripAsciiWhitespace(text));
    const auto outside = [&](std::string_view why) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s names '%s', %s: a checkpoint is read only from inside --checkpoint-dir %s; fix or "
          "remove %s",
          latest_path.string(), absl::CHexEscape(name), why, checkpoint_dir, latest_path.string()));
    };
    if (name.find('/') != std::string::npos || name == "." || name == "..") {
      return outside("a path outside the checkpoint directory");
    }
    named = CheckpointStep(name);
    if (name.empty()) {
      problem = absl::StrFormat("%s is empty", latest_path.string());
    } else if (!named) {
      problem = absl::StrFormat("%s holds '%s', not a checkpoint's name", latest_path.string(),
                                absl::CHexEscape(text.substr(0, 40)));
    } else {
      const fs::path target = dir / name;
      if (!fs::exists(target, error)) {
        problem = absl::StrFormat("latest names %s, which is missing", name);
      } else if (!InsideDir(dir, target)) {
        return outside("a link out of the checkpoint directory");
      } else {
        absl::Status opened = open(target.string());
        if (opened.ok()) return ResumeChoice{target.string(), *named, "", {}};
        problem = absl::StrFormat("latest names %s, which is damaged (%s)", name, opened.message());
        damaged.push_back(name);
      }
    }
  }
  // The previous intact checkpoint: the newest older one that opens.
  std::vector<std::string> failed;
  for (const CheckpointEntry& c : all) {
    const fs::path path = dir / c.name;
    if ((named && c.step >= *named) || !InsideDir(dir, path)) continue;
    absl::Status opened = open(path.string());
    if (opened.ok()) {
      return ResumeChoice{path.string(), c.step,
                          absl::StrFormat("%s; resuming from %s instead", problem, c.name),
                          std::move(damaged)};
    }
    failed.push_back(absl::StrFormat("%s: %s", c.name, opened.message()));
    damaged.push_back(c.name);
  }
  return absl::FailedPreconditionError(absl::StrFormat(
      "cannot resume from %s: %s, and %s", checkpoint_dir, problem,
      failed.empty()
          ? std::string("there is no older checkpoint to fall back to")
          : "no older checkpoint is intact either (" + absl::StrJoin(failed, "; ") + ")"));
}

absl::StatusOr<std::string> CheckpointToResume(comm::Communicator& comm,
                                               const TrainOptions& options) {
  if (options.checkpoint_dir.empty()) {
    return absl::InvalidArgumentError("--resume needs --checkpoint-dir");
  }
  // Rank 0 decides and tells the others (ranks on other nodes may see the files at another
  // moment; they must all load the same checkpoint).
  absl::StatusOr<ResumeChoice> choice = ResumeChoice{};
  if (comm.world_rank() == 0) {
    // Intact: whole and undamaged, whichever run wrote it (a checkpoint of another model is
    // refused by the resume, not passed over as damaged).
    choice = ChooseCheckpoint(options.checkpoint_dir, [&](const std::string& dir) {
      absl::StatusOr<CheckpointReader> weights = CheckpointReader::OpenVerified(dir);
      if (!weights.ok()) return weights.status();
      return CheckTrainStateIntact(dir);
    });
    if (choice.ok() && !choice->note.empty()) std::printf("%s\n", choice->note.c_str());
    if (choice.ok()) SetAside(options.checkpoint_dir, choice->damaged);
  }
  HCP_RETURN_IF_ERROR(comm::AgreeOnStatus(comm, choice.status()));
  double step = comm.world_rank() == 0 ? static_cast<double>(choice->step) : 0.0;
  comm.AllReduceSum(&step, 1, comm::Group::kWorld);
  return (fs::path(options.checkpoint_dir) / CheckpointName(static_cast<int64_t>(step))).string();
}

absl::Status PublishCheckpoint(const std::string& checkpoint_dir, int64_t steps_done,
                               const Retention& retention,
                               const std::function<absl::Status(const std::string&)>& write) {
  const std::string name = CheckpointName(steps_done);
  const fs::path dir(checkpoint_dir);
  RemoveStaleStaging(checkpoint_dir);
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
  if (written.ok() && retention.finite) {
    written = WriteFileAtomically((dir / kLatestFiniteFileName).string(), name + "\n");
  }
  if (!written.ok()) {
    fs::remove_all(staging, error);
    return written;
  }
  std::printf("checkpoint %s\n", (dir / name).string().c_str());
  if (retention.replace_others) {
    std::vector<std::string> removed;
    for (const CheckpointEntry& c : ListCheckpoints(dir)) {
      if (c.step == steps_done) continue;
      fs::remove_all(dir / c.name, error);
      removed.push_back(c.name);
    }
    // An earlier run's latest-finite names one of them.
    if (!retention.finite) fs::remove(dir / kLatestFiniteFileName, error);
    if (!removed.empty()) {
      std::printf("--overwrite-checkpoints: removed the earlier checkpoints %s\n",
                  absl::StrJoin(removed, ", ").c_str());
    }
    return absl::OkStatus();
  }
  if (retention.keep == 0) return absl::OkStatus();
  // The newest `keep` stay, and the newest known finite: never rotate away the last good weights
  // because later steps were skipped.
  const std::optional<int64_t> finite = CheckpointStep(ReadName(dir / kLatestFiniteFileName));
  int64_t kept = 1;  // the new one
  for (const CheckpointEntry& c : ListCheckpoints(dir)) {
    if (c.step >= steps_done) continue;  // the new one, or newer ones this run did not write
    if (kept < retention.keep) {
      ++kept;
      continue;
    }
    if (c.step == finite || c.step == retention.also_keep) continue;
    fs::remove_all(dir / c.name, error);
  }
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
    weights.push_back({name, c.weights_dtype, shape, c.values[i], {}});
    // Rounded weights cannot continue the run exactly: the fp32 masters go with the moments.
    const std::span<const float> master =
        c.weights_dtype == DType::F32 ? std::span<const float>() : c.values[i];
    moments.push_back({name, shape, c.exp_avg[i], c.exp_avg_sq[i], master});
  }
  HCP_RETURN_IF_ERROR(WriteCheckpoint(dir, weights));
  if (!c.model_config.empty()) {
    HCP_RETURN_IF_ERROR(
        WriteFileAtomically((fs::path(dir) / "config.json").string(), c.model_config));
  }
  if (c.tokenizer != nullptr) HCP_RETURN_IF_ERROR(WriteTokenizerFiles(*c.tokenizer, dir));
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
  // The last checkpoint (or the start) and whether an update was applied since: skipped steps
  // change nothing worth saving.
  int64_t saved = first_step;
  bool applied_since_saved = false;
  // The newest checkpoint known finite: the one the run resumed from, then each one written after
  // an applied update.
  int64_t newest_finite = options.resume ? first_step : -1;
  double eval_s = 0;  // time spent evaluating: not training throughput
  for (int64_t step = first_step; step < last; ++step) {
    HCP_RETURN_IF_ERROR(hooks.step(step, record));
    record.tokens += tokens_per_step;
    record.eval_loss = std::numeric_limits<double>::quiet_NaN();
    record.eval_tokens = 0;
    const bool evaluated = hooks.evaluate && EvalDue(options, step + 1, last);
    if (evaluated) {
      const auto eval_start = Clock::now();
      HCP_RETURN_IF_ERROR(hooks.evaluate(step + 1, record));
      eval_s += std::chrono::duration<double>(Clock::now() - eval_start).count();
    }
    record.elapsed_s = std::chrono::duration<double>(Clock::now() - start).count();
    record.tokens_per_s =
        (record.tokens - tokens_at_start) / std::max(record.elapsed_s - eval_s, 1e-9);
    if (root) {
      if (metrics != nullptr) HCP_RETURN_IF_ERROR(metrics->Append(record));
      const bool log = (step + 1) % std::max<int64_t>(options.log_every, 1) == 0 ||
                       step == first_step || step + 1 == last || evaluated;
      if (log) {
        const double eta =
            EstimateEta(record.elapsed_s, step + 1 - first_step, options.steps - step - 1);
        std::printf("%s\n", FormatProgress(record, options.steps, eta).c_str());
        std::fflush(stdout);
      }
    }
    applied_since_saved = applied_since_saved || !record.skipped;
    const bool checkpoint =
        !options.checkpoint_dir.empty() &&
        ((options.checkpoint_every > 0 && (step + 1) % options.checkpoint_every == 0) ||
         step + 1 == last);
    if (!checkpoint) continue;
    if (!applied_since_saved) {
      if (root) {
        const std::string skipped =
            saved + 1 == step + 1
                ? absl::StrFormat("step %d was skipped", step + 1)
                : absl::StrFormat("steps %d-%d were all skipped", saved + 1, step + 1);
        const std::string kept =
            options.resume || saved > first_step
                ? absl::StrFormat("; %s stays the latest", CheckpointName(saved))
                : "";
        std::printf("no checkpoint after step %lld: %s (no update to save)%s\n",
                    static_cast<long long>(step + 1), skipped.c_str(), kept.c_str());
        std::fflush(stdout);
      }
      continue;
    }
    const bool finite = !record.skipped;
    // With --overwrite-checkpoints, the run's first checkpoint replaces the earlier ones.
    const Retention retention{options.keep_checkpoints, finite, finite ? -1 : newest_finite,
                              options.overwrite_checkpoints && saved == first_step};
    HCP_RETURN_IF_ERROR(hooks.save(step + 1, retention));
    if (finite) newest_finite = step + 1;
    saved = step + 1;
    applied_since_saved = false;
  }
  return absl::OkStatus();
}

}  // namespace hcp::train
