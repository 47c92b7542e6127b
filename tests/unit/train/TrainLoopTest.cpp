// The checkpoint directory protocol both training loops use (runtime/train/TrainLoop.h): a
// checkpoint appears whole or not at all, `latest` names the last complete one, the newest two
// are kept; the step loop's cadence of steps and checkpoints; the run a checkpoint records and
// what a resume does with it.
#include "runtime/train/TrainLoop.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/ScratchFiles.h"
#include "tests/unit/train/TestUtil.h"

namespace hcp::train {
namespace {

using hcp::testing::ScratchDir;
using hcp::train::testing::FailsWith;

// A checkpoint writer that puts one file into the staging directory.
absl::Status WriteMarker(const std::string& dir) {
  std::filesystem::create_directories(dir);
  std::ofstream(std::filesystem::path(dir) / "marker") << "x";
  return absl::OkStatus();
}

std::string ReadLatest(const ScratchDir& dir) {
  std::ifstream in(dir / kLatestFileName);
  std::string name;
  in >> name;
  return name;
}

TEST(PublishCheckpoint, KeepsTheNewestTwoAndNamesTheLast) {
  ScratchDir dir;
  for (int64_t step : {3, 6, 9, 12}) {
    ASSERT_TRUE(PublishCheckpoint(dir.path(), step, WriteMarker).ok());
  }
  EXPECT_EQ(dir.List(), (std::vector<std::string>{"latest", "step-000009", "step-000012"}));
  EXPECT_EQ(ReadLatest(dir), "step-000012");
  EXPECT_TRUE(std::filesystem::exists(dir / "step-000012/marker"));
  absl::StatusOr<std::string> latest = LatestCheckpoint(dir.path());
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(*latest, dir / "step-000012");
}

TEST(PublishCheckpoint, AFailedWriteLeavesThePreviousCheckpointInCharge) {
  ScratchDir dir;
  ASSERT_TRUE(PublishCheckpoint(dir.path(), 4, WriteMarker).ok());
  absl::Status failed = PublishCheckpoint(dir.path(), 8, [](const std::string& staging) {
    WriteMarker(staging).IgnoreError();  // half written, then the disk is full
    return absl::ResourceExhaustedError("no space left on device");
  });
  EXPECT_EQ(failed.code(), absl::StatusCode::kResourceExhausted);
  // No staging directory, no step-8 checkpoint, `latest` unchanged.
  EXPECT_EQ(dir.List(), (std::vector<std::string>{"latest", "step-000004"}));
  EXPECT_EQ(ReadLatest(dir), "step-000004");
}

TEST(LatestCheckpoint, SaysThereIsNoneToResumeFrom) {
  ScratchDir dir;
  absl::StatusOr<std::string> latest = LatestCheckpoint(dir.path());
  EXPECT_EQ(latest.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(latest.status().message().find("no complete checkpoint to resume from"),
            std::string::npos);
}

TEST(RunTrainingSteps, RunsFromTheFirstStepAndCheckpointsOnSchedule) {
  TrainOptions options;
  options.steps = 10;
  options.stop_after = 8;
  options.checkpoint_dir = "unused";  // the save hook records instead of writing
  options.checkpoint_every = 3;
  options.log_every = 100;
  std::vector<int64_t> stepped, saved;
  LoopHooks hooks;
  hooks.step = [&](int64_t step, MetricsRecord& record) {
    stepped.push_back(step);
    record.step = step + 1;
    return absl::OkStatus();
  };
  hooks.save = [&](int64_t steps_done) {
    saved.push_back(steps_done);
    return absl::OkStatus();
  };
  // Resumed after step 2: steps 2..7 (0-based), checkpoints after 3 and 6 and at the stop (8).
  ASSERT_TRUE(RunTrainingSteps(options, /*root=*/false, /*first_step=*/2, /*tokens_per_step=*/64,
                               nullptr, hooks)
                  .ok());
  EXPECT_EQ(stepped, (std::vector<int64_t>{2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(saved, (std::vector<int64_t>{3, 6, 8}));
}

TEST(RunTrainingSteps, StopsAtTheFirstFailingStep) {
  TrainOptions options;
  options.steps = 5;
  int calls = 0;
  LoopHooks hooks;
  hooks.step = [&](int64_t step, MetricsRecord&) {
    ++calls;
    return step == 1 ? absl::InternalError("step failed") : absl::OkStatus();
  };
  hooks.save = [](int64_t) { return absl::OkStatus(); };
  EXPECT_EQ(RunTrainingSteps(options, false, 0, 1, nullptr, hooks).code(),
            absl::StatusCode::kInternal);
  EXPECT_EQ(calls, 2);
}

// --- the run a checkpoint records --------------------------------------------------------------

// A plan with parameters of these names and buffer shapes (nothing else: what IdentifyRun reads).
plan::Plan PlanWith(const std::vector<std::pair<std::string, std::vector<int64_t>>>& params) {
  plan::Plan plan;
  plan.seq = 64;
  plan.micro_batch = 2;
  for (const auto& [name, shape] : params) {
    plan::Buffer buffer;
    buffer.name = name;
    buffer.arena = plan::Arena::Parameters;
    buffer.shape = shape;
    plan::Parameter p;
    p.name = name;
    p.buffer = static_cast<uint32_t>(plan.buffers.size());
    plan.buffers.push_back(buffer);
    plan.parameters.push_back(p);
  }
  return plan;
}

const std::vector<std::pair<std::string, std::vector<int64_t>>> kModel = {
    {"model.embed_tokens.weight", {320, 64}},
    {"model.layers.0.mamba.in_proj.weight", {292, 64}},
    {"model.layers.1.self_attn.q_proj.weight", {64, 64}},
    {"model.layers.1.block_sparse_moe.input_linear.weight", {4, 128, 64}}};

TEST(IdentifyRun, TheModelIsItsParametersWhateverTheSplit) {
  const RunIdentity one = IdentifyRun(PlanWith(kModel), /*grad_accum=*/2, {});
  EXPECT_EQ(one.model.size(), 8u);
  EXPECT_EQ(one.parameters, 4);
  EXPECT_EQ(one.global_batch, 4);
  EXPECT_EQ(one.dtype, "f32");

  // cp 2, dp 2 and the experts split over ep 2 (each rank's buffer holds half the experts): the
  // same model, and with grad-accum 1 the same global batch.
  plan::Plan split = PlanWith(kModel);
  split.mesh = {.cp = 2, .dp = 2, .layout = plan::SequenceLayout::Zigzag, .ep = 2};
  split.parameters[3].shards = 2;
  split.parameters[3].full_shape = {4, 128, 64};
  split.buffers[3].shape = {2, 128, 64};
  std::swap(split.parameters[0], split.parameters[1]);  // another order
  EXPECT_EQ(IdentifyRun(split, 1, {}), one);

  // Another model: a parameter renamed (another layer kind), one of another shape.
  auto renamed = kModel;
  renamed[2].first = "model.layers.2.self_attn.q_proj.weight";
  EXPECT_NE(IdentifyRun(PlanWith(renamed), 2, {}).model, one.model);
  auto reshaped = kModel;
  reshaped[3].second = {8, 64, 64};
  EXPECT_NE(IdentifyRun(PlanWith(reshaped), 2, {}).model, one.model);

  plan::Plan bf16 = PlanWith(kModel);
  bf16.buffers[0].dtype = plan::DType::BF16;
  EXPECT_EQ(IdentifyRun(bf16, 2, {}).dtype, "bf16");
}

// A saved run of kModel after step 4 of 12.
TrainState SavedRun() {
  TrainState saved;
  saved.step = 4;
  saved.optimizer_updates = 4;
  saved.rng = {1, 0};
  saved.optimizer = {.weight_decay = 0.1, .max_grad_norm = 1.0};
  saved.schedule = {.max_lr = 3e-3, .min_lr = 3e-4, .warmup_steps = 2, .total_steps = 12};
  saved.run = IdentifyRun(PlanWith(kModel), 2, {"/data/corpus.bin", 1000, "0b6f3c21"});
  return saved;
}

// The command line of the resumed run: the saved run's values, unless a test changes them.
TrainOptions SameOptions() {
  TrainOptions o;
  o.steps = 12;
  o.seed = 1;
  o.adamw = SavedRun().optimizer;
  o.schedule = SavedRun().schedule;
  return o;
}

TEST(AdoptSavedRun, AnotherRunIsRefusedNamingEachDifference) {
  const TrainState saved = SavedRun();
  TrainOptions options = SameOptions();
  RunIdentity now = saved.run;
  now.data.path = "/elsewhere/moved.bin";  // the same data moved: fine
  absl::StatusOr<std::vector<std::string>> notes = AdoptSavedRun("ck", saved, now, options);
  ASSERT_TRUE(notes.ok()) << notes.status();
  EXPECT_TRUE(notes->empty());

  now = saved.run;
  now.seq = 128;
  now.micro_batch = 1;
  now.global_batch = 2;
  now.dtype = "bf16";
  absl::Status status = AdoptSavedRun("ck", saved, now, options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(FailsWith(status,
                        "cannot resume from ck: it was written by another run: seq 64 saved, 128 "
                        "now; micro-batch 2 saved, 1 now; global batch (micro-batch x dp x "
                        "grad-accum) 4 saved, 2 now; dtype f32 saved, bf16 now; resume with"));

  now = IdentifyRun(PlanWith({{"w", {2, 2}}}), 2, saved.run.data);
  EXPECT_TRUE(FailsWith(AdoptSavedRun("ck", saved, now, options).status(),
                        "another model (saved: 4 parameters, identity " + saved.run.model +
                            "; this plan: 1 parameters, identity " + now.model + ")"));

  now = saved.run;
  now.data = {"/data/other.bin", 1000, "12345678"};
  EXPECT_TRUE(FailsWith(AdoptSavedRun("ck", saved, now, options).status(),
                        "--data /data/other.bin (1000 bytes, crc32c of its first MiB 12345678) is "
                        "not the data the run trained on (/data/corpus.bin: 1000 bytes, "
                        "0b6f3c21); give --data that file"));
  // Refused: the options are not touched.
  EXPECT_EQ(options.seed, 1u);
}

TEST(AdoptSavedRun, TheSavedSettingsAreKeptAndEachGivenDifferenceSaidOnce) {
  const TrainState saved = SavedRun();
  TrainOptions options = SameOptions();
  options.schedule = {.max_lr = 0.01, .min_lr = 0.001, .warmup_steps = 0, .total_steps = 12};
  options.adamw.weight_decay = 0.5;
  options.adamw.max_grad_norm = 0;
  options.seed = 9;
  // Given on the command line: all but --warmup (its default differs, unsaid).
  options.given = {"lr", "min-lr", "weight-decay", "clip", "seed"};
  absl::StatusOr<std::vector<std::string>> notes = AdoptSavedRun("ck", saved, saved.run, options);
  ASSERT_TRUE(notes.ok()) << notes.status();
  EXPECT_EQ(
      *notes,
      (std::vector<std::string>{
          "--lr 0.01 differs from the saved run's 0.003: the saved run's value is kept",
          "--min-lr 0.001 differs from the saved run's 0.0003: the saved run's value is kept",
          "--weight-decay 0.5 differs from the saved run's 0.1: the saved run's value is kept",
          "--clip 0 differs from the saved run's 1: the saved run's value is kept",
          "--seed 9 differs from the saved run's 1: the saved run's value is kept"}));
  EXPECT_EQ(options.schedule.max_lr, 3e-3);
  EXPECT_EQ(options.schedule.warmup_steps, 2);
  EXPECT_EQ(options.schedule.total_steps, 12);
  EXPECT_EQ(options.adamw.weight_decay, 0.1);
  EXPECT_EQ(options.adamw.max_grad_norm, 1.0);
  EXPECT_EQ(options.seed, 1u);
}

TEST(AdoptSavedRun, StepsSaysWhereThisRunEndsAndTheScheduleStays) {
  const TrainState saved = SavedRun();
  TrainOptions longer = SameOptions();
  longer.steps = 20;
  longer.schedule.total_steps = 20;  // as PrepareOptions sets it
  absl::StatusOr<std::vector<std::string>> notes = AdoptSavedRun("ck", saved, saved.run, longer);
  ASSERT_TRUE(notes.ok()) << notes.status();
  EXPECT_EQ(*notes, std::vector<std::string>{
                        "--steps 20 differs from the saved run's 12: this run ends after step 20, "
                        "and the learning-rate schedule stays the saved run's 12-step one (steps "
                        "13-20 at its min-lr 0.0003)"});
  EXPECT_EQ(longer.steps, 20);
  EXPECT_EQ(longer.schedule.total_steps, 12);

  TrainOptions shorter = SameOptions();
  shorter.steps = 8;
  notes = AdoptSavedRun("ck", saved, saved.run, shorter);
  ASSERT_TRUE(notes.ok());
  EXPECT_EQ(*notes, std::vector<std::string>{
                        "--steps 8 differs from the saved run's 12: this run ends after step 8, "
                        "and the learning-rate schedule stays the saved run's 12-step one (it "
                        "ends unfinished)"});
}

TEST(StateAfter, RecordsTheRun) {
  TrainingData data;
  data.run = SavedRun().run;
  ScratchDir dir;
  const std::vector<uint32_t> tokens(100, 7);
  ASSERT_TRUE(WriteTokenFile(dir / "tokens.bin", tokens, TokenDType::U16).ok());
  absl::StatusOr<TokenFile> file = TokenFile::Open(dir / "tokens.bin");
  ASSERT_TRUE(file.ok()) << file.status();
  data.file = std::make_unique<TokenFile>(*std::move(file));
  absl::StatusOr<TokenBatcher> batcher = TokenBatcher::Create(*data.file, {8, 1, 1, 1, 256});
  ASSERT_TRUE(batcher.ok()) << batcher.status();
  data.batcher = *std::move(batcher);
  const TrainState state = StateAfter(3, data, SameOptions(), 3);
  EXPECT_EQ(state.run, data.run);
  EXPECT_EQ(state.step, 3);
  EXPECT_TRUE(ValidateTrainState(state).ok()) << ValidateTrainState(state);
}

}  // namespace
}  // namespace hcp::train
