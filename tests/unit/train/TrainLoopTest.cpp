// The checkpoint directory protocol both training loops use (runtime/train/TrainLoop.h): the
// directory is checked before step 1 (a new run never overwrites checkpoints), a checkpoint
// appears whole or not at all, `latest` names the last complete one, the newest N are kept and
// never the newest known finite one removed, leftovers of dead writers are cleaned, a damaged
// `latest` falls back to the previous intact checkpoint; and the step loop's cadence of steps and
// checkpoints, where skipped steps are no progress; the run a checkpoint records and what a
// resume does with it.
#include "runtime/train/TrainLoop.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "tests/unit/ScratchFiles.h"
#include "tests/unit/train/TestUtil.h"

namespace hcp::train {
namespace {

namespace fs = std::filesystem;
using hcp::testing::ReadFileBytes;
using hcp::testing::ScratchDir;
using hcp::testing::WriteFileBytes;

bool Contains(const absl::Status& status, const std::string& text) {
  return status.message().find(text) != std::string_view::npos;
}
using hcp::train::testing::FailsWith;

// A checkpoint writer that puts one file into the staging directory.
absl::Status WriteMarker(const std::string& dir) {
  std::filesystem::create_directories(dir);
  std::ofstream(std::filesystem::path(dir) / "marker") << "x";
  return absl::OkStatus();
}

// Opens when the writer's marker is there.
absl::Status OpensWithMarker(const std::string& dir) {
  if (fs::exists(fs::path(dir) / "marker")) return absl::OkStatus();
  return absl::DataLossError("no marker");
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
    ASSERT_TRUE(PublishCheckpoint(dir.path(), step, {}, WriteMarker).ok());
  }
  EXPECT_EQ(dir.List(),
            (std::vector<std::string>{"latest", "latest-finite", "step-000009", "step-000012"}));
  EXPECT_EQ(ReadLatest(dir), "step-000012");
  EXPECT_TRUE(fs::exists(dir / "step-000012/marker"));
  absl::StatusOr<ResumeChoice> latest = ChooseCheckpoint(dir.path(), OpensWithMarker);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->path, dir / "step-000012");
  EXPECT_EQ(latest->note, "");
}

TEST(PublishCheckpoint, KeepsAsManyAsAskedOrAll) {
  ScratchDir three, all;
  for (int64_t step : {1, 2, 3, 4, 5}) {
    ASSERT_TRUE(PublishCheckpoint(three.path(), step, {.keep = 3}, WriteMarker).ok());
    ASSERT_TRUE(PublishCheckpoint(all.path(), step, {.keep = 0}, WriteMarker).ok());
  }
  EXPECT_EQ(three.List(), (std::vector<std::string>{"latest", "latest-finite", "step-000003",
                                                    "step-000004", "step-000005"}));
  EXPECT_EQ(all.List().size(), 7u);
}

// Steps are numbers, not strings: step-1000000 is newer than step-999999.
TEST(PublishCheckpoint, RotatesByStepNumber) {
  ScratchDir dir;
  for (int64_t step : {999998, 999999, 1000000}) {
    ASSERT_TRUE(PublishCheckpoint(dir.path(), step, {}, WriteMarker).ok());
  }
  EXPECT_EQ(dir.List(),
            (std::vector<std::string>{"latest", "latest-finite", "step-1000000", "step-999999"}));
}

// Checkpoints written after skipped steps do not rotate away the last one known finite, which
// latest-finite names.
TEST(PublishCheckpoint, NeverRemovesTheNewestKnownFinite) {
  ScratchDir dir;
  ASSERT_TRUE(PublishCheckpoint(dir.path(), 3, {.finite = true}, WriteMarker).ok());
  for (int64_t step : {6, 9, 12}) {
    ASSERT_TRUE(PublishCheckpoint(dir.path(), step, {.finite = false}, WriteMarker).ok());
  }
  EXPECT_EQ(dir.List(), (std::vector<std::string>{"latest", "latest-finite", "step-000003",
                                                  "step-000009", "step-000012"}));
  EXPECT_EQ(ReadFileBytes(dir / "latest-finite"), "step-000003\n");
  // A finite one takes over; the old one may go.
  ASSERT_TRUE(PublishCheckpoint(dir.path(), 15, {.finite = true}, WriteMarker).ok());
  EXPECT_EQ(dir.List(),
            (std::vector<std::string>{"latest", "latest-finite", "step-000012", "step-000015"}));
}

// The checkpoint a run resumed from stays while it is the newest known finite (also_keep).
TEST(PublishCheckpoint, KeepsTheCheckpointTheRunResumedFrom) {
  ScratchDir dir;
  for (int64_t step : {2, 4}) {
    ASSERT_TRUE(PublishCheckpoint(dir.path(), step, {.finite = false}, WriteMarker).ok());
  }
  ASSERT_TRUE(
      PublishCheckpoint(dir.path(), 6, {.keep = 1, .finite = false, .also_keep = 2}, WriteMarker)
          .ok());
  EXPECT_EQ(dir.List(), (std::vector<std::string>{"latest", "step-000002", "step-000006"}));
}

TEST(PublishCheckpoint, AFailedWriteLeavesThePreviousCheckpointInCharge) {
  ScratchDir dir;
  ASSERT_TRUE(PublishCheckpoint(dir.path(), 4, {}, WriteMarker).ok());
  absl::Status failed = PublishCheckpoint(dir.path(), 8, {}, [](const std::string& staging) {
    WriteMarker(staging).IgnoreError();  // half written, then the disk is full
    return absl::ResourceExhaustedError("no space left on device");
  });
  EXPECT_EQ(failed.code(), absl::StatusCode::kResourceExhausted);
  // No staging directory, no step-8 checkpoint, `latest` unchanged.
  EXPECT_EQ(dir.List(), (std::vector<std::string>{"latest", "latest-finite", "step-000004"}));
  EXPECT_EQ(ReadLatest(dir), "step-000004");
}

// A process id that is no longer running: a child that has exited and been reaped.
pid_t DeadPid() {
  const pid_t child = fork();
  if (child == 0) _exit(0);
  waitpid(child, nullptr, 0);
  return child;
}

TEST(RemoveStaleStaging, RemovesTheLeftoversOfEndedProcessesOnly) {
  ScratchDir dir;
  const pid_t dead = DeadPid();
  const std::string dead_staging = absl::StrFormat(".step-000008.tmp.%d", dead);
  const std::string live_staging = absl::StrFormat(".step-000008.tmp.%d", getpid());
  for (const std::string& name : {dead_staging, live_staging})
    WriteMarker(dir / name).IgnoreError();
  WriteFileBytes(dir / absl::StrFormat("latest.tmp.%d", dead), "step-000008\n");
  WriteFileBytes(dir / absl::StrFormat("notes.tmp.%d", dead), "not ours");
  RemoveStaleStaging(dir.path());
  EXPECT_EQ(dir.List(),
            (std::vector<std::string>{live_staging, absl::StrFormat("notes.tmp.%d", dead)}));
  // The next checkpoint cleans up too.
  const std::string again = absl::StrFormat(".step-000004.tmp.%d", dead);
  WriteMarker(dir / again).IgnoreError();
  ASSERT_TRUE(PublishCheckpoint(dir.path(), 12, {}, WriteMarker).ok());
  EXPECT_FALSE(fs::exists(dir / again));
  EXPECT_TRUE(fs::exists(dir / live_staging));
}

// --- resuming ----------------------------------------------------------------------------------

void MakeCheckpoint(const ScratchDir& dir, int64_t step) {
  WriteMarker(dir / CheckpointName(step)).IgnoreError();
}

TEST(ChooseCheckpoint, SaysThereIsNoneToResumeFrom) {
  ScratchDir dir;
  absl::StatusOr<ResumeChoice> latest = ChooseCheckpoint(dir.path(), OpensWithMarker);
  EXPECT_EQ(latest.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Contains(latest.status(), "no complete checkpoint to resume from"));
}

TEST(ChooseCheckpoint, FallsBackFromADamagedLatestToThePreviousIntactOne) {
  ScratchDir dir;
  MakeCheckpoint(dir, 6);
  MakeCheckpoint(dir, 9);
  fs::create_directories(dir / "step-000012");  // incomplete: no marker
  WriteFileBytes(dir / "latest", "step-000012\n");
  absl::StatusOr<ResumeChoice> choice = ChooseCheckpoint(dir.path(), OpensWithMarker);
  ASSERT_TRUE(choice.ok()) << choice.status();
  EXPECT_EQ(choice->path, dir / "step-000009");
  EXPECT_EQ(choice->step, 9);
  EXPECT_EQ(choice->note,
            "latest names step-000012, which is damaged (no marker); resuming from step-000009 "
            "instead");
  EXPECT_EQ(choice->damaged, std::vector<std::string>{"step-000012"});
}

// Garbage, an empty file, a missing checkpoint or no latest at all: the newest that opens.
TEST(ChooseCheckpoint, FallsBackFromAnyCorruptLatest) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"step-000012\n", "latest names step-000012, which is missing"},
      {"", "is empty"},
      {"\x01garbage\xff", "holds '\\x01garbage\\xff', not a checkpoint's name"},
      {"step-12x", "not a checkpoint's name"},
      {"step--5", "not a checkpoint's name"},
  };
  for (const auto& [text, why] : cases) {
    ScratchDir dir;
    MakeCheckpoint(dir, 3);
    MakeCheckpoint(dir, 6);
    WriteFileBytes(dir / "latest", text);
    absl::StatusOr<ResumeChoice> choice = ChooseCheckpoint(dir.path(), OpensWithMarker);
    ASSERT_TRUE(choice.ok()) << text << ": " << choice.status();
    EXPECT_EQ(choice->step, 6) << text;
    EXPECT_NE(choice->note.find(why), std::string::npos) << choice->note;
    EXPECT_NE(choice->note.find("resuming from step-000006 instead"), std::string::npos);
  }
  ScratchDir no_latest;
  MakeCheckpoint(no_latest, 6);
  absl::StatusOr<ResumeChoice> choice = ChooseCheckpoint(no_latest.path(), OpensWithMarker);
  ASSERT_TRUE(choice.ok()) << choice.status();
  EXPECT_NE(choice->note.find("has no 'latest' file"), std::string::npos) << choice->note;
}

TEST(ChooseCheckpoint, RefusesALatestOutsideTheDirectory) {
  ScratchDir elsewhere;
  MakeCheckpoint(elsewhere, 5);
  for (const std::string& text : {elsewhere / "step-000005", std::string("../step-000005"),
                                  std::string(".."), std::string("step-000005/../../x")}) {
    ScratchDir dir;
    MakeCheckpoint(dir, 3);
    WriteFileBytes(dir / "latest", text + "\n");
    absl::StatusOr<ResumeChoice> choice = ChooseCheckpoint(dir.path(), OpensWithMarker);
    EXPECT_EQ(choice.status().code(), absl::StatusCode::kFailedPrecondition) << text;
    EXPECT_TRUE(Contains(choice.status(), "outside the checkpoint directory")) << choice.status();
  }
  ScratchDir dir;
  fs::create_directory_symlink(elsewhere / "step-000005", dir / "step-000007");
  WriteFileBytes(dir / "latest", "step-000007\n");
  absl::StatusOr<ResumeChoice> choice = ChooseCheckpoint(dir.path(), OpensWithMarker);
  EXPECT_EQ(choice.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(choice.status(), "a link out of the checkpoint directory"))
      << choice.status();
}

TEST(ChooseCheckpoint, RefusesWhenNoCheckpointIsIntactNamingThemAll) {
  ScratchDir dir;
  fs::create_directories(dir / "step-000004");
  fs::create_directories(dir / "step-000008");
  WriteFileBytes(dir / "latest", "step-000008\n");
  absl::StatusOr<ResumeChoice> choice = ChooseCheckpoint(dir.path(), OpensWithMarker);
  EXPECT_EQ(choice.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(choice.status().message(),
            absl::StrFormat("cannot resume from %s: latest names step-000008, which is damaged "
                            "(no marker), and no older checkpoint is intact either "
                            "(step-000004: no marker)",
                            dir.path()));
}

// --- the directory, before step 1 -----------------------------------------------------------

absl::Status Prepare(const std::string& dir, bool resume = false, bool overwrite = false) {
  comm::LocalCommunicator comm;
  TrainOptions options;
  options.checkpoint_dir = dir;
  options.resume = resume;
  options.overwrite_checkpoints = overwrite;
  return PrepareCheckpointDir(comm, options);
}

TEST(PrepareCheckpointDir, CreatesTheDirectoryOfANewRun) {
  ScratchDir dir;
  ASSERT_TRUE(Prepare(dir / "a/b").ok());
  EXPECT_TRUE(fs::is_directory(dir / "a/b"));
  EXPECT_TRUE(fs::is_empty(dir / "a/b"));  // the probe is gone
}

TEST(PrepareCheckpointDir, RefusesWhatCannotHoldCheckpoints) {
  ScratchDir dir;
  WriteFileBytes(dir / "file", "data");
  absl::Status file = Prepare(dir / "file");
  EXPECT_EQ(file.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(file, "--checkpoint-dir " + (dir / "file") + " is not a directory")) << file;
  absl::Status under = Prepare(dir / "file/ckpt");
  EXPECT_TRUE(Contains(under, "cannot create --checkpoint-dir " + (dir / "file/ckpt"))) << under;
  EXPECT_EQ(ReadFileBytes(dir / "file"), "data");
  absl::Status resume = Prepare(dir / "none", /*resume=*/true);
  EXPECT_EQ(resume.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Contains(resume, "does not exist")) << resume;
}

// Permission bits do not stop root: the check must agree with what a real write does.
TEST(PrepareCheckpointDir, RefusesADirectoryItCannotWriteInto) {
  ScratchDir dir;
  const std::string ro = dir / "ro";
  fs::create_directories(ro);
  chmod(ro.c_str(), 0555);
  const bool writable = std::ofstream(ro + "/try").good();
  fs::remove(ro + "/try");
  absl::Status status = Prepare(ro);
  chmod(ro.c_str(), 0755);
  if (writable) {
    EXPECT_TRUE(status.ok()) << status;
  } else {
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_TRUE(Contains(status, "cannot write into --checkpoint-dir " + ro)) << status;
  }
}

TEST(PrepareCheckpointDir, ANewRunRefusesCheckpointsUnlessItOverwrites) {
  ScratchDir dir;
  for (int64_t step : {3, 6})
    ASSERT_TRUE(PublishCheckpoint(dir.path(), step, {}, WriteMarker).ok());
  const std::vector<std::string> before = dir.List();
  absl::Status refused = Prepare(dir.path());
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(refused.message(),
            absl::StrFormat("--checkpoint-dir %s already holds checkpoints (the latest: "
                            "step-000006), which a new run would overwrite: add --resume to "
                            "continue that run, give another --checkpoint-dir, or add "
                            "--overwrite-checkpoints to replace them",
                            dir.path()));
  EXPECT_EQ(dir.List(), before);
  EXPECT_EQ(ReadFileBytes(dir / "step-000006/marker"), "x");
  // A step directory alone (latest lost) counts too.
  ScratchDir bare;
  MakeCheckpoint(bare, 4);
  EXPECT_TRUE(Contains(Prepare(bare.path()), "(the latest: step-000004)"));
  EXPECT_TRUE(Prepare(dir.path(), /*resume=*/true).ok());
  EXPECT_EQ(dir.List(), before);
  // --overwrite-checkpoints: they stay until the run's first checkpoint replaces them all.
  ASSERT_TRUE(Prepare(dir.path(), /*resume=*/false, /*overwrite=*/true).ok());
  EXPECT_EQ(dir.List(), before);
  ASSERT_TRUE(
      PublishCheckpoint(dir.path(), 2, {.finite = false, .replace_others = true}, WriteMarker)
          .ok());
  EXPECT_EQ(dir.List(), (std::vector<std::string>{"latest", "step-000002"}));
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
  hooks.save = [&](int64_t steps_done, const Retention&) {
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
  hooks.save = [](int64_t, const Retention&) { return absl::OkStatus(); };
  EXPECT_EQ(RunTrainingSteps(options, false, 0, 1, nullptr, hooks).code(),
            absl::StatusCode::kInternal);
  EXPECT_EQ(calls, 2);
}

// Skipped steps are no progress: no checkpoint when every step since the last one was skipped;
// one after a skipped step is not known finite and keeps the newest one that is.
TEST(RunTrainingSteps, SavesNoCheckpointWithoutAnAppliedUpdate) {
  TrainOptions options;
  options.steps = 10;
  options.checkpoint_dir = "unused";
  options.checkpoint_every = 2;
  options.keep_checkpoints = 3;
  options.resume = true;
  // Resumed after step 2; 1-based steps 3, 4, 6 and 10 are skipped.
  const std::vector<int64_t> skipped = {3, 4, 6, 10};
  LoopHooks hooks;
  hooks.step = [&](int64_t step, MetricsRecord& record) {
    record.step = step + 1;
    record.skipped = std::find(skipped.begin(), skipped.end(), step + 1) != skipped.end();
    return absl::OkStatus();
  };
  std::vector<std::tuple<int64_t, bool, int64_t>> saved;
  hooks.save = [&](int64_t steps_done, const Retention& r) {
    EXPECT_EQ(r.keep, 3);
    saved.emplace_back(steps_done, r.finite, r.also_keep);
    return absl::OkStatus();
  };
  ASSERT_TRUE(RunTrainingSteps(options, false, /*first_step=*/2, 1, nullptr, hooks).ok());
  // 4: nothing applied since 2. 6: not finite, keeps 2 (the start). 8: finite. 10: not finite,
  // keeps 8.
  EXPECT_EQ(saved, (std::vector<std::tuple<int64_t, bool, int64_t>>{
                       {6, false, 2}, {8, true, -1}, {10, false, 8}}));
}

// --overwrite-checkpoints: the run's first checkpoint replaces the earlier ones, later ones rotate.
TEST(RunTrainingSteps, ReplacesTheEarlierCheckpointsWithTheFirst) {
  TrainOptions options;
  options.steps = 4;
  options.checkpoint_dir = "unused";
  options.checkpoint_every = 2;
  options.overwrite_checkpoints = true;
  LoopHooks hooks;
  hooks.step = [](int64_t step, MetricsRecord& record) {
    record.step = step + 1;
    return absl::OkStatus();
  };
  std::vector<bool> replaced;
  hooks.save = [&](int64_t, const Retention& r) {
    replaced.push_back(r.replace_others);
    return absl::OkStatus();
  };
  ASSERT_TRUE(RunTrainingSteps(options, false, 0, 1, nullptr, hooks).ok());
  EXPECT_EQ(replaced, (std::vector<bool>{true, false}));
}

// --- the held-out loss ---------------------------------------------------------------------------

TEST(EvalOptions, AreCheckedBeforeStepOne) {
  const auto prepare = [](auto change) {
    TrainOptions options;
    options.steps = 4;
    change(options);
    return PrepareOptions(options);
  };
  EXPECT_TRUE(prepare([](TrainOptions& o) {
                o.eval_data = "held.bin";
                o.eval_every = 2;
              }).ok());
  EXPECT_TRUE(FailsWith(prepare([](TrainOptions& o) { o.eval_every = 2; }),
                        "--eval-every needs --eval-data"));
  EXPECT_TRUE(FailsWith(prepare([](TrainOptions& o) { o.eval_data = "held.bin"; }),
                        "--eval-data needs --eval-every N"));
  EXPECT_TRUE(FailsWith(prepare([](TrainOptions& o) { o.eval_tokens = 64; }),
                        "--eval-tokens needs --eval-data"));
  EXPECT_TRUE(FailsWith(prepare([](TrainOptions& o) {
                          o.eval_data = "held.bin";
                          o.eval_every = 0;
                        }),
                        "--eval-every must be positive, got 0"));
  EXPECT_TRUE(FailsWith(prepare([](TrainOptions& o) {
                          o.eval_data = "held.bin";
                          o.eval_every = 1;
                          o.eval_tokens = -1;
                        }),
                        "--eval-tokens must be positive, got -1"));
}

TEST(EvalGlobalBatches, RoundsUpToWholeGlobalBatchesThatTheFileHolds) {
  const data::BatchConfig batch{
      .seq = 64, .micro_batch = 2, .dp = 2, .grad_accum = 1, .vocab = 300};
  // One global batch: 4 windows, 256 inputs, 4 * 65 = 260 tokens of the file.
  absl::StatusOr<int64_t> batches = EvalGlobalBatches(batch, std::nullopt, "held.bin", 260);
  ASSERT_TRUE(batches.ok()) << batches.status();
  EXPECT_EQ(*batches, 1);
  EXPECT_EQ(*EvalGlobalBatches(batch, 256, "held.bin", 1000), 1);
  EXPECT_EQ(*EvalGlobalBatches(batch, 257, "held.bin", 1000), 2);
  EXPECT_EQ(*EvalGlobalBatches(batch, 1, "held.bin", 1000), 1);
  EXPECT_EQ(*EvalGlobalBatches(batch, 768, "held.bin", 780), 3);
  EXPECT_TRUE(FailsWith(EvalGlobalBatches(batch, std::nullopt, "held.bin", 259).status(),
                        "--eval-data held.bin has 259 tokens; one evaluation needs one global "
                        "batch: global_batch * (seq + 1) = 4 * (64 + 1) = 260 (global_batch = "
                        "micro_batch 2 * dp 2 * grad_accum 1)"));
  EXPECT_TRUE(FailsWith(EvalGlobalBatches(batch, 769, "held.bin", 1000).status(),
                        "--eval-data held.bin has 1,000 tokens; --eval-tokens 769 needs 4 global "
                        "batches: 4 * global_batch * (seq + 1) = 4 * 4 * (64 + 1) = 1,040"));
  EXPECT_TRUE(FailsWith(EvalGlobalBatches(batch, INT64_MAX, "held.bin", 1000).status(),
                        "more tokens than any file holds"));
  EXPECT_TRUE(FailsWith(EvalGlobalBatches(batch, 0, "held.bin", 1000).status(),
                        "--eval-tokens must be positive"));
}

TEST(EvalDue, AtMultiplesOfNAndAfterTheLastStep) {
  TrainOptions options;
  options.eval_every = 3;
  EXPECT_FALSE(EvalDue(options, 3, 10));  // no eval data: never
  options.eval_data = "held.bin";
  std::vector<int64_t> due;
  for (int64_t done = 1; done <= 10; ++done) {
    if (EvalDue(options, done, 10)) due.push_back(done);
  }
  EXPECT_EQ(due, (std::vector<int64_t>{3, 6, 9, 10}));
}

// The loop evaluates after the due steps only (a resumed run on the same cadence), fills the
// record then and clears it after the other steps, and prints the progress line after each
// evaluation whatever --log-every says.
TEST(RunTrainingSteps, EvaluatesOnTheCadenceAndRecordsIt) {
  ScratchDir dir;
  TrainOptions options;
  options.steps = 8;
  options.log_every = 100;
  options.eval_data = "held.bin";
  options.eval_every = 3;
  std::vector<int64_t> evaluated;
  LoopHooks hooks;
  hooks.step = [](int64_t step, MetricsRecord& record) {
    record.step = step + 1;
    record.loss = 1.0;
    return absl::OkStatus();
  };
  hooks.evaluate = [&](int64_t steps_done, MetricsRecord& record) {
    evaluated.push_back(steps_done);
    record.eval_loss = static_cast<double>(steps_done) / 2;
    record.eval_tokens = 128;
    return absl::OkStatus();
  };
  hooks.save = [](int64_t, const Retention&) { return absl::OkStatus(); };
  absl::StatusOr<MetricsWriter> writer = MetricsWriter::Open(dir / "m.jsonl", MetricsMode::kNew);
  ASSERT_TRUE(writer.ok());
  // Resumed after step 2: evaluations after 3, 6 and the last step (8).
  ASSERT_TRUE(RunTrainingSteps(options, /*root=*/true, /*first_step=*/2, 64, &*writer, hooks).ok());
  EXPECT_EQ(evaluated, (std::vector<int64_t>{3, 6, 8}));
  absl::StatusOr<MetricsLog> log = ReadMetrics(dir / "m.jsonl");
  ASSERT_TRUE(log.ok()) << log.status();
  ASSERT_EQ(log->records.size(), 6u);
  for (const MetricsRecord& r : log->records) {
    const bool due = r.step == 3 || r.step == 6 || r.step == 8;
    EXPECT_EQ(r.evaluated(), due) << r.step;
    if (due) {
      EXPECT_EQ(r.eval_loss, static_cast<double>(r.step) / 2);
    }
  }
  // A failing evaluation stops the run.
  hooks.evaluate = [](int64_t, MetricsRecord&) { return absl::InternalError("eval failed"); };
  EXPECT_TRUE(FailsWith(RunTrainingSteps(options, false, 0, 64, nullptr, hooks), "eval failed"));
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

// The saved position points into the saved run's document order: its shuffle seed (or none) is
// kept, silently when the command line gives none, with a note when it gives another.
TEST(AdoptSavedRun, TheSavedShuffleSeedIsKept) {
  TrainState saved = SavedRun();
  saved.run.shuffle_seed = 7;
  TrainOptions options = SameOptions();
  absl::StatusOr<std::vector<std::string>> notes = AdoptSavedRun("ck", saved, saved.run, options);
  ASSERT_TRUE(notes.ok()) << notes.status();
  EXPECT_TRUE(notes->empty());
  EXPECT_EQ(options.shuffle_seed, std::optional<uint64_t>(7));

  options = SameOptions();
  options.shuffle_seed = 8;
  options.given = {"shuffle-seed"};
  notes = AdoptSavedRun("ck", saved, saved.run, options);
  ASSERT_TRUE(notes.ok()) << notes.status();
  EXPECT_EQ(*notes, std::vector<std::string>{"--shuffle-seed 8 differs from the saved run's 7: "
                                             "the saved run's order is kept"});
  EXPECT_EQ(options.shuffle_seed, std::optional<uint64_t>(7));

  saved.run.shuffle_seed = std::nullopt;
  options.shuffle_seed = 8;
  notes = AdoptSavedRun("ck", saved, saved.run, options);
  ASSERT_TRUE(notes.ok()) << notes.status();
  EXPECT_EQ(*notes, std::vector<std::string>{
                        "--shuffle-seed 8 differs from the saved run's order (the documents as "
                        "stored): the saved run's order is kept"});
  EXPECT_EQ(options.shuffle_seed, std::nullopt);
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
  TrainingData training;
  training.run = SavedRun().run;
  ScratchDir dir;
  const std::vector<uint32_t> tokens(100, 7);
  ASSERT_TRUE(data::WriteTokenFile(dir / "tokens.bin", tokens, data::TokenDType::U16).ok());
  absl::StatusOr<data::DataSource> source = data::DataSource::Open(dir / "tokens.bin", {});
  ASSERT_TRUE(source.ok()) << source.status();
  training.source = std::make_unique<data::DataSource>(*std::move(source));
  absl::StatusOr<data::TokenBatcher> batcher =
      data::TokenBatcher::Create(training.source->tokens(), {8, 1, 1, 1, 256});
  ASSERT_TRUE(batcher.ok()) << batcher.status();
  training.batcher = *std::move(batcher);
  const TrainState state = StateAfter(3, training, SameOptions(), 3);
  EXPECT_EQ(state.run, training.run);
  EXPECT_EQ(state.step, 3);
  EXPECT_TRUE(ValidateTrainState(state).ok()) << ValidateTrainState(state);
}

}  // namespace
}  // namespace hcp::train
